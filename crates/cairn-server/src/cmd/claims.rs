//! Claims of committed steps and the writers' close (D²T workflows): claimers lease steps
//! through the control plane's leader; a consuming commit (see [`super::commit`]) ends a claim.

use crate::state::State;
use cairn_core::Result;
use cairn_meta::Cmd;
use cairn_proto::message::Response;
use std::sync::Arc;

/// Leases the lowest free committed step of `dataset` to `claimer`.
pub async fn claim(state: &Arc<State>, dataset: &str, claimer: &str, lease_ms: u64) -> Result<Response> {
    let c = state.meta.claim(crate::control::leader(state)?, dataset, claimer, lease_ms).await?;
    Ok(Response::Claimed { step: c.step, done: c.done })
}

/// Extends `claimer`'s leases; answers the steps it still holds.
pub async fn renew(state: &Arc<State>, dataset: &str, claimer: &str, lease_ms: u64) -> Result<Response> {
    let steps = state.meta.renew(crate::control::leader(state)?, dataset, claimer, lease_ms).await?;
    Ok(Response::Steps { steps, finished: false, pending: Vec::new() })
}

/// Gives back every step `claimer` holds, or records a writer rank's close.
pub async fn done(state: &Arc<State>, cmd: Cmd) -> Result<Response> {
    let dataset = match &cmd {
        Cmd::Unclaim { dataset, .. } | Cmd::Close { dataset, .. } => dataset.clone(),
        _ => unreachable!("only unclaim and close come here"),
    };
    state.meta.done(crate::control::leader(state)?, &dataset, cmd).await?;
    Ok(Response::Ok)
}
