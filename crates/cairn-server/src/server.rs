//! Accepting connections: one task per connection (TCP, and a Unix socket for clients on the same
//! node), at most [`MAX_CONNECTIONS`] at once, until the shutdown signal fires.

use crate::handler::handle;
use crate::state::State;
use std::sync::Arc;
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::Semaphore;

/// Connections served at once; further ones wait to be accepted.
pub const MAX_CONNECTIONS: usize = 1024;

/// Serves `tcp` (and `unix`) until [`State::shutdown`] fires.
pub async fn run(state: Arc<State>, tcp: TcpListener, unix: Option<UnixListener>) {
    let limit = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    let mut shutdown = state.shutdown.subscribe();
    loop {
        let permit = tokio::select! {
            p = limit.clone().acquire_owned() => p.expect("semaphore is never closed"),
            _ = shutdown.recv() => return,
        };
        let accepted = tokio::select! {
            a = tcp.accept() => a.map(|(s, _)| {
                let _ = s.set_nodelay(true);
                let state = state.clone();
                tokio::spawn(async move { handle(state, s).await; drop(permit) });
            }),
            a = async { unix.as_ref().expect("guarded").accept().await }, if unix.is_some() => a.map(|(s, _)| {
                let state = state.clone();
                tokio::spawn(async move { handle(state, s).await; drop(permit) });
            }),
            _ = shutdown.recv() => return,
        };
        if let Err(e) = accepted {
            // Out of file descriptors and the like: wait a little instead of spinning.
            eprintln!("cairn server {}: accept failed: {e}", state.id);
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }
}
