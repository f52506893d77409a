//! The staging engine's reader: step indexes come from the control plane's leader (cached, since
//! committed steps are immutable); each object a box touches is fetched from its server cut to
//! the intersection, and scattered straight into the caller's buffer. Objects on different servers
//! are fetched in parallel.

use super::conn::Cluster;
use super::{index_of, steps_of};
use crate::engine::ReadEngine;
use cairn_core::assemble::for_each_run;
use cairn_core::index::{BlockRecord, StepIndex, VarDef};
use cairn_core::{Error, ErrorKind, Region, Result};
use cairn_proto::message::{unexpected, Request, Response};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Gets sent ahead of the replies read, per connection.
const WINDOW: usize = 16;

/// Reads committed steps of one dataset from a staging cluster.
#[derive(Debug)]
pub struct StagingReader {
    cluster: Arc<Cluster>,
    dataset: String,
    cache: Mutex<HashMap<u64, Arc<StepIndex>>>,
}

/// One object fetch: the request and where each run of the reply goes in the output.
struct Fetch<'a> {
    req: Request,
    what: String,
    parts: Vec<&'a mut [u8]>,
    /// Servers holding a copy, in the order to try them.
    holders: Vec<u32>,
}

impl StagingReader {
    pub(crate) fn open(cluster: Arc<Cluster>, dataset: &str) -> StagingReader {
        StagingReader { cluster, dataset: dataset.to_string(), cache: Mutex::new(HashMap::new()) }
    }

    fn index(&self, step: u64) -> Result<Arc<StepIndex>> {
        if let Some(i) = self.cache.lock().expect("cache lock").get(&step) {
            return Ok(i.clone());
        }
        let i = Arc::new(index_of(&self.cluster, &self.dataset, step)?);
        self.cache.lock().expect("cache lock").insert(step, i.clone());
        Ok(i)
    }

    /// Fetches objects from one server, at most [`WINDOW`] requests ahead of the replies read,
    /// so neither side's socket buffer fills with what the other has not read yet (however many
    /// objects a box touches).
    fn fetch_all(&self, server: u32, fetches: &mut [Fetch<'_>]) -> Result<()> {
        self.cluster.with(server, |c| {
            let mut first_err = None;
            let mut sent = 0;
            for i in 0..fetches.len() {
                while sent < fetches.len() && sent < i + WINDOW {
                    c.send(&fetches[sent].req, &[])?;
                    sent += 1;
                }
                let f = &mut fetches[i];
                let want: u64 = f.parts.iter().map(|p| p.len() as u64).sum();
                let (resp, len) = c.recv(want, "get")?;
                match self.cluster.settle(resp) {
                    Ok(Response::Data { checksum }) if len == want => {
                        c.read_payload(&mut f.parts, "get")?;
                        let got = f.parts.iter().fold(0u32, |c, p| crc32c::crc32c_append(c, p));
                        if got != checksum {
                            first_err.get_or_insert(Error::Corrupt(format!(
                                "{} arrived damaged from server {server} (crc32c {got:#x}, expected {checksum:#x}); read it again",
                                f.what
                            )));
                        }
                    }
                    Ok(other) => {
                        c.skip(len, "get")?;
                        first_err.get_or_insert(unexpected("get", &other));
                    }
                    Err(e) => {
                        first_err.get_or_insert(e);
                    }
                }
            }
            first_err.map_or(Ok(()), Err)
        })
    }

    /// Fetches objects whose first copy is on `server`; when a server fails (dead, hung), its
    /// objects are fetched again from their next copies, server by server.
    fn fetch_with_failover(&self, server: u32, fetches: Vec<Fetch<'_>>) -> Result<()> {
        let mut failed: Vec<u32> = Vec::new();
        // Whether every failed server is gone (refuses connections), not merely hung.
        let mut all_gone = true;
        let mut todo = vec![(server, fetches)];
        while let Some((srv, mut f)) = todo.pop() {
            let e = match self.fetch_all(srv, &mut f) {
                Ok(()) => continue,
                Err(e) if e.kind() == ErrorKind::Unavailable => e,
                Err(e) => return Err(e),
            };
            failed.push(srv);
            all_gone &= server_gone(&e);
            let mut next: BTreeMap<u32, Vec<Fetch<'_>>> = BTreeMap::new();
            for x in f {
                match x.holders.iter().find(|h| !failed.contains(h)) {
                    Some(h) => next.entry(*h).or_default().push(x),
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
}

/// Whether a failed call shows that the server's process is gone (the kernel refuses or resets
/// its connections; its memory went with it), as opposed to slow or hung (it may come back). The
/// client's errors carry the cause only as text.
fn server_gone(e: &Error) -> bool {
    let m = e.to_string();
    ["Connection refused", "No such file or directory", "Connection reset", "Broken pipe", "closed the connection"].iter().any(|p| m.contains(p))
}

impl ReadEngine for StagingReader {
    fn steps(&self) -> Result<Vec<u64>> {
        steps_of(&self.cluster, &self.dataset)
    }

    fn step_vars(&self, step: u64) -> Result<BTreeMap<String, VarDef>> {
        Ok(self.index(step)?.vars.clone())
    }

    fn blocks(&self, var: &str, step: u64) -> Result<Vec<BlockRecord>> {
        Ok(self.index(step)?.blocks_of(var).cloned().collect())
    }

    fn read_into(&self, step: u64, block: &BlockRecord, elem: usize, isect: &Region, dst: &Region, out: &mut [u8]) -> Result<()> {
        if isect.volume() == 0 {
            return Ok(());
        }
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
        let mut by_server: BTreeMap<u32, Vec<Fetch<'_>>> = BTreeMap::new();
        for (o, want, n) in wants {
            let what = format!("object {:#x} of '{}' step {step} (block {:?}+{:?} of writer {})", o.id, block.var, block.region.offset, block.region.count, block.writer);
            let req = Request::Get { dataset: self.dataset.clone(), step, id: o.id, want };
            let holders = o.holders();
            by_server.entry(holders[0]).or_default().push(Fetch { req, what, parts: slices.by_ref().take(n).collect(), holders });
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

    fn down_servers(&self) -> Vec<u32> {
        // The newest view: a spare may have taken a failed server's slot since this one was read.
        self.cluster.refresh_view();
        self.cluster.view().down.clone()
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
        match self.cluster.coord(&Request::Release { dataset: self.dataset.clone(), step })? {
            Response::Ok => Ok(()),
            other => Err(unexpected("release", &other)),
        }
    }
}
