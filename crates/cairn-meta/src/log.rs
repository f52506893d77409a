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
