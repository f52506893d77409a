//! One module per kind of request, dispatched from a decoded frame.
//!
//! - [`data`]: put, get and drop of objects.
//! - [`commit`]: end of step, seal, release, and the step queries readers make.
//! - [`claims`]: claims of committed steps (leases) and the writers' close.
//! - [`kv`]: keyed values and sets (the task store).
//! - [`admin`]: status, object listing, datasets, shutdown.
//! - [`check`]: the stateless checks every request passes first.

pub mod admin;
pub mod check;
pub mod claims;
pub mod commit;
pub mod data;
pub mod kv;

use crate::state::State;
use cairn_core::{Error, Result};
use cairn_proto::frame::Prefix;
use cairn_proto::message::{Request, Response};
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};

/// What a request produced: a response, or a response with payload bytes.
#[derive(Debug)]
pub enum Reply {
    /// A response without payload.
    Plain(Response),
    /// A response followed by raw bytes.
    WithPayload(Response, Payload),
}

/// Payload bytes of a reply: a stored object shared without copying, or bytes cut out of one.
#[derive(Debug)]
pub enum Payload {
    /// A whole stored object.
    Shared(Arc<crate::segment::Memory>),
    /// A sub-box copied out of an object.
    Owned(Vec<u8>),
}

impl Payload {
    /// The bytes.
    pub fn bytes(&self) -> &[u8] {
        match self {
            Payload::Shared(b) => b,
            Payload::Owned(b) => b,
        }
    }
}

/// Runs one request. `stream` is positioned at its payload (if any), which the request consumes.
/// `local` is the client when it runs on this host (for same-node copies and leases).
pub async fn dispatch<S: AsyncRead + AsyncWrite + Unpin>(
    state: &Arc<State>,
    req: Request,
    p: Prefix,
    stream: &mut S,
    peer: &mut Option<crate::segment::Local>,
) -> Result<Reply> {
    let bound = peer.as_ref().map(crate::segment::Local::peer).transpose();
    let data = matches!(
        req,
        Request::Put { .. }
            | Request::PutMany { .. }
            | Request::Get { .. }
            | Request::Encode { .. }
            | Request::Cut { .. }
            | Request::Rebuild { .. }
            | Request::Pieces { .. }
            | Request::KvPut { .. }
            | Request::KvGet { .. }
    );
    if let Err(e) = check::request(&req, p.payload_len).and_then(|_| if data { state.check_member() } else { Ok(()) }) {
        crate::handler::discard(stream, p.payload_len).await?;
        return Err(e);
    }
    let plain = |r: Result<Response>| r.map(Reply::Plain);
    match req {
        Request::Hello { .. } => Err(Error::Conflict("hello sent twice on one connection".into())),
        Request::View => state.view().map(|v| Reply::Plain(Response::View { view: (*v).clone() })),
        Request::SetView { view } => plain(crate::views::set_view(state, view).await),
        Request::ViewChanged { view } => plain(state.adopt(view).map(|_| Response::Ok)),
        Request::Put { dataset, step, session, var, id, region, elem, checksum, copy, writer, shard, sealed, from } => {
            let h = data::PutHeader { dataset, step, session, var, id, region, elem, checksum, copy, writer, shard, sealed };
            match from {
                Some(runs) => plain(data::put_local(state, bound?, &runs, h)),
                None => plain(data::put(state, stream, p.payload_len, h).await),
            }
        }
        Request::PutMany { dataset, step, session, writer, objects, from, leases } => {
            let headers = objects
                .into_iter()
                .map(|o| data::PutHeader {
                    dataset: dataset.clone(),
                    step,
                    session: session.clone(),
                    var: o.var,
                    id: o.id,
                    region: o.region,
                    elem: o.elem,
                    checksum: o.checksum,
                    copy: o.copy,
                    writer,
                    shard: 0,
                    sealed: false,
                })
                .collect();
            match (from, leases) {
                (_, Some(ids)) => plain(data::put_leased(state, peer.as_mut(), &ids, headers)),
                (Some(runs), None) => plain(data::put_many_local(state, bound?, &runs, headers)),
                (None, None) => plain(data::put_many(state, stream, p.payload_len, headers).await),
            }
        }
        Request::Lease { sizes, release } => {
            let peer = peer.as_mut().ok_or_else(crate::cma::not_local)?;
            plain(peer.lease(&sizes, &release).map(|leases| Response::Leased { pid: std::process::id(), leases }))
        }
        Request::Get { dataset, step, id, want, shard, into } => {
            let reply = data::get(state, &dataset, step, (id, shard), &want)?;
            match into {
                Some(runs) => data::deliver_local(state, bound?, &runs, reply),
                None => Ok(reply),
            }
        }
        Request::Attach { addr, len, checksum } => {
            plain(bound?.ok_or_else(crate::cma::not_local)?.probe(addr, len, checksum).map(|()| Response::Ok))
        }
        Request::Encode { dataset, step, id, k, m, shards, holders } => {
            plain(crate::encode::encode(state, &dataset, step, id, crate::encode::Stripe { k, m, shards, holders }).await)
        }
        Request::Rebuild { dataset, pieces } => plain(crate::recover::rebuild(state, &dataset, pieces).await),
        Request::Pieces { dataset, want } => crate::recover::pieces(state, &dataset, &want),
        Request::Touch { dataset, step, ids } => {
            plain(crate::control::leader(state).map(|_| state.recovery.touch(&dataset, step, &ids)).map(|_| Response::Ok))
        }
        Request::Cut { dataset, step, id, k, shard } => {
            plain(crate::encode::cut(state, &dataset, step, id, k, shard).map(|_| Response::Ok))
        }
        req @ (Request::Seal { .. } | Request::Drop { .. }) => plain(commit::seal_or_drop(state, req).map(|_| Response::Ok)),
        Request::EndStep { dataset, fragment, shares, keep_last } => {
            plain(commit::end_step(state, &dataset, fragment, shares, keep_last).await)
        }
        Request::Steps { dataset, follower } => {
            plain(crate::control::reader(state, false, follower).await.map(|(log, _)| Response::Steps {
                steps: state.meta.steps(log, &dataset),
                finished: state.meta.finished(log, &dataset),
                pending: state.meta.pending(log, &dataset),
            }))
        }
        Request::Claim { dataset, claimer, lease_ms } => plain(claims::claim(state, &dataset, &claimer, lease_ms).await),
        Request::Renew { dataset, claimer, lease_ms } => plain(claims::renew(state, &dataset, &claimer, lease_ms).await),
        Request::Unclaim { dataset, claimer } => plain(claims::done(state, cairn_meta::Cmd::Unclaim { dataset, claimer }).await),
        Request::Close { dataset, session, rank, nranks } => {
            plain(claims::done(state, cairn_meta::Cmd::Close { dataset, session, rank, nranks }).await)
        }
        // Linearized: a leader just elected may not have applied every committed entry yet
        // (an `encoded` one whose copies are already gone), and its index must not be older.
        // A follower's answer says so, and its reader re-reads what it finds moved.
        Request::Index { dataset, step, follower } => plain(
            async {
                let (log, led) = crate::control::reader(state, true, follower).await?;
                state.meta.index(log, &dataset, step).map(|i| Response::Index { index: (*i).clone(), follower: !led })
            }
            .await,
        ),
        Request::WaitStep { dataset, step, timeout_ms } => plain(commit::wait_step(state, &dataset, step, timeout_ms).await),
        Request::Release { dataset, step } => plain(commit::release(state, &dataset, step).await),
        Request::StepOutcome { dataset, step, session } => plain(commit::outcome(state, &dataset, step, &session)),
        Request::AbortStep { dataset, step, session, reason } => plain(commit::abort_step(state, &dataset, step, &session, &reason).await),
        Request::KvPut { keys, sizes, member } => plain(kv::put(state, stream, p.payload_len, keys, sizes, member).await),
        Request::KvGet { keys, members } => kv::get(state, &keys, members),
        Request::KvDelete { keys, prefix } => plain(Ok(Response::Deleted { count: state.kv.delete(&state.store, &keys, prefix) })),
        Request::Datasets => plain(crate::control::leader(state).map(|log| Response::Datasets { names: state.meta.datasets(log) })),
        Request::Status => plain(Ok(admin::status(state))),
        Request::Objects => plain(Ok(Response::Objects { objects: state.store.list() })),
        // The connection sends the reply, then signals the shutdown.
        Request::Shutdown => plain(Ok(Response::Ok)),
        Request::Raft { kind, target, head } => {
            let mut payload = vec![0u8; p.payload_len as usize];
            stream.read_exact(&mut payload).await.map_err(|e| Error::io("reading a raft message", e))?;
            let out = crate::control::serve_rpc(state, kind, target, head, payload).await?;
            Ok(Reply::WithPayload(Response::Raft, Payload::Owned(out)))
        }
        Request::MetaCas { key, expect, delete, call } => {
            let mut value = vec![0u8; p.payload_len as usize];
            stream.read_exact(&mut value).await.map_err(|e| Error::io("reading a compare-and-set value", e))?;
            plain(crate::control::cas(state, key, expect, (!delete).then_some(value), call).await)
        }
        Request::MetaGet { key } => crate::control::cas_get(state, &key).await,
        Request::MetaJoin { node, server, addr } => {
            let log = state.control.get().ok_or_else(|| Error::Unavailable(format!("server {} is not a meta server", state.id)))?;
            plain(crate::control::admit(state, log, node, cairn_meta::raft::MetaNode { server, addr }).await.map(|()| Response::Ok))
        }
    }
}
