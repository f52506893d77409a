//! Keyed values: put (space reserved before the payload is read, as for objects), get, delete.

use super::{Payload, Reply};
use crate::state::State;
use cairn_core::{Error, Result};
use cairn_proto::message::Response;
use tokio::io::{AsyncRead, AsyncReadExt};

/// Stores a batch of values or set members (checked by [`super::check`]): the whole payload's
/// space is reserved before it is read, so a batch is stored whole or not at all. On a refusal the payload is read and
/// discarded so the connection stays usable.
pub async fn put<S: AsyncRead + Unpin>(
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

/// The values (or members) of `keys`, back to back; a reply larger than the server's reply bound
/// is refused before anything is copied.
pub fn get(state: &State, keys: &[String], members: bool) -> Result<Reply> {
    let (sizes, bytes) = state.kv.get(keys, members, state.store.max_reply())?;
    Ok(Reply::WithPayload(Response::Values { sizes }, Payload::Owned(bytes)))
}
