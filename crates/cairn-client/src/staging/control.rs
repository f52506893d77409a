//! The control-plane requests the staging reader and writer share: opening the cluster, a
//! dataset's steps and indexes, and waits for the drain.

use super::conn::Cluster;
use crate::config::{StagingConfig, Transport};
use cairn_core::index::StepIndex;
use cairn_core::{Error, Result};
use cairn_proto::message::{unexpected, Request, Response};
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
/// (a full disk: capacity) when it failed. With `ask` (a writer's wait) the drain is asked for
/// the step (default: the newest committed) whatever its cadence: a job's last checkpoint.
pub(crate) fn wait_drained(
    c: &Cluster,
    dataset: &str,
    mut step: Option<u64>,
    timeout: Option<std::time::Duration>,
    mut ask: bool,
) -> Result<bool> {
    let deadline = timeout.map(|t| std::time::Instant::now() + t);
    loop {
        let left = deadline.map_or(DRAIN_WAIT, |d| d.saturating_duration_since(std::time::Instant::now())).min(DRAIN_WAIT);
        let req = Request::WaitDrained { dataset: Some(dataset.to_string()), step, timeout_ms: left.as_millis() as u64, drain: ask };
        let reply = c.coord_waiting(&req, left)?;
        // Asked once: later rounds wait for the step the first one named.
        if let (true, Response::Drain { step: asked, .. }) = (ask, &reply) {
            (step, ask) = (step.or(*asked), false);
        }
        match reply {
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
