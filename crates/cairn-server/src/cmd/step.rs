//! Step requests: ends of steps, aborts and releases (the coordinator's protocol,
//! [`crate::control::commit`]), the queries readers and writers make of committed steps, and
//! readers' touches of objects they read degraded (recovery rebuilds those first).

use super::check::no_payload;
use crate::control::Control;
use crate::reply::Reply;
use cairn_core::{Error, Result};
use cairn_proto::message::{Request, Response, MAX_CONSUME, MAX_KEY, MAX_KEYS, MAX_REASON};
use std::sync::Arc;
use std::time::Duration;

/// Checks a step request (none carries a payload).
pub fn check(req: &Request, payload_len: u64) -> Result<()> {
    no_payload(&req.op_name(), payload_len)?;
    match req {
        Request::EndStep { fragment, .. } => {
            if fragment.consume.len() > MAX_CONSUME || fragment.consume.iter().any(|d| d.is_empty() || d.len() > MAX_KEY) {
                return Err(Error::InvalidArgument(format!(
                    "a step may consume at most {MAX_CONSUME} datasets, each named by 1 to {MAX_KEY} bytes"
                )));
            }
            fragment.validate()
        }
        Request::RemoveDataset { dataset, .. } | Request::WaitDrained { dataset: Some(dataset), .. }
            if dataset.is_empty() || dataset.len() > MAX_KEY =>
        {
            Err(Error::InvalidArgument(format!("a dataset is named by 1 to {MAX_KEY} bytes")))
        }
        Request::Touch { ids, .. } if ids.len() > MAX_KEYS => {
            Err(Error::InvalidArgument(format!("{} object ids in one touch; send at most {MAX_KEYS}", ids.len())))
        }
        Request::AbortStep(a) if a.reason.len() > MAX_REASON => {
            Err(Error::InvalidArgument(format!("an abort's reason of {} bytes: at most {MAX_REASON}", a.reason.len())))
        }
        _ => Ok(()),
    }
}

/// Runs a checked step request.
pub async fn apply(ctl: &Arc<Control>, req: Request) -> Result<Reply> {
    let (gate, meta) = (&ctl.gate, &ctl.meta);
    let r = match req {
        Request::EndStep { dataset, fragment, shares, keep_last } => ctl.commits.end_step(&dataset, fragment, shares, keep_last).await,
        Request::AbortStep(a) => ctl.commits.abort_step(&a.dataset, a.step, &a.session, &a.reason).await,
        Request::Release(r) => ctl.commits.release(&r.dataset, r.step).await,
        Request::RemoveDataset { dataset, from } => ctl.commits.remove(&dataset, from, DISCARD_WAIT).await,
        Request::WaitStep { dataset, step, timeout_ms } => wait_step(ctl, &dataset, step, timeout_ms).await,
        Request::WaitDrained { dataset, step, timeout_ms, drain } => {
            let step = if drain { ctl.drain.ask(dataset.as_deref(), step).await? } else { step };
            ctl.drain.wait(dataset.as_deref(), step, Duration::from_millis(timeout_ms).min(MAX_WAIT)).await
        }
        Request::StepOutcome { dataset, step, session } => gate.leader().map(|log| {
            let (outcome, reason) = meta.outcome(&log, &dataset, step, &session);
            Response::Outcome { outcome: outcome.into(), reason }
        }),
        Request::Steps { dataset, follower } => gate.reader(false, follower).await.map(|(log, _)| Response::Steps {
            steps: meta.steps(&log, &dataset),
            finished: meta.finished(&log, &dataset),
            pending: meta.pending(&log, &dataset),
        }),
        // Linearized: a leader just elected may not have applied every committed entry yet
        // (an `encoded` one whose copies are already gone), and its index must not be older.
        // A follower's answer says so, and its reader re-reads what it finds moved.
        Request::Index { dataset, step, follower } => {
            async {
                let (log, led) = gate.reader(true, follower).await?;
                meta.index(&log, &dataset, step).map(|i| Response::Index { index: (*i).clone(), follower: !led })
            }
            .await
        }
        Request::Touch { dataset, step, ids } => gate.leader().map(|_| {
            ctl.recovery.touch(&dataset, step, &ids);
            Response::Ok
        }),
        other => return Err(super::guard::misrouted("step", &other.op_name())),
    };
    r.map(Reply::Plain)
}

/// Longest wait one `wait_step` may ask for (a day); clients wait longer by asking again.
const MAX_WAIT: Duration = Duration::from_secs(86_400);

/// How long a discard of steps waits for a drain of one of them in flight (a drained step is
/// one file per server; a minute covers gigabytes). The client waits as long, and a little more.
pub const DISCARD_WAIT: Duration = Duration::from_secs(60);

/// Waits until `step` commits or the timeout passes.
async fn wait_step(ctl: &Control, dataset: &str, step: u64, timeout_ms: u64) -> Result<Response> {
    let mut rx = ctl.meta.watch(dataset);
    let deadline = tokio::time::Instant::now() + Duration::from_millis(timeout_ms).min(MAX_WAIT);
    loop {
        // A leader that loses its place mid-wait sends the reader to the new one.
        let log = &ctl.gate.leader()?;
        if ctl.meta.is_committed(log, dataset, step) {
            return Ok(Response::Committed { committed: true });
        }
        if let Some(gone) = ctl.meta.released(log, dataset, step) {
            return Err(gone);
        }
        // Re-checked at least every second: commits finished by a new leader do not ring here.
        let tick = deadline.min(tokio::time::Instant::now() + Duration::from_secs(1));
        match tokio::time::timeout_at(tick, rx.changed()).await {
            Ok(Ok(())) => continue,
            _ if tokio::time::Instant::now() < deadline => continue,
            _ => return Ok(Response::Committed { committed: false }),
        }
    }
}
