//! Keyed values: put (space reserved before the payload is read, as for objects), get, delete.

use super::{Payload, Reply};
use crate::state::State;
use cairn_core::{Error, Result};
use cairn_proto::message::{Response, MAX_KEY, MAX_KEYS};
use tokio::io::{AsyncRead, AsyncReadExt};

fn check_keys(keys: &[String]) -> Result<()> {
    if keys.len() > MAX_KEYS {
        return Err(Error::InvalidArgument(format!("{} keys in one request; send at most {MAX_KEYS} per request", keys.len())));
    }
    keys.iter().try_for_each(|k| check_key(k))
}

fn check_key(key: &str) -> Result<()> {
    if key.is_empty() || key.len() > MAX_KEY {
        return Err(Error::InvalidArgument(format!("key of {} bytes: keys must have 1 to {MAX_KEY} bytes", key.len())));
    }
    Ok(())
}

/// Stores a batch of values or set members: the whole payload's space is reserved before it is
/// read, so a batch is stored whole or not at all. On a refusal the payload is read and
/// discarded so the connection stays usable.
pub async fn put<S: AsyncRead + Unpin>(
    state: &State,
    stream: &mut S,
    len: u64,
    keys: Vec<String>,
    sizes: Vec<u64>,
    member: bool,
) -> Result<Response> {
    let reservation = match check_batch(&keys, &sizes, len).and_then(|_| state.store.reserve(len)) {
        Ok(r) => r,
        Err(e) => {
            crate::handler::discard(stream, len).await?;
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

/// A batch's keys are valid, and its sizes match the keys and add up to the payload.
fn check_batch(keys: &[String], sizes: &[u64], len: u64) -> Result<()> {
    check_keys(keys)?;
    let total = sizes.iter().try_fold(0u64, |a, &n| a.checked_add(n));
    if keys.len() != sizes.len() || total != Some(len) {
        return Err(Error::InvalidArgument(format!(
            "kv_put of {} keys with {} sizes adding up to {total:?} bytes, but a payload of {len} bytes; \
             send one size per key, adding up to the payload",
            keys.len(),
            sizes.len()
        )));
    }
    Ok(())
}

/// The values (or members) of `keys`, back to back; a reply larger than the server's reply bound
/// is refused before anything is copied.
pub fn get(state: &State, keys: &[String], members: bool) -> Result<Reply> {
    check_keys(keys)?;
    let (sizes, bytes) = state.kv.get(keys, members, state.store.max_reply())?;
    Ok(Reply::WithPayload(Response::Values { sizes }, Payload::Owned(bytes)))
}
