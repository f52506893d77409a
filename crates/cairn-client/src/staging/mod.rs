//! The `staging` engine: blocks go to staging servers that hold them in memory; a step commits
//! through the control plane (its Raft leader) when every writer has ended it and every server holding
//! its objects has sealed them. [`local`] starts and stops clusters of server processes.

mod conn;
mod kv;
mod levels;
pub mod local;
mod queue;
mod reader;
mod shm;
mod writer;

pub use conn::Transport;
pub use kv::KvStore;
pub use reader::StagingReader;
pub use writer::StagingWriter;

use crate::config::StagingConfig;
use cairn_core::index::StepIndex;
use cairn_core::{Error, Result};
use cairn_proto::message::{unexpected, Request, Response, ViewChange};
use cairn_proto::ClusterView;
use conn::Cluster;
use std::sync::Arc;

/// Opens the cluster the configuration names.
pub(crate) fn cluster(cfg: &StagingConfig) -> Result<Arc<Cluster>> {
    let path = cfg.cluster.as_ref().ok_or_else(|| {
        Error::Config(
            "engine = \"staging\" needs a cluster: set [staging] cluster = \"cluster.json\" (from `cairn cluster start`); \
             Python's cairn.open starts an embedded one when none is named"
                .into(),
        )
    })?;
    Cluster::open(path, cfg.deadline()?, Transport::parse(&cfg.transport)?)
}

/// Longest wait one `wait_drained` request asks of the leader; longer waits ask again.
const DRAIN_WAIT: std::time::Duration = std::time::Duration::from_secs(60);

/// Waits until `step` of `dataset` (default: the newest committed step the drain's cadence
/// names) is on disk: true once it is, false at `timeout` (none: no limit); the drain's error
/// (a full disk: capacity) when it failed.
pub(crate) fn wait_drained(c: &Cluster, dataset: &str, step: Option<u64>, timeout: Option<std::time::Duration>) -> Result<bool> {
    let deadline = timeout.map(|t| std::time::Instant::now() + t);
    loop {
        let left = deadline.map_or(DRAIN_WAIT, |d| d.saturating_duration_since(std::time::Instant::now())).min(DRAIN_WAIT);
        let req = Request::WaitDrained { dataset: Some(dataset.to_string()), step, timeout_ms: left.as_millis() as u64 };
        match c.coord_waiting(&req, left)? {
            Response::Drain { drained: true, .. } => return Ok(true),
            Response::Drain { drain, failed, .. } => {
                if let (true, Some(message)) = (failed, drain.error) {
                    let kind = drain.error_kind.unwrap_or(cairn_core::ErrorKind::Unavailable);
                    return Err(Error::from_wire(kind, drain.error_reason, format!("the drain to disk failed: {message}")));
                }
                if deadline.is_some_and(|d| std::time::Instant::now() >= d) {
                    return Ok(false);
                }
            }
            other => return Err(unexpected("wait_drained", &other)),
        }
    }
}

/// A reader of `dataset` in the cluster `cfg` names: from memory, and from the drained copy of
/// the steps when the cluster drains to disk.
pub(crate) fn reader(cfg: &StagingConfig, dataset: &str) -> Result<Box<dyn crate::engine::ReadEngine>> {
    if let Some(stopped) = cfg.cluster.as_deref().and_then(cairn_proto::cluster::StoppedFile::load) {
        return stopped_reader(cfg.cluster.as_deref().unwrap_or(std::path::Path::new("")), stopped, dataset);
    }
    let c = cluster(cfg)?;
    let drain = c.drain().map(|d| crate::file::Layout::new(&d.path, dataset));
    let id = c.id();
    let memory = StagingReader::open(c, dataset);
    Ok(match (drain, &cfg.cluster) {
        (Some(layout), Some(file)) => Box::new(levels::Levels::new(memory, layout, file.clone(), id)),
        _ => Box::new(memory),
    })
}

/// A reader of a stopped cluster's dataset: the steps it drained to disk, read as they are.
fn stopped_reader(
    file: &std::path::Path,
    stopped: cairn_proto::cluster::StoppedFile,
    dataset: &str,
) -> Result<Box<dyn crate::engine::ReadEngine>> {
    let Some(drain) = stopped.drain else {
        return Err(Error::Unavailable(format!(
            "the cluster of {} is stopped and drained nothing to disk: its steps are gone; start a cluster with `cairn cluster \
             start --file {}`",
            file.display(),
            file.display()
        )));
    };
    let layout = crate::file::Layout::new(&drain.path, dataset);
    let cadence = drain.every.map_or("the steps its automatic cadence chose".to_string(), |e| {
        if e <= 1 {
            "every step".to_string()
        } else {
            format!("every {e} steps: 0, {e}, {}, …", 2 * e)
        }
    });
    let note = format!(
        "the cluster of {} is stopped: only the steps it drained to {} are there ({cadence})",
        file.display(),
        layout.root.display()
    );
    let reader = crate::file::FileReader::open(layout).map_err(|e| match e.kind() {
        cairn_core::ErrorKind::NotFound => Error::NotFound(format!("no drained steps of {dataset}: {note}")),
        _ => e,
    })?;
    Ok(Box::new(Noted { inner: reader, note }))
}

/// A read engine whose "not committed" errors carry a note (a stopped cluster's: which steps
/// its drain kept).
struct Noted<E> {
    inner: E,
    note: String,
}

impl<E: crate::engine::ReadEngine> Noted<E> {
    fn noted<T>(&self, r: Result<T>) -> Result<T> {
        r.map_err(|e| match e {
            Error::NotFound(m) => Error::NotFound(format!("{m}; {}", self.note)),
            e => e,
        })
    }
}

impl<E: crate::engine::ReadEngine> crate::engine::ReadEngine for Noted<E> {
    fn steps(&self) -> Result<Vec<u64>> {
        self.inner.steps()
    }
    fn note(&self) -> Option<&str> {
        Some(&self.note)
    }
    fn step_vars(&self, step: u64) -> Result<std::collections::BTreeMap<String, cairn_core::index::VarDef>> {
        self.noted(self.inner.step_vars(step))
    }
    fn step_attrs(&self, step: u64) -> Result<cairn_core::attrs::Attrs> {
        self.noted(self.inner.step_attrs(step))
    }
    fn blocks(&self, var: &str, step: u64) -> Result<Vec<cairn_core::index::BlockRecord>> {
        self.noted(self.inner.blocks(var, step))
    }
    fn read_into(
        &self,
        step: u64,
        block: &cairn_core::index::BlockRecord,
        elem: usize,
        isect: &cairn_core::Region,
        dst: &cairn_core::Region,
        out: &mut [u8],
    ) -> Result<()> {
        self.noted(self.inner.read_into(step, block, elem, isect, dst, out))
    }
    fn release(&self, step: u64) -> Result<()> {
        self.inner.release(step)
    }
    fn pending(&self) -> Result<Vec<(u64, u32, u32)>> {
        self.inner.pending()
    }
    fn claim(&self, claimer: &str, lease: std::time::Duration) -> Result<(Option<u64>, bool)> {
        self.inner.claim(claimer, lease)
    }
    fn renew(&self, claimer: &str, lease: std::time::Duration) -> Result<Vec<u64>> {
        self.inner.renew(claimer, lease)
    }
    fn unclaim(&self, claimer: &str) -> Result<()> {
        self.inner.unclaim(claimer)
    }
}

/// Committed steps of `dataset`; `followers`: see [`listing_of`].
pub(crate) fn steps_of(c: &Cluster, dataset: &str, followers: bool) -> Result<Vec<u64>> {
    Ok(listing_of(c, dataset, followers)?.0)
}

/// Steps of `dataset` some writer ranks ended that are not committed: (step, ranks that ended
/// it, ranks it waits for).
pub(crate) fn pending_of(c: &Cluster, dataset: &str) -> Result<Vec<(u64, u32, u32)>> {
    match c.coord(&Request::Steps { dataset: dataset.to_string(), follower: false })? {
        Response::Steps { pending, .. } => Ok(pending),
        other => Err(unexpected("steps", &other)),
    }
}

/// Committed steps of `dataset`, and whether its writers closed it. With `followers` (readers),
/// a follower answers while no leader does: its list may end a step or two early.
pub(crate) fn listing_of(c: &Cluster, dataset: &str, followers: bool) -> Result<(Vec<u64>, bool)> {
    let req = Request::Steps { dataset: dataset.to_string(), follower: false };
    match if followers { c.read_committed(&req) } else { c.coord(&req) }? {
        Response::Steps { steps, finished, .. } => Ok((steps, finished)),
        other => Err(unexpected("steps", &other)),
    }
}

/// A committed step's index, and whether the leader confirmed it. With `followers` (readers), a
/// follower answers while no leader does (then `false`): its index may name copies that
/// encoding or recovery moved since.
pub(crate) fn index_of(c: &Cluster, dataset: &str, step: u64, followers: bool) -> Result<(StepIndex, bool)> {
    let req = Request::Index { dataset: dataset.to_string(), step, follower: false };
    match if followers { c.read_committed(&req) } else { c.coord(&req) }? {
        Response::Index { index, follower } => {
            index.validate()?;
            Ok((index, !follower))
        }
        other => Err(unexpected("index", &other)),
    }
}

/// Gives server `down`'s ring slot to `spare` (or the first spare) by a view change through the
/// control plane ([`ClusterView::replace`] of the newest view); returns the new view.
pub fn replace_server(cluster: &std::path::Path, down: u32, spare: Option<u32>, timeout: std::time::Duration) -> Result<ClusterView> {
    let c = Cluster::open(cluster, timeout, Transport::Auto)?;
    c.refresh_view();
    let view = c.view();
    let spare = match spare.or_else(|| view.spares.first().copied()) {
        Some(s) => s,
        None => return Err(Error::InvalidArgument(format!("view {} has no spare; start the cluster with --spares N", view.epoch))),
    };
    // A live server (one that answers) hands its slot over and retires, its pieces copied from
    // it first; a dead or hung one is replaced, and recovery rebuilds from the surviving pieces.
    let answers = view.is_live(down) && c.call(down, &Request::Status).is_ok();
    let next = if answers { view.hand_over(down, spare)? } else { view.replace(down, spare)? };
    c.coord(&Request::SetView(ViewChange { view: next.clone() }))?;
    Ok(next)
}

/// Adds the running servers `ids` (started with `--cluster` naming this cluster, their entries
/// published in `FILE.d/`) to the cluster as new ring slots, by a view change.
pub fn add_servers(cluster: &std::path::Path, ids: &[u32], timeout: std::time::Duration) -> Result<ClusterView> {
    let dir = cairn_proto::cluster::ClusterFile::entries_dir(cluster);
    let mut entries = Vec::with_capacity(ids.len());
    for id in ids {
        let path = dir.join(format!("server-{id}.json"));
        let text =
            std::fs::read(&path).map_err(|e| Error::io(format!("reading server {id}'s entry {}; is it running?", path.display()), e))?;
        let mut entry: cairn_proto::cluster::ServerEntry =
            serde_json::from_slice(&text).map_err(|e| Error::Corrupt(format!("server entry {}: {e}", path.display())))?;
        entry.spec.spare = false;
        entries.push(entry);
    }
    let c = Cluster::open(cluster, timeout, Transport::Auto)?;
    c.refresh_view();
    let next = c.view().add(entries)?;
    c.coord(&Request::SetView(ViewChange { view: next.clone() }))?;
    Ok(next)
}

/// Retires live server `id` by a view change: it loses its slot at once, recovery moves its
/// pieces to live servers, and the control plane removes it from the view when none is left.
pub fn retire_server(cluster: &std::path::Path, id: u32, timeout: std::time::Duration) -> Result<ClusterView> {
    let c = Cluster::open(cluster, timeout, Transport::Auto)?;
    c.refresh_view();
    let next = c.view().retire(id)?;
    c.coord(&Request::SetView(ViewChange { view: next.clone() }))?;
    Ok(next)
}

/// Sends one administrative request, given as JSON (`{"op": "status"}`, `objects`, `datasets`,
/// `view`, `set_view`, `shutdown`, `wait_drained`), to server `server` of the cluster in `cluster`
/// (`set_view`, `datasets` and `wait_drained` to the control plane's leader), within `timeout`;
/// returns the reply as JSON.
pub fn admin_request(cluster: &std::path::Path, server: u32, request: &str, timeout: std::time::Duration) -> Result<String> {
    let req: Request =
        serde_json::from_str(request).map_err(|e| Error::InvalidArgument(format!("request {request:?} does not parse: {e}")))?;
    let leader = matches!(req, Request::SetView(_) | Request::Datasets | Request::WaitDrained { .. });
    if !leader && !matches!(req, Request::Status | Request::Objects | Request::View | Request::Shutdown) {
        return Err(Error::InvalidArgument(format!(
            "{request:?} is not an administrative request (status, objects, datasets, view, set_view, shutdown, wait_drained)"
        )));
    }
    let c = Cluster::open(cluster, timeout, Transport::Auto)?;
    // A view change is a log entry, and the dataset list the log's state: both go to the control
    // plane's leader, whichever server is named (asked again through an election).
    let resp = match &req {
        Request::WaitDrained { timeout_ms, .. } => c.coord_waiting(&req, std::time::Duration::from_millis(*timeout_ms))?,
        _ if leader => c.coord(&req)?,
        _ => c.call(server, &req)?,
    };
    Ok(serde_json::to_string(&resp).expect("responses serialize"))
}
