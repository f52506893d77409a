//! Keyed values: put (space reserved before the payload is read, as for objects), get, delete;
//! and compare-and-set values kept in the control plane's log (`cairn.tasks`' claims).

use super::check::{check_batch, check_key, check_keys, no_payload};
use crate::control::Control;
use crate::reply::{discard, Payload, Reply};
use crate::state::State;
use cairn_core::{Error, Result};
use cairn_proto::frame::Prefix;
use cairn_proto::message::{Request, Response, MAX_CAS_VALUE};
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncReadExt};

/// Checks a keyed-value request whose frame announced `payload_len` payload bytes.
pub fn check(req: &Request, payload_len: u64) -> Result<()> {
    match req {
        Request::KvPut { keys, sizes, .. } => check_batch(keys, sizes, payload_len),
        Request::MetaCas { key, delete, call, .. } => {
            check_key(key)?;
            // Call ids are kept by the control plane (4096 of them): short ones only.
            if call.as_ref().is_some_and(|o| o.is_empty() || o.len() > 64) {
                return Err(Error::InvalidArgument("a compare-and-set call id must have 1 to 64 bytes".into()));
            }
            if payload_len > MAX_CAS_VALUE || (*delete && payload_len > 0) {
                return Err(Error::InvalidArgument(format!(
                    "a compare-and-set value of {payload_len} bytes: at most {MAX_CAS_VALUE}, and none with delete; \
                     keep bulk values in kv_put"
                )));
            }
            Ok(())
        }
        other => {
            no_payload(&other.op_name(), payload_len)?;
            match other {
                Request::KvGet { keys, .. } | Request::KvDelete { keys, .. } => check_keys(keys),
                Request::MetaGet { key } => check_key(key),
                _ => Ok(()),
            }
        }
    }
}

/// Runs a checked keyed-value request.
pub async fn apply<S: AsyncRead + Unpin>(ctl: &Arc<Control>, req: Request, p: Prefix, stream: &mut S) -> Result<Reply> {
    let state = &ctl.state;
    if matches!(req, Request::KvPut { .. } | Request::KvGet { .. }) {
        super::guard::require_member(state, stream, p.payload_len).await?;
    }
    match req {
        Request::KvPut { keys, sizes, member } => put(state, stream, p.payload_len, keys, sizes, member).await.map(Reply::Plain),
        Request::KvGet { keys, members } => get(state, &keys, members),
        Request::KvDelete { keys, prefix } => Ok(Reply::Plain(Response::Deleted { count: state.kv.delete(&state.store, &keys, prefix) })),
        Request::MetaCas { key, expect, delete, call } => {
            let mut value = vec![0u8; p.payload_len as usize];
            stream.read_exact(&mut value).await.map_err(|e| Error::io("reading a compare-and-set value", e))?;
            crate::control::raft::cas(&ctl.gate, key, expect, (!delete).then_some(value), call).await.map(Reply::Plain)
        }
        Request::MetaGet { key } => crate::control::raft::cas_get(&ctl.gate, &key).await,
        other => Err(super::guard::misrouted("kv", &other.op_name())),
    }
}

/// Stores a batch of values or set members (checked by [`check`]): the whole payload's
/// space is reserved before it is read, so a batch is stored whole or not at all. On a refusal the payload is read and
/// discarded so the connection stays usable.
async fn put<S: AsyncRead + Unpin>(
    state: &State,
    stream: &mut S,
    len: u64,
    keys: Vec<String>,
    sizes: Vec<u64>,
    member: bool,
) -> Result<Response> {
    let reservation = match state.store.reserve(len) {
        Ok(r) => r,
        Err(e) => {
            discard(stream, len).await?;
            return Err(e);
        }
    };
    // Each piece is read into its own buffer (no second copy of the batch); the buffered reader
    // keeps that to a few system calls when pieces are small.
    let mut payload = tokio::io::BufReader::with_capacity(64 << 10, (&mut *stream).take(len));
    let mut pieces = Vec::with_capacity(keys.len());
    for (key, n) in keys.into_iter().zip(sizes) {
        let mut piece = vec![0u8; n as usize];
        payload.read_exact(&mut piece).await.map_err(|e| Error::io("reading a value payload", e))?;
        pieces.push((key, piece));
    }
    reservation.keep();
    state.kv.put_many(&state.store, pieces, member);
    Ok(Response::Ok)
}

/// The values (or members) of `keys`, back to back; a reply larger than the server's reply bound
/// is refused before anything is copied.
fn get(state: &State, keys: &[String], members: bool) -> Result<Reply> {
    let (sizes, bytes) = state.kv.get(keys, members, state.store.max_reply())?;
    Ok(Reply::WithPayload(Response::Values { sizes }, Payload::Owned(bytes)))
}
