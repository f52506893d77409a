//! Backpressure between a dataset's writers and its streaming readers (issue 45; the state is
//! `cairn_meta::queue`): the writers' queue limit, streaming readers' marks, and the writers'
//! wait for room, all answered by the control plane's leader.

use super::check::{check_claimer, no_payload};
use crate::control::Control;
use crate::reply::Reply;
use cairn_core::{Error, Result};
use cairn_meta::queue::Policy;
use cairn_meta::Cmd;
use cairn_proto::message::{Request, Response, MAX_KEY, MAX_LEASE_MS};
use std::sync::Arc;
use std::time::Duration;

/// Longest wait one `wait_queue` may ask for (a day); clients wait longer by asking again.
const MAX_WAIT: Duration = Duration::from_secs(86_400);

/// Checks a queue request (none carries a payload).
pub fn check(req: &Request, payload_len: u64) -> Result<()> {
    no_payload(&req.op_name(), payload_len)?;
    let dataset = match req {
        Request::SetQueue { dataset, policy, .. } => {
            Policy::parse(policy)?;
            dataset
        }
        Request::StreamAt { dataset, reader, lease_ms, .. } => {
            check_claimer(reader)?;
            if *lease_ms > MAX_LEASE_MS {
                return Err(Error::InvalidArgument(format!("a registration of {lease_ms} ms: give at most {MAX_LEASE_MS} ms (a day)")));
            }
            dataset
        }
        Request::WaitQueue { dataset, .. } => dataset,
        _ => return Ok(()),
    };
    if dataset.is_empty() || dataset.len() > MAX_KEY {
        return Err(Error::InvalidArgument(format!("a dataset is named by 1 to {MAX_KEY} bytes")));
    }
    Ok(())
}

/// Runs a checked queue request.
pub async fn apply(ctl: &Arc<Control>, req: Request) -> Result<Reply> {
    let r = match req {
        Request::SetQueue { dataset, limit, policy } => {
            let policy = Policy::parse(&policy)?;
            ctl.commits.queue(&dataset, Cmd::SetQueue { dataset: dataset.clone(), limit, policy }).await?;
            queue(ctl, &dataset)?
        }
        Request::StreamAt { dataset, reader, next, lease_ms } => {
            let now_ms = crate::control::meta::now_ms();
            let cmd = Cmd::Stream { dataset: dataset.clone(), reader: Some(reader.clone()), next, lease_ms, now_ms };
            ctl.commits.queue(&dataset, cmd).await?;
            let mut answer = queue(ctl, &dataset)?;
            if let Response::Queue { mark, .. } = &mut answer {
                *mark = ctl.meta.reader_mark(&ctl.gate.leader()?, &dataset, &reader);
            }
            answer
        }
        Request::WaitQueue { dataset, timeout_ms } => wait(ctl, &dataset, timeout_ms).await?,
        other => return Err(super::guard::misrouted("queue", &other.op_name())),
    };
    Ok(Reply::Plain(r))
}

/// The dataset's queue as answered.
fn queue(ctl: &Control, dataset: &str) -> Result<Response> {
    let q = ctl.meta.queued(&ctl.gate.leader()?, dataset);
    let (limit, policy) = q.limit.unwrap_or((0, Policy::Block));
    Ok(Response::Queue {
        room: limit == 0 || q.queued < limit || q.discarding,
        queued: q.queued,
        limit,
        policy: policy.name().into(),
        lease_ms: q.longest_lease_ms,
        mark: None,
    })
}

/// Waits until the dataset's queue has room or the timeout passes; drops streaming readers
/// whose registration lapsed (a dead or hung reader holds no step for long) and, once its readers
/// all left, looks again at the claim leases that held it with a newer clock.
async fn wait(ctl: &Control, dataset: &str, timeout_ms: u64) -> Result<Response> {
    let mut rx = ctl.meta.watch(dataset);
    let deadline = tokio::time::Instant::now() + Duration::from_millis(timeout_ms).min(MAX_WAIT);
    loop {
        let q = ctl.meta.queued(&ctl.gate.leader()?, dataset);
        if q.lapsed || q.held_by_claims {
            let now_ms = crate::control::meta::now_ms();
            ctl.commits.queue(dataset, Cmd::Stream { dataset: dataset.into(), reader: None, next: None, lease_ms: 0, now_ms }).await?;
        }
        let answer = queue(ctl, dataset)?;
        if matches!(answer, Response::Queue { room: true, .. }) {
            return Ok(answer);
        }
        // Re-checked at least every second: a registration lapses with no change to ring.
        let tick = deadline.min(tokio::time::Instant::now() + Duration::from_secs(1));
        match tokio::time::timeout_at(tick, rx.changed()).await {
            Ok(Ok(())) => continue,
            _ if tokio::time::Instant::now() < deadline => continue,
            _ => return Ok(answer),
        }
    }
}
