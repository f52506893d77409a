//! Prefaulted memory for a fresh server's first steps. A segment's pages cost a fault and a
//! zeroing each the first time (in a VM, often an exit to the host too), and every process that
//! maps it a page-table entry per page: a new cluster's first steps put at ~0.9 GB/s against ~4
//! GB/s once released steps' memory is recycled (issue 45). A thread makes shared segments ahead,
//! of huge pages ([`Segment::ahead`]: a writer's first mapping of one costs a fault per 2 MiB, so
//! a fresh cluster's first 128 MiB puts ran at 0.76–1.04× the warm ones, 0.37–0.59× with small
//! pages; issue 55), up to `[staging] prefault` bytes (default `min(memory, 1GiB)`; 0: none).
//! They were never leased, so any user's lease may take one ([`Segment::claim`] cuts it to size
//! and seals it); a recycled segment still goes only to the user who leased it first.
//!
//! Only two leases' worth is made at once (twice [`FIRST_CHUNK`] from start-up, and twice the
//! first lease's size if those do not fit it), at the lowest nice value; the rest, and whatever
//! replaces what leases take, only while the server moves no object bytes and the machine leaves
//! a whole CPU idle ([`CpuTimes`]), under `SCHED_IDLE` (CPU time no other thread wants) and the
//! idle I/O class, one segment at a time with a pause as long as its making: 3 servers making 1 GiB
//! each at start-up took a third of `make demo`'s write speed from its 4 ranks on 2 cores (issue 55).
//! Before the first lease (a job script starts the cluster seconds before its job) the pause is a
//! short look at the machine only, so that a fresh cluster's first steps find their segments made.
//!
//! Fresh segments are pooled memory: they count against the limit with the recycled buffers and
//! are evicted (last) when a reservation needs room. What eviction takes lowers the target, so a
//! server whose data fills its memory does not churn, making segments only to drop them.

use crate::segment::{Memory, Segment};
use crate::sync::lock;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};
use std::time::Duration;

/// Size of the first segments made: the client's default object size, the size most objects of
/// a big array have.
const FIRST_CHUNK: usize = 16 << 20;

/// Largest segment made ahead (a lease asking for more gets one made for it).
const MAX_CHUNK: usize = 256 << 20;

/// Fresh segments are made only while this share of the memory stays free besides them.
const FREE_SHARE: u64 = 8;

/// Beyond the first two leases' worth, a segment is made only after the server moved no object
/// bytes for this long.
const IDLE: Duration = Duration::from_millis(100);

/// Before any lease came, how long the machine is looked at between segments (a few clock ticks).
const BEFORE_JOBS_LOOK: Duration = Duration::from_millis(30);

/// The pool of fresh segments and what the prefaulter aims for.
#[derive(Debug)]
pub struct Fresh {
    segs: Mutex<HashMap<usize, Vec<Segment>>>,
    /// Bytes in `segs`, and those of them made of huge pages.
    ready: AtomicU64,
    huge: AtomicU64,
    /// Bytes to keep ready.
    target: AtomicU64,
    /// Size of the next segment to make: the latest lease's, if at most [`MAX_CHUNK`].
    chunk: AtomicUsize,
    /// Bytes of fresh segments leases took since start.
    served: AtomicU64,
    /// Bytes still to make at once, before the idle-time rule applies.
    eager: AtomicU64,
    /// Whether a lease came yet.
    leased: std::sync::atomic::AtomicBool,
    /// Rung when a segment is taken.
    taken: (Mutex<()>, Condvar),
}

impl Default for Fresh {
    fn default() -> Self {
        Fresh {
            segs: Mutex::default(),
            ready: AtomicU64::new(0),
            huge: AtomicU64::new(0),
            target: AtomicU64::new(0),
            chunk: AtomicUsize::new(FIRST_CHUNK),
            served: AtomicU64::new(0),
            eager: AtomicU64::new(0),
            leased: Default::default(),
            taken: (Mutex::new(()), Condvar::new()),
        }
    }
}

impl Fresh {
    /// Bytes ready, and bytes aimed for.
    pub fn progress(&self) -> (u64, u64) {
        (self.ready.load(Ordering::Acquire), self.target.load(Ordering::Acquire))
    }

    /// Bytes ready made of huge pages: what an operator checks when first puts run slow (this
    /// kernel may refuse `MADV_COLLAPSE`, or have no free 2 MiB blocks).
    pub fn huge(&self) -> u64 {
        self.huge.load(Ordering::Acquire)
    }

    /// Bytes of fresh segments leases took since start.
    pub fn served(&self) -> u64 {
        self.served.load(Ordering::Acquire)
    }

    /// Sets the bytes to keep ready (two [`FIRST_CHUNK`]s of them made at once).
    pub fn set_target(&self, bytes: u64) {
        self.target.store(bytes, Ordering::Release);
        self.eager.store(bytes.min(2 * FIRST_CHUNK as u64), Ordering::Release);
    }

    /// The smallest fresh segment of `len` to `2 × len` bytes, if any (a lease cuts its segment
    /// to size: a bigger one would have been zeroed for nothing); and notes the size, so the
    /// segments made next fit leases like it. The demo's 4 MiB leases took 16 MiB segments, and
    /// the prefaulter zeroed 4 bytes for each one written (its write phase at 0.83× none).
    pub fn take(&self, len: usize) -> Option<Segment> {
        if len <= MAX_CHUNK {
            self.chunk.store(len, Ordering::Release);
        }
        let mut segs = lock(&self.segs);
        let size = segs.iter().filter(|(s, v)| fits(**s, len) && !v.is_empty()).map(|(s, _)| *s).min();
        let first = !self.leased.swap(true, Ordering::AcqRel);
        let Some(size) = size else {
            drop(segs);
            if first {
                // Two of the first lease's size at once, if what was made at start-up does not fit.
                self.eager.store(self.progress().1.min(2 * len as u64), Ordering::Release);
            }
            self.taken.1.notify_one();
            return None;
        };
        let seg = segs.get_mut(&size).and_then(Vec::pop)?;
        // Counted under the lock, so `ready` never goes below what the pool holds.
        self.ready.fetch_sub(size as u64, Ordering::AcqRel);
        if seg.huge() {
            self.huge.fetch_sub(size as u64, Ordering::AcqRel);
        }
        drop(segs);
        self.served.fetch_add(size as u64, Ordering::AcqRel);
        self.taken.1.notify_one();
        Some(seg)
    }

    /// Pools a segment the prefaulter made (through [`crate::store::Store::add_fresh`]).
    pub(crate) fn put(&self, seg: Segment) {
        let n = seg.len();
        let mut segs = lock(&self.segs);
        self.ready.fetch_add(n as u64, Ordering::AcqRel);
        if seg.huge() {
            self.huge.fetch_add(n as u64, Ordering::AcqRel);
        }
        segs.entry(n).or_default().push(seg);
    }

    /// Moves fresh segments into `gone` until `freed` reaches `bytes`, lowering the target by
    /// what it took (the memory is wanted for data).
    pub fn evict(&self, bytes: u64, freed: &mut u64, gone: &mut Vec<Memory>) {
        let start = *freed;
        let mut segs = lock(&self.segs);
        for v in segs.values_mut() {
            while *freed < bytes {
                let Some(s) = v.pop() else { break };
                *freed += s.len() as u64;
                if s.huge() {
                    self.huge.fetch_sub(s.len() as u64, Ordering::AcqRel);
                }
                gone.push(Memory::Shared(s));
            }
        }
        segs.retain(|_, v| !v.is_empty());
        let took = *freed - start;
        self.ready.fetch_sub(took, Ordering::AcqRel);
        drop(segs);
        let _ = self.target.fetch_update(Ordering::AcqRel, Ordering::Acquire, |t| Some(t.saturating_sub(took)));
    }

    /// Whether no lease came yet: no job runs here, so idle time is made the most of.
    fn before_jobs(&self) -> bool {
        !self.leased.load(Ordering::Acquire)
    }

    /// Whether the next segment is made at once (the first two leases' worth), not in idle time.
    fn short(&self) -> bool {
        self.eager.load(Ordering::Acquire) > 0
    }

    /// Counts a segment of `len` bytes made at once.
    fn made_at_once(&self, len: usize) {
        let _ = self.eager.fetch_update(Ordering::AcqRel, Ordering::Acquire, |e| Some(e.saturating_sub(len as u64)));
    }

    /// The size of the next segment to make (the current lease size), given `free` bytes of
    /// memory beyond the share kept free; `None` while enough are ready or there is no room.
    fn next(&self, free: u64) -> Option<usize> {
        let (ready, target) = self.progress();
        let chunk = self.chunk.load(Ordering::Acquire);
        (ready < target && chunk as u64 <= free).then_some(chunk)
    }

    /// Waits until a segment is taken, or `within` passed.
    pub fn wait(&self, within: Duration) {
        let g = lock(&self.taken.0);
        let _ = self.taken.1.wait_timeout(g, within);
    }
}

/// Whether a fresh segment of `size` bytes may serve a lease of `len`: big enough, and not
/// twice as big.
fn fits(size: usize, len: usize) -> bool {
    size >= len && size <= 2 * len
}

/// What the prefaulter fills: a server's store (implemented by `State`, so this module needs
/// neither it nor the store).
pub trait Filled: Send + Sync + 'static {
    /// The pool of fresh segments.
    fn fresh(&self) -> &Arc<Fresh>;
    /// Bytes of memory free beyond what is used, pooled and the share kept free.
    fn room(&self) -> u64;
    /// Pools a segment made ahead, if there is still room for it (reservations made while it
    /// was being made come first).
    fn add(&self, seg: Segment);
    /// The server's id, for its log.
    fn id(&self) -> u32;
    /// Object bytes the server moved since it started (put and got): unchanged while it idles.
    fn moved(&self) -> u64;
}

/// How the prefault thread is scheduled: `Soon` (the lowest nice value) or `Idle` (`SCHED_IDLE`
/// and the idle I/O class). Best effort: a refusal leaves it as it was.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Priority {
    Soon,
    Idle,
}

fn schedule(p: Priority) {
    // SAFETY: these change the scheduling of this thread (its tid) only.
    unsafe {
        let tid = libc::gettid();
        let param = libc::sched_param { sched_priority: 0 };
        let policy = if p == Priority::Idle { libc::SCHED_IDLE } else { libc::SCHED_OTHER };
        libc::sched_setscheduler(tid, policy, &param);
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 19);
        // ioprio_set(IOPRIO_WHO_PROCESS, tid, class << 13): 3 is idle, 2 best effort (level 7).
        let class = if p == Priority::Idle { 3 << 13 } else { (2 << 13) | 7 };
        libc::syscall(libc::SYS_ioprio_set, 1, tid, class);
    }
}

/// Waits `within`; then the server if it moved no object bytes meanwhile and the machine left
/// a whole CPU idle, `Ok(None)` if not, `Err` if the server is gone.
fn idle_for<T: Filled>(server: &Weak<T>, s: Arc<T>, within: Duration) -> Result<Option<Arc<T>>, ()> {
    let before = s.moved();
    drop(s);
    let cpu = CpuTimes::now();
    std::thread::sleep(within);
    let idle = cpu.zip(CpuTimes::now()).map_or(f64::INFINITY, |(a, b)| a.idle_cpus(&b));
    match server.upgrade() {
        Some(s) => Ok((s.moved() == before && idle >= 1.0).then_some(s)),
        None => Err(()),
    }
}

/// The machine's CPU time so far, from `/proc/stat` (in clock ticks, all CPUs together).
#[derive(Debug, Clone, Copy, PartialEq)]
struct CpuTimes {
    idle: u64,
    total: u64,
    cpus: u32,
}

impl CpuTimes {
    /// Now; `None` where `/proc/stat` cannot be read (then only the server's own idleness counts).
    fn now() -> Option<CpuTimes> {
        CpuTimes::parse(&std::fs::read_to_string("/proc/stat").ok()?)
    }

    /// From `/proc/stat`'s text: its `cpu` line (idle and iowait are idle time; guest time is
    /// already counted in user time) and how many `cpuN` lines follow.
    fn parse(stat: &str) -> Option<CpuTimes> {
        let mut lines = stat.lines();
        let fields: Vec<u64> = lines.next()?.strip_prefix("cpu ")?.split_whitespace().map(|f| f.parse().ok()).collect::<Option<_>>()?;
        let idle = fields.get(3)? + fields.get(4).unwrap_or(&0);
        let total = fields.iter().take(8).sum();
        let cpus = lines.take_while(|l| l.starts_with("cpu")).count() as u32;
        Some(CpuTimes { idle, total, cpus: cpus.max(1) })
    }

    /// How many CPUs' worth stayed idle from `self` to `later`. The prefaulter's work is taken
    /// from whatever runs beside it whatever its priority: memory bandwidth, and in a VM the
    /// host's faults on a first touch, which stall the whole virtual CPU (4 MiB of huge pages
    /// took 9–10 ms from memory the host had taken back, 0.2–0.5 ms otherwise). So beyond the
    /// first leases' worth it makes segments only while the machine leaves a whole CPU idle.
    fn idle_cpus(&self, later: &CpuTimes) -> f64 {
        let total = later.total.saturating_sub(self.total);
        if total == 0 {
            return 0.0;
        }
        later.idle.saturating_sub(self.idle) as f64 / total as f64 * f64::from(later.cpus)
    }
}

/// The room for fresh segments in a store of `limit` bytes with `taken` used or pooled.
pub fn room(limit: u64, taken: u64) -> u64 {
    limit.saturating_sub(taken + limit / FREE_SHARE)
}

/// Starts the prefaulter of `server`, aiming for `target` bytes; it ends with the server.
pub fn spawn<T: Filled>(server: Weak<T>, target: u64) {
    let Some(s) = server.upgrade() else { return };
    s.fresh().set_target(target);
    drop(s);
    if target == 0 {
        return;
    }
    let started = std::thread::Builder::new().name("cairn-prefault".into()).spawn(move || {
        // Writers' copies and the network come first.
        let mut now = Priority::Soon;
        schedule(now);
        // Whether the machine stayed idle through the short look after the last segment, made
        // before any job came (then the next is made without the longer wait).
        let mut still_idle = false;
        loop {
            let Some(s) = server.upgrade() else { return };
            match s.fresh().next(s.room()) {
                Some(len) => {
                    let wanted = if s.fresh().short() { Priority::Soon } else { Priority::Idle };
                    if wanted != now {
                        now = wanted;
                        schedule(now);
                    }
                    let s = if now == Priority::Idle && !std::mem::take(&mut still_idle) {
                        // Only once the server moved no bytes for a while, and the machine left a
                        // whole CPU idle meanwhile: looked at again after.
                        match idle_for(&server, s, IDLE) {
                            Ok(Some(s)) => s,
                            Ok(None) => continue,
                            Err(()) => return,
                        }
                    } else {
                        s
                    };
                    let made = std::time::Instant::now();
                    match Segment::ahead(len) {
                        Ok(seg) => {
                            tracing::debug!(
                                server = s.id(),
                                len,
                                ms = made.elapsed().as_secs_f64() * 1e3,
                                soon = now == Priority::Soon,
                                "prefaulted a segment"
                            );
                            if now == Priority::Soon {
                                s.fresh().made_at_once(len);
                            }
                            s.add(seg)
                        }
                        Err(e) => {
                            tracing::warn!(server = s.id(), "prefaulting stopped: {e}");
                            s.fresh().set_target(0);
                            return;
                        }
                    }
                    if now == Priority::Idle {
                        // Paced once a job runs: at most half of the idle time. Before, a short
                        // look, and on at once if the machine stayed idle: a job script starts
                        // the cluster seconds before its job, time nothing else wants.
                        let before_jobs = s.fresh().before_jobs();
                        let pause = if before_jobs { BEFORE_JOBS_LOOK } else { made.elapsed() };
                        match idle_for(&server, s, pause) {
                            Ok(s) => still_idle = before_jobs && s.is_some(),
                            Err(()) => return,
                        }
                    }
                }
                None => {
                    let fresh = s.fresh().clone();
                    drop(s);
                    // Re-checked now and then: room may come back as steps are released.
                    fresh.wait(Duration::from_secs(1));
                }
            }
        }
    });
    if let Err(e) = started {
        tracing::warn!("no prefault thread ({e}); first steps fault their pages in");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_idle_share_of_the_machine_is_read_from_proc_stat() {
        let at = |user: u64, idle: u64| format!("cpu  {user} 0 10 {idle} 5 0 0 0 0 0\ncpu0 1 2 3 4\ncpu1 1 2 3 4\nintr 5\n");
        let a = CpuTimes::parse(&at(100, 1000)).unwrap();
        assert_eq!(a, CpuTimes { idle: 1005, total: 1115, cpus: 2 });
        let busy = CpuTimes::parse(&at(300, 1000)).unwrap();
        assert_eq!(a.idle_cpus(&busy), 0.0, "both CPUs busy");
        let half = CpuTimes::parse(&at(200, 1100)).unwrap();
        assert!((a.idle_cpus(&half) - 1.0).abs() < 1e-9, "one CPU's worth idle");
        assert_eq!(a.idle_cpus(&a), 0.0, "no time passed: not known idle");
        assert!(CpuTimes::parse("intr 5\n").is_none());
        assert!(CpuTimes::now().is_some_and(|c| c.cpus >= 1 && c.total >= c.idle));
    }

    const MIB: usize = 1 << 20;

    #[test]
    fn a_lease_takes_a_segment_that_fits_and_the_next_ones_are_made_its_size() {
        let f = Fresh::default();
        f.set_target(64 * MIB as u64);
        assert_eq!(f.next(u64::MAX), Some(FIRST_CHUNK), "before any lease: the client's default object size");
        for _ in 0..2 {
            assert!(f.short(), "two of 16 MiB made at once");
            f.made_at_once(16 * MIB);
            f.put(Segment::fresh(16 * MIB).unwrap());
        }
        assert!(!f.short(), "the rest waits for idle time");
        // A 4 MiB lease would cut a 16 MiB segment to a quarter: it is made for it instead,
        // two of its size are made at once, and what is made next is its size.
        assert!(f.take(4 * MIB).is_none());
        assert_eq!((f.short(), f.next(u64::MAX)), (true, Some(4 * MIB)));
        f.made_at_once(8 * MIB);
        assert!(f.take(4 * MIB).is_none() && !f.short(), "only the first lease's size is made at once");
        f.put(Segment::fresh(5 * MIB).unwrap());
        assert_eq!(f.take(4 * MIB).map(|s| s.len()), Some(5 * MIB), "within twice the lease");
        assert_eq!(f.take(12 * MIB).map(|s| s.len()), Some(16 * MIB));
        assert_eq!(f.served(), (5 + 16) as u64 * MIB as u64);
        assert_eq!(f.next(8 * MIB as u64), None, "no room for a 12 MiB segment");
    }
}
