//! Step commits on the dataset's coordinator (the control plane's leader): collect fragments,
//! have every server holding objects of the step verify and seal them, then make the step
//! visible at once; abort, release, and the sweeps and frees that follow.

use super::corec::Corec;
use super::drain::Drain;
use super::fanout::{free, on_all, on_each};
use super::gate::Gate;
use super::meta::{Meta, Ready};
use super::recovery::Recovery;
use super::worker::{Next, Worker};
use crate::state::State;
use crate::sync::lock;
use cairn_core::index::{Fragment, Redundancy, StepIndex};
use cairn_core::{Error, ErrorKind, Result};
use cairn_proto::message::{PeerRequest, Request, Response, Share};
use cairn_proto::ClusterView;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// How long a release of a step the drain still owes waits for it before it is refused.
const RELEASE_WAITS_FOR_DRAIN: std::time::Duration = std::time::Duration::from_secs(5);

/// The leader's services told of every commit and release: the CoREC encoder (what turned
/// cold), recovery (what a lost server held) and the drain to disk (what to write out).
#[derive(Debug)]
pub struct Told {
    /// The CoREC encoder.
    pub corec: Arc<Corec>,
    /// Recovery onto spares.
    pub recovery: Arc<Recovery>,
    /// The drain to disk.
    pub drain: Arc<Drain>,
}

/// The coordinator of step commits.
#[derive(Debug)]
pub struct Commits {
    state: Arc<State>,
    gate: Arc<Gate>,
    meta: Arc<Meta>,
    told: Told,
    /// Drops of what other sessions left of committed steps, and the worker sending them.
    sweeps: Mutex<VecDeque<Sweep>>,
    sweeper: Worker,
}

/// After a commit: the servers that took no part in it, to drop what other sessions (and the
/// committing session's unsealed leftovers) left of the step.
#[derive(Debug)]
struct Sweep {
    dataset: String,
    step: u64,
    session: String,
    servers: Vec<u32>,
}

/// With servers `failed` gone at commit time, whether every object of the step still has its
/// level's worth elsewhere: readable, and surviving `level - 1` more failures (copies: at least
/// `max(1, level)` left; shards: at least `k + level - 1`). Else an error naming what is missing.
fn enough_left(index: &StepIndex, failed: &BTreeSet<u32>) -> Result<()> {
    let mut short = Vec::new();
    for b in &index.blocks {
        let level = index.vars.get(&b.var).map_or(0, |d| d.redundancy);
        for o in &b.objects {
            let left = o.servers().iter().filter(|s| !failed.contains(s)).count() as u32;
            let need = match &o.redundancy {
                Redundancy::Encoded { k, .. } => k + level.saturating_sub(1),
                _ => level.max(1),
            };
            if left < need {
                short.push(format!("object {:#x} of '{}' (writer {}) on servers {:?}", o.id, b.var, b.writer, o.servers()));
            }
        }
    }
    if short.is_empty() {
        return Ok(());
    }
    let more = if short.len() > 5 { format!(" and {} more", short.len() - 5) } else { String::new() };
    short.truncate(5);
    let failed: Vec<String> = failed.iter().map(|s| format!("server {s}")).collect();
    Err(Error::Unavailable(format!(
        "step {} cannot commit: {} failed while it was being sealed, and these objects kept less than their level's \
         worth elsewhere: {}{more}; write the step again (placement avoids failed servers once they are replaced), \
         or raise the variables' redundancy",
        index.step,
        failed.join(", "),
        short.join("; ")
    )))
}

/// The (object id, shard) keys the index places on each server: what its seal expects.
fn keys_by_server(index: &StepIndex) -> BTreeMap<u32, Vec<(u64, u32)>> {
    let mut out: BTreeMap<u32, Vec<(u64, u32)>> = BTreeMap::new();
    for o in index.blocks.iter().flat_map(|b| &b.objects) {
        match &o.redundancy {
            Redundancy::Encoded { shards, .. } => {
                for (i, s) in shards.iter().enumerate() {
                    out.entry(*s).or_default().push((o.id, i as u32 + 1));
                }
            }
            _ => o.holders().into_iter().for_each(|s| out.entry(s).or_default().push((o.id, 0))),
        }
    }
    out
}

impl Commits {
    /// The coordinator of the leader on `gate`.
    pub fn new(state: Arc<State>, gate: Arc<Gate>, meta: Arc<Meta>, told: Told) -> Commits {
        Commits { state, gate, meta, told, sweeps: Mutex::default(), sweeper: Worker::default() }
    }

    /// Records a writer's fragment; the last one commits the step. Only the control plane's leader
    /// takes fragments (others answer `not_leader`).
    pub async fn end_step(self: &Arc<Self>, dataset: &str, frag: Fragment, shares: Vec<Share>, keep_last: Option<u64>) -> Result<Response> {
        let log = &self.gate.leader()?;
        // Marked from before its fragment is proposed: the leader's sweep of prepared steps must not
        // take up a step this end of step is about to finish itself.
        let (step, session) = (frag.step, frag.session.clone());
        self.meta.start_finishing(dataset, step, &session);
        let r = async {
            let Some(ready) = self.meta.add_fragment(log, dataset, frag, shares).await? else {
                return Ok(Response::Committed { committed: false });
            };
            self.finish_once(dataset, &ready, keep_last).await?;
            Ok(Response::Committed { committed: true })
        }
        .await;
        self.meta.done_finishing(dataset, step, &session);
        r
    }

    /// The finalize of a prepared step: every server holding its objects verifies and seals them,
    /// then the `Commit` entry makes it visible; if a seal fails the step is aborted and its objects
    /// dropped. A new leader runs this for every step its predecessor left prepared (seals are
    /// idempotent), so the step ends committed everywhere or invisible everywhere.
    pub async fn finish(self: &Arc<Self>, dataset: &str, ready: &Ready, keep_last: Option<u64>) -> Result<()> {
        let (step, session) = (ready.index.step, ready.session.clone());
        self.meta.start_finishing(dataset, step, &session);
        let r = self.finish_once(dataset, ready, keep_last).await;
        self.meta.done_finishing(dataset, step, &session);
        r
    }

    async fn finish_once(self: &Arc<Self>, dataset: &str, ready: &Ready, keep_last: Option<u64>) -> Result<()> {
        let state = &self.state;
        let log = &self.gate.leader()?;
        let view = state.view()?;
        let (step, session) = (ready.index.step, ready.session.clone());
        let started = std::time::Instant::now();
        let keys = keys_by_server(&ready.index);
        let results = on_each(state, ready.shares.keys().copied(), |s| {
            let keys = keys.get(&s).cloned().unwrap_or_default();
            PeerRequest::Seal { dataset: dataset.into(), step, session: session.clone(), keys, bytes: ready.shares[&s].1 }.into()
        })
        .await;
        // Servers that could not be reached (dead or hung) are tolerated when every object still
        // has its level's worth of copies or shards elsewhere; any other refusal aborts the step.
        let failed: BTreeSet<u32> =
            results.iter().filter(|(_, r)| matches!(r, Err(e) if e.kind() == ErrorKind::Unavailable)).map(|(s, _)| *s).collect();
        let refused = results.into_iter().map(|(_, r)| r).find(|r| matches!(r, Err(e) if e.kind() != ErrorKind::Unavailable));
        let sealed = match refused {
            Some(e) => e,
            None if failed.is_empty() => Ok(()),
            None => enough_left(&ready.index, &failed),
        };
        if let Err(e) = sealed {
            // The seal failure is what the writer must hear (and every rank that ended the step).
            self.abort_and_drop(log, dataset, step, &session, &e.to_string()).await;
            return Err(e);
        }
        let seal = started.elapsed();
        let done = match self.meta.commit(log, dataset, step, &session, keep_last, self.told.drain.every()).await {
            // Refused (what it consumes is gone): it will never commit, so it is aborted like a step
            // whose seal failed.
            Err(e) if matches!(e.kind(), ErrorKind::Conflict | ErrorKind::InvalidArgument) => {
                self.abort_and_drop(log, dataset, step, &session, &e.to_string()).await;
                return Err(e);
            }
            r => r?,
        };
        self.meta.timed(&self.state, seal, started.elapsed() - seal);
        self.sweep(dataset, step, &session, &view, ready.shares.keys().copied().collect());
        self.told.recovery.committed(dataset, &ready.index);
        self.told.drain.committed();
        self.told.corec.committed(dataset, &ready.index, &done.released.iter().map(|i| i.step).collect::<Vec<_>>());
        for old in done.released {
            free(state, dataset, &old).await;
        }
        for (src, index) in done.consumed {
            self.told.corec.released(&src, index.step);
            free(state, &src, &index).await;
        }
        Ok(())
    }

    /// Aborts a prepared step and drops its objects; the objects stay if the abort did not take
    /// (another finisher committed the step, or this leader lost its place).
    async fn abort_and_drop(&self, log: &dyn cairn_meta::MetaLog, dataset: &str, step: u64, session: &str, reason: &str) {
        if let Ok(servers) = self.meta.abort(log, dataset, step, session, reason).await {
            let _ = on_all(&self.state, servers, |_| {
                Request::Drop {
                    dataset: dataset.into(),
                    step,
                    session: Some(session.to_string()),
                    writer: None,
                    ids: Vec::new(),
                    except: None,
                    shard: None,
                }
                .into()
            })
            .await;
        }
    }

    /// On becoming leader: finishes every step the previous leader left prepared.
    pub async fn finish_in_flight(self: &Arc<Self>) {
        let Ok(log) = &self.gate.leader() else { return };
        let prepared = cairn_meta::log::query(log, |s| s.in_flight());
        for p in prepared.into_iter().filter(|p| !self.meta.is_finishing(&p.dataset, p.index.step, &p.session)) {
            let ready = Ready { index: p.index, session: p.session, shares: p.shares };
            if let Err(e) = self.finish(&p.dataset, &ready, None).await {
                tracing::warn!(server = self.state.id, "finishing step {} of '{}' left prepared: {e}", ready.index.step, p.dataset);
            }
        }
    }

    /// After a commit, servers that took no part in it drop what other sessions left of the step
    /// (a crashed run's objects placed where the restart put none) and the committing session's
    /// unsealed leftovers (a put that timed out there and was placed again around it); participants
    /// did so when sealing. In the background (the sweeper): the commit does not wait, and a server
    /// that is down is skipped.
    fn sweep(self: &Arc<Self>, dataset: &str, step: u64, session: &str, view: &ClusterView, sealed: BTreeSet<u32>) {
        let servers: Vec<u32> = view.live().into_iter().filter(|s| !sealed.contains(s)).collect();
        if servers.is_empty() {
            return;
        }
        lock(&self.sweeps).push_back(Sweep { dataset: dataset.to_string(), step, session: session.to_string(), servers });
        let me = self.clone();
        self.sweeper.run(self.state.shutdown.subscribe(), move || {
            let me = me.clone();
            async move {
                let Some(Sweep { dataset, step, session, servers }) = lock(&me.sweeps).pop_front() else { return Next::Idle };
                let _ = on_all(&me.state, servers, |_| {
                    Request::Drop {
                        dataset: dataset.clone(),
                        step,
                        session: None,
                        writer: None,
                        ids: Vec::new(),
                        except: Some(session.clone()),
                        shard: None,
                    }
                    .into()
                })
                .await;
                Next::Again
            }
        });
    }

    /// A writer rank's abort of its session's step: the step aborts for every rank (those that
    /// ended it learn `reason` from [`outcome`]), and the objects of its fragments are dropped.
    /// A step no rank ended yet has nothing to abort here (the rank dropped its own objects).
    pub async fn abort_step(&self, dataset: &str, step: u64, session: &str, reason: &str) -> Result<Response> {
        let log = &self.gate.leader()?;
        if !self.meta.is_finishing(dataset, step, session) {
            self.abort_and_drop(log, dataset, step, session, reason).await;
        }
        Ok(Response::Ok)
    }

    /// Applies a queue command (the writers' limit, a streaming reader's mark) and frees the
    /// steps it released.
    pub async fn queue(&self, dataset: &str, cmd: cairn_meta::Cmd) -> Result<()> {
        let released = self.meta.queue(&self.gate.leader()?, dataset, cmd).await?;
        for index in released {
            self.told.corec.released(dataset, index.step);
            free(&self.state, dataset, &index).await;
        }
        Ok(())
    }

    /// Releases a committed step; one the drain to disk still owes once it is drained (waited
    /// for a few seconds, else refused: its only copy would go).
    pub async fn release(&self, dataset: &str, step: u64) -> Result<Response> {
        if self.told.drain.owes(&self.gate.leader()?, dataset, step) {
            self.told.drain.wait(Some(dataset), Some(step), RELEASE_WAITS_FOR_DRAIN).await?;
            if self.told.drain.owes(&self.gate.leader()?, dataset, step) {
                return Err(Error::Conflict(format!(
                    "step {step} of '{dataset}' is not on disk yet (the drain owes it, and its copy in memory is the only one); \
                     release it once wait_drained({step}) is true, or let keep_last release it after its drain"
                )));
            }
        }
        let index = self.meta.release(&self.gate.leader()?, dataset, step).await?;
        self.told.corec.released(dataset, step);
        free(&self.state, dataset, &index).await;
        Ok(Response::Ok)
    }

    /// Removes `dataset` whole (`cairn rm`, one control-plane command), or its steps from `from`
    /// on with their drained copies (waiting up to `timeout` for a drain of one in flight), and
    /// frees their objects.
    pub async fn remove(&self, dataset: &str, from: Option<u64>, timeout: Duration) -> Result<Response> {
        let released = self.meta.remove(&self.gate.leader()?, dataset, from).await?;
        for index in &released {
            self.told.corec.released(dataset, index.step);
            free(&self.state, dataset, index).await;
        }
        if let Some(from) = from {
            // An operator reading the logs sees why steps went (status shows only what is left).
            tracing::info!(server = self.state.id, "discarded steps of {dataset} from {from} on ({} committed)", released.len());
            crate::failpoint::hit("discard.before_copies");
            // The drain level too, so a restart never reads a discarded step back from disk (a
            // leader killed before this line leaves it to the next one: `Drain::sweep`).
            let drained = self.told.drain.discard(dataset, from, timeout).await?;
            return Ok(Response::Removed { steps: (released.len() as u64).max(drained) });
        }
        tracing::info!(server = self.state.id, "removed dataset {dataset} ({} committed steps)", released.len());
        Ok(Response::Removed { steps: released.len() as u64 })
    }
}
