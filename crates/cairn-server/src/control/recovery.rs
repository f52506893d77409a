//! Recovery onto spares (CoREC §3.4). When a view change gives a lost server's slot to another
//! server, the control plane's leader queues every committed object with a piece (a copy or a
//! shard) on the lost server and has it rebuilt on the new one, a batch of objects at a time:
//! the new holder gets one `rebuild` naming the pieces and the survivors holding what each
//! needs, asks each survivor for everything it needs from it in one `pieces` request, takes a
//! copy or decodes `k` shards, checks each object against its checksum and stores the piece. A
//! `rebuilt` log entry per step then makes the index name the new server. Until then reads are
//! degraded (another copy, or a decode), never wrong. Lazy recovery (the default) spreads the
//! batches over the recovery deadline, so client requests keep most of the servers' time;
//! aggressive recovery rebuilds everything at once, for comparison. Either way recovery moves at
//! most `recovery_rate` bytes per second.
//!
//! An erasure-coded object whose stripe no longer fits (a shard's server lost, no spare left,
//! every live server holding a shard already) is decoded into `m + 1` whole copies on the live
//! servers, which keeps its level, and then encoded again with the smaller `k` they allow
//! ([`Corec::reencode`]): RS(3 + 1) on 4 servers becomes RS(2 + 1) on the 3 left.
//!
//! Batches, because a chain of calls per object (leader → survivor, survivor → `k - 1` holders,
//! survivor → new holder) cost 1.4 ms of server CPU per 16 KiB object (996 objects rebuilt with
//! 1.38 s of CPU), most of it in sending, waking and switching for each small message.

use super::corec::Corec;
use super::gate::Gate;
use super::meta::Meta;
use super::worker::{Next, Worker};
use crate::state::{Limits, State};
use crate::sync::lock;
use cairn_core::index::{ObjectRef, Redundancy, StepIndex};
use cairn_core::{Error, Result};
use cairn_proto::message::{PeerRequest, RebuildPiece, Response, MAX_REBUILD};
use cairn_proto::ClusterView;
use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Objects in one batch at most.
const BATCH: usize = 64;

/// Bytes of objects in one batch at most (a bigger object goes alone).
const BATCH_BYTES: u64 = 16 << 20;

/// Lazy recovery runs a batch about this often, sized so that the queue ends by the deadline.
const PERIOD: Duration = Duration::from_millis(250);

/// Tries per object before it waits for the next rescan.
const TRIES: u32 = 3;

/// How long after a failed rebuild the leader looks again for what is short of its copies (a
/// target or source that failed meanwhile is replaced by a view change before long).
const RESCAN: Duration = Duration::from_secs(1);

/// The leader's recovery queue and counters, and the worker that rebuilds.
#[derive(Debug)]
pub struct Recovery {
    state: Arc<State>,
    gate: Arc<Gate>,
    meta: Arc<Meta>,
    /// Encodes decoded objects again, narrower.
    corec: Arc<Corec>,
    worker: Worker,
    queue: Mutex<VecDeque<Job>>,
    rebuilt: AtomicU64,
    /// Bytes moved since the recovery under way started (for the byte rate).
    sent: AtomicU64,
    /// Objects with no surviving piece (beyond their level), each counted once.
    lost: Mutex<BTreeSet<(String, u64, u64)>>,
    /// Rebuilds given up for now (a server failed during them), queued again by the next
    /// rescan.
    parked: Mutex<Vec<Job>>,
    /// Rebuilds under way.
    inflight: AtomicU64,
    /// When the recovery under way started (its deadline runs from then).
    since: Mutex<Option<tokio::time::Instant>>,
}

/// Committed objects by state (see [`Recovery::census`]).
#[derive(Debug, Clone, Default)]
pub struct Census {
    /// Objects of committed steps.
    pub committed: u64,
    /// Of those, objects with a piece on a server declared down.
    pub degraded: u64,
    /// Of those, objects no live server can take now.
    pub waiting: u64,
    /// Down servers an object not counted lost still names for a piece (as [`Recovery::still_named`]).
    pub named_down: BTreeSet<u32>,
}

/// One object piece to rebuild.
#[derive(Debug, Clone)]
struct Job {
    dataset: String,
    step: u64,
    id: u64,
    /// The lost server the index names.
    from: u32,
    /// The server to rebuild onto when the job was queued (`from` itself: a server back in
    /// its own slot, refilled); a server that failed since is followed to its heir.
    to: u32,
    tries: u32,
    /// Touched by a read: rebuilt without a pause.
    urgent: bool,
    /// A planned move (a retiring server's piece): without the lazy pauses, but yielding to
    /// clients while they are active.
    planned: bool,
    /// The whole object's bytes (what its rebuild moves, at most).
    bytes: u64,
    /// An erasure-coded object whose stripe no longer fits: decoded into copies, then encoded
    /// again narrower (one job per object, `from` its first lost server). The stripe's servers
    /// when queued (shard `i + 1` on the `i`th), whose shards go once the copies are recorded.
    narrow: Option<Vec<u32>>,
}

impl Job {
    fn key(&self) -> (&str, u64, u64, u32) {
        (&self.dataset, self.step, self.id, self.from)
    }
}

impl Recovery {
    /// The recovery of the leader on `gate`, reading the index through `meta`, encoding again
    /// through `corec`.
    pub fn new(state: Arc<State>, gate: Arc<Gate>, meta: Arc<Meta>, corec: Arc<Corec>) -> Recovery {
        Recovery {
            state,
            gate,
            meta,
            corec,
            worker: Worker::default(),
            queue: Mutex::default(),
            rebuilt: AtomicU64::new(0),
            sent: AtomicU64::new(0),
            lost: Mutex::default(),
            parked: Mutex::default(),
            inflight: AtomicU64::new(0),
            since: Mutex::default(),
        }
    }

    /// Objects waiting to be rebuilt (including rebuilds deferred to the next rescan).
    pub fn pending(&self) -> u64 {
        (lock(&self.queue).len() + lock(&self.parked).len()) as u64 + self.inflight.load(Ordering::Relaxed)
    }

    /// Seconds the recovery under way has run past `deadline`, 0 when on time or idle.
    pub fn overdue(&self, deadline: Duration) -> f64 {
        match *lock(&self.since) {
            Some(t) if self.pending() > 0 => t.elapsed().saturating_sub(deadline).as_secs_f64(),
            _ => 0.0,
        }
    }

    /// Objects rebuilt since this server started.
    pub fn rebuilt(&self) -> u64 {
        self.rebuilt.load(Ordering::Relaxed)
    }

    /// Objects that could not be rebuilt (no surviving piece: beyond their level).
    pub fn lost(&self) -> u64 {
        lock(&self.lost).len() as u64
    }

    /// After view change `before` → `after` committed at the leader: queues every committed
    /// piece on a lost server whose slot a live server now holds, and every object of a server
    /// back in its own slot (it came back empty, no spare having taken its place), and starts
    /// rebuilding. The whole index is scanned, not just the servers this change replaced: a
    /// rebuild that was under way onto a spare that failed too continues onto its heir.
    pub fn view_changed(self: &Arc<Self>, before: &ClusterView, after: &ClusterView) {
        let back: Vec<u32> = before.down.iter().copied().filter(|s| !after.down.contains(s) && after.slots.contains(s)).collect();
        self.rescan(after, &back);
    }

    /// On becoming leader: queues what lost servers still hold (a previous leader may have died
    /// with recovery under way).
    pub fn resume(self: &Arc<Self>) {
        let Ok(view) = self.state.view() else { return };
        self.rescan(&view, &[]);
    }

    /// After a commit at the leader: queues the pieces the step placed on servers lost before
    /// it committed (a seal that could not reach a server is tolerated within the level), which
    /// the scan of the view change did not see.
    pub fn committed(self: &Arc<Self>, dataset: &str, index: &StepIndex) {
        let Ok(view) = self.state.view() else { return };
        let jobs = self.short_in(&view, &[], dataset, index);
        self.add(jobs);
    }

    /// Whether a committed index entry (not counted lost) names server `id` for a piece. Pieces
    /// of a server whose slot a spare took stay named until rebuilt on the spare.
    pub fn still_named(&self, id: u32) -> bool {
        let Ok(log) = &self.gate.leader() else { return true };
        let lost = lock(&self.lost);
        self.meta.datasets(log).into_iter().any(|ds| {
            self.meta.steps(log, &ds).into_iter().any(|step| {
                self.meta.index(log, &ds, step).is_ok_and(|index| {
                    index
                        .blocks
                        .iter()
                        .flat_map(|b| &b.objects)
                        .any(|o| o.servers().contains(&id) && !lost.contains(&(ds.clone(), step, o.id)))
                })
            })
        })
    }

    /// Objects just read degraded go first, without a pause (lazy recovery rebuilds what is
    /// touched first).
    pub fn touch(&self, dataset: &str, step: u64, ids: &[u64]) {
        let mut q = lock(&self.queue);
        let (mut first, rest): (VecDeque<Job>, VecDeque<Job>) =
            q.drain(..).partition(|j| j.dataset == dataset && j.step == step && ids.contains(&j.id));
        if first.is_empty() {
            *q = rest;
            return;
        }
        first.iter_mut().for_each(|j| j.urgent = true);
        first.extend(rest);
        *q = first;
        drop(q);
        // Cuts a lazy pause short.
        self.worker.wake();
    }

    /// The committed objects, and of those the ones with a piece on a server `view` declares
    /// down and the ones no live server can take now (every live server holds a piece already):
    /// below their redundancy level until rebuilt; and the down servers still named. Zeros
    /// unless this server leads.
    pub fn census(&self, view: &ClusterView) -> Census {
        let mut c = Census::default();
        let Ok(log) = &self.gate.leader() else { return c };
        let lost = lock(&self.lost).clone();
        for ds in self.meta.datasets(log) {
            for step in self.meta.steps(log, &ds) {
                let Ok(index) = self.meta.index(log, &ds, step) else { continue };
                for o in index.blocks.iter().flat_map(|b| &b.objects) {
                    c.committed += 1;
                    let servers = o.servers();
                    let down: Vec<u32> = servers.iter().copied().filter(|s| view.down.contains(s)).collect();
                    if down.is_empty() {
                        continue;
                    }
                    c.degraded += 1;
                    c.waiting += u64::from(!narrows(view, o) && down.iter().any(|d| target(view, &servers, *d).is_none()));
                    if !lost.contains(&(ds.clone(), step, o.id)) {
                        c.named_down.extend(down);
                    }
                }
            }
        }
        c
    }

    /// Replaces the queue with what `view` leaves short (keeping refills under way and which
    /// jobs were touched), `back` being servers refilled in their own slots.
    fn rescan(self: &Arc<Self>, view: &ClusterView, back: &[u32]) {
        let Ok(log) = &self.gate.leader() else { return };
        let mut jobs = Vec::new();
        for ds in self.meta.datasets(log) {
            for step in self.meta.steps(log, &ds) {
                if let Ok(index) = self.meta.index(log, &ds, step) {
                    jobs.extend(self.short_in(view, back, &ds, &index));
                }
            }
        }
        let parked = std::mem::take(&mut *lock(&self.parked));
        let mut q = lock(&self.queue);
        let urgent: BTreeSet<(&str, u64, u64, u32)> = q.iter().filter(|j| j.urgent).map(Job::key).collect();
        let refills: Vec<Job> = q
            .iter()
            .chain(&parked)
            .filter(|j| j.from == j.to && view.is_live(j.from) && !back.contains(&j.from))
            .map(|j| Job { tries: 0, ..j.clone() })
            .collect();
        for j in &mut jobs {
            j.urgent |= urgent.contains(&j.key());
        }
        drop(urgent);
        jobs.sort_by_key(|j| !j.urgent);
        q.clear();
        q.extend(refills);
        drop(q);
        if !jobs.is_empty() {
            tracing::info!(server = self.state.id, "{} objects to recover (view epoch {})", jobs.len(), view.epoch);
        }
        self.add(jobs);
    }

    /// The pieces of `index` to rebuild in `view`: on a lost server whose heir is live (and
    /// holds no piece of the object yet), or on a server of `back`. Objects counted lost are
    /// not tried again.
    fn short_in(&self, view: &ClusterView, back: &[u32], dataset: &str, index: &StepIndex) -> Vec<Job> {
        let lost = lock(&self.lost);
        let mut jobs = Vec::new();
        for (block, o) in index.blocks.iter().flat_map(|b| b.objects.iter().map(move |o| (b, o))) {
            if lost.contains(&(dataset.to_string(), index.step, o.id)) {
                continue;
            }
            let servers = o.servers();
            let bytes = o.region.volume() * (block.len / block.region.volume().max(1));
            let job = |from, to, planned| Job {
                dataset: dataset.to_string(),
                step: index.step,
                id: o.id,
                from,
                to,
                tries: 0,
                urgent: planned,
                planned,
                bytes,
                narrow: None,
            };
            if narrows(view, o) {
                let from = servers.iter().copied().find(|s| !view.is_live(*s)).expect("narrows: a server is lost");
                let Redundancy::Encoded { shards, .. } = &o.redundancy else { unreachable!("narrows: encoded") };
                jobs.push(Job { narrow: Some(shards.clone()), ..job(from, from, false) });
                continue;
            }
            for &from in &servers {
                let to = if back.contains(&from) { Some(from) } else { target(view, &servers, from) };
                let Some(to) = to else { continue };
                // A planned move (a retiring or replaced server, still up) is not a failure: it
                // runs without the lazy pauses that spread a failure's rebuild over its deadline
                // (a 7 MiB retire took 60 s), still within the recovery byte rate.
                jobs.push(job(from, to, view.retiring.contains(&from)));
            }
        }
        jobs
    }

    fn add(self: &Arc<Self>, jobs: Vec<Job>) {
        {
            // A piece is queued once: the scan of a view change and the commit of a step that
            // placed pieces on the lost server name the same ones, and two rebuilds of one piece
            // in a batch would each find the other's copy stored and fail for good.
            let mut q = lock(&self.queue);
            let mut queued: BTreeSet<(String, u64, u64, u32)> = q.iter().map(|j| (j.dataset.clone(), j.step, j.id, j.from)).collect();
            q.extend(jobs.into_iter().filter(|j| queued.insert((j.dataset.clone(), j.step, j.id, j.from))));
            if q.is_empty() {
                return;
            }
        }
        let me = self.clone();
        self.worker.run(self.state.shutdown.subscribe(), move || {
            let me = me.clone();
            async move { me.round().await }
        });
    }

    /// The next batch: the touched jobs at the front of the queue (up to a full batch), or `n`
    /// jobs, within [`BATCH_BYTES`] (one job at least).
    fn take(&self, n: usize) -> Vec<Job> {
        let mut q = lock(&self.queue);
        let n = q.iter().take_while(|j| j.urgent).count().max(n).min(BATCH);
        let mut bytes = 0u64;
        let mut batch = Vec::new();
        while let Some(j) = q.front() {
            if batch.len() == n || (!batch.is_empty() && bytes + j.bytes > BATCH_BYTES) {
                break;
            }
            bytes += j.bytes;
            batch.extend(q.pop_front());
        }
        batch
    }

    /// One batch, then the pause lazy recovery, the byte rate or planned moves' yielding to
    /// clients call for.
    async fn round(self: &Arc<Self>) -> Next {
        let started = *lock(&self.since).get_or_insert_with(tokio::time::Instant::now);
        let limits = &self.state.limits;
        let (n, pause) = plan(limits, started.elapsed(), self.pending());
        let batch = self.take(n);
        if batch.is_empty() {
            // Rebuilds that failed wait for a rescan: by then a view change has usually
            // replaced the server that failed under them.
            if !lock(&self.parked).is_empty() {
                tokio::time::sleep(RESCAN).await;
                if let Ok(view) = self.state.view() {
                    self.rescan(&view, &[]);
                }
                return Next::Again;
            }
            *lock(&self.since) = None;
            self.sent.store(0, Ordering::Relaxed);
            return Next::Idle;
        }
        self.inflight.store(batch.len() as u64, Ordering::Relaxed);
        let planned = batch.iter().any(|j| j.planned);
        let (clients, ran) = (self.state.client_requests.load(Ordering::Relaxed), tokio::time::Instant::now());
        let (results, rebuilt, bytes) = self.run_batch(batch).await;
        let yielding = yield_to_clients(planned, ran.elapsed(), self.state.client_requests.load(Ordering::Relaxed) - clients);
        self.rebuilt.fetch_add(rebuilt, Ordering::Relaxed);
        let sent = self.sent.fetch_add(bytes, Ordering::Relaxed) + bytes;
        let id = self.state.id;
        for (job, r) in results {
            match r {
                Ok(()) => {}
                Err(e) if e.kind() == cairn_core::ErrorKind::DataLoss => {
                    tracing::error!(server = id, "object {:#x} of '{}' step {} lost: {e}", job.id, job.dataset, job.step);
                    lock(&self.lost).insert((job.dataset.clone(), job.step, job.id));
                }
                Err(e) if job.tries + 1 < TRIES => {
                    tracing::debug!(
                        server = id,
                        "object {:#x} of '{}' step {}: try {} failed: {e}",
                        job.id,
                        job.dataset,
                        job.step,
                        job.tries + 1
                    );
                    lock(&self.queue).push_back(Job { tries: job.tries + 1, ..job });
                }
                Err(e) => {
                    if let Some(n) = crate::logging::limited("rebuild", crate::logging::EVERY) {
                        tracing::warn!(
                            server = id,
                            left_out = n,
                            "object {:#x} of '{}' step {} not rebuilt yet: {e}",
                            job.id,
                            job.dataset,
                            job.step
                        );
                    }
                    lock(&self.parked).push(job);
                }
            }
        }
        self.inflight.store(0, Ordering::Relaxed);
        // The byte rate holds for every object until a lazy recovery nears its deadline, when it
        // goes ahead of client load; the lazy pause is cut short by a touch (a wake).
        if let Some(due) = throttle(limits.recovery_rate, sent).filter(|_| !late(limits, started.elapsed())) {
            tokio::time::sleep_until(started + due).await;
        }
        if let Some(pause) = yielding {
            tokio::time::sleep(pause).await;
        }
        let next_urgent = lock(&self.queue).front().is_some_and(|j| j.urgent);
        match pause.filter(|_| !next_urgent) {
            Some(pause) => Next::After(pause),
            None => Next::Again,
        }
    }
}

/// How many queued objects the next batch takes, and the pause after it. Aggressive, or late
/// (less than a period left before the deadline): full batches, no pause. Lazy: the share of the
/// queue that one period of the time left holds, then the time those objects are due, so that
/// batches come about a period apart and the last ends by the deadline (at most a second apart,
/// so objects touched late are not held back long). The pacing aims at four fifths of the
/// deadline: the rebuilds themselves take time, more under client load (3 writers on 2 cores ran
/// 0.4 s past a 5 s deadline when the pacing aimed at the deadline itself).
fn plan(limits: &Limits, elapsed: Duration, pending: u64) -> (usize, Option<Duration>) {
    let left = paced_left(limits, elapsed);
    if !limits.recovery_lazy || pending == 0 || late(limits, elapsed) {
        return (BATCH, None);
    }
    let n = ((pending as f64 * PERIOD.as_secs_f64() / left.as_secs_f64()).ceil() as usize).clamp(1, BATCH);
    (n, Some((left.mul_f64(n as f64 / (pending as f64 + 1.0))).min(Duration::from_secs(1))))
}

/// Whether a lazy recovery that started `elapsed` ago is late: less than a period left of the
/// time its pacing aims at ([`plan`]). Then it goes at full speed, past the byte rate too.
fn late(limits: &Limits, elapsed: Duration) -> bool {
    limits.recovery_lazy && paced_left(limits, elapsed) < PERIOD
}

/// What is left, `elapsed` into a recovery, of the time the lazy pacing aims at: four fifths of
/// the deadline (see [`plan`]).
fn paced_left(limits: &Limits, elapsed: Duration) -> Duration {
    (limits.recovery_deadline() * 4 / 5).saturating_sub(elapsed)
}

/// How long a batch of planned moves that took `took` yields to clients that sent `clients`
/// requests meanwhile: as long again (half the time to them, at most half a second), or not at
/// all while they are idle. A failure's rebuild does not yield: it has its deadline.
fn yield_to_clients(planned: bool, took: Duration, clients: u64) -> Option<Duration> {
    (planned && clients > 0).then(|| took.min(Duration::from_millis(500)))
}

/// When, counted from the start of recovery, `sent` bytes are within `rate` bytes per second
/// (`None`: no limit).
fn throttle(rate: u64, sent: u64) -> Option<Duration> {
    (rate > 0).then(|| Duration::from_secs_f64(sent as f64 / rate as f64))
}

/// Where a piece the index names on lost or retiring server `from` goes, the object's pieces
/// being on `servers`: the live server holding `from`'s slot now; should that one hold a piece
/// of the object already (a server id back as a spare and replaced again), or `from` be
/// retiring with its slot gone, a live server holding none. While no live server holds a lost
/// server's slot: `None` if a spare is left to take it (the detector gives it one), else a
/// surviving server, so that redundancy comes back without one (`None` when every live server
/// holds a piece already: the object waits, degraded, for a server to be added).
fn target(view: &ClusterView, servers: &[u32], from: u32) -> Option<u32> {
    let heir = view.heir(from);
    // Retiring, or retired with pieces committed onto it since (a put it took just before it
    // learnt it was leaving): its slot is gone, any live server will do.
    let leaving = view.retiring.contains(&from) || view.server(from).is_err();
    if view.is_live(from) {
        return None;
    }
    let unheld = (heir == from && !leaving) || (heir != from && !view.is_live(heir));
    if unheld {
        return if view.spares.is_empty() { survivor(view, servers) } else { None };
    }
    if !servers.contains(&heir) {
        return Some(heir);
    }
    survivor(view, servers)
}

/// Whether erasure-coded object `o` is to be decoded into copies (see the module's comment): a
/// server of its stripe is lost, no spare is left, every live server holds a shard of it already,
/// `k` of its shards are live (else it is lost) and `m + 1` servers are (for its copies).
fn narrows(view: &ClusterView, o: &ObjectRef) -> bool {
    let Redundancy::Encoded { k, m, shards } = &o.redundancy else { return false };
    let live = shards.iter().filter(|s| view.is_live(**s)).count();
    live < shards.len()
        && view.spares.is_empty()
        && survivor(view, shards).is_none()
        && live >= *k as usize
        && view.live().len() > *m as usize
}

/// `n` live servers for the copies of an object, on as many nodes as there are (one copy per
/// failure domain first), or `None` when fewer than `n` are live.
fn spread(view: &ClusterView, n: usize) -> Option<Vec<u32>> {
    let node = |s: &u32| view.server(*s).map(|e| e.spec.node.clone()).ok();
    let live = view.live();
    let mut seen = BTreeSet::new();
    let (mut out, rest): (Vec<u32>, Vec<u32>) = live.iter().partition(|s| seen.insert(node(s)));
    out.extend(rest);
    out.truncate(n);
    (out.len() == n).then_some(out)
}

/// A live server holding no piece of an object whose pieces are on `servers`: on a node none
/// of them is on where there is one (a failure domain of its own), else the first.
fn survivor(view: &ClusterView, servers: &[u32]) -> Option<u32> {
    let node = |s: &u32| view.server(*s).map(|e| e.spec.node.clone()).ok();
    let taken: Vec<String> = servers.iter().filter_map(node).collect();
    let free: Vec<u32> = view.live().into_iter().filter(|s| !servers.contains(s)).collect();
    free.iter().find(|s| node(s).is_some_and(|n| !taken.contains(&n))).or(free.first()).copied()
}

fn no_target(job: &Job) -> Error {
    Error::Unavailable(format!(
        "no live server can take server {}'s piece of object {:#x}: every live one holds a piece of it already; it waits for a \
         spare or a server added with `cairn cluster add`",
        job.from, job.id
    ))
}

/// What the leader knows of a job once it looked it up: the server to rebuild on and the piece.
struct Prepared {
    to: u32,
    piece: RebuildPiece,
    refill: bool,
}

/// The object `job` is about, as the committed index names it now.
fn object(meta: &Meta, log: &dyn cairn_meta::MetaLog, job: &Job) -> Option<ObjectRef> {
    let index = meta.index(log, &job.dataset, job.step).ok()?;
    index.blocks.iter().flat_map(|b| &b.objects).find(|o| o.id == job.id).cloned()
}

/// Looks a job up in the index: `None` when the object is gone or its piece already moved.
fn prepare(meta: &Meta, log: &dyn cairn_meta::MetaLog, view: &ClusterView, job: &Job) -> Result<Option<Prepared>> {
    let Some(o) = object(meta, log, job) else { return Ok(None) };
    // A server back in its own slot (`from == to`) is refilled: the index names it already.
    // Otherwise the piece goes to whoever holds the lost server's slot now.
    let refill = job.from == job.to;
    let retiring = view.retiring.contains(&job.from);
    if !o.servers().contains(&job.from) {
        return Ok(None);
    }
    let to = if refill { job.to } else { target(view, &o.servers(), job.from).ok_or_else(|| no_target(job))? };
    let (shard, k, m, stripe, holders) = match &o.redundancy {
        Redundancy::Replicated { servers } => (0, 0, 0, Vec::new(), servers.clone()),
        Redundancy::Encoded { k, m, shards } => {
            let lost = shards.iter().position(|s| *s == job.from).expect("checked above") as u32;
            (lost + 1, *k, *m, shards.clone(), shards.clone())
        }
        // A retiring server still holds its single copies: they move like any other.
        Redundancy::Single if retiring => (0, 0, 0, Vec::new(), vec![job.from]),
        Redundancy::Single => {
            return Err(Error::DataLoss(format!("object {:#x} had one copy, on server {}", job.id, job.from)));
        }
    };
    // A retiring server is the first source of its own pieces (it is there to be read).
    let mut sources: Vec<u32> =
        holders.iter().copied().filter(|s| *s != to && if *s == job.from { retiring } else { view.is_live(*s) }).collect();
    sources.sort_by_key(|s| *s != job.from);
    if sources.is_empty() {
        return Err(Error::DataLoss(format!("no live server holds a piece of object {:#x}", job.id)));
    }
    let piece = RebuildPiece { step: job.step, id: job.id, shard, k, m, stripe, checksum: o.checksum, sources };
    Ok(Some(Prepared { to, piece, refill }))
}

impl Recovery {
    /// Rebuilds a batch: the jobs bound for one server go in one `rebuild`, all servers at once;
    /// what was stored is recorded with one `rebuilt` command per step, proposed together (they
    /// share log entries). Returns each job's outcome, the objects recorded and the bytes moved.
    async fn run_batch(self: &Arc<Self>, batch: Vec<Job>) -> (Vec<(Job, Result<()>)>, u64, u64) {
        let mut out = Vec::new();
        let (log, view) = match self.gate.leader().and_then(|log| Ok((log, self.state.view()?))) {
            Ok(lv) => lv,
            Err(e) => return (batch.into_iter().map(|j| (j, Err(e.duplicate()))).collect(), 0, 0),
        };
        let log = &log;
        let (narrow, batch): (Vec<Job>, Vec<Job>) = batch.into_iter().partition(|j| j.narrow.is_some());
        let mut narrowing = tokio::task::JoinSet::new();
        for job in narrow {
            let me = self.clone();
            narrowing.spawn(async move {
                let r = me.narrow(&job).await;
                (job, r)
            });
        }
        let mut groups: BTreeMap<(String, u32), Vec<(Job, Prepared)>> = BTreeMap::new();
        for job in batch {
            match prepare(&self.meta, log, &view, &job) {
                Ok(Some(p)) => groups.entry((job.dataset.clone(), p.to)).or_default().push((job, p)),
                Ok(None) => out.push((job, Ok(()))),
                Err(e) => out.push((job, Err(e))),
            }
        }
        let mut calls = tokio::task::JoinSet::new();
        for ((dataset, to), items) in groups {
            let state = self.state.clone();
            calls.spawn(async move {
                let req = PeerRequest::Rebuild { dataset, pieces: items.iter().map(|(_, p)| p.piece.clone()).collect() };
                let r = crate::peer::call(&state, to, &req).await;
                (items, r)
            });
        }
        // (dataset, step) → (object, from, to) to record, with the jobs and bytes behind them.
        let mut record: BTreeMap<(String, u64), Vec<(Job, u32)>> = BTreeMap::new();
        let (mut rebuilt, mut bytes) = (0u64, 0u64);
        while let Some(done) = calls.join_next().await {
            let Ok((items, r)) = done else { continue };
            let failed = match r {
                Ok(Response::Rebuilt { failed }) => failed,
                Ok(other) => {
                    let e = cairn_proto::message::refused("rebuild", other);
                    out.extend(items.into_iter().map(|(j, _)| (j, Err(e.duplicate()))));
                    continue;
                }
                Err(e) => {
                    out.extend(items.into_iter().map(|(j, _)| (j, Err(e.duplicate()))));
                    continue;
                }
            };
            for (job, p) in items {
                if let Some(f) = failed.iter().find(|f| f.step == p.piece.step && f.id == p.piece.id) {
                    out.push((job, Err(Error::from_kind(f.kind, f.message.clone()))));
                    continue;
                }
                bytes += job.bytes;
                if p.refill {
                    rebuilt += 1;
                    out.push((job, Ok(())));
                } else {
                    record.entry((job.dataset.clone(), job.step)).or_default().push((job, p.to));
                }
            }
        }
        let mut entries = tokio::task::JoinSet::new();
        for ((dataset, step), jobs) in record {
            let me = self.clone();
            entries.spawn(async move {
                let moved = jobs.iter().map(|(j, to)| (j.id, j.from, *to)).collect();
                let r = match me.gate.leader() {
                    Ok(log) => me.meta.rebuilt(&log, &dataset, step, moved).await,
                    Err(e) => Err(e),
                };
                (jobs, r)
            });
        }
        while let Some(done) = entries.join_next().await {
            let Ok((jobs, r)) = done else { continue };
            match r {
                Ok(changed) => {
                    rebuilt += changed;
                    out.extend(jobs.into_iter().map(|(j, _)| (j, Ok(()))));
                }
                Err(e) => out.extend(jobs.into_iter().map(|(j, _)| (j, Err(e.duplicate())))),
            }
        }
        while let Some(done) = narrowing.join_next().await {
            let Ok((job, r)) = done else { continue };
            if let Ok(moved) = &r {
                rebuilt += u64::from(*moved > 0);
                bytes += moved;
            }
            out.push((job, r.map(|_| ())));
        }
        (out, rebuilt, bytes)
    }

    /// Decodes an object whose stripe no longer fits into `m + 1` copies on live servers (each
    /// decodes its own from `k` live shards, checked against the object's checksum), records
    /// them in place of the shards, drops the shards, then has it encoded again narrower.
    /// Returns the bytes moved (0: nothing was to do any more).
    async fn narrow(&self, job: &Job) -> Result<u64> {
        let (log, view) = (&self.gate.leader()?, self.state.view()?);
        let o = match object(&self.meta, log, job) {
            Some(o) if matches!(o.redundancy, Redundancy::Encoded { .. }) => o,
            // Recorded by an earlier try told it failed (its entry committed all the same):
            // the shards and the encoding are still to do; the copies it moved count now.
            Some(o) if matches!(o.redundancy, Redundancy::Replicated { .. }) => {
                self.narrowed(job).await?;
                return Ok(job.bytes * o.servers().len() as u64);
            }
            _ => return Ok(0),
        };
        let Redundancy::Encoded { k, m, shards } = &o.redundancy else { unreachable!("matched above") };
        if !narrows(&view, &o) {
            return Ok(0); // a spare or a new server came: the object is rebuilt the usual way
        }
        let copies = spread(&view, *m as usize + 1).ok_or_else(|| no_target(job))?;
        let sources: Vec<u32> = shards.iter().copied().filter(|s| view.is_live(*s)).collect();
        let piece =
            RebuildPiece { step: job.step, id: job.id, shard: 0, k: *k, m: *m, stripe: shards.clone(), checksum: o.checksum, sources };
        let (state, dataset) = (&self.state, &job.dataset);
        // Every copy decoded at once, each by its own server (a copy an earlier try stored is
        // found there and kept).
        let mut calls = tokio::task::JoinSet::new();
        for to in copies.iter().copied() {
            let (state, req) = (state.clone(), PeerRequest::Rebuild { dataset: dataset.clone(), pieces: vec![piece.clone()] });
            calls.spawn(async move {
                match crate::peer::call(&state, to, &req).await? {
                    Response::Rebuilt { failed } => match failed.into_iter().next() {
                        Some(f) => Err(Error::from_kind(f.kind, f.message)),
                        None => Ok(()),
                    },
                    other => Err(cairn_proto::message::refused("rebuild", other)),
                }
            });
        }
        let mut failed = None;
        while let Some(done) = calls.join_next().await {
            if let Err(e) = done.unwrap_or_else(|e| Err(Error::Unavailable(format!("a decoding call failed: {e}")))) {
                failed.get_or_insert(e);
            }
        }
        if let Some(e) = failed {
            for to in &copies {
                crate::encode::drop_piece(state, *to, dataset, job.step, job.id, 0).await;
            }
            return Err(e);
        }
        let recorded = self.meta.decoded(log, dataset, job.step, vec![(job.id, copies.clone())]).await;
        // The index decides, not the answer: a proposal answered with an error (a leader out of
        // touch with its quorum for a moment, as when a voter is replaced) may commit all the
        // same, and the copies it names must stay. Still encoded: the copies stay for a retry.
        let Some(Redundancy::Replicated { servers }) = object(&self.meta, log, job).map(|o| o.redundancy) else {
            return recorded.map(|_| 0);
        };
        for to in copies.iter().filter(|c| !servers.contains(c)) {
            crate::encode::drop_piece(state, *to, dataset, job.step, job.id, 0).await;
        }
        tracing::info!(
            server = state.id,
            "object {:#x} of '{dataset}' step {}: RS({k} + {m}) no longer fits the {} live servers; {} copies on {servers:?}",
            job.id,
            job.step,
            view.live().len(),
            servers.len()
        );
        self.narrowed(job).await?;
        Ok(job.bytes * servers.len() as u64)
    }

    /// The rest of a narrowing once its copies are recorded: drops the old stripe's shards
    /// (shard `i + 1` on the job's `narrow[i]`) and has the object encoded again. An encoding
    /// that fails is an error, so the job is tried again.
    async fn narrowed(&self, job: &Job) -> Result<()> {
        let (state, dataset) = (&self.state, &job.dataset);
        let view = state.view()?;
        for (i, s) in job.narrow.iter().flatten().enumerate().filter(|(_, s)| view.is_live(**s)) {
            crate::encode::drop_piece(state, *s, dataset, job.step, job.id, i as u32 + 1).await;
        }
        self.corec.reencode(dataset, job.step, job.id).await
    }
}

// A batch fits in one `rebuild`.
const _: () = assert!(BATCH <= MAX_REBUILD);

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::tests::view;

    #[test]
    fn a_lost_piece_goes_to_the_live_heir_of_its_slot_or_waits() {
        let v = view(4, 3).fail(1).unwrap();
        assert_eq!(target(&v, &[0, 1], 1), None, "a spare is left to take the slot: it waits for it");
        let v = v.replace(1, 4).unwrap();
        assert_eq!(target(&v, &[0, 1], 1), Some(4));
        // The spare fails before it was refilled: the next one takes over its work.
        let v = v.fail(4).unwrap();
        assert_eq!(target(&v, &[0, 1], 1), None, "the heir is down");
        let v = v.replace(4, 5).unwrap();
        assert_eq!((target(&v, &[0, 1], 1), target(&v, &[0, 4], 4)), (Some(5), Some(5)));
        // The heir holds a piece already: any live server holding none.
        assert_eq!(target(&v, &[1, 5], 1), Some(0));
        assert_eq!(target(&v, &[0, 2], 0), None, "a live server is not rebuilt");
        // Server 1, replaced, back as a spare and live again in another slot: what the index
        // names on it now is its own.
        let v = v.rejoin(1).unwrap().fail(2).unwrap().replace(2, 1).unwrap();
        assert_eq!((target(&v, &[1, 3], 1), target(&v, &[2, 3], 2)), (None, Some(1)));
    }

    fn recovery(state: Arc<State>) -> Recovery {
        let (gate, meta) = (Arc::new(Gate::new(0, Default::default())), Arc::<Meta>::default());
        let corec = Arc::new(Corec::new(state.clone(), gate.clone(), meta.clone()));
        Recovery::new(state, gate, meta, corec)
    }

    fn encoded(k: u32, m: u32, shards: Vec<u32>) -> ObjectRef {
        let region = cairn_core::Region::new(vec![0], vec![8]).unwrap();
        ObjectRef { id: 1, region, server: shards[0], checksum: 0, redundancy: Redundancy::Encoded { k, m, shards } }
    }

    #[test]
    fn a_stripe_that_no_longer_fits_is_narrowed_onto_copies_across_nodes() {
        // RS(3 + 1) on all 4 servers, server 1 lost, no spare: the 3 left hold a shard each.
        let v = view(4, 0).fail(1).unwrap();
        let o = encoded(3, 1, vec![0, 1, 2, 3]);
        assert!(narrows(&v, &o));
        assert_eq!(target(&v, &o.servers(), 1), None, "no server to rebuild the shard on");
        // A fifth server, or a spare, takes the shard the usual way.
        assert!(!narrows(&view(5, 0).fail(1).unwrap(), &o));
        assert!(!narrows(&view(4, 1).fail(1).unwrap(), &o), "the spare takes the slot");
        assert!(!narrows(&view(4, 0), &o), "nothing lost");
        // Two of RS(3 + 1) lost: beyond its level, nothing to decode from.
        assert!(!narrows(&v.fail(2).unwrap(), &o));
        // RS(2 + 2) on 4 with two lost: 2 live shards decode it, but 3 copies need 3 servers.
        let v2 = view(4, 0).fail(1).unwrap().fail(2).unwrap();
        assert!(!narrows(&v2, &encoded(2, 2, vec![0, 1, 2, 3])));
        // The copies go to different nodes first.
        let mut v = view(4, 0);
        v.servers[2].spec.node = "n0".into(); // server 2 shares server 0's node
        assert_eq!(spread(&v, 3), Some(vec![0, 1, 3]));
        assert_eq!(spread(&v, 4), Some(vec![0, 1, 3, 2]));
        assert_eq!(spread(&v, 5), None);
    }

    #[test]
    fn without_spares_a_lost_piece_goes_to_a_survivor_in_another_domain() {
        let v = view(4, 0).fail(1).unwrap();
        assert_eq!(target(&v, &[0, 1], 1), Some(2), "the first live server holding no piece");
        let mut v = view(4, 0);
        v.servers[2].spec.node = "n0".into(); // server 2 shares server 0's node
        let v = v.fail(1).unwrap();
        assert_eq!(target(&v, &[0, 1], 1), Some(3), "a node none of the holders is on");
        assert_eq!(target(&v, &[0, 1, 2, 3], 1), None, "every live server holds a piece: it waits");
    }

    #[tokio::test]
    async fn a_piece_is_queued_once() {
        // The scan of a view change and the commit of a step name the same pieces; two rebuilds
        // of one piece in a batch would each find the other's copy stored, and fail for good.
        let state = State::new(0, "s".into(), "/nonexistent/cluster.json".into(), 1 << 20, Limits::default());
        let r = Arc::new(recovery(state));
        let job =
            |id| Job { dataset: "d".into(), step: 0, id, from: 1, to: 6, tries: 0, urgent: false, planned: false, bytes: 8, narrow: None };
        r.add(vec![job(1), job(1), job(2)]);
        r.add(vec![job(2), job(3)]);
        assert_eq!(r.pending(), 3, "(the worker has not run yet on this runtime)");
    }

    #[test]
    fn a_late_lazy_recovery_goes_past_the_byte_rate() {
        let mut limits = Limits { recovery_lazy: true, recovery_deadline: Some(Duration::from_secs(5)), ..Default::default() };
        assert!(!late(&limits, Duration::from_secs(3)), "on time: the byte rate holds");
        assert!(late(&limits, Duration::from_millis(3800)), "within a period of 4 s");
        assert!(late(&limits, Duration::from_secs(9)));
        limits.recovery_lazy = false;
        assert!(!late(&limits, Duration::from_secs(9)), "aggressive recovery keeps its byte rate");
    }

    #[test]
    fn planned_moves_yield_to_active_clients_and_failures_do_not() {
        let ms = Duration::from_millis;
        assert_eq!(yield_to_clients(true, ms(80), 0), None, "idle clients: full speed");
        assert_eq!(yield_to_clients(true, ms(80), 12), Some(ms(80)), "half the time to clients");
        assert_eq!(yield_to_clients(true, ms(3000), 1), Some(ms(500)), "at most half a second");
        assert_eq!(yield_to_clients(false, ms(80), 12), None, "a failure's rebuild keeps its deadline");
    }

    #[tokio::test(start_paused = true)]
    async fn a_recovery_past_its_deadline_reports_by_how_much() {
        let state = State::new(0, "s".into(), "/nonexistent/cluster.json".into(), 1 << 20, Limits::default());
        let r = recovery(state);
        let deadline = Duration::from_secs(5);
        assert_eq!(r.overdue(deadline), 0.0, "idle");
        *lock(&r.since) = Some(tokio::time::Instant::now());
        r.inflight.store(3, Ordering::Relaxed);
        tokio::time::advance(Duration::from_secs(4)).await;
        assert_eq!(r.overdue(deadline), 0.0, "on time");
        tokio::time::advance(Duration::from_millis(2500)).await;
        assert!((r.overdue(deadline) - 1.5).abs() < 1e-6, "{}", r.overdue(deadline));
        r.inflight.store(0, Ordering::Relaxed);
        assert_eq!(r.overdue(deadline), 0.0, "done");
    }

    #[test]
    fn lazy_recovery_spreads_the_deadline_over_what_is_left() {
        let mut limits = Limits { recovery_lazy: true, ..Default::default() };
        // The plan with its pause in whole milliseconds; the pacing aims at 4/5 of the deadline.
        let plan = |l: &Limits, elapsed: Duration, pending: u64| {
            let (n, pause) = plan(l, elapsed, pending);
            (n, pause.map(|p| (p.as_secs_f64() * 1000.0).round() as u64))
        };
        // Few objects: one at a time, 48 s of the 60 s shared among them (at most a second apart).
        assert_eq!(plan(&limits, Duration::ZERO, 119), (1, Some(400)));
        assert_eq!(plan(&limits, Duration::from_secs(30), 59), (1, Some(300)));
        assert_eq!(plan(&limits, Duration::ZERO, 10), (1, Some(1000)), "at most a second");
        // Many: a period's share of them per batch, a period apart.
        assert_eq!(plan(&limits, Duration::ZERO, 2399), (13, Some(260)));
        assert_eq!(plan(&limits, Duration::from_secs(47), 1000).0, BATCH, "behind: full batches");
        assert_eq!(plan(&limits, Duration::from_millis(47_900), 1000), (BATCH, None), "late: no pause");
        assert_eq!(plan(&limits, Duration::from_secs(90), 10), (BATCH, None));
        assert_eq!(plan(&limits, Duration::ZERO, 0), (BATCH, None));
        limits.mtbf = Some(Duration::from_secs(20));
        assert_eq!(plan(&limits, Duration::ZERO, 9), (1, Some(400)), "a quarter of the MTBF");
        assert_eq!(plan(&limits, Duration::ZERO, 999), (63, Some(252)));
        limits.recovery_deadline = Some(Duration::from_secs(2));
        assert_eq!(plan(&limits, Duration::ZERO, 3), (1, Some(400)), "an explicit deadline wins");
        limits.recovery_lazy = false;
        assert_eq!(plan(&limits, Duration::ZERO, 100), (BATCH, None));
    }

    #[test]
    fn recovery_keeps_to_its_byte_rate() {
        assert_eq!(throttle(100 << 20, 50 << 20), Some(Duration::from_millis(500)));
        assert_eq!(throttle(0, 50 << 20), None, "0: no limit");
    }
}
