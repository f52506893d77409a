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
use cairn_core::index::Redundancy;
use cairn_core::{Error, Result};
use cairn_proto::message::{Request, Response};
use cairn_proto::ClusterView;
use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Tries per object before it is counted as lost.
const TRIES: u32 = 3;

/// The leader's recovery queue and counters.
#[derive(Debug, Default)]
pub struct Recovery {
    queue: Mutex<VecDeque<Job>>,
    running: AtomicBool,
    rebuilt: AtomicU64,
    lost: AtomicU64,
    /// Cuts a lazy pause short when touched objects are queued.
    wake: tokio::sync::Notify,
}

/// One object piece to rebuild.
#[derive(Debug, Clone)]
struct Job {
    dataset: String,
    step: u64,
    id: u64,
    from: u32,
    to: u32,
    tries: u32,
    /// Touched by a read: rebuilt without a pause.
    urgent: bool,
}

impl Recovery {
    /// Objects waiting to be rebuilt.
    pub fn pending(&self) -> u64 {
        lock(&self.queue).len() as u64
    }

    /// Objects rebuilt since this server started.
    pub fn rebuilt(&self) -> u64 {
        self.rebuilt.load(Ordering::Relaxed)
    }

    /// Objects that could not be rebuilt (no surviving piece: beyond their level).
    pub fn lost(&self) -> u64 {
        self.lost.load(Ordering::Relaxed)
    }

    /// After a view change committed at the leader: queues every committed object with a piece
    /// on a server whose slot another server took, or on a server back in its own slot (it
    /// came back empty, no spare having taken its place), and starts rebuilding.
    pub fn view_changed(&self, state: &Arc<State>, before: &ClusterView, after: &ClusterView) {
        let mut moved: Vec<(u32, u32)> = before.slots.iter().zip(&after.slots).filter(|(a, b)| a != b).map(|(a, b)| (*a, *b)).collect();
        let back = before.down.iter().filter(|s| !after.down.contains(s) && after.slots.contains(s));
        moved.extend(back.map(|s| (*s, *s)));
        self.queue_moved(state, moved);
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

    /// On becoming leader: queues what the view's hand-overs still leave on lost servers (a
    /// previous leader may have died with recovery under way).
    pub fn resume(&self, state: &Arc<State>) {
        let Ok(view) = state.view() else { return };
        let moved = view.took.iter().copied().filter(|(from, to)| !view.is_live(*from) && view.is_live(*to)).collect();
        lock(&self.queue).clear();
        self.queue_moved(state, moved);
    }

    fn queue_moved(&self, state: &Arc<State>, moved: Vec<(u32, u32)>) {
        let Ok(log) = crate::control::leader(state) else { return };
        if moved.is_empty() {
            return;
        }
        let mut jobs = Vec::new();
        for ds in state.meta.datasets(log) {
            for step in state.meta.steps(log, &ds) {
                let Ok(index) = state.meta.index(log, &ds, step) else { continue };
                for o in index.blocks.iter().flat_map(|b| &b.objects) {
                    for (from, to) in &moved {
                        if o.servers().contains(from) {
                            jobs.push(Job { dataset: ds.clone(), step, id: o.id, from: *from, to: *to, tries: 0, urgent: false });
                        }
                    }
                }
            }
        }
        if jobs.is_empty() {
            return;
        }
        eprintln!("cairn server {}: recovering {} objects onto {:?}", state.id, jobs.len(), moved);
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
                let Some(job) = lock(&state.recovery.queue).pop_front() else {
                    state.recovery.running.store(false, Ordering::Release);
                    return;
                };
                match rebuild_one(&state, &job).await {
                    Ok(Some(bytes)) => {
                        state.recovery.rebuilt.fetch_add(1, Ordering::Relaxed);
                        sent += bytes;
                    }
                    // Released, or no longer there: nothing to rebuild.
                    Ok(None) => {}
                    Err(e) if job.tries + 1 < TRIES && e.kind() != cairn_core::ErrorKind::DataLoss => {
                        lock(&state.recovery.queue).push_back(Job { tries: job.tries + 1, ..job });
                    }
                    Err(e) => {
                        eprintln!(
                            "cairn server {}: object {:#x} of '{}' step {} not rebuilt: {e}",
                            state.id, job.id, job.dataset, job.step
                        );
                        state.recovery.lost.fetch_add(1, Ordering::Relaxed);
                    }
                }
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

/// Rebuilds one piece and records it: the bytes sent to the new holder, `None` when the object
/// is gone or already moved.
async fn rebuild_one(state: &Arc<State>, job: &Job) -> Result<Option<u64>> {
    let log = crate::control::leader(state)?;
    let view = state.view()?;
    let Ok(index) = state.meta.index(log, &job.dataset, job.step) else { return Ok(None) };
    let found = index.blocks.iter().flat_map(|b| b.objects.iter().map(move |o| (b, o))).find(|(_, o)| o.id == job.id);
    let Some((block, o)) = found else { return Ok(None) };
    // A server back in its own slot (`from == to`) is refilled: the index names it already.
    let refill = job.from == job.to;
    if !o.servers().contains(&job.from) || (o.servers().contains(&job.to) && !refill) {
        return Ok(None);
    }
    let bytes = o.region.volume() * (block.len / block.region.volume().max(1));
    let (shard, k, m, stripe, sources) = match &o.redundancy {
        Redundancy::Replicated { servers } => (0, 0, 0, Vec::new(), servers.clone()),
        Redundancy::Encoded { k, m, shards } => {
            let lost = shards.iter().position(|s| *s == job.from).expect("checked above") as u32;
            (lost + 1, *k, *m, shards.clone(), shards.clone())
        }
        Redundancy::Single => {
            return Err(Error::DataLoss(format!("object {:#x} had one copy, on server {}", job.id, job.from)));
        }
    };
    let live: Vec<u32> = sources.iter().copied().filter(|s| *s != job.from && view.is_live(*s)).collect();
    let source = *live.first().ok_or_else(|| Error::DataLoss(format!("no live server holds a piece of object {:#x}", job.id)))?;
    let piece = Piece { shard, k, m, stripe, checksum: o.checksum };
    if source == state.id {
        rebuild(state, &job.dataset, job.step, job.id, &piece, job.to).await?;
    } else {
        let Piece { shard, k, m, stripe, checksum } = piece;
        let req = Request::Rebuild { dataset: job.dataset.clone(), step: job.step, id: job.id, shard, k, m, stripe, checksum, to: job.to };
        crate::peer::call(state, source, &req).await?;
    }
    let recorded = refill || state.meta.rebuilt(log, &job.dataset, job.step, vec![(job.id, job.from, job.to)]).await? > 0;
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
    let piece: Vec<u8> = if shard == 0 {
        if crc32c::crc32c(&data) != checksum {
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
            let get = Request::Get { dataset: dataset.to_string(), step, id, want: h.region.clone(), shard: i as u32 + 1 };
            if let Ok((Response::Data { checksum }, bytes)) = crate::peer::fetch(state, stripe[i], &get, state.store.max_reply()).await {
                if crc32c::crc32c(&bytes) == checksum {
                    shards[i] = Some(bytes);
                }
            }
        }
        let code = Code::new(k, m)?;
        let whole = code.decode(&mut shards, len)?;
        if crc32c::crc32c(&whole) != checksum {
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
    let h = PutHeader { checksum: crc32c::crc32c(&piece), copy, ..h };
    crate::peer::call_with(state, to, &h.request(), &piece).await.map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

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
