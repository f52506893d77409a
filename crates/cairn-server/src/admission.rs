//! The bound on connections still in their hello: past `max_unauthenticated`
//! ([`Limits`](crate::state::Limits)) a new one evicts the oldest, so idle or slow
//! unauthenticated peers can delay nobody else for long.

use crate::sync::lock;
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use tokio::sync::oneshot;

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

/// A place for a new connection among at most `max` unauthenticated ones, evicting the oldest.
pub fn admit(registry: &Arc<Mutex<Unauthenticated>>, max: usize) -> Place {
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
