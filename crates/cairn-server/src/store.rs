//! The object store: objects by (dataset, step, id, shard), with memory accounting. Shard 0 is a
//! whole copy; shard `i + 1` is erasure-code shard `i` of an encoded object. Space is reserved
//! before a payload is read, so a put that would pass the limit is refused without allocating.

use crate::prefault::Fresh;
use crate::segment::{Memory, Segment};
use crate::sync::lock;
use cairn_core::{Error, Region, Result};
use cairn_proto::message::ObjectInfo;
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// One stored object.
#[derive(Debug)]
pub struct Object {
    /// Variable.
    pub var: String,
    /// Its box.
    pub region: Region,
    /// Element size.
    pub elem: u32,
    /// Writer session that put it.
    pub session: String,
    /// Rank of the writer that put it.
    pub writer: u32,
    /// crc32c of `data`.
    pub checksum: u32,
    /// C-order bytes of `region`.
    pub data: Arc<Memory>,
    /// Whether its step committed.
    pub sealed: bool,
    /// Which copy it is (0: the first); for a shard, 0 for data and 1 for parity.
    pub copy: u32,
    /// For a shard: the geometry of its stripe, as its put named it (`None` for a whole copy).
    pub stripe: Option<cairn_proto::message::Geometry>,
}

/// An object's key within a step: its id and shard.
pub type ObjKey = (u64, u32);

type StepKey = (String, u64);

/// Which objects of a step [`Store::drop_objects`] frees (every field narrows it).
#[derive(Debug, Default, Clone, Copy)]
pub struct Which<'a> {
    /// Only this session's.
    pub session: Option<&'a str>,
    /// Only this writer's.
    pub writer: Option<u32>,
    /// Only these objects (when not empty).
    pub ids: &'a [u64],
    /// Every session's but this one's sealed objects (after its step committed, its unsealed
    /// ones are leftovers of puts placed again elsewhere).
    pub except: Option<&'a str>,
    /// Only this shard of each of `ids`, sealed or not.
    pub shard: Option<u32>,
}

/// A server keeps 1/this of its memory for the oldest step still being written of a dataset
/// (see [`Store::headroom`]).
const HEADROOM_SHARE: u64 = 8;

/// Upper bound of a built reply (see [`Store::max_reply`]).
pub const MAX_REPLY: u64 = 256 << 20;

/// Objects held by this server.
#[derive(Debug)]
pub struct Store {
    server: u32,
    limit: u64,
    used: AtomicU64,
    steps: Mutex<HashMap<StepKey, HashMap<ObjKey, Object>>>,
    pool: Pool,
    /// Counts changes of what is held or reserved, for those waiting on one (room for a put,
    /// a test's condition) instead of polling.
    changes: tokio::sync::watch::Sender<u64>,
}

/// Buffers of freed objects kept for reuse by size. Writing into fresh memory costs a page fault
/// per 4 KiB (measured: puts at ~1.1 GB/s with fresh buffers vs the loopback socket's ~2.8 GB/s);
/// steady-state steps (keep_last) free exactly the sizes the next step needs. Pooled bytes count
/// against the limit, and are given back to the system first when space runs short.
#[derive(Debug, Default)]
struct Pool {
    bufs: Mutex<HashMap<usize, Vec<Vec<u8>>>>,
    /// Shared segments of same-node puts, likewise, by owner uid and size: a segment's first
    /// lessee may keep a mapping of it, so it is leased again only to that user (issue 40).
    segs: Mutex<HashMap<(u32, usize), Vec<Segment>>>,
    /// Segments made ahead, never leased (see [`crate::prefault`]).
    fresh: Arc<Fresh>,
    bytes: AtomicU64,
}

/// Space reserved for a payload being received; given back unless [`Store::insert`] consumes it.
#[derive(Debug)]
pub struct Reservation<'a> {
    store: &'a Store,
    bytes: u64,
}

impl Drop for Reservation<'_> {
    fn drop(&mut self) {
        self.store.give_back(self.bytes);
    }
}

impl Reservation<'_> {
    /// Keeps the bytes counted as used; whoever holds them gives them back with [`Store::free`].
    pub fn keep(self) {
        std::mem::forget(self);
    }
}

impl Store {
    /// The reservation of `bytes` kept earlier with [`Reservation::keep`] (a lease's), to pass
    /// on to [`Store::insert`] or give back by dropping it.
    pub fn reserved(&self, bytes: u64) -> Reservation<'_> {
        Reservation { store: self, bytes }
    }

    /// Gives back bytes kept with [`Reservation::keep`].
    pub fn free(&self, bytes: u64) {
        self.give_back(bytes);
    }

    fn give_back(&self, bytes: u64) {
        self.used.fetch_sub(bytes, Ordering::AcqRel);
        self.changed();
    }

    fn changed(&self) {
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// A receiver told of every later change of what is held or reserved: subscribe, then check
    /// the condition, then wait for [`tokio::sync::watch::Receiver::changed`] (no change is missed).
    pub fn changes(&self) -> tokio::sync::watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// An empty store of server `server` holding at most `limit` bytes.
    pub fn new(server: u32, limit: u64) -> Store {
        Store {
            server,
            limit,
            used: AtomicU64::new(0),
            steps: Mutex::new(HashMap::new()),
            pool: Pool::default(),
            changes: tokio::sync::watch::channel(0).0,
        }
    }

    /// Bytes held or reserved.
    pub fn used(&self) -> u64 {
        self.used.load(Ordering::Acquire)
    }

    /// The limit.
    pub fn limit(&self) -> u64 {
        self.limit
    }

    /// Most bytes one reply that is built (not a stored object shared as is) may carry: the
    /// memory limit, and at most [`MAX_REPLY`].
    pub fn max_reply(&self) -> u64 {
        self.limit.min(MAX_REPLY)
    }

    /// Reserves `bytes`, or fails with [`Error::Capacity`] naming the server and the sizes.
    pub fn reserve(&self, bytes: u64) -> Result<Reservation<'_>> {
        self.reserve_keeping(bytes, 0)
    }

    /// [`Store::reserve`] that leaves `keep` bytes free (see [`Store::headroom`]).
    fn reserve_keeping(&self, bytes: u64, keep: u64) -> Result<Reservation<'_>> {
        let mut cur = self.used.load(Ordering::Acquire);
        let over = cur.saturating_add(bytes).saturating_add(self.pool.bytes.load(Ordering::Acquire)).saturating_sub(self.limit);
        if over > 0 {
            self.evict(over);
        }
        loop {
            let next = cur.saturating_add(bytes);
            if next.saturating_add(keep) > self.limit {
                let kept = if keep > 0 {
                    format!(" ({keep} bytes are kept for an older step other writers still owe: this put is for a later one)")
                } else {
                    String::new()
                };
                return Err(Error::Capacity(format!(
                    "server {} is full: {} of {} bytes in use, a put of {} bytes does not fit{kept}; release old steps \
                     (f.release(step) or keep_last) and retry, or start servers with more --memory",
                    self.server, cur, self.limit, bytes
                )));
            }
            match self.used.compare_exchange_weak(cur, next, Ordering::AcqRel, Ordering::Acquire) {
                Ok(_) => {
                    self.changed();
                    return Ok(Reservation { store: self, bytes });
                }
                Err(now) => cur = now,
            }
        }
    }

    /// Gives at least `bytes` of pooled memory back to the system (or all of it). Only what a
    /// reservation lacks: emptying the whole pool whenever a writer ran ahead into a full server
    /// made every later put fault in fresh pages (two writers fell from 7.6 to 2.8 GB/s).
    fn evict(&self, bytes: u64) {
        let mut freed = 0u64;
        // Freed after the locks are let go: unmapping segments takes system calls.
        let mut gone: Vec<Memory> = Vec::new();
        {
            let mut bufs = lock(&self.pool.bufs);
            let mut segs = lock(&self.pool.segs);
            take_until(&mut bufs, bytes, &mut freed, &mut gone, |k| *k, Memory::Heap);
            take_until(&mut segs, bytes, &mut freed, &mut gone, |k| k.1, Memory::Shared);
        }
        // Fresh segments last: recycled memory serves the same sizes again, they serve any.
        if freed < bytes {
            self.pool.fresh.evict(bytes, &mut freed, &mut gone);
        }
        // Counted before being pushed, uncounted after being popped: never below what the maps hold.
        self.pool.bytes.fetch_sub(freed, Ordering::AcqRel);
        drop(gone);
    }

    /// Reserves `len` bytes and a zeroed-or-recycled buffer of exactly that size to receive a
    /// payload into (its old contents are overwritten entirely by the payload).
    pub fn reserve_buffer(&self, len: usize) -> Result<(Reservation<'_>, Vec<u8>)> {
        self.reserve_pooled(&self.pool.bufs, len, len, 0, |len| Ok(vec![0u8; len]))
    }

    /// [`Store::reserve_buffer`] for a writer's object of `step` of `dataset`, which leaves the
    /// [`Store::headroom`] free.
    pub fn reserve_buffer_for(&self, dataset: &str, step: u64, len: usize) -> Result<(Reservation<'_>, Vec<u8>)> {
        let keep = self.headroom(dataset, step);
        self.reserve_pooled(&self.pool.bufs, len, len, keep, |len| Ok(vec![0u8; len]))
    }

    /// Bytes a put of `step` of `dataset` must leave free: a share of the memory while an older
    /// step of the dataset is still being written here. A writer running several steps ahead
    /// then cannot fill the server with steps that commit only after that one, which the other
    /// writers could no longer put (each waiting for room the others hold).
    pub fn headroom(&self, dataset: &str, step: u64) -> u64 {
        let behind = lock(&self.steps).iter().any(|((d, s), held)| *s < step && d == dataset && held.values().any(|o| !o.sealed));
        if behind {
            self.limit / HEADROOM_SHARE
        } else {
            0
        }
    }

    /// Reserves `len` bytes and a pooled or new shared segment of exactly that size for a
    /// same-node writer of user `owner` to fill: only a segment that user leased before is reused.
    /// Else a fresh one made ahead is cut to size, else a new one is made.
    /// Both are taken out of the pool before the reservation, so a lease near the limit never
    /// evicts the very segment it would use.
    pub fn reserve_segment(&self, len: usize, owner: u32) -> Result<(Reservation<'_>, Segment)> {
        let pooled = self.pooled(&self.pool.segs, &(owner, len), len).map(Ok).or_else(|| {
            let s = self.pool.fresh.take(len)?;
            self.pool.bytes.fetch_sub(s.len() as u64, Ordering::AcqRel);
            Some(s.claim(len, owner))
        });
        match self.reserve_keeping(len as u64, 0) {
            Ok(r) => Ok((r, pooled.unwrap_or_else(|| Segment::new(len, owner))?)),
            Err(e) => {
                if let Some(Ok(s)) = pooled {
                    self.recycle_memory(s.into());
                }
                Err(e)
            }
        }
    }

    /// The segments made ahead of leases.
    pub fn fresh(&self) -> &Arc<Fresh> {
        &self.pool.fresh
    }

    /// Pools a segment made ahead of leases.
    pub fn add_fresh(&self, seg: Segment) {
        self.pool.bytes.fetch_add(seg.len() as u64, Ordering::AcqRel);
        self.pool.fresh.put(seg);
    }

    /// Bytes of pooled memory (recycled buffers and segments, and segments made ahead).
    pub fn pooled_bytes(&self) -> u64 {
        self.pool.bytes.load(Ordering::Acquire)
    }

    /// The pooled memory of `len` bytes is taken before the reservation, so a full server reuses
    /// it instead of evicting it to make room and then allocating fresh memory.
    fn reserve_pooled<K: std::hash::Hash + Eq, T: Into<Memory>>(
        &self,
        pool: &Mutex<HashMap<K, Vec<T>>>,
        key: K,
        len: usize,
        keep: u64,
        new: impl FnOnce(usize) -> Result<T>,
    ) -> Result<(Reservation<'_>, T)> {
        let pooled = self.pooled(pool, &key, len);
        match self.reserve_keeping(len as u64, keep) {
            Ok(r) => Ok((r, pooled.map_or_else(|| new(len), Ok)?)),
            Err(e) => {
                if let Some(m) = pooled {
                    self.recycle_memory(m.into());
                }
                Err(e)
            }
        }
    }

    /// Memory of `len` bytes taken out of `pool` under `key`, if it holds some.
    fn pooled<K: std::hash::Hash + Eq, T>(&self, pool: &Mutex<HashMap<K, Vec<T>>>, key: &K, len: usize) -> Option<T> {
        let m = lock(pool).get_mut(key).and_then(Vec::pop)?;
        self.pool.bytes.fetch_sub(len as u64, Ordering::AcqRel);
        Some(m)
    }

    fn recycle(&self, objs: impl IntoIterator<Item = Object>) {
        for o in objs {
            // Only memory no reader still holds.
            if let Ok(m) = Arc::try_unwrap(o.data) {
                self.recycle_memory(m);
            }
        }
    }

    /// Pools the memory of a freed object (or an unused lease) for the next of its size, while
    /// pool + used stay within the limit; else it goes back to the system.
    pub fn recycle_memory(&self, m: Memory) {
        let n = m.len() as u64;
        if n < 64 << 10 || self.used() + self.pool.bytes.load(Ordering::Acquire) + n > self.limit {
            return;
        }
        self.pool.bytes.fetch_add(n, Ordering::AcqRel);
        match m {
            Memory::Heap(b) => lock(&self.pool.bufs).entry(b.len()).or_default().push(b),
            Memory::Shared(s) => lock(&self.pool.segs).entry((s.owner(), s.bytes().len())).or_default().push(s),
        }
    }

    /// Stores an object under `(dataset, step, key)`, consuming the reservation of its bytes. An
    /// object put again (a writer retrying) replaces the earlier one, unless that one is sealed:
    /// a committed step's objects never change (the reservation is given back).
    pub fn insert(&self, dataset: &str, step: u64, key: ObjKey, obj: Object, r: Reservation<'_>) -> Result<()> {
        let mut steps = lock(&self.steps);
        let held = steps.entry((dataset.to_string(), step)).or_default();
        if held.get(&key).is_some_and(|o| o.sealed) {
            return Err(Error::AlreadyExists(format!(
                "object {:#x} (shard {}) of dataset '{dataset}' step {step} on server {} is sealed (its step is committed or being \
                 committed); committed steps are immutable, write a new step number",
                key.0, key.1, self.server
            )));
        }
        std::mem::forget(r);
        let old = held.insert(key, obj);
        drop(steps);
        self.give_back(old.map_or(0, |o| o.data.len() as u64));
        Ok(())
    }

    /// The bytes, box, element size and checksum of an object's copy or shard.
    pub fn get(&self, dataset: &str, step: u64, key: ObjKey) -> Result<(Arc<Memory>, Region, u32, u32)> {
        self.with(dataset, step, key, |o| (o.data.clone(), o.region.clone(), o.elem, o.checksum))
    }

    /// `f` of an object's copy or shard (under the store's lock: keep it short).
    pub fn with<T>(&self, dataset: &str, step: u64, key: ObjKey, f: impl FnOnce(&Object) -> T) -> Result<T> {
        let steps = lock(&self.steps);
        let o = steps.get(&(dataset.to_string(), step)).and_then(|s| s.get(&key)).ok_or_else(|| {
            let what = if key.1 == 0 { "copy of".to_string() } else { format!("shard {} of", key.1 - 1) };
            Error::NotFound(format!(
                "server {} holds no {what} object {:#x} of dataset '{dataset}' step {step}; the step may have been \
                 released, or the object encoded since (read the step's index again)",
                self.server, key.0
            ))
        })?;
        Ok(f(o))
    }

    /// Checks that the objects `keys` of `session` (`bytes` in all) are held for the step and
    /// seals them; frees objects other sessions left in it, and this session's objects the index
    /// does not name here (a put that failed, say across a view change, may still have landed
    /// here before its objects were placed again elsewhere).
    pub fn seal(&self, dataset: &str, step: u64, session: &str, keys: &[ObjKey], bytes: u64) -> Result<()> {
        let want: std::collections::HashSet<ObjKey> = keys.iter().copied().collect();
        let mut steps = lock(&self.steps);
        let held = steps.entry((dataset.to_string(), step)).or_default();
        let (n, b) = held
            .iter()
            .filter(|(k, o)| o.session == session && want.contains(k))
            .fold((0u64, 0u64), |(n, b), (_, o)| (n + 1, b + o.data.len() as u64));
        if n == 0 && !want.is_empty() {
            // It lost them all (it restarted, or was declared down and rejoined empty): to the
            // commit, like a server that is gone; the step commits if the other copies suffice.
            steps.retain(|_, h| !h.is_empty());
            return Err(Error::Unavailable(format!(
                "server {} holds none of the {} objects the writers put for dataset '{dataset}' step {step} \
                 (it restarted or rejoined empty since)",
                self.server,
                want.len()
            )));
        }
        if (n, b) != (want.len() as u64, bytes) {
            let missing: Vec<String> =
                want.iter().filter(|k| !held.contains_key(k)).take(5).map(|(id, sh)| format!("{id:#x}/{sh}")).collect();
            return Err(Error::Conflict(format!(
                "server {} holds {n} objects ({b} bytes) of dataset '{dataset}' step {step}, but the writers put \
                 {} ({bytes} bytes) there (missing: [{}]); the step was not committed, write it again",
                self.server,
                want.len(),
                missing.join(", ")
            )));
        }
        let mut gone = Vec::new();
        // Sealed objects not named stay: shards and copies that encoding or recovery stored
        // after an earlier seal of this step (a seal repeated by a new leader must not undo them).
        let stale = |k: &ObjKey, o: &Object| o.session != session || (!want.contains(k) && !o.sealed);
        for k in held.iter().filter(|(k, o)| stale(k, o)).map(|(k, _)| *k).collect::<Vec<_>>() {
            gone.extend(held.remove(&k));
        }
        held.values_mut().for_each(|o| o.sealed = true);
        drop(steps);
        self.give_back(gone.iter().map(|o| o.data.len() as u64).sum());
        self.recycle(gone);
        Ok(())
    }

    /// Frees objects of a step (only a session's, a writer's, the listed ones, or those of every
    /// session but `except`, if given). Returns bytes freed. A writer's own clean-up (by writer
    /// or by ids) never frees sealed objects: its step may have committed after all (an end of
    /// step whose answer was lost); only the coordinator (abort, release, `shard`) does.
    pub fn drop_objects(&self, dataset: &str, step: u64, which: &Which<'_>) -> u64 {
        let mut steps = lock(&self.steps);
        let key = (dataset.to_string(), step);
        let Some(held) = steps.get_mut(&key) else { return 0 };
        let Which { session, writer, ids, except, shard } = *which;
        let hits: Vec<ObjKey> = held
            .iter()
            .filter(|((id, sh), o)| {
                !(o.sealed && shard.is_none() && (writer.is_some() || !ids.is_empty()))
                    && session.is_none_or(|s| o.session == s)
                    && except.is_none_or(|s| o.session != s || !o.sealed)
                    && writer.is_none_or(|w| o.writer == w)
                    && (ids.is_empty() || ids.contains(id))
                    && shard.is_none_or(|s| *sh == s)
            })
            .map(|(k, _)| *k)
            .collect();
        let gone: Vec<Object> = hits.iter().filter_map(|id| held.remove(id)).collect();
        if held.is_empty() {
            steps.remove(&key);
        }
        drop(steps);
        let freed = gone.iter().map(|o| o.data.len() as u64).sum();
        self.give_back(freed);
        self.recycle(gone);
        freed
    }

    /// Frees every object; returns bytes freed.
    pub fn clear(&self) -> u64 {
        let gone: Vec<Object> = std::mem::take(&mut *lock(&self.steps)).into_values().flat_map(|s| s.into_values()).collect();
        let freed = gone.iter().map(|o| o.data.len() as u64).sum();
        self.give_back(freed);
        self.recycle(gone);
        freed
    }

    /// (objects, distinct steps) held.
    pub fn counts(&self) -> (u64, u64) {
        let steps = lock(&self.steps);
        (steps.values().map(|s| s.len() as u64).sum(), steps.len() as u64)
    }

    /// (extra copies held, shards held, bytes of first copies and data shards held).
    pub fn copies(&self) -> (u64, u64, u64) {
        let steps = lock(&self.steps);
        steps.values().flat_map(|s| s.iter()).fold((0, 0, 0), |(n, sh, b), ((_, shard), o)| {
            let data = if o.copy == 0 { o.data.len() as u64 } else { 0 };
            match (*shard, o.copy) {
                (0, c) if c > 0 => (n + 1, sh, b),
                (0, _) => (n, sh, b + data),
                _ => (n, sh + 1, b + data),
            }
        })
    }

    /// Bytes of objects whose memory is a segment a same-node writer filled.
    pub fn shared_bytes(&self) -> u64 {
        let steps = lock(&self.steps);
        steps.values().flat_map(|s| s.values()).filter(|o| matches!(*o.data, Memory::Shared(_))).map(|o| o.data.len() as u64).sum()
    }

    /// Every object, for the placement view.
    pub fn list(&self) -> Vec<ObjectInfo> {
        let steps = lock(&self.steps);
        let mut out: Vec<ObjectInfo> = steps
            .iter()
            .flat_map(|((d, s), objs)| {
                objs.iter().map(move |((id, shard), o)| ObjectInfo {
                    dataset: d.clone(),
                    step: *s,
                    var: o.var.clone(),
                    id: *id,
                    shard: *shard,
                    region: o.region.clone(),
                    bytes: o.data.len() as u64,
                    sealed: o.sealed,
                })
            })
            .collect();
        out.sort_by(|a, b| (&a.dataset, a.step, &a.var, a.id, a.shard).cmp(&(&b.dataset, b.step, &b.var, b.id, b.shard)));
        out
    }
}

/// Moves pooled memory out of `pool` into `gone` until `freed` reaches `bytes`.
fn take_until<K: Copy + std::hash::Hash + Eq, T>(
    pool: &mut HashMap<K, Vec<T>>,
    bytes: u64,
    freed: &mut u64,
    gone: &mut Vec<Memory>,
    len: impl Fn(&K) -> usize,
    wrap: impl Fn(T) -> Memory,
) {
    let keys: Vec<K> = pool.keys().copied().collect();
    for k in keys {
        while *freed < bytes {
            let Some(m) = pool.get_mut(&k).and_then(Vec::pop) else { break };
            gone.push(wrap(m));
            *freed += len(&k) as u64;
        }
    }
    pool.retain(|_, v| !v.is_empty());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(session: &str, n: usize) -> Object {
        Object {
            var: "v".into(),
            region: Region::new(vec![0], vec![n as u64]).unwrap(),
            elem: 1,
            session: session.into(),
            writer: 0,
            checksum: 0,
            data: Arc::new(Memory::Heap(vec![0; n])),
            sealed: false,
            copy: 0,
            stripe: None,
        }
    }

    #[test]
    fn a_writer_running_ahead_leaves_room_for_the_step_the_others_still_owe() {
        let s = Store::new(0, 800);
        // Step 0 is being written (unsealed here); the fast writer's steps 1.. may not take the
        // last eighth, which step 0 (and other datasets) still may.
        s.insert("d", 0, (1, 0), obj("a", 100), s.reserve(100).unwrap()).unwrap();
        assert_eq!(s.headroom("d", 1), 100);
        let (r, _) = s.reserve_buffer_for("d", 1, 600).unwrap();
        r.keep();
        let e = s.reserve_buffer_for("d", 2, 100).unwrap_err();
        assert!(e.to_string().contains("older step"), "{e}");
        let (r0, _) = s.reserve_buffer_for("d", 0, 100).unwrap();
        assert_eq!((s.headroom("other", 5), s.headroom("d", 0)), (0, 0));
        drop(r0);
        // Once step 0 is sealed (committed), nothing is behind: the room is anyone's.
        s.seal("d", 0, "a", &[(1, 0)], 100).unwrap();
        assert_eq!(s.headroom("d", 2), 0);
        assert!(s.reserve_buffer_for("d", 2, 100).is_ok());
    }

    #[test]
    fn limit_is_enforced_and_space_comes_back() {
        let s = Store::new(3, 100);
        let r = s.reserve(60).unwrap();
        let e = s.reserve(50).unwrap_err();
        assert_eq!(e.kind(), cairn_core::ErrorKind::Capacity);
        assert!(e.to_string().contains("server 3") && e.to_string().contains("50 bytes"), "{e}");
        s.insert("d", 1, (7, 0), obj("a", 60), r).unwrap();
        assert_eq!(s.used(), 60);
        drop(s.reserve(40).unwrap());
        assert_eq!(s.used(), 60);
        assert_eq!(s.drop_objects("d", 1, &Which::default()), 60);
        assert_eq!((s.used(), s.counts()), (0, (0, 0)));
    }

    #[test]
    fn a_fresh_segment_serves_a_lease_of_any_user_once_cut_to_its_size() {
        let s = Store::new(0, 64 << 20);
        s.fresh().set_target(8 << 20);
        s.add_fresh(Segment::fresh(4 << 20).unwrap());
        assert_eq!((s.fresh().progress(), s.pooled_bytes()), ((4 << 20, 8 << 20), 4 << 20));
        // Not for a lease of under half its size: its zeroed pages would be cut away.
        let (_r, small) = s.reserve_segment(1 << 20, 1001).unwrap();
        assert_eq!((small.len(), s.fresh().progress().0), (1 << 20, 4 << 20));
        let (r, seg) = s.reserve_segment(3 << 20, 1001).unwrap();
        assert_eq!((seg.len(), seg.owner(), r.bytes), (3 << 20, 1001, 3 << 20));
        assert_eq!((s.fresh().progress().0, s.pooled_bytes()), (0, 0), "taken, counted once as the lease's");
        // Too big for any fresh one: made for it, and the next made ahead will be that big.
        let (_r, big) = s.reserve_segment(6 << 20, 1001).unwrap();
        assert_eq!(big.len(), 6 << 20);
    }

    #[test]
    fn a_lease_near_the_limit_takes_the_fresh_segment_instead_of_evicting_it() {
        let s = Store::new(0, 8 << 20);
        s.fresh().set_target(6 << 20);
        s.add_fresh(Segment::fresh(6 << 20).unwrap());
        let (_r, seg) = s.reserve_segment(4 << 20, 1000).unwrap();
        assert_eq!((seg.len(), s.fresh().served(), s.pooled_bytes()), (4 << 20, 6 << 20, 0));
        assert_eq!(s.fresh().progress().1, 6 << 20, "nothing evicted: the target stays");
    }

    #[test]
    fn eviction_takes_fresh_segments_and_lowers_what_the_prefaulter_aims_for() {
        let s = Store::new(0, 8 << 20);
        s.fresh().set_target(6 << 20);
        s.add_fresh(Segment::fresh(6 << 20).unwrap());
        let _r = s.reserve(4 << 20).unwrap();
        assert_eq!((s.fresh().progress(), s.pooled_bytes()), ((0, 0), 0), "the data needed the memory");
    }

    #[test]
    fn a_pooled_segment_goes_only_to_the_user_who_leased_it_first() {
        let s = Store::new(0, 1 << 20);
        let (r, seg) = s.reserve_segment(64 << 10, 1000).unwrap();
        let fd = seg.fd();
        drop(r);
        s.recycle_memory(Memory::Shared(seg));
        // Another user gets a fresh segment (the first may still map the pooled one)...
        let (_r2, other) = s.reserve_segment(64 << 10, 1001).unwrap();
        assert_ne!(other.fd(), fd);
        assert_eq!(other.owner(), 1001);
        // ...and the first user its own again.
        let (_r3, again) = s.reserve_segment(64 << 10, 1000).unwrap();
        assert_eq!((again.fd(), again.owner()), (fd, 1000));
    }

    #[test]
    fn a_full_server_gives_back_only_the_pooled_memory_a_reservation_lacks() {
        const K: usize = 64 << 10;
        let s = Store::new(0, 10 * K as u64);
        for id in 0..4 {
            s.insert("d", 1, (id, 0), obj("a", K), s.reserve(K as u64).unwrap()).unwrap();
        }
        s.drop_objects("d", 1, &Which::default());
        assert_eq!((s.used(), s.pool.bytes.load(Ordering::Acquire)), (0, 4 * K as u64), "freed buffers are pooled");
        let r = s.reserve(7 * K as u64).unwrap();
        assert_eq!(s.pool.bytes.load(Ordering::Acquire), 3 * K as u64, "one buffer evicted, three kept");
        assert_eq!(lock(&s.pool.bufs)[&K].len(), 3);
        drop(r);
        let (_r, taken) = s.reserve_buffer(K).unwrap();
        assert_eq!((taken.len(), s.pool.bytes.load(Ordering::Acquire)), (K, 2 * K as u64));
        // Full with only pooled memory of the size asked for: that memory is used, not evicted.
        let _r7 = s.reserve(7 * K as u64).unwrap();
        assert_eq!(s.pool.bytes.load(Ordering::Acquire), 2 * K as u64);
        let (_r2, _) = s.reserve_buffer(K).unwrap();
        assert_eq!((s.used(), s.pool.bytes.load(Ordering::Acquire)), (9 * K as u64, K as u64), "taken from the pool");
    }

    #[test]
    fn seal_checks_counts_and_drops_stale_sessions() {
        let s = Store::new(0, 1000);
        s.insert("d", 1, (1, 0), obj("old", 10), s.reserve(10).unwrap()).unwrap();
        s.insert("d", 1, (2, 0), obj("new", 20), s.reserve(20).unwrap()).unwrap();
        // A leftover of a put that failed here and was placed again elsewhere: not in the index.
        s.insert("d", 1, (3, 0), obj("new", 7), s.reserve(7).unwrap()).unwrap();
        let short = s.seal("d", 1, "new", &[(2, 0), (4, 0)], 40).unwrap_err().to_string();
        assert!(short.contains("holds 1 objects") && short.contains("0x4/0"), "names what is missing: {short}");
        s.seal("d", 1, "new", &[(2, 0)], 20).unwrap();
        assert_eq!(s.list().iter().map(|o| o.id).collect::<Vec<_>>(), vec![2], "the leftover and the old session's go");
        // A shard stored sealed after the commit (encoding) survives a repeated seal.
        let mut shard = obj("new", 4);
        shard.sealed = true;
        s.insert("d", 1, (2, 1), shard, s.reserve(4).unwrap()).unwrap();
        s.seal("d", 1, "new", &[(2, 0)], 20).unwrap();
        assert_eq!(s.list().len(), 2, "sealed objects the seal does not name stay");
        s.drop_objects("d", 1, &Which { shard: Some(1), ids: &[2], ..Which::default() });
        let lost = s.seal("d", 9, "new", &[(1, 0), (2, 0), (3, 0)], 60).unwrap_err();
        assert_eq!(lost.kind(), cairn_core::ErrorKind::Unavailable, "holding none of them is a lost server: {lost}");
        assert_eq!(s.used(), 20);
        assert!(s.list().iter().all(|o| o.sealed));
        // A sealed object never changes, and a writer's clean-up leaves it: its step committed.
        let e = s.insert("d", 1, (2, 0), obj("new", 5), s.reserve(5).unwrap()).unwrap_err();
        assert!(e.kind() == cairn_core::ErrorKind::AlreadyExists && e.to_string().contains("sealed"), "{e}");
        assert_eq!(s.used(), 20, "the refused put's reservation is given back");
        assert_eq!(s.drop_objects("d", 1, &Which { session: Some("new"), writer: Some(0), ..Which::default() }), 0);
        assert_eq!(s.drop_objects("d", 1, &Which { session: Some("new"), ids: &[2], ..Which::default() }), 0);
        // Replacing an unsealed object accounts for the old bytes.
        s.insert("d", 2, (2, 0), obj("new", 20), s.reserve(20).unwrap()).unwrap();
        s.insert("d", 2, (2, 0), obj("new", 5), s.reserve(5).unwrap()).unwrap();
        assert_eq!(s.used(), 25);
        assert_eq!(
            s.drop_objects("d", 1, &Which { except: Some("new"), ..Which::default() }),
            0,
            "except keeps that session's sealed objects"
        );
        assert_eq!(
            s.drop_objects("d", 2, &Which { writer: Some(0), except: Some("new"), ..Which::default() }),
            5,
            "and drops its unsealed ones: leftovers once its step committed"
        );
        // The coordinator (an abort, a release) frees sealed objects.
        assert_eq!(s.drop_objects("d", 1, &Which { session: Some("new"), ..Which::default() }), 20);
    }
}
