//! Recovery onto spares (CoREC §3.4). When a view change gives a lost server's slot to another
//! server, the control plane's leader queues every committed object with a piece (a copy or a
//! shard) on the lost server and has it rebuilt on the new one: a surviving holder pushes its
//! copy, or a surviving shard holder fetches `k` shards, decodes, and pushes the lost shard. A
//! `rebuilt` log entry then makes the index name the new server. Until then reads are degraded
//! (another copy, or a decode), never wrong. Lazy recovery (the default) spreads the work over
//! the recovery deadline, so client requests keep most of the servers' time; aggressive recovery
//! rebuilds everything at once, for comparison. Either way recovery sends at most
//! `recovery_rate` bytes per second.

use crate::cmd::data::PutHeader;
use crate::state::{lock, State};
use cairn_core::erasure::Code;
use cairn_core::index::{Redundancy, StepIndex};
use cairn_core::{Error, Result};
use cairn_proto::message::{Request, Response};
use cairn_proto::ClusterView;
use std::collections::{BTreeSet, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Objects rebuilt at once when recovery is not paced (aggressive, or past its deadline).
const BATCH: usize = 16;

/// Tries per object before it waits for the next rescan.
const TRIES: u32 = 3;

/// How long after a failed rebuild the leader looks again for what is short of its copies (a
/// target or source that failed meanwhile is replaced by a view change before long).
const RESCAN: Duration = Duration::from_secs(1);

/// The leader's recovery queue and counters.
#[derive(Debug, Default)]
pub struct Recovery {
    queue: Mutex<VecDeque<Job>>,
    running: AtomicBool,
    rebuilt: AtomicU64,
    /// Objects with no surviving piece (beyond their level), each counted once.
    lost: Mutex<BTreeSet<(String, u64, u64)>>,
    /// Rebuilds given up for now (a server failed during them), queued again by the next
    /// rescan.
    parked: Mutex<Vec<Job>>,
    /// Rebuilds under way.
    inflight: AtomicU64,
    /// Cuts a lazy pause short when touched objects are queued.
    wake: tokio::sync::Notify,
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
}

impl Job {
    fn key(&self) -> (&str, u64, u64, u32) {
        (&self.dataset, self.step, self.id, self.from)
    }
}

impl Recovery {
    /// Objects waiting to be rebuilt (including rebuilds deferred to the next rescan).
    pub fn pending(&self) -> u64 {
        (lock(&self.queue).len() + lock(&self.parked).len()) as u64 + self.inflight.load(Ordering::Relaxed)
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
    pub fn view_changed(&self, state: &Arc<State>, before: &ClusterView, after: &ClusterView) {
        let back: Vec<u32> = before.down.iter().copied().filter(|s| !after.down.contains(s) && after.slots.contains(s)).collect();
        self.rescan(state, after, &back);
    }

    /// On becoming leader: queues what lost servers still hold (a previous leader may have died
    /// with recovery under way).
    pub fn resume(&self, state: &Arc<State>) {
        let Ok(view) = state.view() else { return };
        self.rescan(state, &view, &[]);
    }

    /// After a commit at the leader: queues the pieces the step placed on servers lost before
    /// it committed (a seal that could not reach a server is tolerated within the level), which
    /// the scan of the view change did not see.
    pub fn committed(&self, state: &Arc<State>, dataset: &str, index: &StepIndex) {
        let Ok(view) = state.view() else { return };
        let jobs = self.short_in(&view, &[], dataset, index);
        self.add(state, jobs);
    }

    /// Whether a committed index entry (not counted lost) names server `id` for a piece. Pieces
    /// of a server whose slot a spare took stay named until rebuilt on the spare.
    pub fn still_named(&self, state: &State, id: u32) -> bool {
        let Ok(log) = crate::control::leader(state) else { return true };
        let lost = lock(&self.lost);
        state.meta.datasets(log).into_iter().any(|ds| {
            state.meta.steps(log, &ds).into_iter().any(|step| {
                state.meta.index(log, &ds, step).is_ok_and(|index| {
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
        self.wake.notify_one();
    }

    /// Replaces the queue with what `view` leaves short (keeping refills under way and which
    /// jobs were touched), `back` being servers refilled in their own slots.
    fn rescan(&self, state: &Arc<State>, view: &ClusterView, back: &[u32]) {
        let Ok(log) = crate::control::leader(state) else { return };
        let mut jobs = Vec::new();
        for ds in state.meta.datasets(log) {
            for step in state.meta.steps(log, &ds) {
                if let Ok(index) = state.meta.index(log, &ds, step) {
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
            j.urgent = urgent.contains(&j.key());
        }
        drop(urgent);
        jobs.sort_by_key(|j| !j.urgent);
        q.clear();
        q.extend(refills);
        drop(q);
        if !jobs.is_empty() {
            eprintln!("cairn server {}: {} objects to recover (view epoch {})", state.id, jobs.len(), view.epoch);
        }
        self.add(state, jobs);
    }

    /// The pieces of `index` to rebuild in `view`: on a lost server whose heir is live (and
    /// holds no piece of the object yet), or on a server of `back`. Objects counted lost are
    /// not tried again.
    fn short_in(&self, view: &ClusterView, back: &[u32], dataset: &str, index: &StepIndex) -> Vec<Job> {
        let lost = lock(&self.lost);
        let mut jobs = Vec::new();
        for o in index.blocks.iter().flat_map(|b| &b.objects) {
            if lost.contains(&(dataset.to_string(), index.step, o.id)) {
                continue;
            }
            let servers = o.servers();
            for &from in &servers {
                let to = if back.contains(&from) { Some(from) } else { target(view, &servers, from) };
                let Some(to) = to else { continue };
                jobs.push(Job { dataset: dataset.to_string(), step: index.step, id: o.id, from, to, tries: 0, urgent: false });
            }
        }
        jobs
    }

    fn add(&self, state: &Arc<State>, jobs: Vec<Job>) {
        if jobs.is_empty() {
            return;
        }
        lock(&self.queue).extend(jobs);
        self.kick(state);
    }

    fn kick(&self, state: &Arc<State>) {
        if self.running.swap(true, Ordering::AcqRel) {
            return;
        }
        let state = state.clone();
        tokio::spawn(async move {
            let started = tokio::time::Instant::now();
            let mut sent = 0u64;
            loop {
                // Paced (lazy, before the deadline): one object at a time. Otherwise a batch at
                // once, so that their log entries share a commit (a retiring server's thousands
                // of pieces moved one round trip and one entry at a time took minutes).
                let paced = pace(&state.limits, started.elapsed(), state.recovery.pending()).is_some_and(|p| p >= Duration::from_millis(5));
                let batch: Vec<Job> = {
                    let mut q = lock(&state.recovery.queue);
                    let n = if paced { 1 } else { BATCH.min(q.len()) };
                    q.drain(..n).collect()
                };
                if batch.is_empty() {
                    // Rebuilds that failed wait for a rescan: by then a view change has usually
                    // replaced the server that failed under them.
                    if !lock(&state.recovery.parked).is_empty() {
                        tokio::time::sleep(RESCAN).await;
                        if let Ok(view) = state.view() {
                            state.recovery.rescan(&state, &view, &[]);
                        }
                        continue;
                    }
                    state.recovery.running.store(false, Ordering::Release);
                    // A job queued between the empty pop and the flag is not left behind.
                    if lock(&state.recovery.queue).is_empty() || state.recovery.running.swap(true, Ordering::AcqRel) {
                        return;
                    }
                    continue;
                }
                state.recovery.inflight.store(batch.len() as u64, Ordering::Relaxed);
                let mut running = tokio::task::JoinSet::new();
                for job in batch {
                    let state = state.clone();
                    running.spawn(async move {
                        let r = rebuild_one(&state, &job).await;
                        (job, r)
                    });
                }
                while let Some(done) = running.join_next().await {
                    let Ok((job, r)) = done else { continue };
                    match r {
                        Ok(Some(bytes)) => {
                            state.recovery.rebuilt.fetch_add(1, Ordering::Relaxed);
                            sent += bytes;
                        }
                        // Released, or no longer there: nothing to rebuild.
                        Ok(None) => {}
                        Err(e) if e.kind() == cairn_core::ErrorKind::DataLoss => {
                            eprintln!("cairn server {}: object {:#x} of '{}' step {} lost: {e}", state.id, job.id, job.dataset, job.step);
                            lock(&state.recovery.lost).insert((job.dataset.clone(), job.step, job.id));
                        }
                        Err(_) if job.tries + 1 < TRIES => {
                            lock(&state.recovery.queue).push_back(Job { tries: job.tries + 1, ..job });
                        }
                        Err(e) => {
                            eprintln!(
                                "cairn server {}: object {:#x} of '{}' step {} not rebuilt yet: {e}",
                                state.id, job.id, job.dataset, job.step
                            );
                            lock(&state.recovery.parked).push(job);
                        }
                    }
                }
                state.recovery.inflight.store(0, Ordering::Relaxed);
                // The byte rate holds for every object; the lazy pause is cut short by a touch.
                if let Some(due) = throttle(state.limits.recovery_rate, sent) {
                    tokio::time::sleep_until(started + due).await;
                }
                let next_urgent = lock(&state.recovery.queue).front().is_some_and(|j| j.urgent);
                if let Some(pause) = pace(&state.limits, started.elapsed(), state.recovery.pending()).filter(|_| !next_urgent) {
                    tokio::select! {
                        _ = tokio::time::sleep(pause) => {}
                        _ = state.recovery.wake.notified() => {}
                    }
                }
            }
        });
    }
}

/// The pause before the next object: none when aggressive, else the time left before the
/// deadline shared among the objects still queued (at most a second, so objects touched late
/// are not held back long).
fn pace(limits: &crate::state::Limits, elapsed: Duration, pending: u64) -> Option<Duration> {
    if !limits.recovery_lazy || pending == 0 {
        return None;
    }
    let left = limits.recovery_deadline().saturating_sub(elapsed);
    Some((left / (pending as u32 + 1)).min(Duration::from_secs(1)))
}

/// When, counted from the start of recovery, `sent` bytes are within `rate` bytes per second
/// (`None`: no limit).
fn throttle(rate: u64, sent: u64) -> Option<Duration> {
    (rate > 0).then(|| Duration::from_secs_f64(sent as f64 / rate as f64))
}

/// Where a piece the index names on lost or retiring server `from` goes, the object's pieces
/// being on `servers`: the live server holding `from`'s slot now, or, should that one hold a
/// piece of the object already (a server id back as a spare and replaced again) or `from` be
/// retiring with its slot gone, the first live server holding none. `None` while no live
/// server took a lost server's slot (reads stay degraded meanwhile).
fn target(view: &ClusterView, servers: &[u32], from: u32) -> Option<u32> {
    let heir = view.heir(from);
    // Retiring, or retired with pieces committed onto it since (a put it took just before it
    // learnt it was leaving): its slot is gone, any live server will do.
    let leaving = view.retiring.contains(&from) || view.server(from).is_err();
    if view.is_live(from) || (heir == from && !leaving) || (heir != from && !view.is_live(heir)) {
        return None;
    }
    if !servers.contains(&heir) {
        return Some(heir);
    }
    view.live().into_iter().find(|s| !servers.contains(s))
}

fn no_target(job: &Job) -> Error {
    Error::Unavailable(format!("no live server holds server {}'s slot to rebuild object {:#x} on; waiting for a spare", job.from, job.id))
}

/// Rebuilds one piece and records it: the bytes sent to the new holder, `None` when the object
/// is gone or already moved.
async fn rebuild_one(state: &Arc<State>, job: &Job) -> Result<Option<u64>> {
    let log = crate::control::leader(state)?;
    let view = state.view()?;
    let Ok(index) = state.meta.index(log, &job.dataset, job.step) else { return Ok(None) };
    let found = index.blocks.iter().flat_map(|b| b.objects.iter().map(move |o| (b, o))).find(|(_, o)| o.id == job.id);
    let Some((block, o)) = found else { return Ok(None) };
    // A server back in its own slot (`from == to`) is refilled: the index names it already.
    // Otherwise the piece goes to whoever holds the lost server's slot now.
    let refill = job.from == job.to;
    let retiring = view.retiring.contains(&job.from);
    if !o.servers().contains(&job.from) {
        return Ok(None);
    }
    let to = if refill { job.to } else { target(&view, &o.servers(), job.from).ok_or_else(|| no_target(job))? };
    let bytes = o.region.volume() * (block.len / block.region.volume().max(1));
    let (shard, k, m, stripe, sources) = match &o.redundancy {
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
    let mut live: Vec<u32> = sources.iter().copied().filter(|s| if *s == job.from { retiring } else { view.is_live(*s) }).collect();
    live.sort_by_key(|s| *s != job.from);
    if live.is_empty() {
        return Err(Error::DataLoss(format!("no live server holds a piece of object {:#x}", job.id)));
    }
    // Any holder will do; one that fails (or is itself being refilled) passes to the next.
    let piece = Piece { shard, k, m, stripe, checksum: o.checksum };
    let mut last = Ok(());
    for source in live {
        last = if source == state.id {
            rebuild(state, &job.dataset, job.step, job.id, &piece, to).await
        } else {
            let Piece { shard, k, m, ref stripe, checksum } = piece;
            let stripe = stripe.clone();
            let req = Request::Rebuild { dataset: job.dataset.clone(), step: job.step, id: job.id, shard, k, m, stripe, checksum, to };
            crate::peer::call(state, source, &req).await.map(|_| ())
        };
        if last.is_ok() {
            break;
        }
    }
    last?;
    let recorded = refill || state.meta.rebuilt(log, &job.dataset, job.step, vec![(job.id, job.from, to)]).await? > 0;
    Ok(recorded.then_some(if k > 0 { bytes.div_ceil(u64::from(k)) } else { bytes }))
}

/// Which piece of an object to rebuild.
#[derive(Debug, Clone)]
pub struct Piece {
    /// 0: a whole copy; `i + 1`: shard `i`.
    pub shard: u32,
    /// Data shards (0 for a copy).
    pub k: u32,
    /// Parity shards (0 for a copy).
    pub m: u32,
    /// Server of each shard (empty for a copy).
    pub stripe: Vec<u32>,
    /// crc32c of the whole object.
    pub checksum: u32,
}

/// A surviving holder's side: stores `piece` of object `id` on server `to`, from its own copy or
/// from `k` shards it fetches and decodes, checked against the object's checksum either way.
pub async fn rebuild(state: &State, dataset: &str, step: u64, id: u64, piece: &Piece, to: u32) -> Result<()> {
    let Piece { shard, k, m, ref stripe, checksum } = *piece;
    let held = if shard == 0 { 0 } else { stripe.iter().position(|s| *s == state.id).map_or(u32::MAX, |j| j as u32 + 1) };
    let (data, h) = state.store.with(dataset, step, (id, held), |o| (o.data.clone(), PutHeader::piece_of(dataset, step, id, o, shard)))?;
    let piece: Vec<u8> = if shard == held && shard > 0 {
        // A retiring server hands over its own shard as it is (its reads verify it later).
        data.to_vec()
    } else if shard == 0 {
        if cairn_core::checksum::crc(&data) != checksum {
            return Err(Error::Corrupt(format!("the copy of object {id:#x} on server {} does not match its checksum", state.id)));
        }
        data.to_vec()
    } else {
        let (k, m) = (k as usize, m as usize);
        let len = (h.region.volume() * u64::from(h.elem)) as usize;
        let mut shards: Vec<Option<Vec<u8>>> = vec![None; k + m];
        shards[held as usize - 1] = Some(data.to_vec());
        let view = state.view()?;
        let lost = shard as usize - 1;
        let others = (0..k + m).filter(|i| *i != lost && *i + 1 != held as usize && view.is_live(stripe[*i]));
        for i in others {
            if shards.iter().flatten().count() >= k {
                break;
            }
            let get = Request::Get { dataset: dataset.to_string(), step, id, want: h.region.clone(), shard: i as u32 + 1, into: None };
            if let Ok((Response::Data { checksum }, bytes)) = crate::peer::fetch(state, stripe[i], &get, state.store.max_reply()).await {
                if cairn_core::checksum::crc(&bytes) == checksum {
                    shards[i] = Some(bytes);
                }
            }
        }
        let code = Code::new(k, m)?;
        let whole = code.decode(&mut shards, len)?;
        if cairn_core::checksum::crc(&whole) != checksum {
            return Err(Error::Corrupt(format!("object {id:#x} decoded for recovery does not match its checksum")));
        }
        if lost < k {
            cairn_core::erasure::data_shard(&whole, k, lost)
        } else {
            code.parity(&whole).swap_remove(lost - k)
        }
    };
    // A whole copy is an extra copy (1); a shard is data (0) or parity (1).
    let copy = if shard == 0 { 1 } else { u32::from(shard > k) };
    let h = PutHeader { checksum: cairn_core::checksum::crc(&piece), copy, ..h };
    crate::peer::call_with(state, to, &h.request(), &piece).await.map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::view;

    #[test]
    fn a_lost_piece_goes_to_the_live_heir_of_its_slot_or_waits() {
        let v = view(4, 3).fail(1).unwrap();
        assert_eq!(target(&v, &[0, 1], 1), None, "no spare took the slot yet: degraded, no rebuild");
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

    #[test]
    fn lazy_recovery_spreads_the_deadline_over_what_is_left() {
        let mut limits = crate::state::Limits { recovery_lazy: true, ..Default::default() };
        assert_eq!(pace(&limits, Duration::ZERO, 119), Some(Duration::from_millis(500)));
        assert_eq!(pace(&limits, Duration::from_secs(30), 59), Some(Duration::from_millis(500)));
        assert_eq!(pace(&limits, Duration::ZERO, 10), Some(Duration::from_secs(1)), "at most a second");
        assert_eq!(pace(&limits, Duration::from_secs(90), 10), Some(Duration::ZERO), "late: no pause");
        assert_eq!(pace(&limits, Duration::ZERO, 0), None);
        limits.set("mtbf", "20s").unwrap();
        assert_eq!(pace(&limits, Duration::ZERO, 9), Some(Duration::from_millis(500)), "a quarter of the MTBF");
        limits.set("recovery_deadline", "2s").unwrap();
        assert_eq!(pace(&limits, Duration::ZERO, 3), Some(Duration::from_millis(500)), "an explicit deadline wins");
        limits.recovery_lazy = false;
        assert_eq!(pace(&limits, Duration::ZERO, 100), None);
    }

    #[test]
    fn recovery_keeps_to_its_byte_rate() {
        let mut limits = crate::state::Limits::default();
        limits.set("recovery_rate", "100MiB/s").unwrap();
        assert_eq!(throttle(limits.recovery_rate, 50 << 20), Some(Duration::from_millis(500)));
        limits.set("recovery_rate", "0").unwrap();
        assert_eq!(throttle(limits.recovery_rate, 50 << 20), None);
        assert!(limits.set("recovery", "eager").is_err() && limits.set("mtbf", "soon").is_err());
    }
}
