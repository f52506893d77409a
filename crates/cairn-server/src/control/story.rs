//! The control plane's story in the log, once per event with the numbers a post-mortem needs:
//! `event=leader_elected` (term, leader), `event=leader_lost` (term, the leader it had),
//! `event=quorum_lost` and `event=quorum_regained` (after how long) as this replica sees them.
//! View changes are logged where views are installed (`event=view_changed`, [`crate::state`]).

use crate::state::State;
use cairn_meta::raft::RaftLog;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How often the replica's metrics are looked at (a heartbeat's order: an event is logged
/// within this of happening).
const LOOK: Duration = Duration::from_millis(200);

/// Logs this replica's view of leadership and quorum until the server or the replica stops.
pub async fn leadership(state: Arc<State>, log: RaftLog) {
    let mut shutdown = state.shutdown.subscribe();
    let (mut leader, mut lost): (Option<(u64, u32)>, Option<Instant>) = (None, None);
    loop {
        let (role, known) = log.role();
        if role == "none" {
            return;
        }
        let term = log.raft().metrics().borrow().current_term;
        match (leader, known) {
            (Some((t, l)), Some(k)) if t == term && l == k => {}
            (_, Some(k)) => {
                tracing::info!(
                    server = state.id,
                    event = "leader_elected",
                    term,
                    leader = k,
                    "server {k} leads the control plane (term {term})"
                );
                leader = Some((term, k));
            }
            (Some((t, l)), None) => {
                tracing::info!(server = state.id, event = "leader_lost", term, was = l, "no leader known (server {l} led in term {t})");
                leader = None;
            }
            (None, None) => {}
        }
        let cut = role == "leader" && log.check_quorum().is_err();
        match (lost, cut) {
            (None, true) => {
                tracing::warn!(server = state.id, event = "quorum_lost", term, "this leader cannot reach a majority of the meta servers");
                lost = Some(Instant::now());
            }
            (Some(at), false) if role == "leader" => {
                let after_s = (at.elapsed().as_secs_f64() * 10.0).round() / 10.0;
                tracing::info!(server = state.id, event = "quorum_regained", term, after_s, "a majority answers again after {after_s} s");
                lost = None;
            }
            (Some(_), false) => lost = None, // stepped down: leader_lost and leader_elected tell the rest
            _ => {}
        }
        tokio::select! {
            _ = tokio::time::sleep(LOOK) => {}
            _ = shutdown.recv() => return,
        }
    }
}
