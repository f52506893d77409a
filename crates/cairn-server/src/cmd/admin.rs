//! Status of a server.

use crate::state::State;
use cairn_proto::message::{Response, ServerStatus};
use std::sync::atomic::Ordering;

/// Counters for `cairn cluster status`.
pub fn status(state: &State) -> Response {
    let (objects, steps) = state.store.counts();
    let (replicas, shards, data_bytes) = state.store.copies();
    let (meta, leader) = state.control.get().map_or(("none", None), |c| c.role());
    Response::Status {
        status: ServerStatus {
            server: state.id,
            memory_used: state.store.used(),
            memory_limit: state.store.limit(),
            objects,
            steps,
            requests: state.requests.load(Ordering::Relaxed),
            same_node_bytes: state.same_node_bytes.load(Ordering::Relaxed),
            shared_bytes: state.store.shared_bytes(),
            uptime_s: state.started.elapsed().as_secs_f64(),
            meta: meta.to_string(),
            leader,
            epoch: state.view().map_or(0, |v| v.epoch),
            commits: state.meta.times(),
            replicas,
            shards,
            keys: state.kv.len() as u64,
            data_bytes,
            recovery_pending: state.recovery.pending(),
            recovery_rebuilt: state.recovery.rebuilt(),
            recovery_lost: state.recovery.lost(),
            recovery_overdue_s: state.recovery.overdue(state.limits.recovery_deadline()),
        },
    }
}
