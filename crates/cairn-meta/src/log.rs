//! The log that orders commands for the state machine. [`MemLog`] is one replica applying each
//! command as it is proposed (a single coordinator, and unit tests); a Raft log replicates each
//! command to a majority before any replica applies it, behind the same trait.

use crate::state::{Cmd, MetaState, Outcome};
use cairn_core::Error;
use std::future::Future;
use std::pin::Pin;
use std::sync::Mutex;

/// A boxed future of a proposal's outcome.
pub type Proposal<'a> = Pin<Box<dyn Future<Output = Result<Outcome, Error>> + Send + 'a>>;

/// Orders commands and applies them once committed.
pub trait MetaLog: Send + Sync {
    /// Appends `cmd`; resolves once it is committed and applied, with its outcome (a refused
    /// command resolves to its error). A log that cannot commit (no quorum, not the leader)
    /// resolves to an `Unavailable` error saying so.
    fn propose(&self, cmd: Cmd) -> Proposal<'_>;

    /// Runs `f` on the applied state (reads see every command whose proposal has resolved).
    fn read(&self, f: &mut dyn FnMut(&MetaState));
}

/// Reads a value out of the applied state of `log`.
pub fn query<T>(log: &dyn MetaLog, f: impl FnOnce(&MetaState) -> T) -> T {
    let mut f = Some(f);
    let mut out = None;
    log.read(&mut |s| out = f.take().map(|f| f(s)));
    out.expect("read runs its closure once")
}

/// One replica that applies each command when it is proposed.
#[derive(Debug, Default)]
pub struct MemLog {
    state: Mutex<MetaState>,
}

impl MemLog {
    /// A log over `state`.
    pub fn new(state: MetaState) -> MemLog {
        MemLog { state: Mutex::new(state) }
    }
}

impl MetaLog for MemLog {
    fn propose(&self, cmd: Cmd) -> Proposal<'_> {
        // Applying is pure and never panics on a command's content (commands are checked as
        // they apply), so the lock is never poisoned by input; recover anyway.
        let outcome = self.state.lock().unwrap_or_else(|p| p.into_inner()).apply(cmd);
        Box::pin(std::future::ready(outcome.into_result()))
    }

    fn read(&self, f: &mut dyn FnMut(&MetaState)) {
        f(&self.state.lock().unwrap_or_else(|p| p.into_inner()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::state::tests::frag;
    use cairn_core::ErrorKind;

    fn block_on(f: Proposal<'_>) -> Result<Outcome, Error> {
        // A MemLog's proposals are ready at once: one poll completes them.
        let waker = std::task::Waker::noop();
        let mut cx = std::task::Context::from_waker(waker);
        let mut f = f;
        match f.as_mut().poll(&mut cx) {
            std::task::Poll::Ready(r) => r,
            std::task::Poll::Pending => panic!("a MemLog proposal did not resolve at once"),
        }
    }

    #[test]
    fn a_mem_log_applies_proposals_in_order_and_reads_see_them() {
        let log = MemLog::default();
        let add = |w| {
            let (fragment, shares) = frag(3, w, 2, "s");
            block_on(log.propose(Cmd::AddFragment { dataset: "d".into(), fragment, shares }))
        };
        assert_eq!(add(0).unwrap(), Outcome::Pending { have: 1, want: 2 });
        assert!(matches!(add(1).unwrap(), Outcome::Prepared { .. }));
        assert!(query(&log, |s| s.steps("d").is_empty()), "prepared is not visible");
        let commit = Cmd::Commit { dataset: "d".into(), step: 3, session: "s".into(), keep_last: None, drain_every: None, now_ms: 0 };
        assert!(matches!(block_on(log.propose(commit.clone())).unwrap(), Outcome::Committed { .. }));
        assert_eq!(query(&log, |s| s.steps("d")), vec![3]);
        let e = block_on(log.propose(Cmd::Release(cairn_proto::message::Release { dataset: "d".into(), step: 4 }))).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::NotFound, "a refused command resolves to its error: {e}");
        assert_eq!(query(&log, |s| s.steps("d")), vec![3], "and changes nothing");
    }
}
