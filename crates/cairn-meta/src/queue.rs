//! Backpressure between a dataset's writers and its streaming readers (issue 45), as ADIOS2
//! SST's queue limit and policy: the writers set a limit on committed steps not yet released
//! and what happens at it (`Block`: their next `begin_step` waits; `DiscardOldest`: the oldest
//! is released). Readers that stream with release register here: a step is released once every
//! registered reader has passed it, and `keep_last` waits for them too. A reader whose
//! registration is not renewed within its lease (it died) is dropped.
//!
//! As SST's: a `Block` queue holds a step while a registered reader has not passed it (or a
//! claimer holds a lease on it). Before any reader ever registered it blocks (a writer that
//! starts first waits for its analysis); once the last registered reader closed or lapsed, with
//! no claim lease live, it releases as `DiscardOldest` until a reader registers again, so a
//! reader that died, hung or left never jams the writers.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

pub use cairn_core::queue::Policy;

/// One registered reader: the first step it has not passed, and when its registration lapses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
struct Mark {
    next: u64,
    expires_ms: u64,
    /// Its lease: how long a writer may have to wait for it to lapse.
    #[serde(default)]
    lease_ms: u64,
}

/// A dataset's queue limit and its registered readers.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Queue {
    /// Committed steps not yet released the writers allow, and the policy at that limit.
    #[serde(default)]
    limit: Option<(u64, Policy)>,
    /// Registered readers by id.
    #[serde(default)]
    readers: BTreeMap<String, Mark>,
    /// Some reader registered once (a `Block` queue with none left then releases as
    /// `DiscardOldest`).
    #[serde(default)]
    ever: bool,
}

impl Queue {
    /// Sets the limit (0: none).
    pub fn set(&mut self, limit: u64, policy: Policy) {
        self.limit = (limit > 0).then_some((limit, policy));
    }

    /// The limit and policy, if set.
    pub fn limit(&self) -> Option<(u64, Policy)> {
        self.limit
    }

    /// Registers or moves reader `reader` to `next` (the first step it has not passed; `None`
    /// keeps where it is, or `oldest` for a new one) for `lease_ms` from `now_ms`; a lease of 0
    /// unregisters it. A reader never moves back.
    pub fn mark(&mut self, reader: &str, next: Option<u64>, lease_ms: u64, now_ms: u64, oldest: u64) {
        if lease_ms == 0 {
            self.readers.remove(reader);
            return;
        }
        let expires_ms = now_ms.saturating_add(lease_ms);
        let m = self.readers.entry(reader.to_string()).or_insert(Mark { next: next.unwrap_or(oldest), expires_ms, lease_ms });
        m.next = m.next.max(next.unwrap_or(m.next));
        m.expires_ms = expires_ms;
        m.lease_ms = lease_ms;
        self.ever = true;
    }

    /// Whether readers registered once and none is left: a `Block` queue then releases as
    /// `DiscardOldest` (unless a claim lease is live, which the dataset knows).
    pub fn abandoned(&self) -> bool {
        self.ever && self.readers.is_empty()
    }

    /// The longest lease of a registered reader, in ms (0 without readers): a writer blocked by
    /// one waits at most that long for it to lapse.
    pub fn longest_lease_ms(&self) -> u64 {
        self.readers.values().map(|m| m.lease_ms).max().unwrap_or(0)
    }

    /// Reader `reader`'s mark (the first step it has not passed), if registered.
    pub fn mark_of(&self, reader: &str) -> Option<u64> {
        self.readers.get(reader).map(|m| m.next)
    }

    /// Drops readers whose registration lapsed by `now_ms`.
    pub fn expire(&mut self, now_ms: u64) {
        self.readers.retain(|_, m| m.expires_ms > now_ms);
    }

    /// Whether some reader's registration lapsed by `now_ms`.
    pub fn lapsed(&self, now_ms: u64) -> bool {
        self.readers.values().any(|m| m.expires_ms <= now_ms)
    }

    /// The first step some registered reader has not passed; `None` without readers.
    pub fn passed(&self) -> Option<u64> {
        self.readers.values().map(|m| m.next).min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readers_hold_the_first_step_one_of_them_has_not_passed_until_their_lease_lapses() {
        let mut q = Queue::default();
        assert_eq!(q.passed(), None);
        q.mark("a", Some(3), 1000, 0, 0);
        q.mark("b", None, 1000, 0, 1);
        assert_eq!(q.passed(), Some(1), "a new reader without a start is at the oldest step");
        q.mark("b", Some(5), 1000, 500, 0);
        q.mark("a", Some(2), 1000, 500, 0);
        assert_eq!(q.passed(), Some(3), "a reader never moves back");
        assert!(!q.lapsed(1499) && q.lapsed(1500));
        q.expire(1500);
        assert_eq!(q.passed(), None);
        q.mark("c", Some(4), 10, 0, 0);
        q.mark("c", None, 0, 0, 0);
        assert_eq!(q.passed(), None, "a lease of 0 unregisters");
        assert!(q.abandoned(), "readers came and went");
        assert!(!Queue::default().abandoned(), "no reader ever came");
        q.mark("d", None, 2500, 0, 0);
        assert_eq!((q.abandoned(), q.longest_lease_ms()), (false, 2500));
    }

    #[test]
    fn a_limit_of_zero_is_no_queue() {
        let mut q = Queue::default();
        q.set(2, Policy::parse("block").unwrap());
        assert_eq!(q.limit(), Some((2, Policy::Block)));
        q.set(0, Policy::DiscardOldest);
        assert_eq!(q.limit(), None);
        assert!(Policy::parse("drop").is_err());
    }
}
