//! Claims of committed steps and the writers' close (D²T workflows): claimers lease steps
//! through the control plane's leader; a consuming commit ([`super::step`]) ends a claim.

use super::check::{check_claimer, no_payload};
use crate::control::Control;
use crate::reply::Reply;
use cairn_core::{Error, Result};
use cairn_meta::Cmd;
use cairn_proto::message::{ClaimLease, Request, Response, MAX_LEASE_MS};
use std::sync::Arc;

/// Checks a claim request (none carries a payload).
pub fn check(req: &Request, payload_len: u64) -> Result<()> {
    no_payload(&req.op_name(), payload_len)?;
    match req {
        Request::Claim(ClaimLease { claimer, lease_ms, .. }) | Request::Renew(ClaimLease { claimer, lease_ms, .. }) => {
            check_claimer(claimer)?;
            if *lease_ms == 0 || *lease_ms > MAX_LEASE_MS {
                return Err(Error::InvalidArgument(format!("a lease of {lease_ms} ms: give 1 ms to {MAX_LEASE_MS} ms (a day)")));
            }
            Ok(())
        }
        Request::Unclaim(u) => check_claimer(&u.claimer),
        _ => Ok(()),
    }
}

/// Runs a checked claim request.
pub async fn apply(ctl: &Arc<Control>, req: Request) -> Result<Reply> {
    let (log, meta) = (&ctl.gate.leader()?, &ctl.meta);
    let r = match req {
        // Leases the lowest free committed step of `dataset` to `claimer`.
        Request::Claim(ClaimLease { dataset, claimer, lease_ms }) => {
            let c = meta.claim(log, &dataset, &claimer, lease_ms).await?;
            Response::Claimed { step: c.step, done: c.done }
        }
        // Extends `claimer`'s leases; answers the steps it still holds.
        Request::Renew(ClaimLease { dataset, claimer, lease_ms }) => {
            let steps = meta.renew(log, &dataset, &claimer, lease_ms).await?;
            Response::Steps { steps, finished: false, pending: Vec::new() }
        }
        // Gives back every step `claimer` holds, or records a writer rank's close.
        Request::Unclaim(u) => {
            meta.done(log, &u.dataset.clone(), Cmd::Unclaim(u)).await?;
            Response::Ok
        }
        Request::Close(c) => {
            meta.done(log, &c.dataset.clone(), Cmd::Close(c)).await?;
            Response::Ok
        }
        other => return Err(super::guard::misrouted("claims", &other.op_name())),
    };
    Ok(Reply::Plain(r))
}
