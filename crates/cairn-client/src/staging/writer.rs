//! The staging engine's writer: each block is split into objects (CoREC Algorithm 1) and sent
//! to the servers the ring places them on, one thread per server, with the bytes gathered straight
//! from the caller's buffer. At the end of a step the fragment goes to the control plane's leader.

use super::conn::{Cluster, REDIRECTS};
use super::control::{cluster, index_of, steps_of, wait_drained};
use crate::config::StagingConfig;
use crate::engine::{BlockData, StepOutcome, StepPart, WriteEngine};
use cairn_core::assemble::for_each_run;
use cairn_core::corec::{Policy, Scheme};
use cairn_core::dtype::DType;
use cairn_core::erasure::Code;
use cairn_core::index::{BlockRecord, Fragment, ObjectRef, Redundancy, StepIndex, VarDef};
use cairn_core::partition::{is_contiguous, split};
use cairn_core::placement::place_key;
use cairn_core::queue::Policy as QueuePolicy;
use cairn_core::stats::Acc;
use cairn_core::{Error, ErrorKind, Region, Result};
use cairn_proto::message::{unexpected, Abort, Close, Geometry, ObjectPut, PutItem, Request, Response, Share, MAX_PUT_MANY};
use cairn_proto::ClusterView;
use std::borrow::Cow;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// Puts in flight per server before waiting for acknowledgements (bounded so neither side's
/// socket buffer fills with unread replies).
const WINDOW: usize = 16;

/// Writes one rank's blocks into a staging cluster.
#[derive(Debug)]
pub struct StagingWriter {
    cluster: Arc<Cluster>,
    dataset: String,
    rank: u32,
    nranks: u32,
    session: String,
    object_size: u64,
    /// Same-node objects of at least this many bytes go into leased shared segments.
    shared_min: u64,
    keep_last: Option<u64>,
    /// The dataset's queue limit and policy as this writer set it (`define_queue`).
    queue: Option<(u64, QueuePolicy)>,
    /// Level of variables that do not name one.
    default_level: u32,
    /// What this writer put in each unpublished step.
    open: BTreeMap<u64, OpenStep>,
    /// Servers the last failed put could not reach (dead or hung).
    unreached: BTreeSet<u32>,
    /// Servers that refused or did not answer the last failed put.
    refused: Vec<u32>,
}

/// This writer's part of one unpublished step.
#[derive(Debug, Default)]
struct OpenStep {
    blocks: Vec<BlockRecord>,
    /// Objects and bytes sent to each server, reported at the end of the step.
    shares: BTreeMap<u32, (u64, u64)>,
    /// Next object id (unique per writer within the step).
    seq: u32,
}

/// One object to send: its header and its bytes as slices of the caller's buffer (or, for an
/// erasure-code shard, the shard computed from them).
struct Outgoing<'a> {
    req: Request,
    parts: Vec<Cow<'a, [u8]>>,
    /// The object's checksum (for the header) and statistics, computed by whichever sender gets
    /// to it first, just before it goes out: so each server copies one object while its sender
    /// computes the next. `None` when the header's checksum is final (an erasure-code shard).
    sums: Option<Sums>,
    /// The type of the object's values.
    dtype: DType,
}

/// An object's crc32c and the statistics of its values, computed once.
type Sums = Arc<OnceLock<(u32, Acc)>>;

/// Bytes per step of [`sums`]' fused pass.
const PASS: usize = 64 << 10;

/// The crc32c of `parts` and the statistics of their `dtype` values, in one pass: each 64 KiB is
/// checksummed and then reduced while it is in the cache. Measured on 256 MiB of f64 (this
/// 2-core VM): two passes 52–58 ms, fused 45 ms; spread over the senders and overlapped with
/// the servers' copies, a same-node put of 256 MiB went from ~85 ms to ~68 ms.
fn sums(dtype: DType, parts: &[Cow<'_, [u8]>]) -> (u32, Acc) {
    let (mut crc, mut acc) = (0u32, Acc::new(dtype));
    for part in parts {
        // Whole elements per step: PASS is a multiple of every element size.
        for piece in part.chunks(PASS) {
            crc = cairn_core::checksum::crc_append(crc, piece);
            acc.add(piece);
        }
    }
    (crc, acc)
}

/// Copies `parts` into `dst` (their total length) a [`PASS`] at a time, checksumming and reducing
/// each piece copied while it is in the cache, unless another sender has computed `sums`: the
/// copy and [`sums`] in one pass.
fn fill(dst: &mut [u8], parts: &[Cow<'_, [u8]>], dtype: DType, sums: &Sums) {
    let fresh = sums.get().is_none();
    let (mut crc, mut acc) = (0u32, Acc::new(dtype));
    let mut at = 0;
    for part in parts {
        for piece in part.chunks(PASS) {
            let copied = &mut dst[at..at + piece.len()];
            if fresh {
                // The piece is read into the cache by the checksum and the reduction, then
                // streamed into the segment (`crc_copy`: 2.4× a copy then checksum, measured).
                acc.add(piece);
                crc = cairn_core::checksum::crc_copy(crc, piece, copied);
            } else {
                cairn_core::checksum::stream_copy(piece, copied);
            }
            at += piece.len();
        }
    }
    if fresh {
        let _ = sums.set((crc, acc));
    }
}

/// Bytes leased at once at most (one object may be larger): the server drops a connection that
/// holds leases and sends nothing for its deadline (10 s by default), and filling fresh segments
/// runs at ~1 GB/s on this VM.
const LEASED_AT_ONCE: u64 = 256 << 20;

/// How often puts under way look for their servers declared down.
const DOWN_POLL: Duration = Duration::from_millis(500);

/// While puts to `servers` are under way (until `finished` closes), every half second past the
/// first asks for the view, and shuts the connection to any of them the control plane declared
/// down: the put fails at the declaration (a failure timeout), not at the deadline (a SIGSTOPped
/// server cost a step the whole 30 s timeout). The failed put is placed again by the new view.
fn abandon_declared_down(cluster: &Cluster, servers: &[u32], finished: &std::sync::mpsc::Receiver<()>) {
    let mut abandoned = BTreeSet::new();
    while let Err(std::sync::mpsc::RecvTimeoutError::Timeout) = finished.recv_timeout(DOWN_POLL) {
        cluster.refresh_view();
        let view = cluster.view();
        for s in servers.iter().filter(|s| view.down.contains(s)) {
            if abandoned.insert(*s) && matches!(finished.try_recv(), Err(std::sync::mpsc::TryRecvError::Empty)) {
                cluster.abandon(*s);
            }
        }
    }
}

/// The bytes of an outgoing object.
fn bytes_of(o: &Outgoing<'_>) -> u64 {
    o.parts.iter().map(|p| p.len() as u64).sum()
}

/// The step an outgoing put is for.
fn step_of(o: &Outgoing<'_>) -> u64 {
    match o.req {
        Request::Put(ObjectPut { step, .. }) => step,
        _ => u64::MAX,
    }
}

/// Refuses a new run of `dataset` on a cluster whose drain folder holds committed steps of it
/// that this cluster did not drain (another run's): every rank checks the same folder, so all
/// of them refuse alike, before anything is put.
fn refuse_foreign_drain(cluster: &Cluster, dataset: &str, file: Option<&std::path::Path>) -> Result<()> {
    let Some(drain) = cluster.drain() else { return Ok(()) };
    let layout = crate::file::Layout::new(&drain.path, dataset);
    let foreign = crate::file::foreign_steps(&layout, &cluster.id())?;
    let (Some(first), Some(last)) = (foreign.first(), foreign.last()) else { return Ok(()) };
    let file = file.map_or_else(|| "FILE".to_string(), |f| f.display().to_string());
    Err(Error::ForeignDrain(format!(
        "{dataset} has {} committed step(s) (steps {first} to {last}) in the drain folder {} that this cluster did not drain \
         (another run's): opening it in mode \"w\" would mix this run's steps with them. Continue that run with mode \"a\", \
         or remove the old steps with `cairn rm {dataset} --cluster {file} --all`",
        foreign.len(),
        layout.root.display()
    )))
}

impl StagingWriter {
    /// Opens rank `rank` of `nranks`. A dataset that has steps may be opened without appending:
    /// several claimers each commit the steps they claimed into one destination (D²T), and a
    /// committed step is never written again (`begin_step` refuses it), so nothing is overwritten.
    /// Without `append`, a drain folder holding committed steps of `dataset` that this cluster
    /// did not drain is refused (`ForeignDrain`): this run's steps would meet another run's there.
    pub(crate) fn open(cfg: &StagingConfig, dataset: &str, rank: u32, nranks: u32, session: String, append: bool) -> Result<StagingWriter> {
        let cluster = cluster(cfg)?;
        if !append {
            refuse_foreign_drain(&cluster, dataset, cfg.cluster.as_deref())?;
        }
        let default_level = cfg.redundancy.unwrap_or(cluster.policy().redundancy);
        let mut w = StagingWriter {
            default_level,
            cluster,
            dataset: dataset.to_string(),
            rank,
            nranks,
            session,
            object_size: cfg.object_size,
            shared_min: cfg.shared_min,
            keep_last: cfg.keep_last,
            queue: None,
            open: BTreeMap::new(),
            unreached: BTreeSet::new(),
            refused: Vec::new(),
        };
        w.claim_drain(cfg.cluster.as_deref(), append)?;
        if let Some(limit) = cfg.queue_limit {
            let policy = cfg.queue_policy.as_deref().map_or(Ok(QueuePolicy::Block), crate::config::queue_policy)?;
            w.define_queue(limit, policy)?;
        }
        Ok(w)
    }

    /// Claims the drained dataset for this cluster (its owner record, see
    /// [`cairn_file::owner`]), from the step this writer writes first; every rank claims alike.
    fn claim_drain(&self, file: Option<&std::path::Path>, append: bool) -> Result<()> {
        let Some(drain) = self.cluster.drain() else { return Ok(()) };
        let layout = crate::file::Layout::new(&drain.path, &self.dataset);
        let first_step = self.last_index()?.map_or(0, |i| i.step.saturating_add(1));
        let cluster_file = file.map(|f| std::path::absolute(f).unwrap_or_else(|_| f.to_path_buf()));
        let mine = cairn_file::owner::Owner {
            cluster: self.cluster.id(),
            cluster_file: cluster_file.as_deref().map_or_else(String::new, |f| f.display().to_string()),
            host: cairn_proto::cluster::hostname(),
            created: std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0.0, |d| d.as_secs_f64()),
            first_step,
        };
        // A recorded cluster that is stopped, whose file is gone or names another cluster now (a
        // new one started over it), or none of whose servers accepts a connection (every one
        // crashed: a restart after the crash) hands the name on.
        let gone = |owner: &cairn_file::owner::Owner| {
            let p = std::path::Path::new(&owner.cluster_file);
            if owner.cluster_file.is_empty() || !p.exists() || cairn_proto::cluster::StoppedFile::load(p).is_some() {
                return true;
            }
            let Ok(file) = cairn_proto::cluster::ClusterFile::load(p) else { return true };
            file.id() != owner.cluster
                || !file.servers.iter().any(|s| {
                    use std::net::ToSocketAddrs;
                    let addrs = s.addr.to_socket_addrs().map(Iterator::collect::<Vec<_>>).unwrap_or_default();
                    addrs.iter().any(|a| std::net::TcpStream::connect_timeout(a, Duration::from_millis(500)).is_ok())
                })
        };
        cairn_file::owner::claim(&layout, &mine, append, gone).map(|_| ())
    }

    /// Places and puts `blocks` by the current view, again by a newer one when the view changes.
    fn put_placed(&mut self, blocks: &[(u64, BlockData<'_>)]) -> Result<()> {
        // A view change is not a failure (docs/protocol.md): what the old placement stored was
        // dropped by `put_once`, so the blocks are placed again by the newer view, within the
        // deadline and the documented number of redirects.
        let deadline = Instant::now() + self.cluster.timeout;
        let mut placed = 0usize;
        loop {
            let view = self.cluster.view();
            placed += 1;
            let e = match self.put_once(&view, blocks) {
                // Refused as `stale_epoch` (the reply installed the newer view).
                Err(e) if self.cluster.view().epoch != view.epoch => {
                    if placed >= REDIRECTS || Instant::now() >= deadline {
                        return Err(Error::Unavailable(format!(
                            "the cluster view changed under every one of {placed} placements of this step's puts (now view {}): \
                             {e}; retry once the cluster settles (`cairn cluster status`)",
                            self.cluster.view().epoch
                        )));
                    }
                    if self.cluster.view().epoch == view.epoch {
                        self.cluster.await_view_after(view.epoch);
                    }
                    continue;
                }
                Err(e) if e.kind() == ErrorKind::Unavailable => e,
                r => return r,
            };
            // A server failed. The index names every object's servers, so the copies need not wait
            // for the control plane to declare it down: they go around it at once, to the next live
            // servers of the ring, at the same level (measured under `cairn chaos`, waiting for the
            // view change held each write that met a dead server for the failure timeout).
            let mut around = (*view).clone();
            around.down.extend(std::mem::take(&mut self.unreached).into_iter().filter(|s| !view.down.contains(s)));
            let policy = self.cluster.policy().clone();
            let needed = blocks
                .iter()
                .map(|(_, b)| match policy.scheme {
                    Scheme::Erasure => policy.stripe(b.def.redundancy, view.live().len()).map_or(1, |(k, m)| (k + m) as usize),
                    _ => b.def.redundancy as usize + 1,
                })
                .max()
                .unwrap_or(1);
            if around.down.len() > view.down.len() && around.live().len() >= needed {
                match self.put_once(&around, blocks) {
                    // Placed around by a view that is stale now: place again by the newer one.
                    Err(_) if self.cluster.view().epoch != view.epoch && placed < REDIRECTS => continue,
                    Err(e) if e.kind() == ErrorKind::Unavailable => {}
                    r => return r,
                }
            }
            // Not enough servers left around it (or another failed too): place again once the
            // control plane has declared it down (a spare in its slot, or placement passing over it).
            if placed < REDIRECTS && Instant::now() < deadline && self.cluster.await_view_after(view.epoch) {
                continue;
            }
            return Err(e);
        }
    }

    /// A put's capacity error, with what the drain to disk still owes (when the cluster drains).
    fn with_backlog(&self, e: Error) -> Error {
        if self.cluster.drain().is_none() {
            return e;
        }
        let req = Request::WaitDrained { dataset: None, step: None, timeout_ms: 0, drain: false };
        match self.cluster.coord(&req) {
            Ok(Response::Drain { drain, .. }) => Error::Capacity(format!(
                "{e} (waited {:.1} s for room: the drain to {} still owes {:.1} MiB{})",
                self.cluster.timeout.as_secs_f64(),
                drain.path.unwrap_or_default(),
                drain.pending_bytes as f64 / (1u64 << 20) as f64,
                drain.error.map_or(String::new(), |m| format!(" and failed: {m}"))
            )),
            _ => e,
        }
    }

    /// Puts the large whole copies of `objects` into segments the server on this host leases
    /// (see `shm`), one `lease` and one `put_many` per step and [`MAX_PUT_MANY`] objects; returns
    /// which objects went. Where the kernel does not let this process open the server's segments,
    /// the connection stops leasing and the rest go as copies.
    fn put_leased(&self, c: &mut super::conn::Conn, objects: &[Outgoing<'_>]) -> Result<Vec<bool>> {
        let mut done = vec![false; objects.len()];
        // Each group with its bytes so far.
        let mut groups: Vec<(Vec<usize>, u64)> = Vec::new();
        for (i, o) in objects.iter().enumerate() {
            let len = bytes_of(o);
            if o.sums.is_none() || !matches!(o.req, Request::Put(ObjectPut { shard: 0, .. })) || len < self.shared_min.max(1) {
                continue;
            }
            match groups.last_mut() {
                Some((g, bytes)) if g.len() < MAX_PUT_MANY && step_of(&objects[g[0]]) == step_of(o) && *bytes + len <= LEASED_AT_ONCE => {
                    g.push(i);
                    *bytes += len;
                }
                _ => groups.push((vec![i], len)),
            }
        }
        for (g, _) in groups {
            let sizes: Vec<u64> = g.iter().map(|&i| bytes_of(&objects[i])).collect();
            let (pid, leases) = match self.cluster.settle(c.call(&Request::Lease { sizes, release: Vec::new() })?)? {
                Response::Leased { pid, leases } if leases.len() == g.len() => (pid, leases),
                other => return Err(unexpected("lease", &other)),
            };
            let ids: Vec<u64> = leases.iter().map(|l| l.0).collect();
            for (&i, &(_, fd)) in g.iter().zip(&leases) {
                let o = &objects[i];
                let Ok(segment) = c.maps.get(pid, fd, bytes_of(o) as usize) else {
                    c.leasing = false;
                    c.call(&Request::Lease { sizes: Vec::new(), release: ids })?;
                    return Ok(done);
                };
                fill(segment.bytes_mut(), &o.parts, o.dtype, o.sums.as_ref().expect("whole copies have sums"));
            }
            let (mut req, _) = put_many(objects, &g);
            if let Request::PutMany { leases, .. } = &mut req {
                *leases = Some(ids);
            }
            c.send(&req, &[])?;
            match self.cluster.settle(c.recv(0, "put")?.0)? {
                Response::Ok => g.iter().for_each(|&i| done[i] = true),
                other => return Err(unexpected("put", &other)),
            }
        }
        Ok(done)
    }

    fn send_all(&self, server: u32, objects: &[Outgoing<'_>]) -> Result<()> {
        self.cluster.with(server, |c| {
            let leased = if c.leasing { self.put_leased(c, objects)? } else { vec![false; objects.len()] };
            let mut first_err = None;
            let mut acked = 0;
            let mut ack = |c: &mut super::conn::Conn| -> Result<()> {
                let (resp, _) = c.recv(0, "put")?;
                match self.cluster.settle(resp) {
                    Ok(Response::Ok) => {}
                    Ok(other) => return Err(unexpected("put", &other)),
                    Err(e) => {
                        first_err.get_or_insert(e);
                    }
                }
                Ok(())
            };
            let frames: Vec<Vec<usize>> = frames(objects)
                .into_iter()
                .map(|f| f.into_iter().filter(|i| !leased[*i]).collect::<Vec<usize>>())
                .filter(|f| !f.is_empty())
                .collect();
            for (i, frame) in frames.iter().enumerate() {
                let (req, parts) = match frame.as_slice() {
                    [one] => {
                        let o = &objects[*one];
                        let mut req = o.req.clone();
                        if let (Some(s), Request::Put(ObjectPut { object: PutItem { checksum, .. }, .. })) = (&o.sums, &mut req) {
                            *checksum = s.get_or_init(|| sums(o.dtype, &o.parts)).0;
                        }
                        (req, o.parts.iter().map(|p| p.as_ref()).collect::<Vec<&[u8]>>())
                    }
                    many => put_many(objects, many),
                };
                // On the same node the server copies the bytes from this process's memory
                // (they stay borrowed until the replies are read, below).
                match c.runs_of(&parts) {
                    Some(runs) => {
                        let mut req = req;
                        if let Request::Put(ObjectPut { from, .. }) | Request::PutMany { from, .. } = &mut req {
                            *from = Some(runs);
                        }
                        c.send(&req, &[])?
                    }
                    None => c.send(&req, &parts)?,
                }
                if i + 1 - acked >= WINDOW {
                    ack(c)?;
                    acked += 1;
                }
            }
            while acked < frames.len() {
                ack(c)?;
                acked += 1;
            }
            first_err.map_or(Ok(()), Err)
        })
    }

    /// Puts `blocks` once, placed by the current view. On failure every object that arrived is
    /// dropped again (ids are not reused, so a retry starts clean).
    /// Puts `blocks` once through `view`: places their objects, sends each server its own, and
    /// records the blocks of their steps; on a failure, what arrived is dropped again.
    fn put_once(&mut self, view: &ClusterView, blocks: &[(u64, BlockData<'_>)]) -> Result<()> {
        let plan = self.plan(view, blocks)?;
        let sent = self.send(&plan.by_server);
        for (step, seq) in &plan.seqs {
            self.open.entry(*step).or_default().seq = *seq;
        }
        if let Some(e) = sent.iter().find_map(|(_, r)| r.as_ref().err()) {
            let e = e.duplicate();
            self.undo(blocks, &plan.refs, &sent);
            return Err(e);
        }
        // Shards computed here (erasure coding) were sent: their buffers serve the next objects.
        cairn_core::erasure::recycle(plan.by_server.into_values().flatten().flat_map(|o| o.parts).filter_map(|p| match p {
            Cow::Owned(v) => Some(v),
            Cow::Borrowed(_) => None,
        }));
        for (((step, block), objs), objs_sums) in blocks.iter().zip(plan.refs).zip(plan.sums) {
            self.record(*step, block, objs, &objs_sums);
        }
        Ok(())
    }

    /// Cuts `blocks` into objects and places each one's copies or shards on servers of `view`.
    fn plan<'b>(&self, view: &ClusterView, blocks: &'b [(u64, BlockData<'b>)]) -> Result<Plan<'b>> {
        let mut plan = Plan { by_server: BTreeMap::new(), refs: Vec::with_capacity(blocks.len()), sums: Vec::new(), seqs: BTreeMap::new() };
        let base = place_key(&self.dataset, "", &[]);
        let policy = self.cluster.policy().clone();
        for (step, block) in blocks {
            check_level(block.def, &policy, view)?;
            let level = block.def.redundancy;
            // The erasure scheme encodes on the write path, as wide as the live servers allow (a
            // stripe over a lost server would start degraded, and be narrowed by recovery).
            let stripe = if policy.scheme == Scheme::Erasure { policy.stripe(level, view.live().len()) } else { None };
            let pieces = split(&block.region, block.def.dtype.size(), self.object_size);
            let seq = plan.seqs.entry(*step).or_insert_with(|| self.open.get(step).map_or(0, |o| o.seq));
            let mut mine = Vec::with_capacity(pieces.len());
            let mut mine_sums = Vec::with_capacity(pieces.len());
            for piece in pieces {
                let key = slot(base, *step, self.rank, *seq);
                let id = (u64::from(self.rank) << 32) | u64::from(*seq);
                *seq = seq.checked_add(1).ok_or_else(|| Error::InvalidArgument("more than 2^32 objects in one step".into()))?;
                let object = Object { step: *step, block, piece, id, key };
                let object_sums = Sums::default();
                let redundancy = self.place(view, &object, stripe, &object_sums, &mut plan.by_server)?;
                let server = match &redundancy {
                    Redundancy::Replicated { servers } => servers[0],
                    Redundancy::Encoded { shards, .. } => shards[0],
                    Redundancy::Single => view.place(key),
                };
                // The checksum is known once the object has gone out.
                mine.push(ObjectRef { id, region: object.piece, server, checksum: 0, redundancy });
                mine_sums.push(object_sums);
            }
            plan.refs.push(mine);
            plan.sums.push(mine_sums);
        }
        Ok(plan)
    }

    /// Queues `object`'s puts in `by_server`: `level + 1` copies on a group of servers in
    /// different failure domains, or with `stripe` (k, m) its k data and m parity shards, each on a
    /// server of its own. Returns how the object is kept.
    fn place<'b>(
        &self,
        view: &ClusterView,
        object: &Object<'_, 'b>,
        stripe: Option<(u32, u32)>,
        object_sums: &Sums,
        by_server: &mut BTreeMap<u32, Vec<Outgoing<'b>>>,
    ) -> Result<Redundancy> {
        let block = object.block;
        let (elem, dtype) = (block.def.dtype.size(), block.def.dtype);
        let parts: Vec<Cow<'b, [u8]>> = gather(block.bytes, &block.region, &object.piece, elem).into_iter().map(Cow::Borrowed).collect();
        // The checksum is filled in as the object goes out (see `Outgoing::sums`).
        let put = |copy: usize, shard: u32, checksum: u32, stripe: Option<Geometry>| {
            Request::Put(ObjectPut {
                dataset: self.dataset.clone(),
                step: object.step,
                session: self.session.clone(),
                writer: self.rank,
                shard,
                from: None,
                stripe,
                object: PutItem {
                    var: block.def.name.clone(),
                    id: object.id,
                    region: object.piece.clone(),
                    elem: elem as u32,
                    checksum,
                    copy: copy as u32,
                },
            })
        };
        if let Some((k, m)) = stripe {
            let (shards, _) = view.group(object.key, (k + m) as usize);
            let code = Code::new(k as usize, m as usize)?;
            object_sums.get_or_init(|| sums(dtype, &parts));
            let whole: Cow<'_, [u8]> = if parts.len() == 1 { parts[0].clone() } else { Cow::Owned(parts.concat()) };
            let mut pieces: Vec<Vec<u8>> = (0..code.k()).map(|i| code.shard(&whole, i)).collect();
            pieces.extend(code.parity(&whole));
            for (i, (bytes, s)) in pieces.into_iter().zip(&shards).enumerate() {
                let stripe = Some(Geometry { k, m, len: bytes.len() as u64 });
                let req = put(usize::from(i >= k as usize), i as u32 + 1, cairn_core::checksum::crc(&bytes), stripe);
                by_server.entry(*s).or_default().push(Outgoing { req, parts: vec![Cow::Owned(bytes)], sums: None, dtype });
            }
            return Ok(Redundancy::Encoded { k, m, shards });
        }
        let copies = block.def.redundancy as usize + 1;
        let (group, _) = view.group(object.key, copies);
        for (copy, s) in group.iter().enumerate() {
            let (parts, sums) = (parts.clone(), Some(object_sums.clone()));
            by_server.entry(*s).or_default().push(Outgoing { req: put(copy, 0, 0, None), parts, sums, dtype });
        }
        Ok(if copies > 1 { Redundancy::Replicated { servers: group } } else { Redundancy::Single })
    }

    /// Sends each server its objects, in parallel from a thread each (which also computes its
    /// objects' checksums and statistics, see `Outgoing::sums`); per server, whether all arrived.
    fn send(&self, by_server: &BTreeMap<u32, Vec<Outgoing<'_>>>) -> Vec<(u32, Result<()>)> {
        if by_server.len() <= 1 {
            // One server (small blocks): no thread to start; a put costs one round trip.
            return by_server.iter().map(|(srv, objs)| (*srv, self.send_all(*srv, objs))).collect();
        }
        // The watcher is not scoped: a view read that waits out an election must not hold up
        // the puts' return; it ends at its next look once `done` is dropped.
        let (done, finished) = std::sync::mpsc::channel::<()>();
        let (cluster, watched) = (self.cluster.clone(), by_server.keys().copied().collect::<Vec<u32>>());
        std::thread::spawn(move || abandon_declared_down(&cluster, &watched, &finished));
        let sent = std::thread::scope(|s| {
            let handles: Vec<_> = by_server.iter().map(|(srv, objs)| (*srv, s.spawn(move || self.send_all(*srv, objs)))).collect();
            handles.into_iter().map(|(srv, h)| (srv, h.join().expect("sender thread panicked"))).collect()
        });
        drop(done);
        sent
    }

    /// After a failed put: notes the servers that refused or could not be reached, and drops
    /// what arrived again from the servers that answered (one that failed, dead or hung, would
    /// only cost another deadline; its leftovers go with the step).
    fn undo(&mut self, blocks: &[(u64, BlockData<'_>)], refs: &[Vec<ObjectRef>], sent: &[(u32, Result<()>)]) {
        self.refused = sent.iter().filter(|(_, r)| r.is_err()).map(|(s, _)| *s).collect();
        let (unreached, answered): (Vec<_>, Vec<_>) =
            sent.iter().partition(|(_, r)| matches!(r, Err(e) if e.kind() == ErrorKind::Unavailable));
        self.unreached = unreached.into_iter().map(|(s, _)| *s).collect();
        let answered: Vec<u32> = answered.into_iter().map(|(s, _)| *s).collect();
        for ((step, _), objs) in blocks.iter().zip(refs) {
            for &server in &answered {
                let ids: Vec<u64> = objs.iter().filter(|o| o.servers().contains(&server)).map(|o| o.id).collect();
                if !ids.is_empty() {
                    let req = Request::Drop {
                        dataset: self.dataset.clone(),
                        step: *step,
                        session: Some(self.session.clone()),
                        writer: None,
                        ids,
                        except: None,
                        shard: None,
                    };
                    let _ = self.cluster.call(server, &req);
                }
            }
        }
    }

    /// Records a block whose objects all went out in its open step: its record (checksums and
    /// statistics from its objects') and each server's share of the step.
    fn record(&mut self, step: u64, block: &BlockData<'_>, mut objs: Vec<ObjectRef>, objs_sums: &[Sums]) {
        let elem = block.def.dtype.size() as u64;
        // Every object went out, so each one's sums were computed.
        let mut acc = Acc::new(block.def.dtype);
        for (o, s) in objs.iter_mut().zip(objs_sums) {
            let (crc, part) = s.get().expect("an object that went out has its checksum");
            o.checksum = *crc;
            acc.merge(part);
        }
        let open = self.open.entry(step).or_default();
        for o in &objs {
            let bytes = match &o.redundancy {
                Redundancy::Encoded { k, .. } => cairn_core::erasure::shard_len(o.region.volume() * elem, *k),
                _ => o.region.volume() * elem,
            };
            for server in o.servers() {
                let share = open.shares.entry(server).or_default();
                share.0 += 1;
                share.1 += bytes;
            }
        }
        open.blocks.push(BlockRecord {
            var: block.def.name.clone(),
            writer: self.rank,
            region: block.region.clone(),
            file: String::new(),
            pos: 0,
            len: block.bytes.len() as u64,
            chunk: 0,
            crcs: Vec::new(),
            checksum: objs.iter().fold(0, |c, o| c ^ o.checksum),
            stats: acc.finish(),
            objects: objs,
            codec: None,
            stored: 0,
        });
    }
}

/// What one put sends: each server's objects, and per block its objects' refs and sums; the
/// next object sequence number of each step.
struct Plan<'b> {
    by_server: BTreeMap<u32, Vec<Outgoing<'b>>>,
    refs: Vec<Vec<ObjectRef>>,
    sums: Vec<Vec<Sums>>,
    seqs: BTreeMap<u64, u32>,
}

/// One object of a put: a piece of a block, its id and placement key.
struct Object<'o, 'b> {
    step: u64,
    block: &'o BlockData<'b>,
    piece: Region,
    id: u64,
    key: u64,
}

/// Whole-copy objects up to this size go to a server together, up to [`MAX_PUT_MANY`] per
/// frame (a step's coalesced small puts): one header and one acknowledgement for all of them.
const BATCHED: usize = 64 << 10;

/// The frames that carry `objects`: runs of consecutive small whole copies of one step (a batch
/// may hold several steps' blocks: buffered traces), each one `put_many`, and every other object
/// alone (indices into `objects`).
fn frames(objects: &[Outgoing<'_>]) -> Vec<Vec<usize>> {
    let step = |i: usize| step_of(&objects[i]);
    let mut out: Vec<Vec<usize>> = Vec::new();
    let mut group: Vec<usize> = Vec::new();
    for (i, o) in objects.iter().enumerate() {
        let small = o.sums.is_some() && bytes_of(o) <= BATCHED as u64 && matches!(o.req, Request::Put(ObjectPut { shard: 0, .. }));
        if !small || group.len() == MAX_PUT_MANY || group.first().is_some_and(|&g| step(g) != step(i)) {
            out.extend((!group.is_empty()).then(|| std::mem::take(&mut group)));
        }
        if small {
            group.push(i);
        } else {
            out.push(vec![i]);
        }
    }
    out.extend((!group.is_empty()).then_some(group));
    out
}

/// One `put_many` of the objects `which` (all whole-copy puts of one step by one writer), with
/// their checksums, and their bytes in order.
fn put_many<'a>(objects: &'a [Outgoing<'_>], which: &[usize]) -> (Request, Vec<&'a [u8]>) {
    let mut items = Vec::with_capacity(which.len());
    let mut parts = Vec::new();
    let mut head = None;
    for &i in which {
        let o = &objects[i];
        let Request::Put(ObjectPut { dataset, step, session, writer, object, .. }) = &o.req else { unreachable!("only puts are batched") };
        let checksum = o.sums.as_ref().map_or(0, |s| s.get_or_init(|| sums(o.dtype, &o.parts)).0);
        items.push(PutItem { checksum, ..object.clone() });
        parts.extend(o.parts.iter().map(|p| p.as_ref()));
        head.get_or_insert((dataset, *step, session, *writer));
    }
    let (dataset, step, session, writer) = head.expect("at least one object");
    let req =
        Request::PutMany { dataset: dataset.clone(), step, session: session.clone(), writer, objects: items, from: None, leases: None };
    (req, parts)
}

/// Refuses a variable whose level the cluster cannot give.
fn check_level(def: &VarDef, policy: &Policy, view: &ClusterView) -> Result<()> {
    let level = def.redundancy;
    if level > 0 && policy.scheme == Scheme::None {
        return Err(Error::InvalidArgument(format!(
            "'{}' asks to survive {level} server failures, but the cluster keeps one copy of everything (scheme \
             \"none\"); define it with redundancy=0 or start the cluster with another --scheme",
            def.name
        )));
    }
    let copies = level as usize + 1;
    if copies > view.slots.len() {
        return Err(Error::InvalidArgument(format!(
            "'{}' asks to survive {level} server failures, which takes {copies} servers; the cluster has {} active: \
             lower its redundancy or add servers",
            def.name,
            view.slots.len()
        )));
    }
    Ok(())
}

/// The ring position of a writer's `seq`-th object of `step`: a writer's objects take consecutive
/// positions (so one block's objects spread over the servers and move in parallel), each writer
/// starting one position after the previous rank, and the whole pattern moving by one position
/// each step. With a regular decomposition every server gets the same number of objects per step
/// (within a few), and the remainders rotate from step to step. (Interleaving writers as
/// `rank + seq·nranks` balances each step exactly, but puts all of a writer's objects on one
/// server whenever nranks is a multiple of the server count: measured, a whole-step read with 2
/// writers on 2 servers fell from 2.3 to 1.1 GB/s.)
fn slot(base: u64, step: u64, rank: u32, seq: u32) -> u64 {
    base.wrapping_add(step).wrapping_add(u64::from(rank)).wrapping_add(u64::from(seq))
}

impl StagingWriter {
    /// Whether committed `step` holds this writer's blocks of `req` (its end of step).
    fn committed_with(&self, step: u64, req: &Request) -> Result<bool> {
        let Request::EndStep { fragment, .. } = req else { return Ok(false) };
        let (index, _) = index_of(&self.cluster, &self.dataset, step, false)?;
        Ok(fragment.blocks.iter().all(|b| {
            index.blocks.iter().any(|c| c.writer == b.writer && c.var == b.var && c.region == b.region && c.checksum == b.checksum)
        }))
    }
}

impl WriteEngine for StagingWriter {
    fn last_index(&self) -> Result<Option<StepIndex>> {
        let memory = steps_of(&self.cluster, &self.dataset, false)?.last().copied();
        // A new cluster draining where an earlier one did (a new allocation, after every server
        // died): the run goes on after the newest drained step.
        let drained = match self.cluster.drain() {
            Some(d) => {
                let layout = crate::file::Layout::new(&d.path, &self.dataset);
                let last = if layout.require().is_ok() { layout.steps()?.last().copied() } else { None };
                last.map(|s| (s, layout))
            }
            None => None,
        };
        match (memory, drained) {
            (m, Some((d, layout))) if m.is_none_or(|m| d > m) => layout.read_step(d).map(Some),
            (Some(m), _) => index_of(&self.cluster, &self.dataset, m, false).map(|(i, _)| Some(i)),
            (None, _) => Ok(None),
        }
    }

    fn wait_drained(&self, step: Option<u64>, timeout: Option<Duration>) -> Result<bool> {
        wait_drained(&self.cluster, &self.dataset, step, timeout, true)
    }

    fn agree(&self, key: &str, mine: bool) -> Result<bool> {
        let key = format!("agree/{}/{key}", self.dataset);
        let value: &[u8] = if mine { b"1" } else { b"0" };
        // One id for every try of this call: a retry after a lost reply is not decided twice.
        let call = Some(cairn_proto::auth::new_nonce()?);
        let req = Request::MetaCas { key: key.clone(), expect: None, delete: false, call };
        match self.cluster.leader_call(&req, &[value], 0)?.0 {
            Response::Cas { ok: true, .. } => return Ok(mine),
            Response::Cas { ok: false, .. } => {}
            other => return Err(unexpected("meta_cas", &other)),
        }
        match self.cluster.leader_call(&Request::MetaGet { key: key.clone() }, &[], 1)? {
            (Response::Cas { ok: true, .. }, v) => Ok(v == b"1"),
            (other, _) => Err(unexpected("meta_get", &other)),
        }
    }

    fn define_queue(&mut self, limit: u64, policy: QueuePolicy) -> Result<()> {
        super::queue::set(&self.cluster, &self.dataset, limit, policy)?;
        self.queue = (limit > 0).then_some((limit, policy));
        Ok(())
    }

    fn wait_queue(&self) -> Result<()> {
        match &self.queue {
            Some((_, QueuePolicy::Block)) => super::queue::wait_room(&self.cluster, &self.dataset, self.cluster.timeout),
            _ => Ok(()),
        }
    }

    fn is_committed(&self, step: u64) -> Result<bool> {
        if steps_of(&self.cluster, &self.dataset, false)?.contains(&step) {
            return Ok(true);
        }
        // On disk: drained by the run before (a name continued with "a"), or by this cluster and
        // released since. Written again, its drain would meet the copy there and fail for good.
        Ok(self.cluster.drain().is_some_and(|d| crate::file::Layout::new(&d.path, &self.dataset).step_path(step).exists()))
    }

    fn written_in(&self, var: &str) -> Result<Option<u64>> {
        for step in steps_of(&self.cluster, &self.dataset, false)? {
            if index_of(&self.cluster, &self.dataset, step, false)?.0.blocks.iter().any(|b| b.var == var) {
                return Ok(Some(step));
            }
        }
        Ok(None)
    }

    fn put_batch(&mut self, blocks: Vec<(u64, BlockData<'_>)>) -> Result<()> {
        // Flow control: servers full of steps not yet drained (keep_last holds those) or not
        // released get room back as the drain and releases go on, so a full server is waited
        // for, within the deadline, before the put fails.
        let deadline = Instant::now() + self.cluster.timeout;
        let mut pause = Duration::from_millis(10);
        loop {
            match self.put_placed(&blocks) {
                Err(e) if e.kind() == ErrorKind::Capacity && Instant::now() + pause < deadline => {
                    std::thread::sleep(pause);
                    pause = (pause * 2).min(Duration::from_millis(250));
                }
                Err(e) if e.kind() == ErrorKind::Capacity => return Err(self.with_backlog(e)),
                r => return r,
            }
        }
    }

    fn end_step(&mut self, step: u64, part: &StepPart) -> Result<bool> {
        let open = self.open.remove(&step).unwrap_or_default();
        let mut fragment = Fragment::new(step, self.rank, self.nranks, self.session.clone(), part.defs.clone(), open.blocks);
        fragment.consume = part.consume.clone();
        fragment.attrs = part.attrs.clone();
        let shares = open.shares.into_iter().map(|(server, (objects, bytes))| Share { server, objects, bytes }).collect();
        let req = Request::EndStep { dataset: self.dataset.clone(), fragment, shares, keep_last: self.keep_last };
        let result = match self.cluster.coord(&req) {
            Ok(Response::Committed { committed }) => return Ok(committed),
            Ok(other) => unexpected("end of step", &other),
            // The request was retried after the leader died with it: the step may have been
            // finished by the next leader, or be finishing.
            Err(e) if e.kind() == ErrorKind::AlreadyExists && self.committed_with(step, &req)? => return Ok(true),
            Err(e @ Error::StepInFlight(_)) => {
                let wait = Request::WaitStep { dataset: self.dataset.clone(), step, timeout_ms: self.cluster.timeout.as_millis() as u64 };
                match self.cluster.coord_waiting(&wait, self.cluster.timeout) {
                    Ok(Response::Committed { committed: true }) if self.committed_with(step, &req)? => return Ok(true),
                    Ok(_) => e,
                    Err(e) => e,
                }
            }
            Err(e) => e,
        };
        // Kept, so that a retry sends this writer's blocks and shares again, not an empty fragment.
        if let Request::EndStep { fragment, shares, .. } = req {
            let shares = shares.into_iter().map(|s| (s.server, (s.objects, s.bytes))).collect();
            self.open.insert(step, OpenStep { blocks: fragment.blocks, shares, seq: open.seq });
        }
        Err(result)
    }

    fn default_redundancy(&self) -> u32 {
        self.default_level
    }

    fn coalesces_small_puts(&self) -> bool {
        true
    }

    fn admits(&self, def: &VarDef) -> Result<()> {
        check_level(def, self.cluster.policy(), &self.cluster.view())
    }

    fn failed_servers(&self) -> Vec<u32> {
        self.refused.clone()
    }

    fn close(&mut self) -> Result<()> {
        let req =
            Request::Close(Close { dataset: self.dataset.clone(), session: self.session.clone(), rank: self.rank, nranks: self.nranks });
        match self.cluster.coord(&req)? {
            Response::Ok => Ok(()),
            other => Err(unexpected("close", &other)),
        }
    }

    fn abort_step(&mut self, step: u64) -> Result<()> {
        let open = self.open.remove(&step).unwrap_or_default();
        let req = Request::Drop {
            dataset: self.dataset.clone(),
            step,
            session: Some(self.session.clone()),
            writer: Some(self.rank),
            ids: Vec::new(),
            except: None,
            shard: None,
        };
        // Best effort: a server that failed lost the objects anyway, and whatever a hung one
        // keeps goes with the next commit's sweep of other sessions' leftovers.
        for server in open.shares.into_keys() {
            let _ = self.cluster.call(server, &req);
        }
        // One transaction for all ranks: those that ended the step learn it aborted, and why.
        // Best effort, as the drops above: an abort runs on error paths (a `with f.step` block
        // left by an exception), where a control plane that cannot be reached must not replace
        // the error being reported; the step then stays pending, never visible.
        if self.nranks > 1 {
            let reason = format!("writer rank {} of {} aborted step {step}", self.rank, self.nranks);
            let abort = Request::AbortStep(Abort { dataset: self.dataset.clone(), step, session: self.session.clone(), reason });
            let _ = self.cluster.coord(&abort);
        }
        Ok(())
    }

    fn outcome(&self, step: u64) -> Result<StepOutcome> {
        let req = Request::StepOutcome { dataset: self.dataset.clone(), step, session: self.session.clone() };
        match self.cluster.coord(&req)? {
            Response::Outcome { outcome, reason } => Ok(match outcome.as_str() {
                "committed" => StepOutcome::Committed,
                "pending" => StepOutcome::Pending,
                "aborted" => StepOutcome::Aborted(reason.unwrap_or_default()),
                _ => StepOutcome::Unknown,
            }),
            other => Err(unexpected("step outcome", &other)),
        }
    }
}

/// The bytes of `piece` (inside `block`) as slices of the block's buffer, in C order of the piece:
/// one slice when they are contiguous, else one per run (sent with vectored writes, not copied).
fn gather<'a>(bytes: &'a [u8], block: &Region, piece: &Region, elem: usize) -> Vec<&'a [u8]> {
    if piece.volume() == 0 {
        return Vec::new();
    }
    if is_contiguous(block, piece) {
        let (lo, hi) = block.byte_span(piece, elem);
        return vec![&bytes[lo as usize..hi as usize]];
    }
    let mut parts = Vec::new();
    for_each_run(block, piece, piece, elem, |src, _, len| parts.push(&bytes[src as usize..src as usize + len]));
    parts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn out(step: u64, id: u64, bytes: &[u8], shard: u32) -> Outgoing<'_> {
        let req = Request::Put(ObjectPut {
            dataset: "d".into(),
            step,
            session: "s".into(),
            writer: 0,
            shard,
            from: None,
            stripe: None,
            object: PutItem {
                var: "v".into(),
                id,
                region: Region::new(vec![0], vec![bytes.len() as u64]).unwrap(),
                elem: 1,
                checksum: 0,
                copy: 0,
            },
        });
        Outgoing { req, parts: vec![Cow::Borrowed(bytes)], sums: (shard == 0).then(Sums::default), dtype: DType::U8 }
    }

    #[test]
    fn small_whole_copies_of_one_step_share_a_frame_and_carry_their_own_checksums() {
        let (small, big) = (vec![1u8; 100], vec![2u8; BATCHED + 1]);
        let objs = vec![
            out(0, 0, &small, 0),
            out(0, 1, &small, 0),
            out(1, 2, &small, 0), // another step (buffered traces): another frame
            out(1, 3, &big, 0),
            out(1, 4, &small, 1), // an erasure-code shard goes alone
            out(1, 5, &small, 0),
        ];
        assert_eq!(frames(&objs), vec![vec![0, 1], vec![2], vec![3], vec![4], vec![5]]);
        let (req, parts) = put_many(&objs, &[0, 1]);
        let Request::PutMany { step, objects, .. } = req else { panic!("{req:?}") };
        assert_eq!((step, objects.len(), parts.len()), (0, 2, 2));
        assert!(objects.iter().all(|o| o.checksum == cairn_core::checksum::crc(&small)));
        let many: Vec<Outgoing<'_>> = (0..MAX_PUT_MANY as u64 + 1).map(|i| out(0, i, &small, 0)).collect();
        assert_eq!(frames(&many).iter().map(Vec::len).collect::<Vec<_>>(), vec![MAX_PUT_MANY, 1]);
    }
}
