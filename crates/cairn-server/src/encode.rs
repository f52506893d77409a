//! A holder's side of CoREC encoding: cut its whole copy of a committed object into `k` data
//! shards, compute `m` parity shards, and store shard `i` on server `i` of the stripe (sealed
//! at once: the object's step is committed). Only one encoding runs per server at a time, off
//! the request path (a blocking thread), so encoding takes at most one core's share. A data
//! shard bound for a server that holds a whole copy is cut there from its copy ([`cut`]), not
//! sent: with replicas and stripes on consecutive ring slots that is `min(r + 1, k)` shards, so
//! r = 2 on RS(4 + 2) sends 3 shards instead of 5.

use crate::objects::piece_of;
use crate::state::State;
use crate::store::Which;
use cairn_core::erasure::Code;
use cairn_core::{Error, Result};
use cairn_proto::message::{Geometry, ObjectPut, PeerRequest, Request, Response};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Where an object's shards go.
#[derive(Debug, Clone)]
pub struct Stripe {
    /// Data shards.
    pub k: u32,
    /// Parity shards.
    pub m: u32,
    /// Server of each shard.
    pub shards: Vec<u32>,
    /// Servers holding a whole copy.
    pub holders: Vec<u32>,
}

/// Encodes object `id` of `dataset` step `step` into the shards of `stripe`.
pub async fn encode(state: &Arc<State>, dataset: &str, step: u64, id: u64, stripe: Stripe) -> Result<Response> {
    let Stripe { k, m, shards, holders } = stripe;
    let (data, base, crc) =
        state.store.with(dataset, step, (id, 0), |o| (o.data.clone(), piece_of(dataset, step, id, o, 0), o.checksum))?;
    // Waiting for the turn is bounded well within the leader's deadline for this call, so an
    // encoding the leader gave up on does not store shards after it dropped them.
    let wait = state.limits.peer_timeout / 2;
    let _turn = match tokio::time::timeout(wait, state.encoding.acquire()).await {
        Ok(Ok(turn)) => turn,
        Ok(Err(_)) => return Err(Error::Unavailable("the server is stopping".into())),
        Err(_) => return Err(Error::Unavailable(format!("server {} is busy encoding other objects; try later", state.id))),
    };
    // Data shards cut by another holder are not computed here (None).
    let cut_there: Vec<bool> = shards.iter().enumerate().map(|(i, s)| i < k as usize && *s != state.id && holders.contains(s)).collect();
    let what = format!("object {id:#x} of '{dataset}' step {step}");
    let pieces = tokio::task::spawn_blocking(move || -> Result<Vec<Option<Vec<u8>>>> {
        crate::objects::intact(&data, crc, || what)?;
        let code = Code::new(k as usize, m as usize)?;
        let mut all: Vec<Option<Vec<u8>>> = (0..code.k()).map(|i| (!cut_there[i]).then(|| code.shard(&data, i))).collect();
        all.extend(code.parity(&data).into_iter().map(Some));
        Ok(all)
    })
    .await
    .map_err(|e| Error::Unavailable(format!("encoding task failed: {e}")))??;
    let mut stored = tokio::task::JoinSet::new();
    for (i, (piece, to)) in pieces.into_iter().zip(shards.iter().copied()).enumerate() {
        let Some(bytes) = piece else {
            let req = PeerRequest::Cut { dataset: dataset.to_string(), step, id, k, shard: i as u32, m };
            let state = state.clone();
            stored.spawn(async move { crate::peer::call(&state, to, &req).await.map(|_| ()) });
            continue;
        };
        let mut h = ObjectPut { shard: i as u32 + 1, stripe: Some(Geometry { k, m, len: bytes.len() as u64 }), ..base.clone() };
        (h.object.checksum, h.object.copy) = (cairn_core::checksum::crc(&bytes), u32::from(i >= k as usize));
        let state = state.clone();
        stored.spawn(async move { store_shard(&state, to, h, bytes).await });
    }
    let mut first = Ok(());
    while let Some(r) = stored.join_next().await {
        let r = r.unwrap_or_else(|e| Err(Error::Unavailable(format!("shard task failed: {e}"))));
        if first.is_ok() {
            first = r;
        }
    }
    first?;
    let rate = state.requests.load(Ordering::Relaxed) as f64 / state.started.elapsed().as_secs_f64().max(1e-3);
    Ok(Response::Encoded { rate })
}

/// Stores one shard here or on server `to`.
async fn store_shard(state: &State, to: u32, h: ObjectPut, bytes: Vec<u8>) -> Result<()> {
    if to != state.id {
        return crate::peer::call_with(state, to, &PeerRequest::Piece(h), &bytes).await.map(|_| ());
    }
    let r = state.store.reserve(bytes.len() as u64)?;
    crate::objects::store(state, h, true, bytes, r)
}

/// Stores data shard `shard` (of `k` data and `m` parity shards) of object `id`, cut from this
/// server's whole copy.
pub fn cut(state: &State, dataset: &str, step: u64, id: u64, (k, m): (u32, u32), shard: u32) -> Result<()> {
    let (data, h) = state.store.with(dataset, step, (id, 0), |o| (o.data.clone(), piece_of(dataset, step, id, o, shard + 1)))?;
    crate::objects::intact(&data, h.object.checksum, || format!("object {id:#x} of '{dataset}' step {step}"))?;
    let bytes = cairn_core::erasure::data_shard(&data, k as usize, shard as usize);
    let mut h = h;
    h.object.checksum = cairn_core::checksum::crc(&bytes);
    h.stripe = Some(Geometry { k, m, len: bytes.len() as u64 });
    let r = state.store.reserve(bytes.len() as u64)?;
    crate::objects::store(state, h, true, bytes, r)
}

/// Drops shard `shard` (0: the whole copy) of object `id` here or on server `to`; best effort.
pub async fn drop_piece(state: &State, to: u32, dataset: &str, step: u64, id: u64, shard: u32) {
    if to == state.id {
        state.store.drop_objects(dataset, step, &Which { ids: &[id], shard: Some(shard), ..Which::default() });
        return;
    }
    let req =
        Request::Drop { dataset: dataset.to_string(), step, session: None, writer: None, ids: vec![id], except: None, shard: Some(shard) };
    let _ = crate::peer::call(state, to, &req).await;
}
