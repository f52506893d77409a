//! A holder's side of CoREC encoding: cut its whole copy of a committed object into `k` data
//! shards, compute `m` parity shards, and store shard `i` on server `i` of the stripe (sealed
//! at once: the object's step is committed). Only one encoding runs per server at a time, off
//! the request path (a blocking thread), so encoding takes at most one core's share.

use crate::state::State;
use crate::cmd::data::PutHeader;
use crate::store::Which;
use cairn_core::erasure::Code;
use cairn_core::{Error, Result};
use cairn_proto::message::{Request, Response};
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Encodes object `id` of `dataset` step `step` into `k + m` shards on `shards`.
pub async fn encode(state: &Arc<State>, dataset: &str, step: u64, id: u64, k: u32, m: u32, shards: Vec<u32>) -> Result<Response> {
    let (data, region, elem, var, writer, session) =
        state.store.with(dataset, step, (id, 0), |o| (o.data.clone(), o.region.clone(), o.elem, o.var.clone(), o.writer, o.session.clone()))?;
    // Waiting for the turn is bounded well within the leader's deadline for this call, so an
    // encoding the leader gave up on does not store shards after it dropped them.
    let wait = state.limits.peer_timeout / 2;
    let _turn = match tokio::time::timeout(wait, state.encoding.acquire()).await {
        Ok(Ok(turn)) => turn,
        Ok(Err(_)) => return Err(Error::Unavailable("the server is stopping".into())),
        Err(_) => return Err(Error::Unavailable(format!("server {} is busy encoding other objects; try later", state.id))),
    };
    let pieces = tokio::task::spawn_blocking(move || -> Result<Vec<Vec<u8>>> {
        let code = Code::new(k as usize, m as usize)?;
        let mut all: Vec<Vec<u8>> = (0..code.k()).map(|i| code.shard(&data, i)).collect();
        all.extend(code.parity(&data));
        Ok(all)
    })
    .await
    .map_err(|e| Error::Unavailable(format!("encoding task failed: {e}")))??;
    let mut stored = tokio::task::JoinSet::new();
    for (i, (bytes, to)) in pieces.into_iter().zip(shards.iter().copied()).enumerate() {
        let h = PutHeader {
            dataset: dataset.to_string(),
            step,
            session: session.clone(),
            var: var.clone(),
            id,
            region: region.clone(),
            elem,
            checksum: crc32c::crc32c(&bytes),
            copy: u32::from(i >= k as usize),
            writer,
            shard: i as u32 + 1,
            sealed: true,
        };
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
async fn store_shard(state: &State, to: u32, h: PutHeader, bytes: Vec<u8>) -> Result<()> {
    if to != state.id {
        return crate::peer::call_with(state, to, &h.request(), &bytes).await.map(|_| ());
    }
    let r = state.store.reserve(bytes.len() as u64)?;
    crate::cmd::data::store(state, h, bytes, r)
}

/// Drops shard `shard` (0: the whole copy) of object `id` here or on server `to`; best effort.
pub async fn drop_piece(state: &State, to: u32, dataset: &str, step: u64, id: u64, shard: u32) {
    if to == state.id {
        state.store.drop_objects(dataset, step, &Which { ids: &[id], shard: Some(shard), ..Which::default() });
        return;
    }
    let req = Request::Drop {
        dataset: dataset.to_string(),
        step,
        session: None,
        writer: None,
        ids: vec![id],
        except: None,
        shard: Some(shard),
    };
    let _ = crate::peer::call(state, to, &req).await;
}
