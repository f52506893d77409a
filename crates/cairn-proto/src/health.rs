//! A cluster's health (`cairn cluster status`, `cairn_cluster_health`): a state (`ok`, `warn`,
//! `err`) and its reasons, each a typed code with a sentence saying what to do. The control
//! plane's leader assesses it from what it knows ([`assess`]); a client that finds no leader
//! names `electing` or `lost_quorum` itself.

use crate::ClusterView;
use serde::{Deserialize, Serialize};

/// How a cluster is: every reason's state, the worst of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HealthState {
    /// Every committed object at its level, every server up, nothing overdue.
    Ok,
    /// Serving, but one more failure may cost data or the quorum, or something waits.
    Warn,
    /// Data lost, or nothing can commit.
    Err,
}

/// Why a cluster is not `ok` (the JSON `code`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HealthCode {
    /// A server was declared down.
    ServerDown,
    /// Objects of committed steps are below their redundancy level.
    Degraded,
    /// Spares were configured and every one is in use.
    SparesExhausted,
    /// The recovery under way has run past its deadline.
    RecoveryOverdue,
    /// The drain to disk failed.
    DrainError,
    /// One failure would lose the quorum, or the default level cannot be placed.
    FragileLayout,
    /// No leader yet, within the election timeout.
    Electing,
    /// No majority of the control plane's voters is up: nothing commits.
    LostQuorum,
    /// Objects lost beyond their redundancy level.
    Lost,
}

impl HealthCode {
    /// The state a reason of this code puts the cluster in.
    pub fn state(self) -> HealthState {
        match self {
            HealthCode::LostQuorum | HealthCode::Lost => HealthState::Err,
            _ => HealthState::Warn,
        }
    }
}

/// One reason.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HealthReason {
    /// What is wrong.
    pub code: HealthCode,
    /// What is wrong, in a sentence, and what to do.
    pub message: String,
}

/// A cluster's health.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Health {
    /// The worst of the reasons' states.
    pub state: HealthState,
    /// Every reason, in a fixed order of codes.
    pub reasons: Vec<HealthReason>,
}

impl Health {
    /// The health these reasons make (`ok` without any).
    pub fn of(reasons: Vec<HealthReason>) -> Health {
        let state = reasons.iter().map(|r| r.code.state()).max().unwrap_or(HealthState::Ok);
        Health { state, reasons }
    }
}

/// What the leader knows that health is made of.
#[derive(Debug, Clone, Default)]
pub struct Facts {
    /// The control plane's voters (servers).
    pub voters: Vec<u32>,
    /// Down servers nothing depends on any more: no index names them for a piece and they hold
    /// no vote (their work was taken over by the survivors).
    pub absorbed: Vec<u32>,
    /// Objects of committed steps with a piece on a server declared down.
    pub degraded: u64,
    /// Of those, objects no server can take now (too few live servers for their level).
    pub waiting: u64,
    /// Objects lost beyond their level.
    pub lost: u64,
    /// Seconds the recovery under way is past its deadline.
    pub overdue_s: f64,
    /// The drain's error, if it failed.
    pub drain_error: Option<String>,
    /// The cluster's default redundancy level.
    pub default_level: u32,
}

/// The health of a cluster in `view` with `facts`, as its leader (which has its quorum) sees it.
pub fn assess(view: &ClusterView, facts: &Facts) -> Health {
    let mut out = Vec::new();
    let mut say = |code, message: String| out.push(HealthReason { code, message });
    let down: Vec<u32> = view.down.iter().copied().filter(|d| !facts.absorbed.contains(d)).collect();
    if !down.is_empty() {
        say(
            HealthCode::ServerDown,
            format!(
                "server(s) {down:?} declared down in view {}: their pieces are being rebuilt; restart them (they rejoin \
                 empty), or `cairn cluster add` servers",
                view.epoch
            ),
        );
    }
    if facts.degraded > 0 {
        let waiting = if facts.waiting > 0 {
            format!("; {} wait for a server to be rebuilt onto (`cairn cluster add`, or a spare)", facts.waiting)
        } else {
            "; recovery is rebuilding them on the live servers".to_string()
        };
        say(HealthCode::Degraded, format!("{} object(s) of committed steps are below their redundancy level{waiting}", facts.degraded));
    }
    let configured = view.servers.iter().filter(|e| e.spec.spare).count();
    if configured > 0 && view.spares.is_empty() {
        say(HealthCode::SparesExhausted, format!("all {configured} spare(s) are in use: the next failure has no spare to take its slot"));
    }
    if facts.overdue_s > 0.0 {
        say(
            HealthCode::RecoveryOverdue,
            format!("the recovery under way is {:.1} s past its deadline: the servers cannot rebuild faster here", facts.overdue_s),
        );
    }
    if let Some(e) = &facts.drain_error {
        say(HealthCode::DrainError, format!("the drain to disk failed: {e}"));
    }
    if let Some(why) = fragile(view, &facts.voters, facts.default_level) {
        say(HealthCode::FragileLayout, why);
    }
    if facts.lost > 0 {
        say(
            HealthCode::Lost,
            format!(
                "{} object(s) are lost: more of their servers failed than their level survives; their blocks raise DataLossError",
                facts.lost
            ),
        );
    }
    Health::of(out)
}

/// Why one more failure would cost the quorum or the default level cannot be placed, if so.
pub fn fragile(view: &ClusterView, voters: &[u32], default_level: u32) -> Option<String> {
    let live = view.live();
    let up = voters.iter().filter(|v| live.contains(v)).count();
    let majority = voters.len() / 2 + 1;
    if !voters.is_empty() && up <= majority {
        let more = if voters.len() < 3 {
            "start 3 or more servers (3 meta servers survive 1 failure, 5 survive 2)"
        } else {
            "restart or add servers so that the control plane has voters to spare"
        };
        return Some(format!(
            "{up} of the control plane's {} voter(s) are up and {majority} are needed: one more failure stops every commit; {more}",
            voters.len()
        ));
    }
    if (live.len() as u64) < u64::from(default_level) + 1 {
        return Some(format!(
            "{} live server(s) cannot hold the default redundancy level {default_level} ({} copies on distinct servers): start or add servers",
            live.len(),
            default_level + 1
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cluster::ServerEntry;
    use cairn_core::placement::ServerSpec;

    fn entry(id: u32, spare: bool) -> ServerEntry {
        let spec = ServerSpec { id, node: String::new(), rack: String::new(), spare };
        ServerEntry { spec, addr: String::new(), unix: None, host: String::new(), pid: 0, memory: 0, metrics: None }
    }

    fn view(slots: &[u32], spares: &[u32], down: &[u32]) -> ClusterView {
        ClusterView {
            epoch: 2,
            slots: slots.to_vec(),
            spares: spares.to_vec(),
            down: down.to_vec(),
            took: Vec::new(),
            retiring: Vec::new(),
            servers: slots.iter().map(|s| entry(*s, false)).chain(spares.iter().map(|s| entry(*s, true))).collect(),
        }
    }

    fn codes(h: &Health) -> Vec<HealthCode> {
        h.reasons.iter().map(|r| r.code).collect()
    }

    #[test]
    fn a_whole_cluster_is_ok() {
        let h = assess(&view(&[0, 1, 2, 3], &[], &[]), &Facts { voters: vec![0, 1, 2], default_level: 1, ..Default::default() });
        assert_eq!(h, Health { state: HealthState::Ok, reasons: vec![] });
    }

    #[test]
    fn a_down_server_warns_and_lost_objects_are_errors() {
        let v = view(&[0, 1, 2, 3], &[], &[3]);
        let h = assess(&v, &Facts { voters: vec![0, 1, 2], degraded: 5, default_level: 1, ..Default::default() });
        assert_eq!((h.state, codes(&h)), (HealthState::Warn, vec![HealthCode::ServerDown, HealthCode::Degraded]));
        let h = assess(&v, &Facts { voters: vec![0, 1, 2], lost: 1, default_level: 1, ..Default::default() });
        assert_eq!(h.state, HealthState::Err);
    }

    #[test]
    fn a_down_server_whose_work_the_survivors_took_is_no_reason() {
        let v = view(&[0, 1, 2, 3], &[], &[3]);
        let h = assess(&v, &Facts { voters: vec![0, 1, 2], absorbed: vec![3], default_level: 1, ..Default::default() });
        assert_eq!(h.state, HealthState::Ok, "{h:?}");
    }

    #[test]
    fn two_servers_or_a_voter_short_of_a_majority_are_fragile() {
        let two = assess(&view(&[0, 1], &[], &[]), &Facts { voters: vec![0, 1], default_level: 1, ..Default::default() });
        assert_eq!(codes(&two), vec![HealthCode::FragileLayout]);
        assert!(two.reasons[0].message.contains("start 3 or more servers"), "{}", two.reasons[0].message);
        let one_down = assess(&view(&[0, 1, 2], &[], &[2]), &Facts { voters: vec![0, 1, 2], default_level: 1, ..Default::default() });
        assert!(codes(&one_down).contains(&HealthCode::FragileLayout));
        let level = fragile(&view(&[0, 1, 2], &[], &[]), &[0, 1, 2], 3).unwrap();
        assert!(level.contains("default redundancy level 3"), "{level}");
    }

    #[test]
    fn used_spares_are_named() {
        let h = assess(&view(&[0, 1, 2], &[], &[]), &Facts { voters: vec![0, 1, 2], default_level: 1, ..Default::default() });
        assert!(h.reasons.is_empty());
        let mut v = view(&[0, 1, 3], &[], &[2]);
        v.servers.push(entry(3, true));
        let h = assess(&v, &Facts { voters: vec![0, 1, 3], default_level: 1, ..Default::default() });
        assert!(codes(&h).contains(&HealthCode::SparesExhausted), "{h:?}");
    }
}
