//! Accepting connections: one task per connection (TCP, and a Unix socket for clients on the same
//! node) until shutdown. Connections in their hello are bounded apart from authenticated ones:
//! past [`Limits::max_unauthenticated`](crate::state::Limits) a new one evicts the oldest, so
//! idle or slow unauthenticated peers can delay nobody else for long. Authenticated connections
//! are bounded by a semaphore; past it, a hello is answered `busy`.

use crate::handler::handle;
use crate::state::{lock, State};
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::{oneshot, Semaphore};
use tokio::task::JoinSet;

/// The sockets a server accepts on.
#[derive(Debug)]
pub struct Listeners {
    /// TCP, for every client.
    pub tcp: TcpListener,
    /// A Unix socket for clients on this node (none when its path is too long).
    pub unix: Option<UnixListener>,
}

/// Connections still in their hello, oldest first; each can be told to give up its place.
#[derive(Debug, Default)]
pub struct Unauthenticated {
    next: u64,
    waiting: BTreeMap<u64, oneshot::Sender<()>>,
}

/// A connection's place among the unauthenticated ones; dropping it gives the place up.
#[derive(Debug)]
pub struct Place {
    id: u64,
    registry: Arc<Mutex<Unauthenticated>>,
    /// Fires when a newer connection evicts this one.
    pub evicted: oneshot::Receiver<()>,
}

impl Drop for Place {
    fn drop(&mut self) {
        lock(&self.registry).waiting.remove(&self.id);
    }
}

fn admit(registry: &Arc<Mutex<Unauthenticated>>, max: usize) -> Place {
    let (tx, rx) = oneshot::channel();
    let mut r = lock(registry);
    while r.waiting.len() >= max.max(1) {
        if let Some((_, oldest)) = r.waiting.pop_first() {
            let _ = oldest.send(());
        }
    }
    let id = r.next;
    r.next += 1;
    r.waiting.insert(id, tx);
    Place { id, registry: registry.clone(), evicted: rx }
}

/// Serves `listeners` until `shutdown` completes or a shutdown request arrives; then every
/// connection is closed (in-flight requests are cut, as when the process dies).
pub async fn run(state: Arc<State>, listeners: Listeners, shutdown: impl Future<Output = ()>) {
    let authenticated = Arc::new(Semaphore::new(state.limits.max_connections));
    let registry = Arc::new(Mutex::new(Unauthenticated::default()));
    let mut stop = state.shutdown.subscribe();
    let mut tasks = JoinSet::new();
    let Listeners { tcp, unix } = listeners;
    tokio::pin!(shutdown);
    loop {
        while tasks.try_join_next().is_some() {}
        let spawn = |tasks: &mut JoinSet<()>, place: Place, conn| {
            let (state, auth) = (state.clone(), authenticated.clone());
            tasks.spawn(async move {
                match conn {
                    Conn::Tcp(s) => handle(state, s, place, auth, None).await,
                    Conn::Unix(s) => {
                        // The kernel's word for who opened the connection: the only process
                        // same-node copies of this connection may touch.
                        use std::os::fd::AsFd;
                        let peer = crate::cma::Peer::bind(s.as_fd(), state.limits.same_node_other_users);
                        handle(state, s, place, auth, Some(peer)).await
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
            eprintln!("cairn server {}: accept failed: {e}", state.id);
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }
    tasks.shutdown().await;
}

enum Conn {
    Tcp(tokio::net::TcpStream),
    Unix(tokio::net::UnixStream),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admitting_past_the_bound_evicts_the_oldest() {
        let reg = Arc::new(Mutex::new(Unauthenticated::default()));
        let mut a = admit(&reg, 2);
        let mut b = admit(&reg, 2);
        assert!(a.evicted.try_recv().is_err());
        let _c = admit(&reg, 2);
        assert!(a.evicted.try_recv().is_ok(), "the oldest goes");
        assert!(b.evicted.try_recv().is_err());
        drop(b);
        assert_eq!(lock(&reg).waiting.len(), 1, "a place given up is free again");
        let _d = admit(&reg, 2);
        assert_eq!(lock(&reg).waiting.len(), 2);
    }
}
