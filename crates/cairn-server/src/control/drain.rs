//! The drain to disk (multi-level checkpoints): the leader drains every committed step its
//! cadence names, oldest first in each dataset, into `PATH/<dataset>/` as a `file`-engine step
//! (the file engine's layout and atomic commit), then records it in the log ([`Cmd::Drained`]),
//! which lets `keep_last` release it. The leader plans and commits; the servers write: each
//! block goes to the server holding most of its pieces, which gathers the rest from its peers
//! and writes its blocks into one data file of its own ([`crate::drainer`]), so a step costs one
//! file per server and the drain's bandwidth is every server's. A server lost mid-drain has its
//! part written by another from the copies or shards left; an object whose every holder was
//! declared down fails the step for good (`DataLoss`). A new leader continues from the log's
//! record: a step a killed leader half wrote is written again (its index was never committed, so
//! no reader saw it); one it committed but did not record is found on disk, known for this step
//! by its identity (the cluster's id and every object's crc32c, never its statistics) and
//! recorded. A step on disk that is not this
//! cluster's is refused (`ForeignDrain`), and each dataset's failure stays its own: the others'
//! drains go on while it waits for its retry.
//!
//! The cadence is `drain_every` steps, or (`auto`) the Young/Daly interval
//! `sqrt(2 × C × MTBF)` over the time between commits, with `C` the measured time to drain a step.

use super::corec::Corec;
use super::fanout::free;
use super::gate::Gate;
use super::meta::Meta;
use super::worker::{Next, Worker};
use crate::state::State;
use crate::sync::lock;
use cairn_core::index::{BlockRecord, StepIndex};
use cairn_core::{Error, ErrorKind, Result};
use cairn_file::drain::{commit, discard, on_disk, Drained, Part};
use cairn_file::layout::Layout;
use cairn_meta::log::query;
use cairn_meta::MetaLog;
use cairn_proto::cluster::DrainSpec;
use cairn_proto::message::PeerRequest;
use cairn_proto::message::{DrainStatus, Response};
use cairn_proto::ClusterView;
use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::watch;

/// How long after a failed drain (a full disk, a server gone) that dataset's drain tries again.
const RETRY: Duration = Duration::from_secs(1);

/// How long after finding another run's step in the way (which only an operator can clear).
const RETRY_FOREIGN: Duration = Duration::from_secs(10);

/// Weight of the newest measurement in the running means of drain cost and commit period.
const EWMA: f64 = 0.3;

/// The running mean `mean` with measurement `s` taken in.
fn ewma(mean: Option<f64>, s: f64) -> Option<f64> {
    Some(mean.map_or(s, |m| m * (1.0 - EWMA) + s * EWMA))
}

/// The leader's drain (see the module comment); idle on other servers and without a drain.
#[derive(Debug)]
pub struct Drain {
    state: Arc<State>,
    gate: Arc<Gate>,
    meta: Arc<Meta>,
    corec: Arc<Corec>,
    spec: Option<DrainSpec>,
    worker: Worker,
    progress: Mutex<Progress>,
    /// Bumped whenever a step is drained or the drain's error changes; waiters watch it.
    changes: watch::Sender<u64>,
    /// When the drained copies of discarded steps that a leader killed midway through a discard
    /// left are to be removed: at this server's first round as leader, and again a while after a
    /// sweep that failed (it never holds up the drain meanwhile). None: no sweep due.
    sweep_at: Mutex<Option<Instant>>,
}

#[derive(Debug, Default)]
struct Progress {
    /// Per dataset, why its last drain failed, the attempt that failed, and when it tries again.
    failures: std::collections::BTreeMap<String, Failure>,
    /// Attempts started.
    attempts: u64,
    bytes: u64,
    busy: Duration,
    /// Running mean of the seconds one step's drain takes.
    cost_s: Option<f64>,
    /// Running mean of the seconds between commits, and the last commit.
    period_s: Option<f64>,
    last_commit: Option<Instant>,
    /// The step being written now: a discard of it waits until the write is over.
    in_flight: Option<(String, u64)>,
}

/// Marks a step in flight for as long as it lives (also when the round is dropped midway).
struct InFlight<'a>(&'a Drain);

impl<'a> InFlight<'a> {
    fn mark(drain: &'a Drain, dataset: &str, step: u64) -> InFlight<'a> {
        lock(&drain.progress).in_flight = Some((dataset.to_string(), step));
        InFlight(drain)
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        lock(&self.0.progress).in_flight = None;
        self.0.changes.send_modify(|n| *n += 1);
    }
}

#[derive(Debug)]
struct Failure {
    error: Error,
    attempt: u64,
    /// None: never (a step with a lost object is never drained; `cairn rm` or a new leader
    /// forgets it).
    retry_at: Option<Instant>,
}

impl Progress {
    /// The newest failure (the one status shows), or the failure of `dataset` when one is named.
    fn failure(&self, dataset: Option<&str>) -> Option<&Failure> {
        match dataset {
            Some(d) => self.failures.get(d),
            None => self.failures.values().max_by_key(|f| f.attempt),
        }
    }
}

impl Drain {
    /// The drain of the server with `state` (none when `spec` is none).
    pub fn new(state: Arc<State>, gate: Arc<Gate>, meta: Arc<Meta>, corec: Arc<Corec>, spec: Option<DrainSpec>) -> Drain {
        Drain {
            state,
            gate,
            meta,
            corec,
            spec,
            worker: Worker::default(),
            progress: Mutex::default(),
            changes: watch::channel(0).0,
            sweep_at: Mutex::new(None),
        }
    }

    /// The cadence the leader passes with each commit, so `keep_last` holds the steps it names
    /// until they are drained; none without a drain.
    pub fn every(&self) -> Option<u64> {
        self.spec.as_ref().map(|s| s.every.unwrap_or_else(|| self.auto().0))
    }

    /// Whether the drain still owes committed `step` of `dataset` (its cadence names it and it is
    /// not on disk yet).
    pub fn owes(&self, log: &dyn MetaLog, dataset: &str, step: u64) -> bool {
        let Some(every) = self.every() else { return false };
        query(log, |s| s.owed(dataset, every).iter().any(|(owed, _)| *owed == step))
    }

    /// The automatic cadence and the interval it comes from (1 step until both the drain's
    /// cost and the time between commits were measured, or without an MTBF).
    fn auto(&self) -> (u64, Option<f64>) {
        let p = lock(&self.progress);
        let interval = self.interval(&p);
        match (interval, p.period_s) {
            (Some(i), Some(period)) if period > 0.0 => (((i / period).round() as u64).max(1), interval),
            _ => (1, interval),
        }
    }

    /// Young/Daly's checkpoint interval `sqrt(2 × C × MTBF)`, once the cost `C` was measured.
    fn interval(&self, p: &Progress) -> Option<f64> {
        Some((2.0 * p.cost_s? * self.spec.as_ref()?.mtbf_s?).sqrt())
    }

    /// A step of `dataset` committed: measures the time between commits and wakes the drain.
    pub fn committed(self: &Arc<Self>) {
        if self.spec.is_none() {
            return;
        }
        {
            let mut p = lock(&self.progress);
            let now = Instant::now();
            if let Some(last) = p.last_commit.replace(now) {
                p.period_s = ewma(p.period_s, now.duration_since(last).as_secs_f64());
            }
        }
        self.resume();
    }

    /// Starts the drain when this server starts to lead (once per term), first sweeping what a
    /// previous leader's discard left.
    pub fn lead(self: &Arc<Self>) {
        *lock(&self.sweep_at) = Some(Instant::now());
        self.resume();
    }

    /// Starts (or wakes) the drain: at each commit, and when this server starts to lead.
    pub fn resume(self: &Arc<Self>) {
        if self.spec.is_none() {
            return;
        }
        let me = self.clone();
        self.worker.run(self.state.shutdown.subscribe(), move || {
            let me = me.clone();
            async move { me.round().await }
        });
    }

    /// Drains the oldest step owed of the first dataset (in name order) whose drain is not
    /// waiting for a retry, if this server leads.
    async fn round(self: &Arc<Self>) -> Next {
        let (Some(spec), Ok(log)) = (&self.spec, &self.gate.leader()) else { return Next::Idle };
        let due = {
            let mut at = lock(&self.sweep_at);
            at.take_if(|t| *t <= Instant::now()).is_some()
        };
        if due {
            if let Err(e) = self.sweep(&spec.path, log).await {
                // Tried again later; the drain goes on meanwhile (a copy left in the way of a
                // rewrite shows as that dataset's `ForeignDrain` in status).
                tracing::warn!(server = self.state.id, "removing drained copies of discarded steps: {e}");
                *lock(&self.sweep_at) = Some(Instant::now() + RETRY_FOREIGN);
            }
        }
        let every = self.every().unwrap_or(1);
        let owed = query(log, |s| {
            s.datasets().into_iter().filter_map(|d| s.owed(&d, every).into_iter().next().map(|o| (d, o))).collect::<Vec<_>>()
        });
        let now = Instant::now();
        let (ready, waiting): (Vec<_>, Vec<_>) = {
            let p = lock(&self.progress);
            owed.into_iter().partition(|(d, _)| p.failures.get(d).is_none_or(|f| f.retry_at.is_some_and(|at| at <= now)))
        };
        let Some((dataset, (step, index))) = ready.into_iter().next() else {
            // A failed sweep is tried again in time, commits or not.
            let sweep = *lock(&self.sweep_at);
            let p = lock(&self.progress);
            let next = waiting.iter().filter_map(|(d, _)| p.failures.get(d).and_then(|f| f.retry_at)).chain(sweep).min();
            return next.map_or(Next::Idle, |at| Next::After(at.saturating_duration_since(now)));
        };
        let started = Instant::now();
        let _flight = InFlight::mark(self, &dataset, step);
        let attempt = {
            let mut p = lock(&self.progress);
            p.attempts += 1;
            p.attempts
        };
        let d = match self.write(&spec.path, &dataset, &index).await {
            Ok(d) => d,
            Err(e) => {
                tracing::warn!(server = self.state.id, "draining step {step} of {dataset} (attempt {attempt}): {e}");
                self.failed(&dataset, e, attempt);
                return Next::Again;
            }
        };
        crate::failpoint::hit("drain.before_record");
        match self.meta.drained(log, &dataset, step).await {
            Ok(released) => {
                self.state.stats.drain_steps.inc();
                let took = started.elapsed();
                {
                    let mut p = lock(&self.progress);
                    p.failures.remove(&dataset);
                    p.bytes += d.bytes;
                    p.busy += took;
                    if !d.found {
                        p.cost_s = ewma(p.cost_s, took.as_secs_f64());
                    }
                }
                for index in released {
                    self.corec.released(&dataset, index.step);
                    free(&self.state, &dataset, &index).await;
                }
                self.changes.send_modify(|n| *n += 1);
                Next::Again
            }
            // Removed or discarded meanwhile (`cairn rm`, a restart from an older step): the
            // step just written is no step of the dataset now.
            Err(e) if e.kind() == cairn_core::ErrorKind::NotFound => {
                if !d.found {
                    let _ = cairn_file::drain::remove_drained(&Layout::new(&spec.path, &dataset), step);
                }
                Next::Again
            }
            // Lost the lead: the next leader finds the step on disk and records it.
            Err(_) => Next::Idle,
        }
    }

    fn failed(&self, dataset: &str, error: Error, attempt: u64) {
        {
            // Another run's step and a planted folder wait on a person: the disk is not tried every
            // second meanwhile. A lost object never comes back.
            let retry = match error.reason() {
                _ if error.kind() == ErrorKind::DataLoss => None,
                Some(cairn_core::Reason::ForeignDrain | cairn_core::Reason::UnsafePath) => Some(RETRY_FOREIGN),
                _ => Some(RETRY),
            };
            let mut p = lock(&self.progress);
            p.failures.insert(dataset.to_string(), Failure { error, attempt, retry_at: retry.map(|r| Instant::now() + r) });
        }
        self.changes.send_modify(|n| *n += 1);
    }

    /// The drain's state as `cairn cluster status` shows it (the leader's; others answer
    /// not-leader).
    pub fn status(&self, log: &dyn MetaLog) -> DrainStatus {
        let Some(spec) = &self.spec else { return DrainStatus::default() };
        let every = self.every().unwrap_or(1);
        let (steps, pending_bytes) = query(log, |s| {
            let mut steps = std::collections::BTreeMap::new();
            let mut pending = 0u64;
            for d in s.datasets() {
                if let Some(done) = s.drained(&d) {
                    steps.insert(d.clone(), done);
                }
                pending += s.owed(&d, every).iter().flat_map(|(_, i)| i.blocks.iter().map(|b| b.len)).sum::<u64>();
            }
            (steps, pending)
        });
        let p = lock(&self.progress);
        let newest = p.failure(None);
        DrainStatus {
            path: Some(spec.path.display().to_string()),
            every,
            interval_s: if spec.every.is_none() { self.interval(&p) } else { None },
            steps,
            pending_bytes,
            mbps: if p.busy.is_zero() { 0.0 } else { p.bytes as f64 / 1e6 / p.busy.as_secs_f64() },
            error: newest.map(|f| f.error.to_string()),
            error_kind: newest.map(|f| f.error.kind()),
            error_reason: newest.and_then(|f| f.error.reason()),
            errors: p.failures.iter().map(|(d, f)| (d.clone(), f.error.to_string())).collect(),
            attempts: p.attempts,
            failed_attempt: newest.map_or(0, |f| f.attempt),
        }
    }

    /// Removes the drained copies of every step the log remembers as discarded (and not written
    /// again): a leader killed between a discard's command and its removal of the copies left
    /// them, where a staging reader falling back to disk would find them and a rewrite's drain
    /// would refuse them as another run's. Runs in the drain's own worker, so no drain of this
    /// server writes meanwhile.
    async fn sweep(&self, path: &Path, log: &dyn MetaLog) -> Result<()> {
        let discarded = query(log, |s| s.discarded());
        let cluster = cairn_proto::auth::cluster_id(&self.state.secret);
        let mut failed = None;
        for (dataset, steps) in discarded {
            let (layout, cluster) = (Layout::new(path, &dataset), cluster.clone());
            match blocking(move || cairn_file::drain::discard_steps(&layout, &steps, &cluster)).await {
                Ok(0) => {}
                Ok(gone) => tracing::info!(server = self.state.id, "removed {gone} drained copies of discarded steps of {dataset}"),
                // Each dataset's own: the others are swept all the same.
                Err(e) => failed = Some(Error::from_kind(e.kind(), format!("dataset {dataset}: {e}"))),
            }
        }
        failed.map_or(Ok(()), Err)
    }

    /// After steps of `dataset` from `from` on were discarded: waits (up to `timeout`) for a
    /// drain of one of them in flight, then removes their drained copies (newest first, so a
    /// crash midway leaves a prefix); returns how many went. Nothing without a drain.
    pub async fn discard(&self, dataset: &str, from: u64, timeout: Duration) -> Result<u64> {
        let Some(spec) = &self.spec else { return Ok(0) };
        let deadline = tokio::time::Instant::now() + timeout;
        let mut rx = self.changes.subscribe();
        loop {
            let busy = lock(&self.progress).in_flight.clone().filter(|(d, s)| d == dataset && *s >= from);
            let Some((_, step)) = busy else { break };
            if tokio::time::timeout_at(deadline, rx.changed()).await.is_err() {
                return Err(Error::Unavailable(format!(
                    "step {step} of '{dataset}' is still being drained after {timeout:?}; its steps from {from} were \
                     discarded in memory, but their drained copies are kept: run the same command again"
                )));
            }
        }
        lock(&self.progress).failures.remove(dataset);
        let layout = Layout::new(&spec.path, dataset);
        blocking(move || cairn_file::drain::discard_drained(&layout, from)).await
    }

    /// Asks the drain for `step` of `dataset` (default: its newest committed step), or with no
    /// dataset the newest committed step of every dataset, whatever the cadence, and wakes it;
    /// returns the step asked (of the one dataset).
    pub async fn ask(self: &Arc<Self>, dataset: Option<&str>, step: Option<u64>) -> Result<Option<u64>> {
        if self.spec.is_none() {
            return Ok(step);
        }
        let log = self.gate.leader()?;
        let asks: Vec<(String, u64)> = query(&log, |s| match dataset {
            Some(d) => step.or_else(|| s.steps(d).last().copied()).map(|st| (d.to_string(), st)).into_iter().collect(),
            None => s.datasets().into_iter().filter_map(|d| s.steps(&d).last().map(|st| (d.clone(), *st))).collect(),
        });
        for (d, st) in &asks {
            match self.meta.ask_drain(&log, d, *st).await {
                // A step released since (by its readers) is none to drain; the wait says so.
                Err(e) if dataset.is_none() && e.kind() == ErrorKind::NotFound => {}
                r => r?,
            }
        }
        self.resume();
        Ok(if dataset.is_some() { asks.first().map(|a| a.1) } else { step })
    }

    /// Waits until `step` of `dataset` (default: its newest committed step the cadence drains) is
    /// drained, the drain fails, or `timeout` passes.
    pub async fn wait(&self, dataset: Option<&str>, step: Option<u64>, timeout: Duration) -> Result<Response> {
        if self.spec.is_none() {
            return Err(Error::Config(
                "this cluster drains nothing to disk; start it with `cairn cluster start --drain PATH` (or [staging] drain = \"PATH\")"
                    .into(),
            ));
        }
        let deadline = tokio::time::Instant::now() + timeout;
        let mut rx = self.changes.subscribe();
        // An error is reported once an attempt started during this wait failed too: one left
        // from before (a disk given room since) may be cleared by the next retry.
        let began = lock(&self.progress).attempts;
        let mut commits = dataset.map(|d| self.meta.watch(d));
        loop {
            let log = &self.gate.leader()?;
            let every = self.every().unwrap_or(1);
            let (target, done) = match dataset {
                None => (None, true),
                Some(d) => query(log, |s| {
                    let target = step.or_else(|| s.steps(d).into_iter().filter(|st| st.is_multiple_of(every)).max());
                    (target, target.is_none_or(|t| s.drained(d).is_some_and(|x| x >= t)))
                }),
            };
            // A failure for good (a lost object) is reported however long ago it came.
            let failed =
                lock(&self.progress).failure(dataset).filter(|f| f.attempt > began || f.retry_at.is_none()).map(|f| f.error.duplicate());
            if done || failed.is_some() || tokio::time::Instant::now() >= deadline {
                // The status (a walk over every owed step's index) only for the answer.
                let mut drain = self.status(log);
                if let (Some(e), false) = (&failed, done) {
                    // The waiter raises its own dataset's failure.
                    (drain.error, drain.error_kind, drain.error_reason) = (Some(e.to_string()), Some(e.kind()), e.reason());
                }
                return Ok(Response::Drain { drain, step: target, drained: done, failed: failed.is_some() && !done });
            }
            let commit = async {
                match commits.as_mut() {
                    Some(c) => c.changed().await,
                    None => std::future::pending().await,
                }
            };
            // Re-checked at least every second: a new leader's drains do not ring here.
            let tick = deadline.min(tokio::time::Instant::now() + Duration::from_secs(1));
            tokio::select! {
                _ = rx.changed() => {}
                _ = commit => {}
                _ = tokio::time::sleep_until(tick) => {}
            }
        }
    }
}

/// Runs blocking file work off the runtime's threads.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f).await.unwrap_or_else(|e| Err(Error::Corrupt(format!("the drain's task failed: {e}"))))
}

/// The servers that write a step's blocks: each block to the live server holding most of its
/// pieces (so most of it is read from that server's own memory), ties to the one given fewer
/// bytes so far; a block with no live holder to `fallback` (whose gather then says it is lost).
fn assign(index: &StepIndex, blocks: &[usize], view: &ClusterView, skip: &BTreeSet<u32>, fallback: u32) -> BTreeMap<u32, Vec<usize>> {
    let mut load: BTreeMap<u32, u64> = BTreeMap::new();
    let mut plan: BTreeMap<u32, Vec<usize>> = BTreeMap::new();
    for &at in blocks {
        let b = &index.blocks[at];
        let mut held: BTreeMap<u32, usize> = BTreeMap::new();
        for s in b.objects.iter().flat_map(|o| o.servers()).filter(|s| view.is_live(*s) && !skip.contains(s)) {
            *held.entry(s).or_default() += 1;
        }
        let to = held.iter().max_by_key(|(s, n)| (**n, std::cmp::Reverse(load.get(s).copied().unwrap_or(0)))).map_or(fallback, |(s, _)| *s);
        *load.entry(to).or_default() += b.len;
        plan.entry(to).or_default().push(at);
    }
    plan
}

impl Drain {
    /// This server's part of a step the leader asked for ([`PeerRequest::DrainPart`]).
    pub async fn part(&self, dataset: &str, index: StepIndex) -> Result<Part> {
        let Some(spec) = &self.spec else {
            return Err(Error::Config(format!("server {} has no drain folder, unlike the leader that asked it to drain", self.state.id)));
        };
        crate::drainer::part(&self.state, &spec.path, dataset, index).await
    }

    /// Drains step `index` of `dataset` under `path`: taken as found if this cluster's step is on
    /// disk, else written in parts (each by the server holding most of its blocks' pieces, one
    /// data file per server) and committed here once every part is on disk. A part whose server
    /// fails is written by another live server from the remaining copies or shards; an object
    /// whose every holder was declared down fails the step with `DataLoss`.
    async fn write(&self, path: &Path, dataset: &str, index: &StepIndex) -> Result<Drained> {
        // Objects move under a drain (CoREC encodes write-cold ones and drops their copies,
        // recovery rebuilds pieces elsewhere): a holder without its piece sends the step's index
        // to be read again, as readers do, while it keeps changing (or 8 moves).
        let mut index = std::borrow::Cow::Borrowed(index);
        let mut moves = 0;
        loop {
            match self.write_parts(path, dataset, &index).await {
                Err(e) if e.kind() == ErrorKind::NotFound && moves < 8 => {
                    moves += 1;
                    let every = self.every().unwrap_or(1);
                    let step = index.step;
                    let fresh = query(&self.gate.leader()?, |s| s.owed(dataset, every).into_iter().find(|(s, _)| *s == step));
                    match fresh {
                        Some((_, i)) if i.blocks != index.blocks => index = std::borrow::Cow::Owned((*i).clone()),
                        Some(_) => tokio::time::sleep(Duration::from_millis(100)).await,
                        // Released, drained or removed meanwhile: the round sees which.
                        None => return Err(e),
                    }
                }
                r => return r,
            }
        }
    }

    /// One try of [`Self::write`] with step index `index`.
    async fn write_parts(&self, path: &Path, dataset: &str, index: &StepIndex) -> Result<Drained> {
        let layout = Layout::new(path, dataset);
        let cluster = cairn_proto::auth::cluster_id(&self.state.secret);
        let found = {
            let (l, i, c) = (layout.clone(), index.clone(), cluster.clone());
            blocking(move || on_disk(&l, &i, &c)).await?
        };
        if let Some(d) = found {
            return Ok(d);
        }
        let view = self.state.view()?;
        let me = self.state.id;
        let mut failed: BTreeSet<u32> = BTreeSet::new();
        let mut records: Vec<Option<BlockRecord>> = vec![None; index.blocks.len()];
        let all: Vec<usize> = (0..index.blocks.len()).collect();
        let mut plan = assign(index, &all, &view, &failed, me);
        let written = loop {
            if plan.is_empty() {
                break Ok(());
            }
            let mut calls = tokio::task::JoinSet::new();
            for (srv, blocks) in std::mem::take(&mut plan) {
                let part = StepIndex { blocks: blocks.iter().map(|&i| index.blocks[i].clone()).collect(), ..index.clone() };
                let (state, path, dataset) = (self.state.clone(), path.to_path_buf(), dataset.to_string());
                calls.spawn(async move {
                    let r = if srv == state.id {
                        crate::drainer::part(&state, &path, &dataset, part).await
                    } else {
                        remote(&state, srv, dataset, part).await
                    };
                    (srv, blocks, r)
                });
            }
            let mut lost = None;
            while let Some(done) = calls.join_next().await {
                let Ok((srv, blocks, r)) = done else { continue };
                match r {
                    Ok(p) => {
                        for (at, rec) in blocks.into_iter().zip(p.records) {
                            records[at] = Some(rec);
                        }
                    }
                    Err(e)
                        if e.kind() == ErrorKind::DataLoss
                            || e.kind() == ErrorKind::NotFound
                            || e.reason() == Some(cairn_core::Reason::UnsafePath) =>
                    {
                        lost.get_or_insert(e);
                    }
                    Err(e) => {
                        tracing::warn!(server = me, "server {srv}'s part of step {} of {dataset} failed: {e}", index.step);
                        failed.insert(srv);
                        // Its blocks go to other live servers, which gather them from the pieces left.
                        let next = assign(index, &blocks, &view, &failed, me);
                        if next.keys().any(|s| failed.contains(s)) {
                            lost.get_or_insert(e);
                        }
                        for (s, b) in next {
                            plan.entry(s).or_default().extend(b);
                        }
                    }
                }
            }
            if let Some(e) = lost {
                break Err(e);
            }
        };
        let done: Vec<BlockRecord> = records.iter().flatten().cloned().collect();
        let written = written.and_then(|()| {
            (done.len() == records.len()).then_some(()).ok_or_else(|| Error::Unavailable("a part of the step was not written".into()))
        });
        if let Err(e) = written {
            let l = layout.clone();
            let _ = blocking(move || {
                discard(&l, &done);
                Ok(())
            })
            .await;
            return Err(e);
        }
        let (index, state) = (index.clone(), self.state.clone());
        blocking(move || commit(&layout, &index, done, crate::drainer::options(&state, &cluster))).await
    }
}

/// Server `srv`'s part of a step, asked over the peer protocol within a deadline that grows
/// with the part's bytes (written at no less than 4 MB/s).
async fn remote(state: &State, srv: u32, dataset: String, index: StepIndex) -> Result<Part> {
    let bytes: u64 = index.blocks.iter().map(|b| b.len).sum();
    let limit = state.limits.peer_timeout.max(Duration::from_secs(30)) + Duration::from_secs_f64(bytes as f64 / 4e6);
    match crate::peer::call_within(state, srv, &PeerRequest::DrainPart { dataset, index }, &[], limit).await? {
        Response::Part { records, bytes, stored } => Ok(Part { records, bytes, stored }),
        other => Err(cairn_proto::message::refused("drain_part", other)),
    }
}
