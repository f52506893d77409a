//! Backpressure (issue 45): the writers' queue limit of a dataset, their wait for room under
//! the `block` policy, and streaming readers' marks (`stream(release=True)`), all sent to the
//! control plane's leader.

use super::conn::Cluster;
use cairn_core::queue::Policy;
use cairn_core::{Error, Result};
use cairn_proto::message::{Request, Response};
use std::time::{Duration, Instant};

/// Longest wait one `wait_queue` request asks of the leader; longer waits ask again.
const WAIT_SLICE: Duration = Duration::from_secs(60);

fn unexpected(what: &str, got: &Response) -> Error {
    Error::Corrupt(format!("the cluster answered {what} with {got:?}; please report this"))
}

/// Sets `dataset`'s queue limit (0: none) and policy.
pub(crate) fn set(c: &Cluster, dataset: &str, limit: u64, policy: Policy) -> Result<()> {
    match c.coord(&Request::SetQueue { dataset: dataset.into(), limit, policy: policy.name().into() })? {
        Response::Queue { .. } => Ok(()),
        other => Err(unexpected("set_queue", &other)),
    }
}

/// Waits until `dataset`'s queue has room, up to `max(timeout, the longest registered reader's
/// lease + 1 s)` (so a reader that died or hung costs a writer at most its lease, once); then a
/// capacity error naming it.
pub(crate) fn wait_room(c: &Cluster, dataset: &str, timeout: Duration) -> Result<()> {
    let started = Instant::now();
    let mut deadline = started + timeout;
    loop {
        let left = deadline.saturating_duration_since(Instant::now()).min(WAIT_SLICE).max(Duration::from_millis(1));
        let req = Request::WaitQueue { dataset: dataset.into(), timeout_ms: left.as_millis() as u64 };
        match c.coord_waiting(&req, left)? {
            Response::Queue { room: true, .. } => return Ok(()),
            Response::Queue { lease_ms, .. } if started + Duration::from_millis(lease_ms) + Duration::from_secs(1) > deadline => {
                deadline = started + Duration::from_millis(lease_ms) + Duration::from_secs(1);
            }
            Response::Queue { queued, limit, policy, .. } if Instant::now() >= deadline => {
                return Err(Error::Capacity(format!(
                    "the queue of '{dataset}' is full: {queued} committed steps are not released, its limit \
                     (define_queue(limit={limit}, policy=\"{policy}\")), and none was released within {:.1} s; readers \
                     release what they passed with stream(release=True) (or release(step), keep_last), or use \
                     policy=\"discard_oldest\"",
                    started.elapsed().as_secs_f64()
                )))
            }
            Response::Queue { .. } => {}
            other => return Err(unexpected("wait_queue", &other)),
        }
    }
}

/// Registers streaming reader `reader` of `dataset`, moves it to `next`, or renews it (`next`
/// none) for `lease`, or (`leave`) ends its registration; returns its mark (the first step it
/// holds).
pub(crate) fn stream_at(c: &Cluster, dataset: &str, reader: &str, next: Option<u64>, lease: Duration, leave: bool) -> Result<Option<u64>> {
    let lease_ms = if leave { 0 } else { (lease.as_millis() as u64).max(1) };
    match c.coord(&Request::StreamAt { dataset: dataset.into(), reader: reader.into(), next, lease_ms })? {
        Response::Queue { mark, .. } => Ok(mark),
        other => Err(unexpected("stream_at", &other)),
    }
}
