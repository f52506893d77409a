//! The staging engine's reader: step indexes come from the control plane's leader (cached, since
//! committed steps are immutable); each object a box touches is fetched from its server cut to
//! the intersection, and scattered straight into the caller's buffer. Objects on different servers
//! are fetched in parallel.

use super::conn::Cluster;
use super::control::{index_of, listing_of, pending_of, steps_of, wait_drained};
use crate::engine::ReadEngine;
use cairn_core::assemble::for_each_run;
use cairn_core::assemble::{copy_box, Layout};
use cairn_core::erasure::Code;
use cairn_core::index::{BlockRecord, ObjectRef, Redundancy, StepIndex, VarDef};
use cairn_core::{Error, ErrorKind, Reason, Region, Result};
use cairn_proto::message::{unexpected, ClaimLease, Geometry, Release, Request, Response, Unclaim};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Gets sent ahead of the replies read, per connection.
const WINDOW: usize = 16;

/// Reads committed steps of one dataset from a staging cluster.
#[derive(Debug)]
pub struct StagingReader {
    cluster: Arc<Cluster>,
    dataset: String,
    cache: Mutex<HashMap<u64, Cached>>,
    /// Objects already reported to the leader as read degraded (once each).
    touched: Mutex<std::collections::HashSet<(u64, u64)>>,
    /// Where those reports go out from, off the read path (see [`StagingReader::touch_degraded`]).
    toucher: Mutex<Option<std::sync::mpsc::SyncSender<Request>>>,
    /// When the view was last read again because a server refused connections.
    view_read: Mutex<Option<Instant>>,
}

/// A step index as cached: naming a server the view no longer counts live (`degraded`, as of view
/// `epoch`), it is read again after [`REREAD_DEGRADED`], since recovery rewrites those entries.
#[derive(Debug)]
struct Cached {
    index: Arc<StepIndex>,
    at: Instant,
    epoch: u64,
    degraded: bool,
}

impl Cached {
    fn new(index: Arc<StepIndex>, view: &cairn_proto::ClusterView) -> Cached {
        let degraded = names_lost(&index, view);
        Cached { index, at: Instant::now(), epoch: view.epoch, degraded }
    }

    /// Whether the index may be used as it is in `view`: it names no lost server, or it was read
    /// less than [`REREAD_DEGRADED`] ago.
    fn usable(&mut self, view: &cairn_proto::ClusterView) -> bool {
        if self.epoch != view.epoch {
            (self.epoch, self.degraded) = (view.epoch, names_lost(&self.index, view));
        }
        !self.degraded || self.at.elapsed() < REREAD_DEGRADED
    }
}

/// How old a cached index naming a lost server may get before it is read again. Without this a
/// reader kept reading the objects of a step it had read before a failure degraded after recovery
/// had rebuilt them (a 16-step read pass: 2.2 ms per step against 1.75).
const REREAD_DEGRADED: Duration = Duration::from_millis(500);

/// Whether `index` names a piece on a server `view` does not count live.
fn names_lost(index: &StepIndex, view: &cairn_proto::ClusterView) -> bool {
    index.blocks.iter().flat_map(|b| &b.objects).any(|o| o.servers().iter().any(|s| !view.is_live(*s)))
}

/// Reports of degraded reads waiting to go out at most: beyond, they are dropped (each is a hint
/// to rebuild an object sooner; recovery's deadline rebuilds it anyway).
const TOUCHES_QUEUED: usize = 64;

/// One object fetch: the request and where each run of the reply goes in the output.
struct Fetch<'a> {
    req: Request,
    what: String,
    /// The object as the committed index names it (its box, element size and crc32c): what a
    /// copy out of a mapping of its segment is cut from and checked against.
    object: &'a ObjectRef,
    elem: usize,
    parts: Vec<&'a mut [u8]>,
    /// Servers holding a copy, in the order to try them.
    holders: Vec<u32>,
    /// Whether its bytes arrived intact.
    done: bool,
}

/// (object, shard) of a read of encoded objects.
type Piece = (usize, usize);

/// One server's part of such a read: its pieces, which arrived, and how the server did.
type Fetched = (u32, Vec<Piece>, Vec<bool>, Result<()>);

/// An encoded object being read whole: which shards arrived into `buf` (shard `i` at `i·n`).
/// What went wrong fetching shards: each failed server (down, or without the shard) and the
/// first other error.
struct Misses {
    failed: BTreeMap<u32, Error>,
    other: Option<Error>,
}

struct Stripe {
    k: usize,
    m: usize,
    n: usize,
    len: usize,
    servers: Vec<u32>,
    have: Vec<bool>,
    buf: Vec<u8>,
}

impl Stripe {
    /// An empty stripe for encoded object `o` of `elem`-byte values.
    fn of(o: &ObjectRef, elem: usize) -> Stripe {
        let Redundancy::Encoded { k, m, shards } = &o.redundancy else { unreachable!("only encoded objects come here") };
        let (k, m) = (*k as usize, *m as usize);
        let len = o.region.volume() as usize * elem;
        let n = cairn_core::erasure::shard_len(len as u64, k as u32) as usize;
        Stripe { k, m, n, len, servers: shards.clone(), have: vec![false; k + m], buf: vec![0u8; n * (k + m)] }
    }

    /// The geometry a shard get names: a server holding a piece of another stripe under the
    /// same key (the object encoded again) answers `NotFound` instead of that piece.
    fn geometry(&self) -> Geometry {
        Geometry { k: self.k as u32, m: self.m as u32, len: self.n as u64 }
    }
}

impl StagingReader {
    pub(crate) fn open(cluster: Arc<Cluster>, dataset: &str) -> StagingReader {
        StagingReader {
            cluster,
            dataset: dataset.to_string(),
            cache: Mutex::new(HashMap::new()),
            touched: Mutex::default(),
            toucher: Mutex::default(),
            view_read: Mutex::default(),
        }
    }

    fn index(&self, step: u64) -> Result<Arc<StepIndex>> {
        Ok(self.index_confirmed(step)?.0)
    }

    /// A server refused connections: if the view still counts it live, reads the view again (at
    /// most every [`REREAD_DEGRADED`]), so that cached indexes naming it are read again once
    /// recovery has moved its pieces, instead of read around it for good.
    fn server_refused(&self, server: u32, e: &Error) {
        if e.kind() == ErrorKind::NotFound || !server_gone(e) || !self.cluster.view().is_live(server) {
            return;
        }
        let mut last = self.view_read.lock().unwrap_or_else(|p| p.into_inner());
        if last.is_some_and(|t| t.elapsed() < REREAD_DEGRADED) {
            return;
        }
        *last = Some(Instant::now());
        drop(last);
        self.cluster.refresh_view();
    }

    /// A step's index and whether the leader confirmed it. Only a confirmed one is kept: a
    /// follower's (read during an election) may be behind, and is read again next time.
    fn index_confirmed(&self, step: u64) -> Result<(Arc<StepIndex>, bool)> {
        let view = self.cluster.view();
        if let Some(c) = self.cache.lock().expect("cache lock").get_mut(&step) {
            if c.usable(&view) {
                return Ok((c.index.clone(), true));
            }
        }
        let (i, confirmed) = index_of(&self.cluster, &self.dataset, step, true)?;
        let i = Arc::new(i);
        if confirmed {
            self.cache.lock().expect("cache lock").insert(step, Cached::new(i.clone(), &view));
        }
        Ok((i, confirmed))
    }

    /// Fetches objects from one server, at most [`WINDOW`] requests ahead of the replies read,
    /// so neither side's socket buffer fills with what the other has not read yet (however many
    /// objects a box touches).
    fn fetch_all(&self, server: u32, fetches: &mut [Fetch<'_>]) -> Result<()> {
        self.cluster.with(server, |c| {
            let mut first_err = None;
            let mut sent = 0;
            // Gets whose mapping did not serve: asked again for a payload, after the others.
            let mut again = Vec::new();
            if c.mapping {
                c.rmaps.trim();
            }
            for i in 0..fetches.len() {
                while sent < fetches.len() && sent < i + WINDOW {
                    // Replies come as payloads or, on the same node, as mappings of the segment
                    // holding the object: a server never writes into a client's memory (issue 52).
                    if let Request::Get { map, shard: 0, .. } = &mut fetches[sent].req {
                        *map = c.mapping.then(|| c.rmaps.take_unmapped());
                    }
                    c.send(&fetches[sent].req, &[])?;
                    sent += 1;
                }
                match self.read_reply(c, &mut fetches[i], server)? {
                    Ok(true) => fetches[i].done = true,
                    Ok(false) => again.push(i),
                    Err(e) => {
                        first_err.get_or_insert(e);
                    }
                }
            }
            for i in again {
                let f = &mut fetches[i];
                if let Request::Get { map, .. } = &mut f.req {
                    *map = None;
                }
                c.send(&f.req, &[])?;
                match self.read_reply(c, f, server)? {
                    Ok(true) => f.done = true,
                    Ok(false) => {
                        first_err.get_or_insert(Error::Corrupt(format!(
                            "{}: server {server} answered a get without `map` with a mapping",
                            f.what
                        )));
                    }
                    Err(e) => {
                        first_err.get_or_insert(e);
                    }
                }
            }
            first_err.map_or(Ok(()), Err)
        })
    }

    /// Reads the reply to fetch `f`'s get from `server`: `Ok(Ok(true))` its bytes arrived intact,
    /// `Ok(Ok(false))` a mapping could not serve it (ask again for a payload), `Ok(Err(e))` the
    /// fetch failed with `e` (the connection stays in step), `Err` the connection failed.
    fn read_reply(&self, c: &mut super::conn::Conn, f: &mut Fetch<'_>, server: u32) -> Result<Result<bool>> {
        let want: u64 = f.parts.iter().map(|p| p.len() as u64).sum();
        let (resp, len) = c.recv(want, "get")?;
        let stale = matches!(&resp, Response::Error { kind: ErrorKind::StaleEpoch, .. });
        Ok(match self.cluster.settle(resp) {
            // Its view (now this client's) may have moved the piece: the step's index is read
            // again, as for a piece not where the index says.
            Err(e) if stale => Err(Error::NotFound(format!("{}: server {server} has a newer cluster view than this read ({e})", f.what))),
            Ok(Response::Mapped { segment, len: size, fd }) if len == u64::from(fd) => Ok(copy_mapped(c, f, segment, size, fd)?),
            Ok(Response::Data { checksum }) if len == want => {
                let got = c.read_payload_crc(&mut f.parts, "get")?;
                if got != checksum {
                    Err(Error::Corrupt(format!(
                        "{} arrived damaged from server {server} (crc32c {got:#x}, expected {checksum:#x}); read it again",
                        f.what
                    )))
                } else {
                    Ok(true)
                }
            }
            Ok(other) => {
                c.skip(len, "get")?;
                Err(unexpected("get", &other))
            }
            Err(e) => Err(e),
        })
    }

    /// Fetches objects whose first copy is on `server`; when a server fails (dead, hung), its
    /// objects are fetched again from their next copies, server by server.
    fn fetch_with_failover(&self, server: u32, fetches: Vec<Fetch<'_>>) -> Result<()> {
        let mut failed: Vec<u32> = Vec::new();
        // Whether every failed server was declared down by the control plane: only then is a
        // piece lost. One that refuses connections but is not declared yet, or hangs, may be
        // a restart or a pause away (hung is not lost).
        let mut all_gone = true;
        let mut todo = vec![(server, fetches)];
        // A holder that answers it has no such copy (dropped after encoding, or a server that
        // rejoined empty) is passed over like a failed one; if none has it, NotFound goes up so
        // the step's index is read again.
        let mut not_found: Option<Error> = None;
        while let Some((srv, mut f)) = todo.pop() {
            let e = match self.fetch_all(srv, &mut f) {
                Ok(()) => continue,
                Err(e) if e.kind() == ErrorKind::Unavailable => e,
                Err(e) if e.kind() == ErrorKind::NotFound => {
                    not_found = Some(Error::NotFound(e.to_string()));
                    e
                }
                Err(e) => return Err(e),
            };
            failed.push(srv);
            self.server_refused(srv, &e);
            all_gone &= e.kind() == ErrorKind::NotFound || self.declared_down(srv);
            let mut next: BTreeMap<u32, Vec<Fetch<'_>>> = BTreeMap::new();
            for x in f {
                match x.holders.iter().find(|h| !failed.contains(h)) {
                    Some(h) => next.entry(*h).or_default().push(x),
                    None if not_found.is_some() => return Err(not_found.take().expect("checked")),
                    None if !all_gone => return Err(e),
                    None => {
                        return Err(Error::DataLoss(format!(
                            "{} is lost: no server holding a copy of it ({}) answered (last: {e}); the rest of the step \
                             still reads. Define variables with redundancy=r to survive r server failures",
                            x.what,
                            x.holders.iter().map(|s| format!("server {s}")).collect::<Vec<_>>().join(", ")
                        )))
                    }
                }
            }
            todo.extend(next);
        }
        Ok(())
    }

    /// Tells the leader which objects of `block` were read with a piece on a down server, so
    /// lazy recovery rebuilds them first; once per object, best effort.
    fn touch_degraded(&self, step: u64, block: &BlockRecord, isect: &Region) {
        let view = self.cluster.view();
        if view.down.is_empty() {
            return;
        }
        let ids: Vec<u64> = {
            let mut seen = self.touched.lock().unwrap_or_else(|p| p.into_inner());
            block
                .objects
                .iter()
                .filter(|o| o.region.intersect(isect).is_some() && o.servers().iter().any(|s| view.down.contains(s)))
                .filter(|o| seen.insert((step, o.id)))
                .map(|o| o.id)
                .collect()
        };
        if ids.is_empty() {
            return;
        }
        // Sent by a thread of its own: a read never waits on the leader for a hint (with the
        // leader just killed, that wait was an election's, measured as most of the read
        // overhead of lazy recovery at an 18 s MTBF).
        let mut toucher = self.toucher.lock().unwrap_or_else(|p| p.into_inner());
        let tx = toucher.get_or_insert_with(|| {
            let (tx, rx) = std::sync::mpsc::sync_channel::<Request>(TOUCHES_QUEUED);
            let cluster = self.cluster.clone();
            std::thread::spawn(move || {
                for touch in rx {
                    let _ = cluster.leader_call(&touch, &[], 0);
                }
            });
            tx
        });
        let _ = tx.try_send(Request::Touch { dataset: self.dataset.clone(), step, ids });
    }

    /// Reads `isect` of one block: whole-copy objects box by box (failing over between copies),
    /// encoded ones whole from their shards.
    fn read_block(&self, step: u64, block: &BlockRecord, elem: usize, isect: &Region, dst: &Region, out: &mut [u8]) -> Result<()> {
        if isect.volume() == 0 {
            return Ok(());
        }
        self.touch_degraded(step, block, isect);
        // The runs each object contributes to `out`, cut from it as disjoint slices in order.
        let mut runs: Vec<(usize, usize)> = Vec::new(); // (dst offset, len), object after object
        let mut wants = Vec::new(); // (object, its box to fetch, how many runs it fills)
        for o in &block.objects {
            if let Some(want) = o.region.intersect(isect) {
                let before = runs.len();
                for_each_run(&want, dst, &want, elem, |_, d, len| runs.push((d as usize, len)));
                wants.push((o, want, runs.len() - before));
            }
        }
        let mut order: Vec<usize> = (0..runs.len()).collect();
        order.sort_by_key(|&i| runs[i].0);
        let mut slices: Vec<Option<&mut [u8]>> = (0..runs.len()).map(|_| None).collect();
        let mut rest = &mut out[..];
        let mut pos = 0usize;
        for &i in &order {
            let (d, len) = runs[i];
            let (_, tail) = std::mem::take(&mut rest).split_at_mut(d - pos);
            let (run, tail) = tail.split_at_mut(len);
            slices[i] = Some(run);
            rest = tail;
            pos = d + len;
        }
        let mut slices = slices.into_iter().map(|s| s.expect("every run cut"));
        let what = |o: &ObjectRef| {
            format!(
                "object {:#x} of '{}' step {step} (block {:?}+{:?} of writer {})",
                o.id, block.var, block.region.offset, block.region.count, block.writer
            )
        };
        let mut by_server: BTreeMap<u32, Vec<Fetch<'_>>> = BTreeMap::new();
        let mut encoded: Vec<(&ObjectRef, Region, Vec<&mut [u8]>)> = Vec::new();
        for (o, want, n) in wants {
            let parts: Vec<&mut [u8]> = slices.by_ref().take(n).collect();
            let mut holders = o.holders();
            // Copies on servers the view declares down are tried last (a hung one costs a deadline).
            let down = &self.cluster.view().down;
            holders.sort_by_key(|h| down.contains(h));
            if holders.is_empty() {
                encoded.push((o, want, parts));
                continue;
            }
            let req = Request::Get { dataset: self.dataset.clone(), step, id: o.id, want, shard: 0, stripe: None, map: None };
            by_server.entry(holders[0]).or_default().push(Fetch { req, what: what(o), object: o, elem, parts, holders, done: false });
        }
        if !encoded.is_empty() {
            let objs: Vec<&ObjectRef> = encoded.iter().map(|(o, _, _)| *o).collect();
            let whole = self.read_encoded(step, &objs, elem, &what)?;
            for ((o, want, parts), bytes) in encoded.into_iter().zip(whole) {
                let mut cut = vec![0u8; (want.volume() as usize) * elem];
                copy_box(&bytes, Layout { layout: &o.region, base: 0 }, &mut cut, Layout { layout: &want, base: 0 }, &want, elem);
                let mut at = 0;
                for p in parts {
                    p.copy_from_slice(&cut[at..at + p.len()]);
                    at += p.len();
                }
            }
        }
        if by_server.is_empty() {
            return Ok(());
        }
        if by_server.len() == 1 {
            let (server, f) = by_server.into_iter().next().expect("one server");
            return self.fetch_with_failover(server, f);
        }
        std::thread::scope(|s| {
            let handles: Vec<_> = by_server.into_iter().map(|(srv, f)| s.spawn(move || self.fetch_with_failover(srv, f))).collect();
            handles.into_iter().try_for_each(|h| h.join().expect("fetch thread panicked"))
        })
    }
}

/// A get answered with a mapping: claims the segment's descriptor when one came (the reply's
/// one-byte payload carries it), then copies the fetch's box out of the mapping, checking the
/// whole object against the committed crc32c as it goes (in one pass for a whole object).
/// `false` when the mapping cannot serve it (not mapped here, or the bytes do not match: its
/// step released and the segment reused, or changed by its writer): the server's payload (or
/// its refusal) decides then.
fn copy_mapped(c: &mut super::conn::Conn, f: &mut Fetch<'_>, segment: u64, size: u64, fd: bool) -> Result<bool> {
    if fd {
        c.skip(1, "get")?;
        let mapped = c.take_fd().map(|passed| c.rmaps.insert(segment, passed, size as usize));
        if !matches!(mapped, Some(Ok(()))) {
            c.rmaps.forget(segment);
            c.mapping = false; // the rest of this connection's gets come as payloads
            return Ok(false);
        }
    }
    let o = f.object;
    let bytes = o.region.volume() * f.elem as u64;
    let Some(map) = c.rmaps.get(segment).filter(|m| m.len() as u64 == bytes && size == bytes) else {
        c.rmaps.forget(segment);
        return Ok(false);
    };
    let Request::Get { want, .. } = &f.req else { unreachable!("fetches are gets") };
    let crc = map.read(|src| copy_out(src, o, f.elem, want, &mut f.parts));
    Ok(crc == o.checksum)
}

/// Copies the box `want` of object `o` (of `elem`-byte elements) out of `src` (the object's
/// bytes) into `parts`, which hold the box in order; returns the crc32c of the whole object.
fn copy_out(src: &[u8], o: &ObjectRef, elem: usize, want: &Region, parts: &mut [&mut [u8]]) -> u32 {
    if *want == o.region {
        super::shm::copy_crc(src, parts)
    } else {
        // The box's runs out of the object, in the box's order, into the parts that hold it.
        let mut parts = parts.iter_mut().map(|p| &mut **p);
        let (mut part, mut at): (&mut [u8], usize) = (parts.next().unwrap_or_default(), 0);
        for_each_run(&o.region, want, want, elem, |s, _, len| {
            let (mut s, mut len) = (s as usize, len);
            while len > 0 {
                if at == part.len() {
                    (part, at) = (parts.next().expect("the parts hold the box"), 0);
                }
                let n = len.min(part.len() - at);
                part[at..at + n].copy_from_slice(&src[s..s + n]);
                (s, len, at) = (s + n, len - n, at + n);
            }
        });
        cairn_core::checksum::crc(src)
    }
}

impl StagingReader {
    /// Reads encoded objects whole: their data shards as they are (the code is systematic), or,
    /// where servers fail, parity shards too and any `k` decoded. Checked against each object's
    /// crc32c, so a wrong byte is never returned.
    fn read_encoded(&self, step: u64, objs: &[&ObjectRef], elem: usize, what: &dyn Fn(&ObjectRef) -> String) -> Result<Vec<Vec<u8>>> {
        let mut stripes: Vec<Stripe> = objs.iter().map(|o| Stripe::of(o, elem)).collect();
        // Servers the view declares down are not asked (a hung one would cost a deadline).
        let view = self.cluster.view();
        let failed = view.down.iter().map(|d| (*d, Error::ServerGone(format!("server {d} was declared down in view {}", view.epoch))));
        let mut misses = Misses { failed: failed.collect(), other: None };
        // Round 0: data shards; round 1: parity shards of the objects still short.
        for round in 0..2 {
            self.fetch_round(step, objs, &mut stripes, round, &mut misses, what);
        }
        stripes.into_iter().zip(objs).map(|(st, o)| self.assemble(st, o, &misses, what)).collect()
    }

    /// Fetches, from every server at once, the shards round `round` asks for (0: the data
    /// shards; 1: parity shards of the objects still short of `k`) from servers not yet failed,
    /// noting in `misses` the servers that fail and the first other error.
    fn fetch_round(
        &self,
        step: u64,
        objs: &[&ObjectRef],
        stripes: &mut [Stripe],
        round: usize,
        misses: &mut Misses,
        what: &dyn Fn(&ObjectRef) -> String,
    ) {
        let mut by_server: BTreeMap<u32, Vec<(usize, usize)>> = BTreeMap::new();
        for (j, st) in stripes.iter().enumerate() {
            let have = st.have.iter().filter(|h| **h).count();
            let complete = if round == 0 { st.have[..st.k].iter().all(|h| *h) } else { have >= st.k };
            if complete {
                continue;
            }
            let range = if round == 0 { 0..st.k } else { st.k..st.k + st.m };
            for i in range.filter(|i| !st.have[*i] && !misses.failed.contains_key(&st.servers[*i])) {
                by_server.entry(st.servers[i]).or_default().push((j, i));
            }
        }
        if by_server.is_empty() {
            return;
        }
        let geometry: Vec<Geometry> = stripes.iter().map(Stripe::geometry).collect();
        let mut chunks: BTreeMap<(usize, usize), &mut [u8]> = BTreeMap::new();
        for (j, st) in stripes.iter_mut().enumerate() {
            for (i, c) in st.buf.chunks_mut(st.n).enumerate() {
                chunks.insert((j, i), c);
            }
        }
        let mut work: Vec<(u32, Vec<Piece>, Vec<Fetch<'_>>)> = Vec::new();
        for (srv, list) in by_server {
            let fetches = list
                .iter()
                .map(|&(j, i)| {
                    let o = objs[j];
                    let req = Request::Get {
                        dataset: self.dataset.clone(),
                        step,
                        id: o.id,
                        want: o.region.clone(),
                        shard: i as u32 + 1,
                        stripe: Some(geometry[j]),
                        map: None,
                    };
                    let part = chunks.remove(&(j, i)).expect("each shard fetched once");
                    Fetch {
                        req,
                        what: format!("shard {i} of {}", what(o)),
                        object: o,
                        elem: 1, /* shards are never mapped */
                        parts: vec![part],
                        holders: Vec::new(),
                        done: false,
                    }
                })
                .collect();
            work.push((srv, list, fetches));
        }
        let results: Vec<Fetched> = std::thread::scope(|s| {
            let handles: Vec<_> = work
                .into_iter()
                .map(|(srv, list, mut f)| {
                    s.spawn(move || {
                        let r = self.fetch_all(srv, &mut f);
                        (srv, list, f.iter().map(|x| x.done).collect::<Vec<_>>(), r)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("fetch thread panicked")).collect()
        });
        for (srv, list, done, r) in results {
            for (&(j, i), ok) in list.iter().zip(done) {
                stripes[j].have[i] |= ok;
            }
            match r {
                Err(e) if matches!(e.kind(), ErrorKind::Unavailable | ErrorKind::NotFound) => {
                    self.server_refused(srv, &e);
                    misses.failed.insert(srv, e);
                }
                Err(e) => {
                    misses.other.get_or_insert(e);
                }
                Ok(()) => {}
            }
        }
    }

    /// One object from its stripe's shards: the data shards as they are, or any `k` decoded,
    /// checked against the object's crc32c; else why it cannot be read.
    fn assemble(&self, st: Stripe, o: &ObjectRef, misses: &Misses, what: &dyn Fn(&ObjectRef) -> String) -> Result<Vec<u8>> {
        let (failed, other) = (&misses.failed, misses.other.as_ref());
        let bytes = if st.have[..st.k].iter().all(|h| *h) {
            let mut b = st.buf;
            b.truncate(st.len);
            b
        } else if st.have.iter().filter(|h| **h).count() >= st.k {
            let code = Code::new(st.k, st.m)?;
            let mut shards: Vec<Option<Vec<u8>>> = st.buf.chunks(st.n).zip(&st.have).map(|(c, h)| h.then(|| c.to_vec())).collect();
            code.decode(&mut shards, st.len)?
        } else if let Some(e) = other {
            return Err(e.duplicate());
        } else if st.servers.iter().any(|s| failed.get(s).is_some_and(|e| e.kind() == ErrorKind::NotFound)) {
            // A holder answered without its shard: the object moved (encoded anew, rebuilt
            // elsewhere) or went with a release, not with its servers, even if another
            // holder is down meanwhile (a chaos run's history caught a DataLoss here); the
            // caller reads the index again.
            return Err(Error::NotFound(format!("the shards of {} are not where the index says", what(o))));
        } else {
            let gone = st.servers.iter().filter(|s| failed.contains_key(s)).all(|s| self.declared_down(*s));
            let lost: Vec<String> = st.servers.iter().filter(|s| failed.contains_key(s)).map(|s| format!("server {s}")).collect();
            let msg = format!(
                "{} is lost: it was coded into {}+{} shards on servers {:?} and {} of them failed ({}), more than the {} \
                 it survives; the rest of the step still reads",
                what(o),
                st.k,
                st.m,
                st.servers,
                lost.len(),
                lost.join(", "),
                st.m
            );
            return Err(if gone { Error::DataLoss(msg) } else { Error::Unavailable(msg) });
        };
        let got = cairn_core::checksum::crc(&bytes);
        if got != o.checksum {
            return Err(Error::Corrupt(format!(
                "{} decoded to the wrong bytes (crc32c {got:#x}, expected {:#x}); read it again",
                what(o),
                o.checksum
            )));
        }
        Ok(bytes)
    }
}

impl StagingReader {
    /// Whether the control plane declared `server` down (by the newest view, asked for when the
    /// one at hand does not say so).
    fn declared_down(&self, server: u32) -> bool {
        if self.cluster.view().down.contains(&server) {
            return true;
        }
        self.cluster.refresh_view();
        self.cluster.view().down.contains(&server)
    }
}

/// Whether a failed call shows that the server's process is gone (the kernel refuses or resets
/// its connections; its memory went with it), as opposed to slow or hung (it may come back). The
/// client's errors carry the cause only as text.
fn server_gone(e: &Error) -> bool {
    // It answered without the piece (not coming back), or nobody is there.
    e.kind() == ErrorKind::NotFound || e.reason() == Some(Reason::ServerGone)
}

impl ReadEngine for StagingReader {
    fn steps(&self) -> Result<Vec<u64>> {
        steps_of(&self.cluster, &self.dataset, true)
    }

    fn step_vars(&self, step: u64) -> Result<BTreeMap<String, VarDef>> {
        Ok(self.index(step)?.vars.clone())
    }

    fn step_attrs(&self, step: u64) -> Result<cairn_core::attrs::Attrs> {
        Ok(self.index(step)?.attrs.clone())
    }

    fn blocks(&self, var: &str, step: u64) -> Result<Vec<BlockRecord>> {
        Ok(self.index(step)?.blocks_of(var).cloned().collect())
    }

    fn read_into(&self, step: u64, block: &BlockRecord, elem: usize, isect: &Region, dst: &Region, out: &mut [u8]) -> Result<()> {
        // Copies are dropped once an object is encoded (and rebuilt pieces move): read the step's
        // index again while it keeps changing under the read; a block's objects are encoded one
        // at a time, so a second object may go between one index read and the next. (Index reads
        // are linearized, and copies go only once the entry naming the shards is applied.) An
        // index a follower gave during an election may be behind: while the leader has not
        // confirmed one, the read waits for it rather than calling the block lost.
        let mut current = block.clone();
        let until = Instant::now() + self.cluster.timeout;
        let mut moves = 0;
        // A cached index may be of a step discarded and written again since (`from_step`): its
        // objects' ids come back with other bytes, and a get fails their crc32c. Once per read,
        // such a failure reads the index again; the same objects failing again are corrupt.
        let mut reread_corrupt = true;
        loop {
            let epoch = self.cluster.view().epoch;
            let e = match self.read_block(step, &current, elem, isect, dst, out) {
                Err(e) if e.kind() == ErrorKind::NotFound && current.objects.iter().any(|o| !o.servers().is_empty()) => e,
                Err(e) if e.kind() == ErrorKind::Corrupt && std::mem::take(&mut reread_corrupt) => {
                    self.forget(step);
                    let (fresh, _) = self.index_confirmed(step)?;
                    match fresh.blocks.iter().find(|b| b.var == block.var && b.writer == block.writer && b.region == block.region) {
                        Some(b) if *b != current => {
                            current = b.clone();
                            continue;
                        }
                        _ => return Err(e),
                    }
                }
                r => return r,
            };
            self.forget(step);
            let (fresh, confirmed) = self.index_confirmed(step)?;
            match fresh.blocks.iter().find(|b| b.var == block.var && b.writer == block.writer && b.region == block.region) {
                Some(b) if b.objects != current.objects => {
                    // A block of many objects is encoded one object at a time: follow it until
                    // the deadline, not for a fixed number of moves (8 failed a chaos run's check).
                    if moves >= 8 && Instant::now() >= until {
                        return Err(Error::Unavailable(format!(
                            "block {:?}+{:?} of '{}' step {step} kept moving while it was read (encoding or recovery); read it again",
                            block.region.offset, block.region.count, block.var
                        )));
                    }
                    moves += 1;
                    current = b.clone();
                }
                // The view changed under the read (a server declared down, a spare in its slot,
                // a stale get refused): asked again at once, by the new view.
                Some(_) if self.cluster.view().epoch != epoch && Instant::now() < until => moves += 1,
                // A follower's index may be behind, and a server that took a lost one's slot may
                // not have its piece rebuilt yet (recovery under way, and hurried by the touch):
                // ask again until the deadline before calling the block lost.
                _ if Instant::now() < until => std::thread::sleep(Duration::from_millis(if confirmed { 100 } else { 50 })),
                // The index still names servers that do not hold the pieces (they were lost
                // and rejoined empty, beyond the variable's level): the block is gone.
                _ => {
                    return Err(Error::DataLoss(format!(
                        "block {:?}+{:?} of '{}' step {step} (writer {}) is lost: {e}; the rest of the step still reads",
                        block.region.offset, block.region.count, block.var, block.writer
                    )))
                }
            }
        }
    }

    fn forget(&self, step: u64) {
        self.cache.lock().expect("cache lock").remove(&step);
    }

    fn down_servers(&self) -> Vec<u32> {
        // The newest view: a spare may have taken a failed server's slot since this one was read.
        self.cluster.refresh_view();
        self.cluster.view().down.clone()
    }

    fn wait_drained(&self, step: Option<u64>, timeout: Option<Duration>) -> Result<bool> {
        wait_drained(&self.cluster, &self.dataset, step, timeout, false)
    }

    fn remove(&self) -> Result<u64> {
        match self.cluster.coord(&Request::RemoveDataset { dataset: self.dataset.clone(), from: None })? {
            Response::Removed { steps } => Ok(steps),
            other => Err(unexpected("remove_dataset", &other)),
        }
    }

    fn discard_from(&self, from: u64) -> Result<u64> {
        self.cache.lock().expect("cache lock").retain(|s, _| *s < from);
        // The leader waits up to a minute for a drain of a discarded step in flight.
        let req = Request::RemoveDataset { dataset: self.dataset.clone(), from: Some(from) };
        match self.cluster.coord_waiting(&req, Duration::from_secs(70))? {
            Response::Removed { steps } => Ok(steps),
            other => Err(unexpected("remove_dataset", &other)),
        }
    }

    fn stream_at(&self, reader: &str, next: Option<u64>, leave: bool) -> Result<(Duration, Option<u64>)> {
        // Registered for the cluster's timeout: a reader that dies holds steps that long.
        let mark = super::queue::stream_at(&self.cluster, &self.dataset, reader, next, self.cluster.timeout, leave)?;
        Ok((self.cluster.timeout, mark))
    }

    fn wait_step(&self, step: u64, timeout: Duration) -> Result<bool> {
        let req = Request::WaitStep { dataset: self.dataset.clone(), step, timeout_ms: timeout.as_millis().min(u64::MAX.into()) as u64 };
        match self.cluster.coord_waiting(&req, timeout)? {
            Response::Committed { committed } => Ok(committed),
            other => Err(unexpected("wait", &other)),
        }
    }

    fn release(&self, step: u64) -> Result<()> {
        self.cache.lock().expect("cache lock").remove(&step);
        match self.cluster.coord(&Request::Release(Release { dataset: self.dataset.clone(), step }))? {
            Response::Ok => Ok(()),
            other => Err(unexpected("release", &other)),
        }
    }

    fn pending(&self) -> Result<Vec<(u64, u32, u32)>> {
        pending_of(&self.cluster, &self.dataset)
    }

    fn listing(&self) -> Result<(Vec<u64>, bool)> {
        listing_of(&self.cluster, &self.dataset, true)
    }

    fn claim(&self, claimer: &str, lease: Duration) -> Result<(Option<u64>, bool)> {
        let req = Request::Claim(ClaimLease { dataset: self.dataset.clone(), claimer: claimer.to_string(), lease_ms: millis(lease) });
        match self.cluster.coord(&req)? {
            Response::Claimed { step, done } => Ok((step, done)),
            other => Err(unexpected("claim", &other)),
        }
    }

    fn renew(&self, claimer: &str, lease: Duration) -> Result<Vec<u64>> {
        let req = Request::Renew(ClaimLease { dataset: self.dataset.clone(), claimer: claimer.to_string(), lease_ms: millis(lease) });
        match self.cluster.coord(&req)? {
            Response::Steps { steps, .. } => Ok(steps),
            other => Err(unexpected("renew", &other)),
        }
    }

    fn unclaim(&self, claimer: &str) -> Result<()> {
        match self.cluster.coord(&Request::Unclaim(Unclaim { dataset: self.dataset.clone(), claimer: claimer.to_string() }))? {
            Response::Ok => Ok(()),
            other => Err(unexpected("unclaim", &other)),
        }
    }
}

/// A lease in whole milliseconds, at least one.
fn millis(d: Duration) -> u64 {
    (d.as_millis().min(u128::from(u64::MAX)) as u64).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_core::placement::ServerSpec;
    use cairn_proto::cluster::{ClusterFile, ServerEntry};

    fn view(servers: u32) -> cairn_proto::ClusterView {
        let entry = |id| ServerEntry {
            spec: ServerSpec { id, node: format!("n{id}"), rack: String::new(), spare: id + 1 == servers },
            addr: String::new(),
            unix: None,
            host: "h".into(),
            pid: 0,
            memory: 1,
            metrics: None,
        };
        cairn_proto::ClusterView::initial(&ClusterFile {
            secret: "s".into(),
            servers: (0..servers).map(entry).collect(),
            redundancy: Default::default(),
            drain: None,
        })
    }

    fn index_on(servers: Vec<u32>) -> Arc<StepIndex> {
        let region = Region::new(vec![0], vec![4]).unwrap();
        let object =
            ObjectRef { id: 1, region: region.clone(), server: servers[0], checksum: 0, redundancy: Redundancy::Replicated { servers } };
        let block = BlockRecord {
            var: "v".into(),
            writer: 0,
            region,
            file: String::new(),
            pos: 0,
            len: 32,
            chunk: 0,
            crcs: vec![],
            checksum: 0,
            stats: Default::default(),
            objects: vec![object],
            stored: 0,
            codec: None,
        };
        Arc::new(StepIndex {
            format: 1,
            step: 0,
            nranks: 1,
            vars: BTreeMap::new(),
            blocks: vec![block],
            attrs: Default::default(),
            consumed: None,
            staged: None,
        })
    }

    #[test]
    fn a_cached_index_naming_a_lost_server_is_read_again_after_a_while() {
        // Servers 0-2 active, 3 a spare; the index names 0 and 1.
        let before = view(4);
        let mut c = Cached::new(index_on(vec![0, 1]), &before);
        assert!(c.usable(&before));
        c.at -= 2 * REREAD_DEGRADED;
        assert!(c.usable(&before), "naming live servers only, it is kept however old");
        // Server 1 fails and the spare takes its slot: the index names a lost server now.
        let after = before.fail(1).unwrap().replace(1, 3).unwrap();
        assert!(!c.usable(&after), "an old index naming a lost server is read again");
        let mut fresh = Cached::new(index_on(vec![0, 1]), &after);
        assert!(fresh.usable(&after), "just read (recovery not there yet): used for a while");
        fresh.at -= 2 * REREAD_DEGRADED;
        assert!(!fresh.usable(&after));
        // Recovery moved the piece: the index read again names the spare.
        let mut moved = Cached::new(index_on(vec![0, 3]), &after);
        moved.at -= 2 * REREAD_DEGRADED;
        assert!(moved.usable(&after));
    }
}
