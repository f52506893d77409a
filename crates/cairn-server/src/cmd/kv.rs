//! Keyed values: put (space reserved before the payload is read, as for objects), get, delete.

use super::{Payload, Reply};
use crate::state::State;
use cairn_core::{Error, Result};
use cairn_proto::message::{Response, MAX_KEY};
use tokio::io::{AsyncRead, AsyncReadExt};

fn check_key(key: &str) -> Result<()> {
    if key.is_empty() || key.len() > MAX_KEY {
        return Err(Error::InvalidArgument(format!("key of {} bytes: keys must have 1 to {MAX_KEY} bytes", key.len())));
    }
    Ok(())
}

/// Stores a value or set member. On a refusal the payload is read and discarded so the
/// connection stays usable.
pub async fn put<S: AsyncRead + Unpin>(state: &State, stream: &mut S, len: u64, key: String, member: bool) -> Result<Response> {
    let reservation = match check_key(&key).and_then(|_| state.store.reserve(len)) {
        Ok(r) => r,
        Err(e) => {
            tokio::io::copy(&mut (&mut *stream).take(len), &mut tokio::io::sink())
                .await
                .map_err(|e| Error::io("discarding a refused payload", e))?;
            return Err(e);
        }
    };
    let mut data = vec![0u8; len as usize];
    stream.read_exact(&mut data).await.map_err(|e| Error::io("reading a value payload", e))?;
    reservation.keep();
    state.kv.put(&state.store, key, data, member);
    Ok(Response::Ok)
}

/// The values (or members) of `keys`, back to back.
pub fn get(state: &State, keys: &[String], members: bool) -> Result<Reply> {
    keys.iter().try_for_each(|k| check_key(k))?;
    let (sizes, bytes) = state.kv.get(keys, members);
    Ok(Reply::WithPayload(Response::Values { sizes }, Payload::Owned(bytes)))
}
