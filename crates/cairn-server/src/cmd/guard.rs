//! What the families' `apply`s share, below them (a family never calls into the `mod.rs` that
//! dispatches to it): refusing requests while this server is declared down, and the error of a
//! request routed to the wrong family.

use crate::reply::discard;
use crate::state::State;
use cairn_core::Result;
use tokio::io::AsyncRead;

/// Refuses a request that needs this server's objects while the server is declared down (see
/// [`State::check_member`]), reading past the request's payload so the connection stays in step.
pub async fn require_member<S: AsyncRead + Unpin>(state: &State, stream: &mut S, payload_len: u64) -> Result<()> {
    if let Err(e) = state.check_member() {
        discard(stream, payload_len).await?;
        return Err(e);
    }
    Ok(())
}

/// The error for a request routed to a family it is not of (a bug here, never the client's).
pub fn misrouted(family: &str, op: &str) -> cairn_core::Error {
    cairn_core::Error::Corrupt(format!("request {op} reached the {family} requests; please report this"))
}
