//! The control plane's state machine: what a replicated log applies, command after command, the
//! same on every replica. Pure: no I/O, no clocks, no randomness, so replicas that apply the same
//! commands hold the same state, and tests drive it with no network at all.
//!
//! A step's commit (D²T) runs through it in three commands: every writer's `AddFragment` (the
//! last one merges the step and *prepares* it: its seals may go out), then `Commit` (the step is
//! visible, at once, everywhere) or `Abort`. A coordinator that dies between them is replaced by
//! one that finds the prepared steps in [`MetaState::in_flight`] and finishes each.

use crate::claims::{Claimed, Claims};
use cairn_core::index::{Fragment, Redundancy, StepIndex};
use cairn_core::{Error, ErrorKind};
use cairn_proto::message::{Abort, ClaimLease, Close, Release, Share, Unclaim, ViewChange};
use cairn_proto::ClusterView;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// A command of the log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Cmd {
    /// A writer's part of a step: its fragment and where its objects went.
    AddFragment {
        /// Dataset.
        dataset: String,
        /// The writer's definitions and blocks.
        fragment: Fragment,
        /// Objects and bytes it put on each server.
        shares: Vec<Share>,
    },
    /// The finalize of a prepared step: it becomes visible. `keep_last` then releases the oldest.
    Commit {
        /// Dataset.
        dataset: String,
        /// Step.
        step: u64,
        /// The session whose prepared step commits.
        session: String,
        /// Keep only this many newest committed steps.
        keep_last: Option<u64>,
        /// With a drain to disk: its cadence (steps that are multiples of it are drained), so
        /// `keep_last` releases none of those before it is drained.
        #[serde(default)]
        drain_every: Option<u64>,
        /// The leader's clock (ms since the epoch): streaming readers whose registration lapsed
        /// by then hold no step.
        #[serde(default)]
        now_ms: u64,
    },
    /// The writers' queue limit of a dataset (committed steps not yet released; 0: none) and its
    /// policy (see [`crate::queue`]).
    SetQueue {
        /// Dataset.
        dataset: String,
        /// Limit.
        limit: u64,
        /// What happens at the limit.
        policy: crate::queue::Policy,
    },
    /// A streaming reader registers, moves on (`next`: the first step it has not passed), renews
    /// its registration for `lease_ms`, or (`lease_ms` 0) leaves; the steps every registered
    /// reader has passed are released. Without `reader`, only drops lapsed registrations.
    Stream {
        /// Dataset.
        dataset: String,
        /// The reader's id.
        reader: Option<String>,
        /// The first step it has not passed (`None`: where it is, or the oldest kept step).
        next: Option<u64>,
        /// How long its registration lasts without renewal.
        lease_ms: u64,
        /// The leader's clock when it proposed this.
        now_ms: u64,
    },
    /// A writer (or `cairn cluster drain`) asks the drain for committed `step` of a dataset
    /// whatever the cadence (a job's last checkpoint): the drain owes it from now on, so
    /// `keep_last` and the queue hold it until it is on disk.
    AskDrain {
        /// Dataset.
        dataset: String,
        /// The step.
        step: u64,
    },
    /// Step `step` of a dataset (and every step before it the cadence drains) is on disk: the
    /// steps `keep_last` held back for the drain may be released now.
    Drained {
        /// Dataset.
        dataset: String,
        /// The step now drained.
        step: u64,
    },
    /// Leases the lowest free committed step of a dataset to a claimer (D²T claims), by the
    /// leader's clock.
    Claim {
        /// The claimer's request.
        lease: ClaimLease,
        /// The leader's clock (ms since the epoch) when it proposed this.
        now_ms: u64,
    },
    /// Extends every lease a claimer holds on a dataset's steps, from the leader's clock.
    Renew {
        /// The claimer's request.
        lease: ClaimLease,
        /// The leader's clock when it proposed this.
        now_ms: u64,
    },
    /// Gives back every step a claimer holds.
    Unclaim(Unclaim),
    /// A writer rank closed the dataset; once every rank of its session did, no more steps come
    /// (readers' streams and claims end).
    Close(Close),
    /// A step (pending or prepared) of a session that will not commit: a seal failed, or its
    /// writers are gone. Its fragments are forgotten.
    Abort(Abort),
    /// Forgets a committed step.
    Release(Release),
    /// Forgets a dataset whole (`cairn rm`): its committed steps, the queue and its readers,
    /// the released-step memory, claims, the drained mark and constants, so its name behaves as
    /// one never used. Refused while a step of it is ended by some ranks and not committed.
    Remove {
        /// Dataset.
        dataset: String,
        /// Only the steps from this one on (a restart from an older step): committed ones
        /// released and remembered as discarded, their claims, commit records and released-step
        /// memory forgotten, the drained mark moved back before it.
        #[serde(default)]
        from: Option<u64>,
    },
    /// Objects of a committed step were erasure coded (CoREC): their index entries now name
    /// their shards instead of their copies. Objects no longer replicated (or gone) are skipped.
    Encoded {
        /// Dataset.
        dataset: String,
        /// Step.
        step: u64,
        /// Object ids and how each is now kept (`Redundancy::Encoded`).
        objects: Vec<(u64, Redundancy)>,
    },
    /// Objects of a committed step were rebuilt on server `to` after server `from` was lost:
    /// their entries name `to` where they named `from`.
    Rebuilt {
        /// Dataset.
        dataset: String,
        /// Step.
        step: u64,
        /// Object ids, each with the lost server and the one that holds its piece now.
        objects: Vec<(u64, u32, u32)>,
    },
    /// Erasure-coded objects of a committed step whose stripe no longer fits on the live servers
    /// were decoded into whole copies (recovery, before it encodes them again with a smaller
    /// `k`): their entries name the copies. Objects no longer encoded (or gone) are skipped.
    Decoded {
        /// Dataset.
        dataset: String,
        /// Step.
        step: u64,
        /// Object ids, each with the servers holding its copies now.
        objects: Vec<(u64, Vec<u32>)>,
    },
    /// Commands that arrived together, in one log entry (group commit): applied in order, each
    /// with its own outcome.
    Batch {
        /// The commands (not batches themselves).
        cmds: Vec<Cmd>,
    },
    /// Installs the next cluster view (its epoch must be the next one).
    SetView(ViewChange),
    /// Compare-and-set of a small keyed value (markers, claims, leases).
    KvCas {
        /// Key.
        key: String,
        /// The version the caller saw: `None` when the key must not exist.
        expect: Option<u64>,
        /// The new value, or `None` to delete.
        value: Option<Vec<u8>>,
        /// The caller's id for this call: a repeat of a recent id gets the first outcome.
        #[serde(default)]
        op: Option<String>,
    },
}

/// What applying a command did.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "outcome", rename_all = "snake_case")]
pub enum Outcome {
    /// A fragment was recorded; others are still missing.
    Pending {
        /// Fragments in.
        have: u32,
        /// Fragments expected.
        want: u32,
    },
    /// The last fragment came in: the step is merged and prepared; seal it on `shares`' servers.
    Prepared {
        /// The merged index.
        index: Arc<StepIndex>,
        /// Objects and bytes expected per server.
        shares: BTreeMap<u32, (u64, u64)>,
    },
    /// A step committed; these older steps were released by `keep_last` (free their objects).
    Committed {
        /// Released indexes.
        released: Vec<Arc<StepIndex>>,
        /// Steps of other datasets the commit consumed (released with it), by dataset.
        #[serde(default)]
        consumed: Vec<(String, Arc<StepIndex>)>,
        /// Datasets whose consumed step the drain still owes: held until drained, freed then.
        #[serde(default)]
        held: Vec<String>,
    },
    /// A drained step recorded; these older steps `keep_last` held back are released now.
    Drained {
        /// Released indexes.
        released: Vec<Arc<StepIndex>>,
    },
    /// A queue set or a reader moved: these steps are released now.
    Trimmed {
        /// Released indexes.
        released: Vec<Arc<StepIndex>>,
    },
    /// What a claim got.
    Claimed(Claimed),
    /// The steps a claimer still holds after renewing its leases.
    Held {
        /// Steps.
        steps: Vec<u64>,
    },
    /// The command was applied and has nothing to report.
    Done,
    /// A step was aborted: free its session's objects on these servers.
    Aborted {
        /// Servers that may hold its objects (from the shares recorded so far).
        servers: Vec<u32>,
    },
    /// A committed step was released (free its objects).
    Released {
        /// Its index.
        index: Arc<StepIndex>,
    },
    /// A dataset was removed: the indexes of the committed steps it had (free their objects).
    Removed {
        /// Their indexes.
        released: Vec<Arc<StepIndex>>,
    },
    /// The view is installed.
    ViewSet,
    /// Encodings recorded: how many of the objects named were changed.
    Encoded {
        /// Objects whose entries changed.
        changed: u64,
    },
    /// The outcomes of a batch's commands, in order.
    Batch {
        /// One per command.
        outcomes: Vec<Outcome>,
    },
    /// A compare-and-set: whether it took, and the key's version now (0: absent).
    Cas {
        /// Whether the value was set.
        ok: bool,
        /// Version after the command (0 when the key is absent).
        version: u64,
    },
    /// The command was refused; nothing changed.
    Refused {
        /// Error kind.
        kind: ErrorKind,
        /// Why, where callers act on it.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<cairn_core::Reason>,
        /// What was wrong and what to do.
        message: String,
    },
}

impl Outcome {
    fn refused(e: Error) -> Outcome {
        Outcome::Refused { kind: e.kind(), reason: e.reason(), message: e.to_string() }
    }

    /// The outcome as a result: `Refused` becomes its error.
    pub fn into_result(self) -> Result<Outcome, Error> {
        match self {
            Outcome::Refused { kind, reason, message } => Err(Error::from_wire(kind, reason, message)),
            o => Ok(o),
        }
    }
}

/// A step of one session whose fragments are coming in.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
struct Pending {
    frags: BTreeMap<u32, Fragment>,
    shares: BTreeMap<u32, BTreeMap<u32, (u64, u64)>>,
}

/// A step whose fragments are all in, merged, waiting for its seals.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Prepared {
    /// Dataset.
    pub dataset: String,
    /// Session.
    pub session: String,
    /// Merged index.
    pub index: Arc<StepIndex>,
    /// Objects and bytes expected per server.
    pub shares: BTreeMap<u32, (u64, u64)>,
    /// Datasets whose same step the commit releases (consume-and-produce).
    #[serde(default)]
    pub consume: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
struct Dataset {
    /// Claims of committed steps, and whether the writers finished.
    #[serde(default)]
    claims: Claims,
    committed: BTreeMap<u64, Arc<StepIndex>>,
    /// Steps consumed while the drain still owed them: out of reads and claims, their objects
    /// kept only until they are on disk (a planned stop drains them first, so a restarted
    /// producer goes on after them instead of producing them again).
    #[serde(default)]
    held: BTreeMap<u64, Arc<StepIndex>>,
    /// The session that committed each committed step (a repeated commit of it is a no-op).
    #[serde(default)]
    committed_by: BTreeMap<u64, String>,
    /// By step, then session (nested: snapshots are JSON, whose keys are strings).
    pending: BTreeMap<u64, BTreeMap<String, Pending>>,
    prepared: BTreeMap<u64, BTreeMap<String, Prepared>>,
    /// Sessions whose step was aborted, by step (the newest [`ABORTED_KEPT`] steps): a writer's
    /// late or repeated end of such a step is refused, never left pending forever.
    #[serde(default)]
    aborted: BTreeMap<u64, BTreeSet<String>>,
    /// Why each of those aborted, where known (by step, then session).
    #[serde(default)]
    abort_reasons: BTreeMap<u64, BTreeMap<String, String>>,
    /// Steps committed and then released (the newest [`RELEASED_KEPT`]): a read or wait of one
    /// is told so at once instead of waiting for a commit that will never come (issue 40).
    #[serde(default)]
    released: BTreeSet<u64>,
    /// Steps discarded by a restart from an older step and not written again since (the newest
    /// [`RELEASED_KEPT`]): a read of one is told so, a new commit of one is no repeat.
    #[serde(default)]
    discarded: BTreeSet<u64>,
    /// The newest step drained to disk (every earlier step the cadence names is, too).
    #[serde(default)]
    drained: Option<u64>,
    /// Committed steps the drain was asked for off its cadence ([`Cmd::AskDrain`]): owed while
    /// past `drained`, on disk after; forgotten with the step.
    #[serde(default)]
    drain_asked: BTreeSet<u64>,
    /// The drain's cadence and `keep_last` as of the newest commit.
    #[serde(default)]
    drain_every: Option<u64>,
    #[serde(default)]
    keep_last: Option<u64>,
    /// The writers' queue limit and the streaming readers registered.
    #[serde(default)]
    queue: crate::queue::Queue,
    /// The leader's clock as of the newest command that carried it (claim leases are live
    /// until then).
    #[serde(default)]
    clock_ms: u64,
}

/// Compare-and-set call ids remembered (a retry comes within seconds of its first try).
const CAS_OPS_KEPT: usize = 4096;

/// Aborted steps remembered per dataset.
const ABORTED_KEPT: usize = 4096;

/// Released steps remembered per dataset.
const RELEASED_KEPT: usize = 65_536;

impl Dataset {
    fn take_pending(&mut self, step: u64, session: &str) -> Option<Pending> {
        take(&mut self.pending, step, session)
    }

    fn take_prepared(&mut self, step: u64, session: &str) -> Option<Prepared> {
        take(&mut self.prepared, step, session)
    }

    fn mark_released(&mut self, step: u64) {
        self.released.insert(step);
        while self.released.len() > RELEASED_KEPT {
            self.released.pop_first();
        }
    }

    /// Whether the drain still owes `step` (its cadence names it and it is not on disk yet).
    fn owed(&self, step: u64) -> bool {
        self.drain_every.is_some_and(|every| self.names(step, every) && self.drained.is_none_or(|d| step > d))
    }

    /// Whether the drain writes `step` at cadence `every`: the cadence names it, or it was asked.
    fn names(&self, step: u64, every: u64) -> bool {
        step.is_multiple_of(every.max(1)) || self.drain_asked.contains(&step)
    }

    /// Asks the drain for committed `step` off the cadence (see [`Cmd::AskDrain`]).
    fn ask_drain(&mut self, dataset: &str, step: u64) -> Result<(), Error> {
        if !self.committed.contains_key(&step) {
            return Err(self.missing(dataset, step));
        }
        let on_cadence = self.drain_every.is_some_and(|e| step.is_multiple_of(e.max(1)));
        match self.drained {
            Some(d) if step <= d && !on_cadence && !self.drain_asked.contains(&step) => Err(Error::Conflict(format!(
                "step {step} of '{dataset}' is older than its newest drained step {d} and off the drain's cadence: it is not on \
                 disk, and only steps newer than the newest drained one are drained on demand"
            ))),
            Some(d) if step <= d => Ok(()),
            _ => {
                self.drain_asked.insert(step);
                Ok(())
            }
        }
    }

    /// Releases, of the committed steps the drain does not still owe and that hold no constant's
    /// blocks: with streaming readers registered, those every one of them has passed; else those
    /// older than the newest `keep_last`; and with a `discard_oldest` queue, the oldest while more
    /// than its limit are kept (readers or not). Returns their indexes.
    fn trim(&mut self) -> Vec<Arc<StepIndex>> {
        // A step holding a constant's blocks stays while the dataset is kept: they are its only copy.
        let holds_constant = |i: &StepIndex| i.blocks.iter().any(|b| i.vars.get(&b.var).is_some_and(|d| d.constant));
        let releasable: Vec<u64> = self.committed.iter().filter(|(s, i)| !self.owed(**s) && !holds_constant(i)).map(|(s, _)| *s).collect();
        let mut old: BTreeSet<u64> = match (self.queue.passed(), self.keep_last) {
            (Some(next), _) => releasable.iter().copied().filter(|s| *s < next).collect(),
            (None, Some(k)) => {
                let excess = (self.committed.len() as u64).saturating_sub(k.max(1)) as usize;
                let cut = self.committed.keys().nth(excess).copied().unwrap_or(u64::MAX);
                releasable.iter().copied().filter(|s| *s < cut).collect()
            }
            (None, None) => BTreeSet::new(),
        };
        if let Some(limit) = self.discarding() {
            let over = (self.queued() as usize).saturating_sub(old.len()).saturating_sub(limit as usize);
            // Never the newest: the step just committed is what readers are waiting for.
            let newest = self.committed.keys().next_back().copied();
            let more: Vec<u64> = releasable.iter().copied().filter(|s| !old.contains(s) && Some(*s) != newest).take(over).collect();
            old.extend(more);
        }
        let mut released: Vec<Arc<StepIndex>> = old.into_iter().filter_map(|step| self.take_committed(step)).collect();
        // Consumed steps the drain held, now on disk.
        if let Some(d) = self.drained {
            let later = self.held.split_off(&(d + 1));
            released.extend(std::mem::replace(&mut self.held, later).into_values());
        }
        released
    }

    /// Takes committed `step` out of reads and claims, remembered as released.
    fn take_committed(&mut self, step: u64) -> Option<Arc<StepIndex>> {
        let index = self.committed.remove(&step)?;
        self.committed_by.remove(&step);
        self.drain_asked.remove(&step);
        self.mark_released(step);
        self.claims.gone(step);
        Some(index)
    }

    /// The limit past which the oldest steps are released: a `DiscardOldest` queue's, or a
    /// `Block` queue's once its readers all left (see [`crate::queue`]).
    fn discarding(&self) -> Option<u64> {
        match self.queue.limit()? {
            (limit, crate::queue::Policy::DiscardOldest) => Some(limit),
            (limit, crate::queue::Policy::Block) => (self.queue.abandoned() && !self.claims.live(self.clock_ms)).then_some(limit),
        }
    }

    /// Committed steps not yet released, but those holding a constant's blocks (kept for good).
    fn queued(&self) -> u64 {
        self.committed.values().filter(|i| !i.blocks.iter().any(|b| i.vars.get(&b.var).is_some_and(|d| d.constant))).count() as u64
    }

    /// Whether `step` was committed and released (and not committed again since).
    fn was_released(&self, step: u64) -> bool {
        self.released.contains(&step) && !self.committed.contains_key(&step)
    }

    /// Whether `step` was discarded (a restart from an older step) and not committed again since.
    fn was_discarded(&self, step: u64) -> bool {
        self.discarded.contains(&step) && !self.committed.contains_key(&step)
    }

    /// The error for a step that is not committed: released, or not (yet) committed.
    fn missing(&self, dataset: &str, step: u64) -> Error {
        if self.was_released(step) {
            let kept = match self.committed.keys().next() {
                Some(oldest) => format!("the oldest kept step is {oldest}"),
                None => "no step is kept now".into(),
            };
            return Error::Released(format!("step {step} of '{dataset}' was committed and then released (keep_last or release); {kept}"));
        }
        if self.was_discarded(step) {
            return Error::Released(format!(
                "step {step} of '{dataset}' was discarded by a restart from an older step (from_step) and is not written \
                 again yet; read a step before it, or wait for the new one"
            ));
        }
        not_committed(dataset, step, &self.committed)
    }
}

fn take<T>(m: &mut BTreeMap<u64, BTreeMap<String, T>>, step: u64, session: &str) -> Option<T> {
    let by_session = m.get_mut(&step)?;
    let v = by_session.remove(session);
    if by_session.is_empty() {
        m.remove(&step);
    }
    v
}

/// A dataset's queue as the writers' wait for room sees it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct QueueState {
    /// Committed steps not yet released (but those holding a constant).
    pub queued: u64,
    /// The limit and policy, if set.
    pub limit: Option<(u64, crate::queue::Policy)>,
    /// A streaming reader's registration lapsed (a command drops it).
    pub lapsed: bool,
    /// The oldest steps past the limit are released at each commit (`discard_oldest`, or a
    /// `block` queue whose readers all left): a writer never waits.
    pub discarding: bool,
    /// The longest lease of a registered reader, in ms.
    pub longest_lease_ms: u64,
    /// Its readers all left but a claim lease was live at the last clock: a command with a
    /// newer clock may find it lapsed.
    pub held_by_claims: bool,
}

/// The replicated state: views, datasets' steps, keyed values.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct MetaState {
    view: Option<ClusterView>,
    datasets: BTreeMap<String, Dataset>,
    kv: BTreeMap<String, (u64, Vec<u8>)>,
    /// Outcomes of the newest compare-and-sets by call id, oldest first (retries are idempotent).
    #[serde(default)]
    cas_ops: std::collections::VecDeque<(String, Outcome)>,
    /// Commands applied (a replica's position; equal states have equal counts).
    applied: u64,
}

impl MetaState {
    /// Applies one command. Deterministic; a refused command changes nothing but the count.
    pub fn apply(&mut self, cmd: Cmd) -> Outcome {
        self.applied += 1;
        self.apply_one(cmd)
    }

    fn apply_one(&mut self, cmd: Cmd) -> Outcome {
        let r = match cmd {
            Cmd::AddFragment { dataset, fragment, shares } => self.add_fragment(&dataset, fragment, &shares),
            Cmd::Commit { dataset, step, session, keep_last, drain_every, now_ms } => {
                self.commit(&dataset, step, &session, (keep_last, drain_every), now_ms)
            }
            Cmd::SetQueue { dataset, limit, policy } => {
                let ds = self.datasets.entry(dataset).or_default();
                ds.queue.set(limit, policy);
                Ok(Outcome::Trimmed { released: ds.trim() })
            }
            Cmd::Stream { dataset, reader, next, lease_ms, now_ms } => {
                let ds = self.datasets.entry(dataset).or_default();
                ds.clock_ms = ds.clock_ms.max(now_ms);
                ds.queue.expire(now_ms);
                if let Some(r) = reader {
                    let oldest = ds.committed.keys().next().copied().unwrap_or(0);
                    // A reader passes at most what is committed (a reader's start may lie ahead).
                    let next = match ds.committed.keys().next_back() {
                        Some(newest) => next.map(|n| n.min(newest + 1)),
                        None => next,
                    };
                    ds.queue.mark(&r, next, lease_ms, now_ms, oldest);
                }
                Ok(Outcome::Trimmed { released: ds.trim() })
            }
            Cmd::Drained { dataset, step } => match self.datasets.get_mut(&dataset) {
                // Discarded while it was written (a restart from an older step): the drain
                // removes what it wrote, and the mark stays where the discard put it.
                Some(ds) if ds.was_discarded(step) => {
                    Err(Error::NotFound(format!("step {step} of '{dataset}' was discarded while it drained; its drained copy goes too")))
                }
                Some(ds) => {
                    ds.drained = ds.drained.max(Some(step));
                    Ok(Outcome::Drained { released: ds.trim() })
                }
                None => Err(no_dataset(&dataset)),
            },
            Cmd::AskDrain { dataset, step } => match self.datasets.get_mut(&dataset) {
                Some(ds) => ds.ask_drain(&dataset, step).map(|()| Outcome::Done),
                None => Err(no_dataset(&dataset)),
            },
            Cmd::Abort(Abort { dataset, step, session, reason }) => Ok(self.abort(&dataset, step, &session, reason)),
            Cmd::Release(Release { dataset, step }) => self.release(&dataset, step),
            Cmd::Remove { dataset, from: None } => self.remove(&dataset),
            Cmd::Remove { dataset, from: Some(from) } => self.truncate(&dataset, from),
            Cmd::Claim { lease: ClaimLease { dataset, claimer, lease_ms }, now_ms } => {
                let ds = self.datasets.entry(dataset).or_default();
                ds.clock_ms = ds.clock_ms.max(now_ms);
                let committed: Vec<u64> = ds.committed.keys().copied().collect();
                Ok(Outcome::Claimed(ds.claims.claim(&committed, &claimer, now_ms, lease_ms)))
            }
            Cmd::Renew { lease: ClaimLease { dataset, claimer, lease_ms }, now_ms } => Ok(Outcome::Held {
                steps: self.datasets.get_mut(&dataset).map(|d| d.claims.renew(&claimer, now_ms, lease_ms)).unwrap_or_default(),
            }),
            Cmd::Unclaim(Unclaim { dataset, claimer }) => {
                if let Some(d) = self.datasets.get_mut(&dataset) {
                    d.claims.unclaim(&claimer);
                }
                Ok(Outcome::Done)
            }
            Cmd::Close(Close { dataset, session, rank, nranks }) => {
                self.datasets.entry(dataset).or_default().claims.close(&session, rank, nranks);
                Ok(Outcome::Done)
            }
            Cmd::SetView(ViewChange { view }) => self.set_view(view),
            Cmd::Encoded { dataset, step, objects } => self.encoded(&dataset, step, objects),
            Cmd::Rebuilt { dataset, step, objects } => self.rebuilt(&dataset, step, objects),
            Cmd::Decoded { dataset, step, objects } => self.decoded(&dataset, step, objects),
            // Nested batches are refused (the batcher never makes them), so applying stays flat.
            Cmd::Batch { cmds } => Ok(Outcome::Batch {
                outcomes: cmds
                    .into_iter()
                    .map(|c| match c {
                        Cmd::Batch { .. } => Outcome::refused(Error::InvalidArgument("a batch inside a batch".into())),
                        c => self.apply_one(c),
                    })
                    .collect(),
            }),
            Cmd::KvCas { key, expect, value, op } => Ok(self.cas_once(key, expect, value, op)),
        };
        r.unwrap_or_else(Outcome::refused)
    }

    fn add_fragment(&mut self, dataset: &str, frag: Fragment, shares: &[Share]) -> Result<Outcome, Error> {
        frag.validate()?;
        let step = frag.step;
        let session = frag.session.clone();
        let ds = self.datasets.entry(dataset.to_string()).or_default();
        if ds.committed.contains_key(&step) {
            return Err(Error::AlreadyExists(format!("step {step} of '{dataset}' is already committed; write a new step number")));
        }
        if ds.aborted.get(&step).is_some_and(|a| a.contains(&session)) {
            return Err(Error::Conflict(format!(
                "step {step} of '{dataset}' (session '{session}') was aborted (a server holding its objects failed or did not \
                 have them all) and will never commit; write the data as a new step"
            )));
        }
        if ds.prepared.get(&step).is_some_and(|p| p.contains_key(&session)) {
            return Err(Error::StepInFlight(format!(
                "step {step} of '{dataset}' (session '{}') is already being committed; wait for its outcome",
                frag.session
            )));
        }
        let p = ds.pending.entry(step).or_default().entry(session.clone()).or_default();
        if let Some(other) = p.frags.values().next().filter(|o| o.nranks != frag.nranks) {
            return Err(Error::Conflict(format!(
                "writer {} ends step {step} of '{dataset}' for {} writers, but writer {} did for {}; all ranks must agree",
                frag.writer, frag.nranks, other.writer, other.nranks
            )));
        }
        if let Some(prev) = p.frags.get(&frag.writer).filter(|prev| !prev.same_content(&frag)) {
            return Err(Error::Conflict(format!(
                "rank {} of session '{}' already ended step {step} of '{dataset}' with other blocks ({} vs {}); two \
                 processes were started as the same rank: give each its own rank (or its own session)",
                frag.writer,
                frag.session,
                prev.blocks.len(),
                frag.blocks.len()
            )));
        }
        let want = frag.nranks;
        ds.claims.writing();
        p.shares.insert(frag.writer, shares.iter().map(|s| (s.server, (s.objects, s.bytes))).collect());
        p.frags.insert(frag.writer, frag);
        let have = p.frags.len() as u32;
        if have < want {
            return Ok(Outcome::Pending { have, want });
        }
        let p = ds.take_pending(step, &session).expect("present");
        let mut consume: Vec<String> = p.frags.values().flat_map(|f| f.consume.iter().cloned()).collect();
        consume.sort();
        consume.dedup();
        let mut total: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
        for per_writer in p.shares.values() {
            for (server, (n, b)) in per_writer {
                let t = total.entry(*server).or_default();
                t.0 = t.0.saturating_add(*n);
                t.1 = t.1.saturating_add(*b);
            }
        }
        // A merge that fails (overlapping blocks, disagreeing definitions) forgets the step's
        // fragments: the writers learn why and write the step again.
        let index = Arc::new(StepIndex::merge(step, p.frags.into_values().collect())?);
        self.check_consumable(dataset, step, &consume)?;
        let ds = self.datasets.get_mut(dataset).expect("present");
        let prepared =
            Prepared { dataset: dataset.to_string(), session: session.clone(), index: index.clone(), shares: total.clone(), consume };
        ds.prepared.entry(step).or_default().insert(session, prepared);
        Ok(Outcome::Prepared { index, shares: total })
    }

    /// `kept`: `keep_last` and the drain's cadence; `now_ms`: the leader's clock (registered
    /// readers that lapsed by then hold nothing).
    fn commit(&mut self, dataset: &str, step: u64, session: &str, kept: (Option<u64>, Option<u64>), now_ms: u64) -> Result<Outcome, Error> {
        let ds = self.datasets.get_mut(dataset).ok_or_else(|| no_dataset(dataset))?;
        // Two finishers of one step (the writer's coordinator and a new leader's sweep of
        // prepared steps) may both commit it: the second is told it is done.
        if ds.committed_by.get(&step).is_some_and(|s| s == session) {
            return Ok(Outcome::Committed { released: Vec::new(), consumed: Vec::new(), held: Vec::new() });
        }
        let consume = ds.prepared.get(&step).and_then(|p| p.get(session)).map(|p| p.consume.clone()).ok_or_else(|| {
            Error::Conflict(format!("step {step} of '{dataset}' (session '{session}') is not prepared; it cannot commit"))
        })?;
        // What it consumes may have gone since it was prepared (a claimer whose lease lapsed
        // races the one that took over): then neither happens, and the coordinator aborts it.
        self.check_consumable(dataset, step, &consume)?;
        let (mut consumed, mut held) = (Vec::new(), Vec::new());
        for src in &consume {
            let from = self.datasets.get_mut(src).ok_or_else(|| no_dataset(src))?;
            let owed = from.owed(step);
            let index = from.take_committed(step).ok_or_else(|| from.missing(src, step))?;
            if owed {
                from.held.insert(step, index);
                held.push(src.clone());
            } else {
                consumed.push((src.clone(), index));
            }
        }
        let ds = self.datasets.get_mut(dataset).expect("checked above");
        let p = ds.take_prepared(step, session).expect("checked above");
        ds.committed.insert(step, p.index);
        ds.committed_by.insert(step, session.to_string());
        // Written again after a discard: its new drained copy is no discarded step's.
        ds.discarded.remove(&step);
        // Other sessions' fragments of this step (a crashed run) can never complete now.
        ds.pending.remove(&step);
        ds.prepared.remove(&step);
        (ds.keep_last, ds.drain_every) = kept;
        ds.clock_ms = ds.clock_ms.max(now_ms);
        ds.queue.expire(now_ms);
        Ok(Outcome::Committed { released: ds.trim(), consumed, held })
    }

    /// Whether step `step` of every dataset in `consume` is committed, so a commit of `step` of
    /// `dataset` may release them with it.
    fn check_consumable(&self, dataset: &str, step: u64, consume: &[String]) -> Result<(), Error> {
        for src in consume {
            if src == dataset {
                return Err(Error::InvalidArgument(format!("step {step} of '{dataset}' cannot consume its own dataset")));
            }
            if !self.is_committed(src, step) {
                return Err(Error::Conflict(format!(
                    "step {step} of '{dataset}' consumes step {step} of '{src}', which is no longer committed (another \
                     claimer consumed it after this one's lease lapsed, or it was released); this step is not committed, \
                     drop its result"
                )));
            }
        }
        Ok(())
    }

    fn abort(&mut self, dataset: &str, step: u64, session: &str, reason: String) -> Outcome {
        let mut servers: Vec<u32> = Vec::new();
        if let Some(ds) = self.datasets.get_mut(dataset) {
            let mut found = false;
            if let Some(p) = ds.take_prepared(step, session) {
                servers.extend(p.shares.keys());
                found = true;
            }
            if let Some(p) = ds.take_pending(step, session) {
                servers.extend(p.shares.values().flat_map(|s| s.keys()));
                found = true;
            }
            if found {
                ds.aborted.entry(step).or_default().insert(session.to_string());
                if !reason.is_empty() {
                    ds.abort_reasons.entry(step).or_default().insert(session.to_string(), reason);
                }
                while ds.aborted.len() > ABORTED_KEPT {
                    if let Some((gone, _)) = ds.aborted.pop_first() {
                        ds.abort_reasons.remove(&gone);
                    }
                }
            }
        }
        servers.sort_unstable();
        servers.dedup();
        Outcome::Aborted { servers }
    }

    fn release(&mut self, dataset: &str, step: u64) -> Result<Outcome, Error> {
        let ds = self.datasets.get_mut(dataset).ok_or_else(|| no_dataset(dataset))?;
        let index = ds.take_committed(step).ok_or_else(|| ds.missing(dataset, step))?;
        Ok(Outcome::Released { index })
    }

    fn remove(&mut self, dataset: &str) -> Result<Outcome, Error> {
        let Some(ds) = self.datasets.get(dataset) else { return Ok(Outcome::Removed { released: Vec::new() }) };
        let begun = ds.pending.keys().chain(ds.prepared.keys()).min();
        if let Some(step) = begun {
            return Err(Error::Conflict(format!(
                "step {step} of '{dataset}' is begun and not ended (some writer ranks ended it, others not yet): end or \
                 abort it (or wait until its writers are done) before removing the dataset"
            )));
        }
        let ds = self.datasets.remove(dataset).expect("looked up above");
        Ok(Outcome::Removed { released: ds.committed.into_values().chain(ds.held.into_values()).collect() })
    }

    /// Discards the steps of `dataset` from `from` on (see [`Cmd::Remove`]); returns the
    /// indexes of the committed ones. Refused while a step is begun and not ended.
    fn truncate(&mut self, dataset: &str, from: u64) -> Result<Outcome, Error> {
        let Some(ds) = self.datasets.get_mut(dataset) else { return Ok(Outcome::Removed { released: Vec::new() }) };
        if let Some(step) = ds.pending.keys().chain(ds.prepared.keys()).min() {
            return Err(Error::Conflict(format!(
                "step {step} of '{dataset}' is begun and not ended (some writer ranks ended it, others not yet): end or \
                 abort it (or wait until its writers are done, or their crash is noticed) before discarding steps from {from}"
            )));
        }
        let released: Vec<Arc<StepIndex>> = ds.committed.split_off(&from).into_values().collect();
        let held: Vec<Arc<StepIndex>> = ds.held.split_off(&from).into_values().collect();
        ds.drain_asked.retain(|s| *s < from);
        let forgotten = ds.released.split_off(&from);
        ds.discarded.extend(released.iter().map(|i| i.step).chain(forgotten));
        while ds.discarded.len() > RELEASED_KEPT {
            ds.discarded.pop_first();
        }
        ds.committed_by.split_off(&from);
        ds.aborted.split_off(&from);
        ds.abort_reasons.split_off(&from);
        for index in &released {
            ds.claims.gone(index.step);
        }
        // Every step before `from` the mark covered stays drained.
        ds.drained = ds.drained.and_then(|d| from.checked_sub(1).map(|before| d.min(before)));
        Ok(Outcome::Removed { released: released.into_iter().chain(held).collect() })
    }

    fn encoded(&mut self, dataset: &str, step: u64, objects: Vec<(u64, Redundancy)>) -> Result<Outcome, Error> {
        let ds = self.datasets.get_mut(dataset).ok_or_else(|| no_dataset(dataset))?;
        // A consumed step held for the drain is read by the drain: its index follows its objects.
        let index = match ds.committed.get_mut(&step) {
            Some(index) => index,
            None => ds.held.get_mut(&step).ok_or_else(|| not_committed(dataset, step, &BTreeMap::new()))?,
        };
        let mut changed = 0;
        let index = Arc::make_mut(index);
        for (id, red) in objects {
            let Redundancy::Encoded { shards, .. } = &red else {
                return Err(Error::InvalidArgument(format!("object {id:#x}: an encoding must record shards, got {red:?}")));
            };
            let first = *shards.first().ok_or_else(|| Error::InvalidArgument(format!("object {id:#x}: an encoding without shards")))?;
            for o in index.blocks.iter_mut().flat_map(|b| b.objects.iter_mut()) {
                if o.id == id && matches!(o.redundancy, Redundancy::Replicated { .. }) {
                    o.server = first;
                    o.redundancy = red.clone();
                    changed += 1;
                }
            }
        }
        Ok(Outcome::Encoded { changed })
    }

    fn decoded(&mut self, dataset: &str, step: u64, objects: Vec<(u64, Vec<u32>)>) -> Result<Outcome, Error> {
        let ds = self.datasets.get_mut(dataset).ok_or_else(|| no_dataset(dataset))?;
        // A consumed step held for the drain is read by the drain: its index follows its objects.
        let index = match ds.committed.get_mut(&step) {
            Some(index) => index,
            None => ds.held.get_mut(&step).ok_or_else(|| not_committed(dataset, step, &BTreeMap::new()))?,
        };
        let mut changed = 0;
        let index = Arc::make_mut(index);
        for (id, servers) in objects {
            let Some(first) = servers.first().copied() else {
                return Err(Error::InvalidArgument(format!("object {id:#x}: decoded into no copies")));
            };
            for o in index.blocks.iter_mut().flat_map(|b| b.objects.iter_mut()) {
                if o.id == id && matches!(o.redundancy, Redundancy::Encoded { .. }) {
                    o.server = first;
                    o.redundancy = Redundancy::Replicated { servers: servers.clone() };
                    changed += 1;
                }
            }
        }
        Ok(Outcome::Encoded { changed })
    }

    fn rebuilt(&mut self, dataset: &str, step: u64, objects: Vec<(u64, u32, u32)>) -> Result<Outcome, Error> {
        let ds = self.datasets.get_mut(dataset).ok_or_else(|| no_dataset(dataset))?;
        let index = ds.committed.get_mut(&step).ok_or_else(|| not_committed(dataset, step, &BTreeMap::new()))?;
        let mut changed = 0;
        let index = Arc::make_mut(index);
        for (id, from, to) in objects {
            for o in index.blocks.iter_mut().flat_map(|b| b.objects.iter_mut()) {
                let servers = o.servers();
                if o.id != id || !servers.contains(&from) || servers.contains(&to) {
                    continue;
                }
                let swap = |s: &mut u32| {
                    if *s == from {
                        *s = to;
                    }
                };
                swap(&mut o.server);
                match &mut o.redundancy {
                    Redundancy::Replicated { servers } => servers.iter_mut().for_each(swap),
                    Redundancy::Encoded { shards, .. } => shards.iter_mut().for_each(swap),
                    Redundancy::Single => {}
                }
                changed += 1;
            }
        }
        Ok(Outcome::Encoded { changed })
    }

    fn set_view(&mut self, view: ClusterView) -> Result<Outcome, Error> {
        view.validate()?;
        let now = self.view.as_ref().map_or(0, |v| v.epoch);
        if view.epoch != now + 1 {
            return Err(Error::Conflict(format!(
                "the cluster is at view {now}; a view of epoch {} is not the next one, change the current view",
                view.epoch
            )));
        }
        self.view = Some(view);
        Ok(Outcome::ViewSet)
    }

    fn cas_once(&mut self, key: String, expect: Option<u64>, value: Option<Vec<u8>>, op: Option<String>) -> Outcome {
        let Some(op) = op else { return self.cas(key, expect, value) };
        if let Some((_, o)) = self.cas_ops.iter().find(|(id, _)| *id == op) {
            return o.clone();
        }
        let o = self.cas(key, expect, value);
        self.cas_ops.push_back((op, o.clone()));
        if self.cas_ops.len() > CAS_OPS_KEPT {
            self.cas_ops.pop_front();
        }
        o
    }

    fn cas(&mut self, key: String, expect: Option<u64>, value: Option<Vec<u8>>) -> Outcome {
        let current = self.kv.get(&key).map(|(v, _)| *v);
        if current != expect {
            return Outcome::Cas { ok: false, version: current.unwrap_or(0) };
        }
        match value {
            Some(bytes) => {
                let version = current.unwrap_or(0) + 1;
                self.kv.insert(key, (version, bytes));
                Outcome::Cas { ok: true, version }
            }
            None => {
                self.kv.remove(&key);
                Outcome::Cas { ok: true, version: 0 }
            }
        }
    }

    /// Commands applied so far.
    pub fn applied(&self) -> u64 {
        self.applied
    }

    /// The current view, once one is set.
    pub fn view(&self) -> Option<&ClusterView> {
        self.view.as_ref()
    }

    /// Committed steps of a dataset (empty if unknown: a reader may come before the writers).
    pub fn steps(&self, dataset: &str) -> Vec<u64> {
        self.datasets.get(dataset).map(|d| d.committed.keys().copied().collect()).unwrap_or_default()
    }

    /// Streaming reader `reader`'s mark on `dataset`: the first step it holds.
    pub fn reader_mark(&self, dataset: &str, reader: &str) -> Option<u64> {
        self.datasets.get(dataset)?.queue.mark_of(reader)
    }

    /// `dataset`'s queue at `now_ms` (see [`QueueState`]).
    pub fn queue(&self, dataset: &str, now_ms: u64) -> QueueState {
        self.datasets.get(dataset).map_or_else(QueueState::default, |d| QueueState {
            queued: d.queued(),
            limit: d.queue.limit(),
            lapsed: d.queue.lapsed(now_ms),
            discarding: d.discarding().is_some(),
            longest_lease_ms: d.queue.longest_lease_ms(),
            held_by_claims: d.queue.abandoned() && d.claims.live(d.clock_ms),
        })
    }

    /// Steps of `dataset` some writer ranks ended that are not committed: each with the number of
    /// ranks of its most advanced session that ended it (all, once prepared and waiting for its
    /// seals) and the number it waits for.
    pub fn pending(&self, dataset: &str) -> Vec<(u64, u32, u32)> {
        let Some(ds) = self.datasets.get(dataset) else { return Vec::new() };
        let mut most: BTreeMap<u64, (u32, u32)> = BTreeMap::new();
        let ended = ds.pending.iter().flat_map(|(step, sessions)| {
            sessions.values().map(move |p| (*step, p.frags.len() as u32, p.frags.values().next().map_or(0, |f| f.nranks)))
        });
        let prepared =
            ds.prepared.iter().flat_map(|(step, sessions)| sessions.values().map(move |p| (*step, p.index.nranks, p.index.nranks)));
        for (step, n, of) in ended.chain(prepared) {
            let e = most.entry(step).or_default();
            *e = (*e).max((n, of));
        }
        most.into_iter().filter(|(s, _)| !ds.committed.contains_key(s)).map(|(s, (n, of))| (s, n, of)).collect()
    }

    /// The committed index of a step.
    pub fn index(&self, dataset: &str, step: u64) -> Result<Arc<StepIndex>, Error> {
        let ds = self.datasets.get(dataset).ok_or_else(|| no_dataset(dataset))?;
        ds.committed.get(&step).cloned().ok_or_else(|| ds.missing(dataset, step))
    }

    /// What became of `step` of `dataset` as ended by writer session `session`: `committed`,
    /// `pending`, `aborted` with its reason, or `unknown`.
    pub fn outcome(&self, dataset: &str, step: u64, session: &str) -> (&'static str, Option<String>) {
        let Some(ds) = self.datasets.get(dataset) else { return ("unknown", None) };
        if ds.committed_by.get(&step).is_some_and(|s| s == session) || ds.was_released(step) {
            return ("committed", None);
        }
        if ds.aborted.get(&step).is_some_and(|s| s.contains(session)) {
            let why = ds.abort_reasons.get(&step).and_then(|r| r.get(session)).cloned();
            return ("aborted", Some(why.unwrap_or_else(|| "the step was aborted (no reason recorded)".into())));
        }
        if ds.pending.get(&step).is_some_and(|by| by.contains_key(session))
            || ds.prepared.get(&step).is_some_and(|by| by.contains_key(session))
        {
            return ("pending", None);
        }
        if let Some(other) = ds.committed_by.get(&step) {
            return ("aborted", Some(format!("step {step} was committed by another writer session ('{other}')")));
        }
        ("unknown", None)
    }

    /// The newest step of `dataset` drained to disk.
    pub fn drained(&self, dataset: &str) -> Option<u64> {
        self.datasets.get(dataset)?.drained
    }

    /// The committed steps of `dataset` the drain owes at cadence `every` (past the newest
    /// drained one), oldest first, with their indexes.
    pub fn owed(&self, dataset: &str, every: u64) -> Vec<(u64, Arc<StepIndex>)> {
        let Some(ds) = self.datasets.get(dataset) else { return Vec::new() };
        let after = ds.drained.map_or(0, |d| d + 1);
        let mut owed: BTreeMap<u64, Arc<StepIndex>> =
            ds.committed.range(after..).filter(|(s, _)| ds.names(**s, every)).map(|(s, i)| (*s, i.clone())).collect();
        owed.extend(ds.held.range(after..).map(|(s, i)| (*s, i.clone())));
        owed.into_iter().collect()
    }

    /// Per dataset, the steps discarded by a restart from an older step and not written again
    /// since: a new leader removes drained copies of them that a killed one left.
    pub fn discarded(&self) -> Vec<(String, Vec<u64>)> {
        self.datasets
            .iter()
            .map(|(n, d)| (n.clone(), d.discarded.iter().copied().filter(|s| d.was_discarded(*s)).collect::<Vec<_>>()))
            .filter(|(_, steps)| !steps.is_empty())
            .collect()
    }

    /// The `NotFound` error of `step` of `dataset` if it was committed and released.
    pub fn released(&self, dataset: &str, step: u64) -> Option<Error> {
        let ds = self.datasets.get(dataset)?;
        ds.was_released(step).then(|| ds.missing(dataset, step))
    }

    /// Whether `step` of `dataset` is committed.
    pub fn is_committed(&self, dataset: &str, step: u64) -> bool {
        self.datasets.get(dataset).is_some_and(|d| d.committed.contains_key(&step))
    }

    /// Whether a writer session closed `dataset` with all its ranks and none wrote since.
    pub fn finished(&self, dataset: &str) -> bool {
        self.datasets.get(dataset).is_some_and(|d| d.claims.finished())
    }

    /// The lowest committed step of `dataset` that `claimer` could claim at `now_ms`.
    pub fn claimable(&self, dataset: &str, claimer: &str, now_ms: u64) -> Option<u64> {
        let ds = self.datasets.get(dataset)?;
        ds.claims.free(ds.committed.keys().copied(), claimer, now_ms)
    }

    /// Names of the datasets with committed steps (or consumed ones held for the drain).
    pub fn datasets(&self) -> Vec<String> {
        self.datasets.iter().filter(|(_, d)| !d.committed.is_empty() || !d.held.is_empty()).map(|(n, _)| n.clone()).collect()
    }

    /// Steps prepared but neither committed nor aborted: what a new coordinator must finish.
    pub fn in_flight(&self) -> Vec<Prepared> {
        self.datasets.values().flat_map(|d| d.prepared.values().flat_map(|s| s.values().cloned())).collect()
    }

    /// A keyed value and its version.
    pub fn kv(&self, key: &str) -> Option<(u64, &[u8])> {
        self.kv.get(key).map(|(v, b)| (*v, b.as_slice()))
    }
}

fn no_dataset(dataset: &str) -> Error {
    Error::NotFound(format!("dataset '{dataset}' has no committed step in this cluster"))
}

fn not_committed(dataset: &str, step: u64, committed: &BTreeMap<u64, Arc<StepIndex>>) -> Error {
    let have = match (committed.keys().next(), committed.keys().next_back()) {
        (Some(a), Some(b)) => format!("committed: {} steps, {a} to {b}", committed.len()),
        _ => "no step is committed".into(),
    };
    Error::NotFound(format!("step {step} of '{dataset}' is not committed ({have}); wait for the writers or pick a kept step"))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use cairn_core::index::{BlockRecord, ObjectRef, VarDef};
    use cairn_core::{DType, Region};

    /// Writer `w` of `n`'s fragment of `step` in `session`: one row of a (n, 4) f64 array, in one
    /// object on server `w % 3`.
    pub(crate) fn frag(step: u64, w: u32, n: u32, session: &str) -> (Fragment, Vec<Share>) {
        let region = Region::new(vec![u64::from(w), 0], vec![1, 4]).unwrap();
        let obj = ObjectRef { id: u64::from(w) << 32, region: region.clone(), server: w % 3, checksum: 7, redundancy: Default::default() };
        let block = BlockRecord {
            var: "p".into(),
            writer: w,
            region,
            file: String::new(),
            pos: 0,
            len: 32,
            chunk: 0,
            crcs: Vec::new(),
            checksum: 7,
            stats: Default::default(),
            objects: vec![obj],
            codec: None,
            stored: 0,
        };
        let def = VarDef::new("p", DType::F64, Some(vec![u64::from(n), 4])).unwrap();
        let f = Fragment::new(step, w, n, session.into(), vec![def], vec![block]);
        (f, vec![Share { server: w % 3, objects: 1, bytes: 32 }])
    }

    fn add(s: &mut MetaState, step: u64, w: u32, n: u32, session: &str) -> Outcome {
        let (fragment, shares) = frag(step, w, n, session);
        s.apply(Cmd::AddFragment { dataset: "d".into(), fragment, shares })
    }

    fn commit(s: &mut MetaState, step: u64, session: &str, keep_last: Option<u64>) -> Outcome {
        s.apply(Cmd::Commit { dataset: "d".into(), step, session: session.into(), keep_last, drain_every: None, now_ms: 0 })
    }

    #[test]
    fn a_step_is_invisible_until_its_commit_and_then_visible_at_once() {
        let mut s = MetaState::default();
        assert_eq!(add(&mut s, 0, 1, 3, "a"), Outcome::Pending { have: 1, want: 3 });
        assert_eq!(add(&mut s, 0, 0, 3, "a"), Outcome::Pending { have: 2, want: 3 });
        let Outcome::Prepared { index, shares } = add(&mut s, 0, 2, 3, "a") else { panic!("prepared") };
        assert_eq!(index.blocks.len(), 3);
        assert_eq!(shares, BTreeMap::from([(0, (1, 32)), (1, (1, 32)), (2, (1, 32))]));
        assert!(s.steps("d").is_empty() && !s.is_committed("d", 0), "prepared is not visible");
        assert_eq!(s.in_flight().len(), 1, "a new coordinator would find it");
        assert!(matches!(commit(&mut s, 0, "a", None), Outcome::Committed { ref released, .. } if released.is_empty()));
        assert_eq!(s.steps("d"), vec![0]);
        assert_eq!(s.index("d", 0).unwrap().blocks.len(), 3);
        assert!(s.in_flight().is_empty());
        assert_eq!(add(&mut s, 0, 0, 3, "b").into_result().unwrap_err().kind(), ErrorKind::AlreadyExists);
        assert_eq!(
            commit(&mut s, 0, "a", None),
            Outcome::Committed { released: vec![], consumed: vec![], held: vec![] },
            "a second finisher is told it is done"
        );
        assert_eq!(commit(&mut s, 0, "b", None).into_result().unwrap_err().kind(), ErrorKind::Conflict, "another session cannot");
    }

    fn step(s: &mut MetaState, step: u64, session: &str, keep_last: Option<u64>) {
        add(s, step, 0, 1, session);
        commit(s, step, session, keep_last);
    }

    #[test]
    fn discarding_from_a_step_forgets_it_everywhere_and_a_new_session_writes_it_again() {
        let mut s = MetaState::default();
        for n in 0..6 {
            step(&mut s, n, "a", Some(4));
        }
        s.apply(Cmd::Drained { dataset: "d".into(), step: 5 });
        assert_eq!(s.steps("d"), vec![2, 3, 4, 5], "keep_last released 0 and 1");
        let Outcome::Removed { released } = s.apply(Cmd::Remove { dataset: "d".into(), from: Some(1) }) else { panic!("removed") };
        assert_eq!(released.iter().map(|i| i.step).collect::<Vec<_>>(), vec![2, 3, 4, 5]);
        assert!(s.steps("d").is_empty());
        assert_eq!(s.drained("d"), Some(0), "the mark moves back before the discarded steps");
        assert_eq!(s.index("d", 3).unwrap_err().reason(), Some(cairn_core::Reason::Released), "a reader is told");
        assert!(s.index("d", 3).unwrap_err().to_string().contains("discarded"));
        assert_eq!(s.index("d", 1).unwrap_err().reason(), Some(cairn_core::Reason::Released), "released before, discarded now");
        assert_eq!(s.index("d", 0).unwrap_err().reason(), Some(cairn_core::Reason::Released), "before `from`: still released");
        assert_eq!(s.outcome("d", 3, "b"), ("unknown", None), "no commit record is left to confuse a new writer");
        // A drain of a discarded step that finishes late is refused: its copy goes.
        assert_eq!(s.apply(Cmd::Drained { dataset: "d".into(), step: 4 }).into_result().unwrap_err().kind(), ErrorKind::NotFound);
        assert_eq!(s.discarded(), vec![("d".to_string(), vec![1, 2, 3, 4, 5])], "what a new leader sweeps from the drain");
        step(&mut s, 1, "b", None);
        assert_eq!(s.steps("d"), vec![1]);
        assert_eq!(s.outcome("d", 1, "b").0, "committed");
        s.apply(Cmd::Release(Release { dataset: "d".into(), step: 1 }));
        assert_eq!(s.discarded(), vec![("d".to_string(), vec![2, 3, 4, 5])], "written again, then released: no discarded step");
        assert!(!s.index("d", 1).unwrap_err().to_string().contains("discarded"));
        step(&mut s, 1, "c", None);
        let Outcome::Removed { released } = s.apply(Cmd::Remove { dataset: "d".into(), from: Some(0) }) else { panic!("removed") };
        assert_eq!(released.len(), 1);
        assert_eq!(s.drained("d"), None);
    }

    #[test]
    fn discarding_is_refused_while_a_step_is_begun_and_not_ended() {
        let mut s = MetaState::default();
        step(&mut s, 0, "a", None);
        add(&mut s, 1, 0, 2, "a");
        let e = s.apply(Cmd::Remove { dataset: "d".into(), from: Some(0) }).into_result().unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Conflict);
        assert!(e.to_string().contains("step 1 of 'd' is begun and not ended"), "{e}");
        assert_eq!(s.steps("d"), vec![0]);
    }

    #[test]
    fn pending_steps_count_the_ranks_that_ended_them_until_committed() {
        let mut s = MetaState::default();
        add(&mut s, 4, 0, 3, "old");
        add(&mut s, 4, 2, 3, "new");
        add(&mut s, 4, 1, 3, "new");
        add(&mut s, 6, 0, 2, "new");
        assert_eq!(s.pending("d"), vec![(4, 2, 3), (6, 1, 2)], "the most advanced session of each step");
        assert!(matches!(add(&mut s, 6, 1, 2, "new"), Outcome::Prepared { .. }));
        assert_eq!(s.pending("d"), vec![(4, 2, 3), (6, 2, 2)], "prepared: every rank ended it, the commit waits");
        commit(&mut s, 6, "new", None);
        assert_eq!(s.pending("d"), vec![(4, 2, 3)]);
        assert!(s.pending("other").is_empty());
    }

    #[test]
    fn an_aborted_step_never_commits_and_late_ends_of_it_are_refused() {
        let mut s = MetaState::default();
        add(&mut s, 5, 0, 2, "a");
        assert_eq!(s.outcome("d", 5, "a"), ("pending", None), "rank 1 has not ended it");
        assert_eq!(s.outcome("d", 5, "b"), ("unknown", None));
        assert!(matches!(add(&mut s, 5, 1, 2, "a"), Outcome::Prepared { .. }));
        let e = add(&mut s, 5, 1, 2, "a").into_result().unwrap_err();
        assert_eq!((e.kind(), e.reason()), (ErrorKind::Conflict, Some(cairn_core::Reason::StepInFlight)), "prepared: wait for it");
        assert_eq!(
            s.apply(Cmd::Abort(Abort { dataset: "d".into(), step: 5, session: "a".into(), reason: "a seal failed".into() })),
            Outcome::Aborted { servers: vec![0, 1] }
        );
        assert!(s.in_flight().is_empty() && s.steps("d").is_empty());
        assert_eq!(s.outcome("d", 5, "a"), ("aborted", Some("a seal failed".into())), "every rank learns why");
        assert_eq!(commit(&mut s, 5, "a", None).into_result().unwrap_err().kind(), ErrorKind::Conflict, "an aborted step never commits");
        // A writer cut off during the abort sends its end again: refused, not left pending.
        let e = add(&mut s, 5, 0, 2, "a").into_result().unwrap_err();
        assert!(e.kind() == ErrorKind::Conflict && e.to_string().contains("was aborted"), "{e}");
        assert!(s.datasets["d"].pending.is_empty());
        // A new session (a restarted run) may write the step.
        add(&mut s, 5, 0, 2, "b");
        assert!(matches!(add(&mut s, 5, 1, 2, "b"), Outcome::Prepared { .. }));
        assert!(matches!(commit(&mut s, 5, "b", None), Outcome::Committed { .. }));
        assert_eq!(
            s.apply(Cmd::Abort(Abort { dataset: "d".into(), step: 9, session: "x".into(), reason: String::new() })),
            Outcome::Aborted { servers: vec![] }
        );
    }

    #[test]
    fn duplicate_ranks_mismatched_counts_and_crashed_sessions() {
        let mut s = MetaState::default();
        add(&mut s, 1, 0, 2, "a");
        assert_eq!(add(&mut s, 1, 0, 2, "a"), Outcome::Pending { have: 1, want: 2 }, "a retry of the same part is accepted");
        let (mut other, shares) = frag(1, 0, 2, "a");
        other.blocks[0].checksum = 9;
        let e = s.apply(Cmd::AddFragment { dataset: "d".into(), fragment: other, shares }).into_result().unwrap_err();
        assert!(e.to_string().contains("rank 0 of session 'a'") && e.kind() == ErrorKind::Conflict, "{e}");
        assert_eq!(add(&mut s, 1, 1, 3, "a").into_result().unwrap_err().kind(), ErrorKind::Conflict, "ranks must agree on nranks");
        // A crashed run's fragment of step 1 (session "a") never mixes with its restart's ("b").
        add(&mut s, 1, 0, 2, "b");
        assert!(matches!(add(&mut s, 1, 1, 2, "b"), Outcome::Prepared { .. }));
        commit(&mut s, 1, "b", None);
        assert!(s.in_flight().is_empty());
        assert_eq!(s.datasets.get("d").unwrap().pending.len(), 0, "the crashed session's part is dropped at commit");
        let (bad, shares) = frag(2, 3, 2, "a");
        assert_eq!(
            s.apply(Cmd::AddFragment { dataset: "d".into(), fragment: bad, shares }).into_result().unwrap_err().kind(),
            ErrorKind::InvalidArgument
        );
    }

    #[test]
    fn keep_last_and_release_free_steps() {
        let mut s = MetaState::default();
        for step in 0..5 {
            add(&mut s, step, 0, 1, "a");
            let Outcome::Committed { released, .. } = commit(&mut s, step, "a", Some(2)) else { panic!() };
            assert_eq!(released.iter().map(|i| i.step).collect::<Vec<_>>(), if step >= 2 { vec![step - 2] } else { vec![] });
        }
        assert_eq!(s.steps("d"), vec![3, 4]);
        assert!(
            matches!(s.apply(Cmd::Release(Release { dataset: "d".into(), step: 3 })), Outcome::Released { ref index } if index.step == 3)
        );
        assert_eq!(s.apply(Cmd::Release(Release { dataset: "d".into(), step: 3 })).into_result().unwrap_err().kind(), ErrorKind::NotFound);
        assert_eq!(s.apply(Cmd::Release(Release { dataset: "x".into(), step: 0 })).into_result().unwrap_err().kind(), ErrorKind::NotFound);
        assert_eq!(s.datasets(), vec!["d".to_string()]);
    }

    fn stream(s: &mut MetaState, reader: &str, next: Option<u64>, lease_ms: u64, now_ms: u64) -> Vec<u64> {
        let cmd = Cmd::Stream { dataset: "d".into(), reader: Some(reader.into()), next, lease_ms, now_ms };
        let Outcome::Trimmed { released } = s.apply(cmd) else { panic!("trimmed") };
        released.iter().map(|i| i.step).collect()
    }

    #[test]
    fn streaming_readers_hold_steps_keep_last_would_release_until_every_one_passed_them() {
        let mut s = MetaState::default();
        assert!(stream(&mut s, "slow", Some(0), 10_000, 0).is_empty());
        assert!(stream(&mut s, "fast", Some(0), 10_000, 0).is_empty());
        for step in 0..4 {
            add(&mut s, step, 0, 1, "a");
            let Outcome::Committed { released, .. } = commit(&mut s, step, "a", Some(1)) else { panic!() };
            assert!(released.is_empty(), "step {step}: the readers have passed nothing");
        }
        assert!(stream(&mut s, "fast", Some(4), 10_000, 1).is_empty(), "the slow one still reads step 0");
        assert_eq!(stream(&mut s, "slow", Some(2), 10_000, 1), vec![0, 1]);
        assert_eq!(s.steps("d"), vec![2, 3]);
        // A reader that stops renewing is dropped when its lease lapses; then keep_last rules.
        add(&mut s, 4, 0, 1, "a");
        let c = Cmd::Commit { dataset: "d".into(), step: 4, session: "a".into(), keep_last: Some(1), drain_every: None, now_ms: 20_000 };
        let Outcome::Committed { released, .. } = s.apply(c) else { panic!() };
        assert_eq!(released.iter().map(|i| i.step).collect::<Vec<_>>(), vec![2, 3]);
    }

    #[test]
    fn a_discard_oldest_queue_keeps_its_limit_whatever_the_readers_and_never_an_undrained_step() {
        let mut s = MetaState::default();
        let q = Cmd::SetQueue { dataset: "d".into(), limit: 2, policy: crate::queue::Policy::DiscardOldest };
        assert_eq!(s.apply(q), Outcome::Trimmed { released: Vec::new() });
        stream(&mut s, "slow", Some(0), 10_000, 0);
        let mut gone = Vec::new();
        for step in 0..5 {
            add(&mut s, step, 0, 1, "a");
            let c = Cmd::Commit { dataset: "d".into(), step, session: "a".into(), keep_last: None, drain_every: Some(3), now_ms: 0 };
            let Outcome::Committed { released, .. } = s.apply(c) else { panic!() };
            gone.extend(released.iter().map(|i| i.step));
        }
        assert_eq!(gone, vec![1, 2], "0 and 3 are owed to the drain");
        assert_eq!(s.steps("d"), vec![0, 3, 4]);
        assert_eq!(s.datasets.get("d").unwrap().queued(), 3);
    }

    #[test]
    fn a_step_asked_off_the_cadence_is_owed_and_held_until_drained() {
        let mut s = MetaState::default();
        let commit = |s: &mut MetaState, step: u64| {
            add(s, step, 0, 1, "a");
            s.apply(Cmd::Commit { dataset: "d".into(), step, session: "a".into(), keep_last: Some(1), drain_every: Some(5), now_ms: 0 });
        };
        let owed = |s: &MetaState| s.owed("d", 5).iter().map(|(st, _)| *st).collect::<Vec<_>>();
        for step in 0..8 {
            commit(&mut s, step);
        }
        assert_eq!(owed(&s), vec![0, 5], "the cadence's steps");
        assert_eq!(s.apply(Cmd::AskDrain { dataset: "d".into(), step: 6 }).into_result().unwrap_err().kind(), ErrorKind::NotFound);
        s.apply(Cmd::AskDrain { dataset: "d".into(), step: 7 }).into_result().unwrap();
        assert_eq!(owed(&s), vec![0, 5, 7], "the asked step is owed too");
        commit(&mut s, 8);
        commit(&mut s, 9);
        assert_eq!(s.steps("d"), vec![0, 5, 7, 9], "keep_last holds the asked step until it is drained");
        s.apply(Cmd::Drained { dataset: "d".into(), step: 0 });
        s.apply(Cmd::Drained { dataset: "d".into(), step: 5 });
        let Outcome::Drained { released } = s.apply(Cmd::Drained { dataset: "d".into(), step: 7 }) else { panic!() };
        assert!(released.iter().any(|i| i.step == 7), "released once on disk");
        assert!(owed(&s).is_empty());
        // Older than the newest drained and off the cadence: not on disk, and said so.
        commit(&mut s, 10);
        s.apply(Cmd::Drained { dataset: "d".into(), step: 10 });
        assert_eq!(s.apply(Cmd::AskDrain { dataset: "d".into(), step: 9 }).into_result().unwrap_err().kind(), ErrorKind::NotFound);
        for step in [11, 12] {
            add(&mut s, step, 0, 1, "a");
            s.apply(Cmd::Commit { dataset: "d".into(), step, session: "a".into(), keep_last: None, drain_every: Some(5), now_ms: 0 });
        }
        s.apply(Cmd::AskDrain { dataset: "d".into(), step: 12 }).into_result().unwrap();
        s.apply(Cmd::Drained { dataset: "d".into(), step: 12 });
        assert_eq!(s.apply(Cmd::AskDrain { dataset: "d".into(), step: 11 }).into_result().unwrap_err().kind(), ErrorKind::Conflict);
    }

    #[test]
    fn keep_last_holds_back_the_steps_the_drain_owes_until_they_are_drained() {
        let mut s = MetaState::default();
        let steps = |r: &[Arc<StepIndex>]| r.iter().map(|i| i.step).collect::<Vec<_>>();
        for step in 0..5 {
            add(&mut s, step, 0, 1, "a");
            let c = Cmd::Commit { dataset: "d".into(), step, session: "a".into(), keep_last: Some(1), drain_every: Some(2), now_ms: 0 };
            let Outcome::Committed { released, .. } = s.apply(c) else { panic!() };
            // Odd steps are not drained at this cadence: released as keep_last says.
            assert!(steps(&released).iter().all(|r| r % 2 == 1), "step {step}: {:?}", steps(&released));
        }
        assert_eq!(s.steps("d"), vec![0, 2, 4], "the drain owes 0 and 2 (4 is the newest)");
        let first = |s: &MetaState| s.owed("d", 2).first().map(|(step, _)| *step);
        assert_eq!(first(&s), Some(0));
        let Outcome::Drained { released } = s.apply(Cmd::Drained { dataset: "d".into(), step: 0 }) else { panic!() };
        assert_eq!(steps(&released), vec![0]);
        assert_eq!((s.drained("d"), first(&s)), (Some(0), Some(2)));
        let Outcome::Drained { released } = s.apply(Cmd::Drained { dataset: "d".into(), step: 2 }) else { panic!() };
        assert_eq!((steps(&released), s.steps("d")), (vec![2], vec![4]));
        assert_eq!(s.owed("d", 2).iter().map(|(step, _)| *step).collect::<Vec<_>>(), vec![4]);
        assert_eq!(s.apply(Cmd::Drained { dataset: "x".into(), step: 0 }).into_result().unwrap_err().kind(), ErrorKind::NotFound);
    }

    /// `session`'s one-writer commit of `step` into dataset `dst`, consuming `step` of `src`.
    fn produce(s: &mut MetaState, dst: &str, step: u64, session: &str, src: &str) -> Result<Outcome, Error> {
        let (mut fragment, shares) = frag(step, 0, 1, session);
        fragment.consume = vec![src.into()];
        s.apply(Cmd::AddFragment { dataset: dst.into(), fragment, shares }).into_result()?;
        s.apply(Cmd::Commit { dataset: dst.into(), step, session: session.into(), keep_last: None, drain_every: None, now_ms: 0 })
            .into_result()
    }

    fn claim(s: &mut MetaState, claimer: &str, now_ms: u64) -> Claimed {
        let Outcome::Claimed(c) =
            s.apply(Cmd::Claim { lease: ClaimLease { dataset: "d".into(), claimer: claimer.into(), lease_ms: 100 }, now_ms })
        else {
            panic!("claimed")
        };
        c
    }

    #[test]
    fn a_consuming_commit_releases_its_source_step_with_it_or_neither_happens() {
        let mut s = MetaState::default();
        for step in 0..2 {
            add(&mut s, step, 0, 1, "w");
            commit(&mut s, step, "w", None);
        }
        assert_eq!(claim(&mut s, "a", 0).step, Some(0));
        assert_eq!(claim(&mut s, "b", 0).step, Some(1));
        let Outcome::Committed { consumed, .. } = produce(&mut s, "stats", 0, "a", "d").unwrap() else { panic!() };
        assert_eq!(consumed.iter().map(|(d, i)| (d.as_str(), i.step)).collect::<Vec<_>>(), vec![("d", 0)], "freed by the caller");
        assert_eq!((s.steps("d"), s.steps("stats")), (vec![1], vec![0]));
        // b's lease lapses; c takes step 1 over and commits first: b's late commit is refused
        // whole, at its end of step (prepare) or at its commit.
        assert_eq!(claim(&mut s, "c", 200).step, Some(1));
        let (mut late, shares) = frag(1, 0, 1, "b");
        late.consume = vec!["d".into()];
        assert!(matches!(s.apply(Cmd::AddFragment { dataset: "stats".into(), fragment: late, shares }), Outcome::Prepared { .. }));
        produce(&mut s, "stats2", 1, "c", "d").unwrap();
        let e = s
            .apply(Cmd::Commit { dataset: "stats".into(), step: 1, session: "b".into(), keep_last: None, drain_every: None, now_ms: 0 })
            .into_result()
            .unwrap_err();
        assert!(e.kind() == ErrorKind::Conflict && e.to_string().contains("no longer committed"), "{e}");
        assert_eq!(s.steps("stats"), vec![0], "refused: nothing changed");
        assert_eq!(produce(&mut s, "stats", 1, "x", "d").unwrap_err().kind(), ErrorKind::Conflict, "refused at prepare too");
        assert_eq!(produce(&mut s, "d", 7, "x", "d").unwrap_err().kind(), ErrorKind::InvalidArgument);
        // The writers close: a claimer with nothing left is done.
        s.apply(Cmd::Close(Close { dataset: "d".into(), session: "w".into(), rank: 0, nranks: 1 }));
        assert!(s.finished("d"));
        assert_eq!(claim(&mut s, "a", 300), Claimed { step: None, done: true });
    }

    #[test]
    fn a_consumed_step_the_drain_owes_is_held_for_it_and_freed_once_on_disk() {
        let mut s = MetaState::default();
        for step in 0..3 {
            add(&mut s, step, 0, 1, "w");
            s.apply(Cmd::Commit { dataset: "d".into(), step, session: "w".into(), keep_last: None, drain_every: Some(2), now_ms: 0 });
        }
        // Step 1 is off the cadence: consumed, it is freed at once. Step 2 is owed: held.
        let Outcome::Committed { consumed, held, .. } = produce(&mut s, "out", 1, "a", "d").unwrap() else { panic!() };
        assert_eq!((consumed.len(), held.len()), (1, 0));
        let Outcome::Committed { consumed, held, .. } = produce(&mut s, "out", 2, "a", "d").unwrap() else { panic!() };
        assert_eq!((consumed.len(), held), (0, vec!["d".to_string()]), "its objects are kept");
        assert_eq!(s.steps("d"), vec![0], "out of reads and claims");
        assert_eq!(s.owed("d", 2).iter().map(|(st, _)| *st).collect::<Vec<_>>(), vec![0, 2], "the drain still writes it");
        assert_eq!(claim(&mut s, "b", 0).step, Some(0));
        // Drained: step 0 stays committed (no keep_last), the held step 2 is freed now.
        let Outcome::Drained { released } = s.apply(Cmd::Drained { dataset: "d".into(), step: 2 }) else { panic!() };
        assert_eq!(released.iter().map(|i| i.step).collect::<Vec<_>>(), vec![2]);
        assert!(s.owed("d", 2).is_empty());
        // A held step goes with its dataset's removal too.
        add(&mut s, 4, 0, 1, "w");
        s.apply(Cmd::Commit { dataset: "d".into(), step: 4, session: "w".into(), keep_last: None, drain_every: Some(2), now_ms: 0 });
        produce(&mut s, "out", 4, "a", "d").unwrap();
        let Outcome::Removed { released } = s.apply(Cmd::Remove { dataset: "d".into(), from: Some(3) }) else { panic!() };
        assert_eq!(released.iter().map(|i| i.step).collect::<Vec<_>>(), vec![4]);
    }

    #[test]
    fn views_advance_one_epoch_at_a_time() {
        use cairn_proto::cluster::{ClusterFile, ServerEntry};
        let servers = (0..3)
            .map(|id| ServerEntry {
                spec: cairn_core::placement::ServerSpec { id, node: format!("n{id}"), rack: String::new(), spare: id == 2 },
                addr: format!("h:{id}"),
                unix: None,
                host: String::new(),
                pid: 0,
                memory: 1,
                metrics: None,
            })
            .collect();
        let v1 = ClusterView::initial(&ClusterFile { secret: String::new(), servers, redundancy: Default::default(), drain: None });
        let mut s = MetaState::default();
        assert_eq!(s.apply(Cmd::SetView(ViewChange { view: v1.clone() })), Outcome::ViewSet);
        assert_eq!(s.apply(Cmd::SetView(ViewChange { view: v1.clone() })).into_result().unwrap_err().kind(), ErrorKind::Conflict);
        let v2 = v1.replace(1, 2).unwrap();
        assert_eq!(s.apply(Cmd::SetView(ViewChange { view: v2.clone() })), Outcome::ViewSet);
        assert_eq!(s.view(), Some(&v2));
        let mut bad = v2.clone();
        bad.epoch = 3;
        bad.slots.push(0);
        assert_eq!(s.apply(Cmd::SetView(ViewChange { view: bad })).into_result().unwrap_err().kind(), ErrorKind::InvalidArgument);
    }

    #[test]
    fn compare_and_set_claims_once() {
        let mut s = MetaState::default();
        let cas = |s: &mut MetaState, expect, value: Option<&[u8]>| {
            s.apply(Cmd::KvCas { key: "claim/7".into(), expect, value: value.map(<[u8]>::to_vec), op: None })
        };
        assert_eq!(cas(&mut s, None, Some(b"w1")), Outcome::Cas { ok: true, version: 1 });
        assert_eq!(cas(&mut s, None, Some(b"w2")), Outcome::Cas { ok: false, version: 1 }, "the second claimer loses");
        assert_eq!(s.kv("claim/7"), Some((1, &b"w1"[..])));
        assert_eq!(cas(&mut s, Some(1), Some(b"w1+")), Outcome::Cas { ok: true, version: 2 });
        assert_eq!(cas(&mut s, Some(1), None), Outcome::Cas { ok: false, version: 2 });
        assert_eq!(cas(&mut s, Some(2), None), Outcome::Cas { ok: true, version: 0 });
        assert_eq!(s.kv("claim/7"), None);
        // A retried call (its reply was lost with the leader) gets its first outcome, not a
        // second decision that would tell the winner it lost.
        let once = |s: &mut MetaState, op: &str| {
            s.apply(Cmd::KvCas { key: "lease".into(), expect: None, value: Some(b"me".to_vec()), op: Some(op.into()) })
        };
        assert_eq!(once(&mut s, "call-1"), Outcome::Cas { ok: true, version: 1 });
        assert_eq!(once(&mut s, "call-1"), Outcome::Cas { ok: true, version: 1 }, "the retry");
        assert_eq!(once(&mut s, "call-2"), Outcome::Cas { ok: false, version: 1 }, "another call is decided");
    }

    proptest::proptest! {
        /// Replicas applying the same commands in the same order hold equal states, whatever the
        /// commands; a snapshot (JSON) restores the state exactly; no command sequence commits a
        /// step before every fragment of one session is in.
        #[test]
        fn replicas_agree_and_snapshots_restore(ops in proptest::collection::vec((0u8..6, 0u64..3, 0u32..3, 0u8..2), 0..60)) {
            let (mut a, mut b) = (MetaState::default(), MetaState::default());
            for (op, step, w, sess) in ops {
                let session = if sess == 0 { "a" } else { "b" };
                let cmd = match op {
                    0 | 1 => { let (fragment, shares) = frag(step, w, 3, session); Cmd::AddFragment { dataset: "d".into(), fragment, shares } }
                    2 => Cmd::Commit { dataset: "d".into(), step, session: session.into(), keep_last: Some(2), drain_every: Some(u64::from(w) + 1), now_ms: 0 },
                    5 => Cmd::Drained { dataset: "d".into(), step },
                    3 => Cmd::Abort(Abort { dataset: "d".into(), step, session: session.into(), reason: "r".into() }),
                    _ => Cmd::Release(Release { dataset: "d".into(), step }),
                };
                let (oa, ob) = (a.apply(cmd.clone()), b.apply(cmd));
                proptest::prop_assert_eq!(&oa, &ob);
                if let Outcome::Committed { .. } = oa {
                    proptest::prop_assert_eq!(a.index("d", step).unwrap().blocks.len(), 3);
                }
            }
            proptest::prop_assert_eq!(&a, &b);
            let snap: MetaState = serde_json::from_str(&serde_json::to_string(&a).unwrap()).unwrap();
            proptest::prop_assert_eq!(snap, a);
        }
    }
}
