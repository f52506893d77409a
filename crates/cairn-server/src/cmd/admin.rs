//! Cluster views, status, object listing, datasets and shutdown.

use super::check::no_payload;
use crate::control::recovery::Census;
use crate::control::Control;
use crate::reply::Reply;
use cairn_core::{Error, Result};
use cairn_proto::health::{assess, Facts, Health, HealthCode, HealthReason};
use cairn_proto::message::{Request, Response, ServerStatus};
use cairn_proto::ClusterView;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Checks an admin request (none carries a payload).
pub fn check(req: &Request, payload_len: u64) -> Result<()> {
    no_payload(&req.op_name(), payload_len)?;
    match req {
        Request::SetView(c) => c.view.validate(),
        _ => Ok(()),
    }
}

/// Runs a checked admin request. A shutdown is answered here; the connection then signals it.
pub async fn apply(ctl: &Arc<Control>, req: Request) -> Result<Reply> {
    let state = &ctl.state;
    let r = match req {
        Request::Hello { .. } => return Err(Error::Conflict("hello sent twice on one connection".into())),
        Request::View => Response::View { view: (*state.view()?).clone() },
        Request::SetView(c) => ctl.views.set_view(c.view).await?,
        Request::Datasets => Response::Datasets { names: ctl.meta.datasets(&ctl.gate.leader()?) },
        Request::Status => status(ctl),
        Request::Objects => Response::Objects { objects: state.store.list() },
        Request::Shutdown => Response::Ok,
        other => return Err(super::guard::misrouted("admin", &other.op_name())),
    };
    Ok(Reply::Plain(r))
}

/// Counters for `cairn cluster status`.
fn status(ctl: &Control) -> Response {
    let state = &ctl.state;
    let (objects, steps) = state.store.counts();
    let (replicas, shards, data_bytes) = state.store.copies();
    let (meta, leader) = ctl.gate.get().map_or(("none", None), |c| c.role());
    let voters = ctl.gate.get().map(|c| c.voter_servers()).unwrap_or_default();
    let (prefault_ready, prefault_target) = state.store.fresh().progress();
    let (recovery_degraded, health) = match cluster_health(ctl) {
        Some((census, h)) => (census.degraded, Some(h)),
        None => (0, None),
    };
    Response::Status {
        status: ServerStatus {
            server: state.id,
            memory_used: state.store.used(),
            memory_limit: state.store.limit(),
            objects,
            steps,
            requests: state.requests.load(Ordering::Relaxed),
            same_node_bytes: state.same_node_bytes.load(Ordering::Relaxed),
            mapped_gets: state.mapped_gets.load(Ordering::Relaxed),
            shared_bytes: state.store.shared_bytes(),
            uptime_s: state.started.elapsed().as_secs_f64(),
            meta: meta.to_string(),
            leader,
            epoch: state.view().map_or(0, |v| v.epoch),
            commits: ctl.meta.times(),
            replicas,
            shards,
            keys: state.kv.len() as u64,
            data_bytes,
            recovery_pending: ctl.recovery.pending(),
            recovery_rebuilt: ctl.recovery.rebuilt(),
            recovery_lost: ctl.recovery.lost(),
            recovery_overdue_s: ctl.recovery.overdue(state.limits.recovery_deadline()),
            prefault_ready,
            prefault_target,
            prefault_taken: state.store.fresh().served(),
            prefault_huge: state.store.fresh().huge(),
            recovery_degraded,
            voters,
            health,
        },
    }
}

/// The cluster's committed objects and health, if this server's replica leads (see [`health`]).
pub fn cluster_health(ctl: &Control) -> Option<(Census, Health)> {
    let replica = ctl.gate.get()?;
    if replica.role().0 != "leader" {
        return None;
    }
    let view = ctl.state.view().ok()?;
    let census = ctl.recovery.census(&view);
    let voters = replica.voter_servers();
    let health = health(ctl, &view, &voters, &census);
    Some((census, health))
}

/// The cluster's health as this server, leading the control plane, sees it: `lost_quorum` once
/// its voters stopped answering, else what [`cairn_proto::health::assess`] makes of its facts.
fn health(ctl: &Control, view: &ClusterView, voters: &[u32], census: &Census) -> Health {
    let log = match ctl.gate.leader() {
        Ok(log) => log,
        Err(e) => {
            let reason = HealthReason {
                code: HealthCode::LostQuorum,
                message: format!("{e}: nothing commits until a majority of the voters {voters:?} is back"),
            };
            return Health::of(vec![reason]);
        }
    };
    // Named by the census's own walk of the indexes, not one more walk per down server.
    let absorbed = view.down.iter().copied().filter(|d| !voters.contains(d) && !census.named_down.contains(d)).collect();
    let facts = Facts {
        voters: voters.to_vec(),
        absorbed,
        degraded: census.degraded,
        waiting: census.waiting,
        lost: ctl.recovery.lost(),
        overdue_s: ctl.recovery.overdue(ctl.state.limits.recovery_deadline()),
        drain_error: ctl.drain.status(&log).error,
        default_level: ctl.state.policy().map_or(0, |p| p.redundancy),
    };
    assess(view, &facts)
}
