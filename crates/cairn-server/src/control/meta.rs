//! The coordinator's side of commits (D²T) over the control plane's log: writers' fragments, the
//! prepared step, its commit or abort, and releases become commands of the Raft-replicated
//! [`MetaLog`], applied to the pure [`MetaState`](cairn_meta::MetaState) on every meta server;
//! reads query the applied state of the leader. A step is visible once its `Commit` entry is
//! committed by a majority, never before; `wait_step` callers on the leader wake when it is.

use crate::sync::lock;
use cairn_core::index::{Fragment, Redundancy, StepIndex};
use cairn_core::{Error, Result};
use cairn_meta::claims::Claimed;
use cairn_meta::log::query;
use cairn_meta::{Cmd, MetaLog, Outcome};
use cairn_proto::message::{Abort, ClaimLease, CommitTimes, Release, Share};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// A step whose fragments are complete and must now be sealed.
#[derive(Debug)]
pub struct Ready {
    /// The merged index.
    pub index: Arc<StepIndex>,
    /// The session that wrote it.
    pub session: String,
    /// Objects and bytes expected per server.
    pub shares: BTreeMap<u32, (u64, u64)>,
}

/// The commit side of the control plane on this server; each call takes the log it goes through.
#[derive(Debug, Default)]
pub struct Meta {
    /// Bumped at every commit and release of a dataset; `wait_step` callers watch it.
    versions: Mutex<HashMap<String, watch::Sender<u64>>>,
    /// Steps (dataset, step, session) this server is finishing, so that a leader's sweep of
    /// prepared steps leaves a writer's own finish alone.
    finishing: Mutex<HashMap<(String, u64, String), usize>>,
    /// When the first fragment of each step being gathered here arrived.
    first_fragment: Mutex<HashMap<(String, u64, String), Instant>>,
    /// Time per commit phase (`cairn cluster status`, `python -m cairn.bench commit`).
    times: Mutex<CommitTimes>,
    /// Commands proposed together go in one log entry.
    batcher: cairn_meta::batch::Batcher,
}

/// Steps whose first fragment time is kept; past this (fragments of steps that never complete)
/// the times start over.
const TIMED_STEPS: usize = 65_536;

impl Meta {
    fn changed(&self, dataset: &str) {
        if let Some(v) = lock(&self.versions).get(dataset) {
            v.send_modify(|n| *n += 1);
        }
    }

    /// Records a writer's fragment. Returns the step ready to seal when this was the last one.
    pub async fn add_fragment(&self, log: &dyn MetaLog, dataset: &str, fragment: Fragment, shares: Vec<Share>) -> Result<Option<Ready>> {
        let session = fragment.session.clone();
        let key = (dataset.to_string(), fragment.step, session.clone());
        {
            let mut first = lock(&self.first_fragment);
            if first.len() >= TIMED_STEPS {
                first.clear();
            }
            first.entry(key.clone()).or_insert_with(Instant::now);
        }
        match self.batcher.propose(log, Cmd::AddFragment { dataset: dataset.to_string(), fragment, shares }).await? {
            Outcome::Pending { .. } => Ok(None),
            Outcome::Prepared { index, shares } => {
                if let Some(t) = lock(&self.first_fragment).remove(&key) {
                    lock(&self.times).fragments_us += t.elapsed().as_micros() as u64;
                }
                Ok(Some(Ready { index, session, shares }))
            }
            other => Err(unexpected_outcome("add_fragment", &other)),
        }
    }

    /// Adds a committed step's seal and commit times.
    pub fn timed(&self, state: &crate::state::State, seal: Duration, commit: Duration) {
        state.stats.commit_seconds.observe((seal + commit).as_secs_f64());
        let mut t = lock(&self.times);
        t.steps += 1;
        t.seal_us += seal.as_micros() as u64;
        t.commit_us += commit.as_micros() as u64;
    }

    /// Time per commit phase so far.
    pub fn times(&self) -> CommitTimes {
        *lock(&self.times)
    }

    /// Makes a prepared step visible. Returns the steps that `keep_last` now releases.
    /// `drain_every` is the drain's cadence, whose steps `keep_last` holds until drained.
    pub async fn commit(
        &self,
        log: &dyn MetaLog,
        dataset: &str,
        step: u64,
        session: &str,
        keep_last: Option<u64>,
        drain_every: Option<u64>,
    ) -> Result<Committed> {
        let cmd =
            Cmd::Commit { dataset: dataset.to_string(), step, session: session.to_string(), keep_last, drain_every, now_ms: now_ms() };
        let (released, consumed, held) = match self.batcher.propose(log, cmd).await? {
            Outcome::Committed { released, consumed, held } => (released, consumed, held),
            other => return Err(unexpected_outcome("commit", &other)),
        };
        self.changed(dataset);
        for src in consumed.iter().map(|(src, _)| src).chain(&held) {
            self.changed(src);
        }
        Ok(Committed { released, consumed })
    }

    /// Leases the lowest free committed step of `dataset` to `claimer` (see [`Cmd::Claim`]).
    /// Asks the log only when a step looks free, so claimers polling an empty dataset add no
    /// entries.
    pub async fn claim(&self, log: &dyn MetaLog, dataset: &str, claimer: &str, lease_ms: u64) -> Result<Claimed> {
        let now_ms = now_ms();
        let (free, finished) = query(log, |s| (s.claimable(dataset, claimer, now_ms), s.finished(dataset)));
        if free.is_none() && !finished {
            return Ok(Claimed { step: None, done: false });
        }
        let cmd = Cmd::Claim { lease: ClaimLease { dataset: dataset.to_string(), claimer: claimer.to_string(), lease_ms }, now_ms };
        match self.batcher.propose(log, cmd).await? {
            Outcome::Claimed(c) => Ok(c),
            other => Err(unexpected_outcome("claim", &other)),
        }
    }

    /// Extends `claimer`'s leases on `dataset`; returns the steps it still holds.
    pub async fn renew(&self, log: &dyn MetaLog, dataset: &str, claimer: &str, lease_ms: u64) -> Result<Vec<u64>> {
        let cmd =
            Cmd::Renew { lease: ClaimLease { dataset: dataset.to_string(), claimer: claimer.to_string(), lease_ms }, now_ms: now_ms() };
        match self.batcher.propose(log, cmd).await? {
            Outcome::Held { steps } => Ok(steps),
            other => Err(unexpected_outcome("renew", &other)),
        }
    }

    /// Proposes a command whose outcome is [`Outcome::Done`] (unclaim, close); wakes the
    /// dataset's watchers.
    pub async fn done(&self, log: &dyn MetaLog, dataset: &str, cmd: Cmd) -> Result<()> {
        match self.batcher.propose(log, cmd).await? {
            Outcome::Done => {
                self.changed(dataset);
                Ok(())
            }
            other => Err(unexpected_outcome("unclaim or close", &other)),
        }
    }

    /// Whether the writers closed `dataset`.
    pub fn finished(&self, log: &dyn MetaLog, dataset: &str) -> bool {
        query(log, |s| s.finished(dataset))
    }

    /// Forgets a step that will not commit; returns the servers that may hold its objects (none
    /// when the step was no longer prepared: another finisher committed or aborted it).
    pub async fn abort(&self, log: &dyn MetaLog, dataset: &str, step: u64, session: &str, reason: &str) -> Result<Vec<u32>> {
        let cmd = Cmd::Abort(Abort { dataset: dataset.to_string(), step, session: session.to_string(), reason: reason.to_string() });
        match self.batcher.propose(log, cmd).await? {
            Outcome::Aborted { servers } => Ok(servers),
            other => Err(unexpected_outcome("abort", &other)),
        }
    }

    /// Marks a step as being ended or finished on this server (counted: several writers' ends
    /// of one step may be under way).
    pub fn start_finishing(&self, dataset: &str, step: u64, session: &str) {
        *lock(&self.finishing).entry((dataset.to_string(), step, session.to_string())).or_default() += 1;
    }

    /// Whether this server is finishing the step.
    pub fn is_finishing(&self, dataset: &str, step: u64, session: &str) -> bool {
        lock(&self.finishing).contains_key(&(dataset.to_string(), step, session.to_string()))
    }

    /// Ends [`Meta::start_finishing`].
    pub fn done_finishing(&self, dataset: &str, step: u64, session: &str) {
        let mut f = lock(&self.finishing);
        let key = (dataset.to_string(), step, session.to_string());
        if let Some(n) = f.get_mut(&key) {
            *n -= 1;
            if *n == 0 {
                f.remove(&key);
            }
        }
    }

    /// Removes a committed step; returns its index so its objects can be freed.
    pub async fn release(&self, log: &dyn MetaLog, dataset: &str, step: u64) -> Result<Arc<StepIndex>> {
        let index = match self.batcher.propose(log, Cmd::Release(Release { dataset: dataset.to_string(), step })).await? {
            Outcome::Released { index } => index,
            other => return Err(unexpected_outcome("release", &other)),
        };
        self.changed(dataset);
        Ok(index)
    }

    /// Removes `dataset` whole, or its steps from `from` on; returns the indexes of the
    /// committed steps that went.
    pub async fn remove(&self, log: &dyn MetaLog, dataset: &str, from: Option<u64>) -> Result<Vec<Arc<StepIndex>>> {
        let released = match self.batcher.propose(log, Cmd::Remove { dataset: dataset.to_string(), from }).await? {
            Outcome::Removed { released } => released,
            other => return Err(unexpected_outcome("remove", &other)),
        };
        self.changed(dataset);
        Ok(released)
    }

    /// Records `step` of `dataset` as drained to disk; returns the steps `keep_last` released
    /// with it (held back until then).
    pub async fn drained(&self, log: &dyn MetaLog, dataset: &str, step: u64) -> Result<Vec<Arc<StepIndex>>> {
        let released = match self.batcher.propose(log, Cmd::Drained { dataset: dataset.to_string(), step }).await? {
            Outcome::Drained { released } => released,
            other => return Err(unexpected_outcome("drained", &other)),
        };
        self.changed(dataset);
        Ok(released)
    }

    /// Asks the drain for committed `step` of `dataset` off its cadence ([`Cmd::AskDrain`]).
    pub async fn ask_drain(&self, log: &dyn MetaLog, dataset: &str, step: u64) -> Result<()> {
        self.batcher.propose(log, Cmd::AskDrain { dataset: dataset.to_string(), step }).await?;
        self.changed(dataset);
        Ok(())
    }

    /// Proposes a queue command ([`Cmd::SetQueue`], [`Cmd::Stream`]); returns the steps it released.
    pub async fn queue(&self, log: &dyn MetaLog, dataset: &str, cmd: Cmd) -> Result<Vec<Arc<StepIndex>>> {
        let released = match self.batcher.propose(log, cmd).await? {
            Outcome::Trimmed { released } => released,
            other => return Err(unexpected_outcome("queue", &other)),
        };
        self.changed(dataset);
        Ok(released)
    }

    /// Streaming reader `reader`'s mark on `dataset` (the first step it holds).
    pub fn reader_mark(&self, log: &dyn MetaLog, dataset: &str, reader: &str) -> Option<u64> {
        query(log, |s| s.reader_mark(dataset, reader))
    }

    /// `dataset`'s queue now (see [`cairn_meta::state::QueueState`]).
    pub fn queued(&self, log: &dyn MetaLog, dataset: &str) -> cairn_meta::state::QueueState {
        query(log, |s| s.queue(dataset, now_ms()))
    }

    /// Records that objects of a committed step were encoded; returns how many entries changed.
    pub async fn encoded(&self, log: &dyn MetaLog, dataset: &str, step: u64, objects: Vec<(u64, Redundancy)>) -> Result<u64> {
        match self.batcher.propose(log, Cmd::Encoded { dataset: dataset.to_string(), step, objects }).await? {
            Outcome::Encoded { changed } => Ok(changed),
            other => Err(unexpected_outcome("encoded", &other)),
        }
    }

    /// Records erasure-coded objects decoded into copies on the given servers (see
    /// [`Cmd::Decoded`]); returns how many entries changed.
    pub async fn decoded(&self, log: &dyn MetaLog, dataset: &str, step: u64, objects: Vec<(u64, Vec<u32>)>) -> Result<u64> {
        match self.batcher.propose(log, Cmd::Decoded { dataset: dataset.to_string(), step, objects }).await? {
            Outcome::Encoded { changed } => Ok(changed),
            other => Err(unexpected_outcome("decoded", &other)),
        }
    }

    /// Records objects rebuilt on `to` for lost `from` (see [`Cmd::Rebuilt`]); returns how many changed.
    pub async fn rebuilt(&self, log: &dyn MetaLog, dataset: &str, step: u64, objects: Vec<(u64, u32, u32)>) -> Result<u64> {
        match self.batcher.propose(log, Cmd::Rebuilt { dataset: dataset.to_string(), step, objects }).await? {
            Outcome::Encoded { changed } => Ok(changed),
            other => Err(unexpected_outcome("rebuilt", &other)),
        }
    }

    /// Committed steps of a dataset (empty if unknown: a reader may come before the writers).
    pub fn steps(&self, log: &dyn MetaLog, dataset: &str) -> Vec<u64> {
        query(log, |s| s.steps(dataset))
    }

    /// Steps of `dataset` some writer ranks ended that are not committed (see
    /// [`cairn_meta::MetaState::pending`]).
    pub fn pending(&self, log: &dyn MetaLog, dataset: &str) -> Vec<(u64, u32, u32)> {
        query(log, |s| s.pending(dataset))
    }

    /// The committed index of a step.
    pub fn index(&self, log: &dyn MetaLog, dataset: &str, step: u64) -> Result<Arc<StepIndex>> {
        query(log, |s| s.index(dataset, step))
    }

    /// A receiver that changes whenever a step of `dataset` commits or is released.
    pub fn watch(&self, dataset: &str) -> watch::Receiver<u64> {
        lock(&self.versions).entry(dataset.to_string()).or_insert_with(|| watch::channel(0).0).subscribe()
    }

    /// Whether `step` of `dataset` is committed.
    pub fn is_committed(&self, log: &dyn MetaLog, dataset: &str, step: u64) -> bool {
        query(log, |s| s.is_committed(dataset, step))
    }

    /// What became of `step` of `dataset` as ended by `session` (see `MetaState::outcome`).
    pub fn outcome(&self, log: &dyn MetaLog, dataset: &str, step: u64, session: &str) -> (&'static str, Option<String>) {
        query(log, |s| s.outcome(dataset, step, session))
    }

    /// The error of `step` of `dataset` if it was committed and then released.
    pub fn released(&self, log: &dyn MetaLog, dataset: &str, step: u64) -> Option<Error> {
        query(log, |s| s.released(dataset, step))
    }

    /// Names of the datasets with committed steps (or consumed ones held for the drain).
    pub fn datasets(&self, log: &dyn MetaLog) -> Vec<String> {
        query(log, |s| s.datasets())
    }
}

/// What a commit released: older steps of its dataset (`keep_last`), and the steps of other
/// datasets it consumed.
#[derive(Debug)]
pub struct Committed {
    /// Released indexes of the committed dataset.
    pub released: Vec<Arc<StepIndex>>,
    /// Consumed steps, by dataset.
    pub consumed: Vec<(String, Arc<StepIndex>)>,
}

/// The leader's clock for leases: milliseconds since the epoch (servers of one cluster keep
/// their clocks in step; leases are seconds long).
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}

/// The error for an outcome a command cannot have (a bug in the state machine or its log).
fn unexpected_outcome(what: &str, got: &Outcome) -> Error {
    Error::Corrupt(format!("the control plane answered {what} with {got:?}; please report this"))
}
