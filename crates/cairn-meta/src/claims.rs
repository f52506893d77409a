//! Claims of committed steps (D²T §IV): any number of claimer processes share a dataset's steps,
//! each step leased to one claimer at a time. A claimer renews its leases while it lives; one that
//! dies loses them when they expire and another claimer gets the step. Consuming a step (the
//! claimer's commit of its result, which releases the step) ends its claim with it.
//!
//! Time enters only as the leader's clock stamped into each command (`now_ms`), so applying stays
//! deterministic: every replica decides a lease's expiry from the same numbers.

use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};

/// One claimer's hold on a step.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Lease {
    /// The claimer (a random id per `claims()` loop).
    pub claimer: String,
    /// Leader time (ms since the epoch) at which the lease lapses unless renewed.
    pub expires_ms: u64,
}

/// A dataset's claims and whether its writers are done.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Claims {
    /// Leases by step.
    held: BTreeMap<u64, Lease>,
    /// Ranks that closed, by session; a session whose every rank closed finishes the dataset.
    closed: BTreeMap<String, BTreeSet<u32>>,
    /// A writer session closed with every rank: no more steps come.
    finished: bool,
}

/// Sessions whose closed ranks are remembered per dataset.
const CLOSED_KEPT: usize = 64;

/// What a claim got.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Claimed {
    /// The step now leased to the claimer, if any was free.
    pub step: Option<u64>,
    /// Nothing will ever be free for this claimer: the writers finished and every committed step
    /// left is leased to it.
    pub done: bool,
}

impl Claims {
    /// Whether the step is leased to someone other than `claimer` at `now_ms`.
    fn taken(&self, step: u64, claimer: &str, now_ms: u64) -> bool {
        self.held.get(&step).is_some_and(|l| l.expires_ms > now_ms && l.claimer != claimer)
    }

    /// Whether `claimer` holds a live lease on `step`.
    fn mine(&self, step: u64, claimer: &str, now_ms: u64) -> bool {
        self.held.get(&step).is_some_and(|l| l.expires_ms > now_ms && l.claimer == claimer)
    }

    /// Whether some claimer holds a live lease at `now_ms`.
    pub fn live(&self, now_ms: u64) -> bool {
        self.held.values().any(|l| l.expires_ms > now_ms)
    }

    /// The lowest of `committed` that is free at `now_ms` (unleased, or its lease lapsed).
    pub fn free(&self, committed: impl IntoIterator<Item = u64>, claimer: &str, now_ms: u64) -> Option<u64> {
        committed.into_iter().find(|&s| !self.taken(s, claimer, now_ms) && !self.mine(s, claimer, now_ms))
    }

    /// Leases the lowest free step of `committed` to `claimer` for `lease_ms`.
    pub fn claim(&mut self, committed: &[u64], claimer: &str, now_ms: u64, lease_ms: u64) -> Claimed {
        // Lapsed leases of steps that are gone are forgotten here, so the map stays small.
        self.held.retain(|s, l| l.expires_ms > now_ms || committed.binary_search(s).is_ok());
        match self.free(committed.iter().copied(), claimer, now_ms) {
            Some(step) => {
                self.held.insert(step, Lease { claimer: claimer.to_string(), expires_ms: now_ms.saturating_add(lease_ms) });
                Claimed { step: Some(step), done: false }
            }
            None => Claimed { step: None, done: self.finished && committed.iter().all(|&s| self.mine(s, claimer, now_ms)) },
        }
    }

    /// Extends every live lease of `claimer`; returns the steps it still holds (a lease that
    /// lapsed and was taken by another claimer is not among them).
    pub fn renew(&mut self, claimer: &str, now_ms: u64, lease_ms: u64) -> Vec<u64> {
        let mut steps = Vec::new();
        for (s, l) in self.held.iter_mut().filter(|(_, l)| l.claimer == claimer) {
            l.expires_ms = l.expires_ms.max(now_ms.saturating_add(lease_ms));
            steps.push(*s);
        }
        steps
    }

    /// Gives back every step `claimer` holds (its loop ended without consuming them).
    pub fn unclaim(&mut self, claimer: &str) {
        self.held.retain(|_, l| l.claimer != claimer);
    }

    /// A step is gone (consumed or released): its claim ends.
    pub fn gone(&mut self, step: u64) {
        self.held.remove(&step);
    }

    /// Rank `rank` of `nranks` of `session` closed; the dataset is finished once all did.
    pub fn close(&mut self, session: &str, rank: u32, nranks: u32) {
        let ranks = self.closed.entry(session.to_string()).or_default();
        ranks.insert(rank);
        if ranks.len() as u64 >= u64::from(nranks) {
            self.finished = true;
        }
        while self.closed.len() > CLOSED_KEPT {
            self.closed.pop_first();
        }
    }

    /// A writer ended a step: the dataset is being written again.
    pub fn writing(&mut self) {
        self.finished = false;
        self.closed.clear();
    }

    /// Whether a writer session closed with all its ranks and none wrote since.
    pub fn finished(&self) -> bool {
        self.finished
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_step_goes_to_one_live_claimer_and_a_lapsed_lease_to_the_next() {
        let mut c = Claims::default();
        let steps = [0, 1, 2];
        assert_eq!(c.claim(&steps, "a", 0, 100).step, Some(0));
        assert_eq!(c.claim(&steps, "b", 10, 100).step, Some(1));
        assert_eq!(c.claim(&steps, "a", 20, 100).step, Some(2), "a claimer moves on past its own lease");
        assert_eq!(c.claim(&steps, "c", 30, 100), Claimed { step: None, done: false });
        // a keeps renewing, b died: b's step goes to c once its lease lapses.
        assert_eq!(c.renew("a", 90, 100), vec![0, 2]);
        assert_eq!(c.claim(&steps, "c", 109, 100).step, None, "b's lease runs to 110");
        assert_eq!(c.claim(&steps, "c", 110, 100).step, Some(1));
        assert_eq!(c.renew("b", 120, 100), Vec::<u64>::new(), "b lost step 1");
        c.gone(0);
        c.unclaim("a");
        assert_eq!(c.claim(&[1, 2], "d", 130, 100).step, Some(2));
    }

    #[test]
    fn a_claimer_is_done_once_the_writers_closed_and_it_holds_all_that_is_left() {
        let mut c = Claims::default();
        c.close("s", 0, 2);
        assert!(!c.finished());
        assert_eq!(c.claim(&[4], "a", 0, 100), Claimed { step: Some(4), done: false });
        assert_eq!(c.claim(&[4], "a", 1, 100), Claimed { step: None, done: false }, "writers not closed");
        c.close("s", 1, 2);
        assert!(c.finished());
        assert_eq!(c.claim(&[4], "a", 2, 100), Claimed { step: None, done: true });
        assert_eq!(c.claim(&[4], "b", 2, 100), Claimed { step: None, done: false }, "a may still die and lose it");
        assert_eq!(c.claim(&[], "b", 2, 100), Claimed { step: None, done: true });
        c.writing();
        assert_eq!(c.claim(&[], "b", 3, 100), Claimed { step: None, done: false }, "a writer came back");
    }
}
