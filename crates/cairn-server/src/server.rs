//! Accepting connections: one task per connection (TCP, and a Unix socket for clients on the same
//! node) until shutdown. Connections in their hello are bounded apart from authenticated ones:
//! past [`Limits::max_unauthenticated`](crate::state::Limits) a new one evicts the oldest, so
//! idle or slow unauthenticated peers can delay nobody else for long. Authenticated connections
//! are bounded by a semaphore; past it, a hello is answered `busy`.

use crate::admission::{admit, Place, Unauthenticated};
use crate::control::Control;
use crate::handler::handle;
use std::future::Future;
use std::sync::{Arc, Mutex};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

/// The sockets a server accepts on.
#[derive(Debug)]
pub struct Listeners {
    /// TCP, for every client.
    pub tcp: TcpListener,
    /// A Unix socket for clients on this node (none when its path is too long).
    pub unix: Option<UnixListener>,
}

/// Serves `listeners` until `shutdown` completes or a shutdown request arrives; then every
/// connection is closed (in-flight requests are cut, as when the process dies).
pub async fn run(ctl: Arc<Control>, listeners: Listeners, shutdown: impl Future<Output = ()>) {
    let state = ctl.state.clone();
    let authenticated = Arc::new(Semaphore::new(state.limits.max_connections));
    let registry = Arc::new(Mutex::new(Unauthenticated::default()));
    let mut stop = state.shutdown.subscribe();
    let mut tasks = JoinSet::new();
    let Listeners { tcp, unix } = listeners;
    tokio::pin!(shutdown);
    loop {
        while tasks.try_join_next().is_some() {}
        let spawn = |tasks: &mut JoinSet<()>, place: Place, conn| {
            let (ctl, auth) = (ctl.clone(), authenticated.clone());
            tasks.spawn(async move {
                match conn {
                    Conn::Tcp(s) => handle(ctl, s, place, auth, None).await,
                    Conn::Unix(s) => {
                        // The kernel's word for who opened the connection: the only process
                        // same-node copies of this connection may touch.
                        use std::os::fd::AsFd;
                        let peer = crate::cma::Peer::bind(s.as_fd(), ctl.state.limits.same_node_other_users);
                        // Descriptors for same-node readers go over it (see `Local::mapping`).
                        let sock = s.as_fd().try_clone_to_owned().ok();
                        handle(ctl, s, place, auth, Some((peer, sock))).await
                    }
                }
            });
        };
        let max = state.limits.max_unauthenticated;
        let accepted = tokio::select! {
            a = tcp.accept() => a.map(|(s, _)| {
                let _ = s.set_nodelay(true);
                spawn(&mut tasks, admit(&registry, max), Conn::Tcp(s));
            }),
            a = async { unix.as_ref().expect("guarded").accept().await }, if unix.is_some() => a.map(|(s, _)| {
                spawn(&mut tasks, admit(&registry, max), Conn::Unix(s));
            }),
            _ = &mut shutdown => break,
            _ = stop.recv() => break,
        };
        if let Err(e) = accepted {
            // Out of file descriptors and the like: wait a little instead of spinning.
            if let Some(n) = crate::logging::limited("accept", crate::logging::EVERY) {
                tracing::warn!(server = state.id, left_out = n, "accept failed: {e}");
            }
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }
    tasks.shutdown().await;
}

enum Conn {
    Tcp(tokio::net::TcpStream),
    Unix(tokio::net::UnixStream),
}
