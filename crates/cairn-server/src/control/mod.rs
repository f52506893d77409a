//! The control plane's services on this server, above the data plane ([`crate::state`]) and
//! below the requests ([`crate::cmd`]), each handed only what it uses:
//!
//! - [`gate`]: this server's Raft replica of the control plane's log (meta servers only) and
//!   whether it leads; [`raft`]: Raft's transport over the staging protocol, joins,
//!   compare-and-set values.
//! - [`meta`]: commits as commands of the log; [`commit`]: the coordinator's protocol (seal,
//!   commit or abort, release, sweeps).
//! - [`corec`]: the leader's CoREC encoder; [`recovery`]: its queue of rebuilds onto spares;
//!   [`drain`]: its drain of committed steps to disk; [`fanout`]: calls to several servers.
//! - [`detect`]: failure detection; [`views`]: view changes and how servers learn them;
//!   [`rehome`]: keyed values following a view change.
//! - [`worker`]: the one shape of their background tasks.
//!
//! The first `meta` servers of the ring (different failure domains) run a replica, talking to
//! each other over the staging protocol. Their state is volatile: a meta server that restarts
//! rejoins under a new node id (server id in the high 32 bits, a random incarnation below)
//! through a membership change on the leader, so it never votes twice in a term.

pub mod commit;
pub mod corec;
pub mod detect;
pub mod drain;
pub mod fanout;
pub mod gate;
pub mod meta;
pub mod raft;
pub mod recovery;
pub mod rehome;
pub mod views;
pub mod worker;

use crate::state::State;
use cairn_meta::raft::{MetaNode, NodeId, RaftLog};
use cairn_proto::message::RaftRequest;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

pub use gate::{members, Gate, MetaOptions};

/// The control plane's services of one server.
#[derive(Debug)]
pub struct Control {
    /// The data plane they serve.
    pub state: Arc<State>,
    /// The replica and whether it leads.
    pub gate: Arc<Gate>,
    /// Commits as commands of the log.
    pub meta: Arc<meta::Meta>,
    /// The coordinator of step commits.
    pub commits: Arc<commit::Commits>,
    /// The leader's CoREC encoder.
    pub corec: Arc<corec::Corec>,
    /// The leader's recovery of lost servers' objects onto the servers that took their slots.
    pub recovery: Arc<recovery::Recovery>,
    /// The leader's drain of committed steps to disk.
    pub drain: Arc<drain::Drain>,
    /// View changes.
    pub views: Arc<views::Views>,
    /// Failure detection (while leading).
    pub detector: Arc<detect::Detector>,
}

impl Control {
    /// The services of the server with `state`, taking part in the control plane as `options`
    /// says; nothing runs until [`Control::start`].
    pub fn new(state: Arc<State>, options: MetaOptions, drain: Option<cairn_proto::cluster::DrainSpec>) -> Arc<Control> {
        let gate = Arc::new(Gate::new(state.id, options));
        let meta = Arc::new(meta::Meta::default());
        let recovery = Arc::new(recovery::Recovery::new(state.clone(), gate.clone(), meta.clone()));
        let corec = Arc::new(corec::Corec::new(state.clone(), gate.clone(), meta.clone()));
        let drain = Arc::new(drain::Drain::new(state.clone(), gate.clone(), meta.clone(), corec.clone(), drain));
        let told = commit::Told { corec: corec.clone(), recovery: recovery.clone(), drain: drain.clone() };
        let commits = Arc::new(commit::Commits::new(state.clone(), gate.clone(), meta.clone(), told));
        let views = Arc::new(views::Views::new(state.clone(), gate.clone(), recovery.clone()));
        let detector = Arc::new(detect::Detector::new(state.clone(), gate.clone(), views.clone(), recovery.clone()));
        Arc::new(Control { state, gate, meta, commits, corec, recovery, drain, views, detector })
    }

    /// Starts this server's replica once the cluster view is known, if it is a meta server, or
    /// later, once a view change gives it a meta server's slot (a spare replacing a failed one).
    pub fn start(self: &Arc<Self>) {
        let ctl = self.clone();
        tokio::spawn(async move {
            let (state, gate) = (&ctl.state, &ctl.gate);
            let mut shutdown = state.shutdown.subscribe();
            // The first view is the cluster file's, once server 0 has written it (a file, so it is
            // looked for; every later view comes as a message, and is waited for).
            let first = loop {
                if let Ok(v) = state.view() {
                    break v;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            };
            if gate.options.rejoin {
                ctl.views.refresh();
            }
            // One of the first members starts with the cluster; any other joins the running one.
            let founding = !gate.options.rejoin && gate.members(&first).contains(&state.id);
            let view = loop {
                let v = state.view().unwrap_or(first.clone());
                // A restarted server first learns the current view (its slot may be a spare's now).
                let settled = !ctl.views.refreshing();
                if founding || (settled && gate.members(&v).contains(&state.id) && v.is_live(state.id)) {
                    break v;
                }
                // Woken by the next view (or to look again once the refresh settled).
                tokio::select! {
                    _ = state.view_at(v.epoch + 1, Duration::from_millis(200)) => {}
                    _ = shutdown.recv() => return,
                }
            };
            let members = gate.members(&view);
            let incarnation = if founding { 0 } else { u64::from(raft::rand_u32().max(1)) };
            let id = (u64::from(state.id) << 32) | incarnation;
            let net = raft::PeerNet::new(state, gate);
            let log = match RaftLog::start(id, gate.options.timing, net).await {
                Ok(l) => l,
                Err(e) => return tracing::error!(server = state.id, "control plane did not start: {e}"),
            };
            gate.set(log.clone());
            tokio::spawn(ctl.clone().on_leadership(log.clone()));
            tokio::spawn(ctl.views.clone().follow(log.clone()));
            ctl.detector.start();
            let node = |s: u32| view.server(s).map(|e| MetaNode { server: s, addr: e.addr.clone() });
            if founding {
                if members.first() == Some(&state.id) {
                    let all: Option<BTreeMap<NodeId, MetaNode>> =
                        members.iter().map(|s| Some((u64::from(*s) << 32, node(*s).ok()?))).collect();
                    if let Some(all) = all {
                        if let Err(e) = log.bootstrap(all).await {
                            tracing::error!(server = state.id, "control plane bootstrap failed: {e}");
                        }
                    }
                }
                return;
            }
            // A restart or a replacement: ask the meta servers (any; followers name the leader) to
            // take this node in.
            let Ok(me) = node(state.id) else { return };
            let join = RaftRequest::MetaJoin { node: id, server: state.id, addr: me.addr };
            loop {
                let now = state.view().unwrap_or(view.clone());
                for s in gate.members(&now).iter().filter(|s| **s != state.id) {
                    if crate::peer::call(state, *s, &join).await.is_ok() {
                        return;
                    }
                }
                tokio::select! {
                    _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                    _ = shutdown.recv() => return,
                }
            }
        });
    }

    /// While this replica leads: once its state has caught up with every committed entry, it finishes
    /// the steps a previous leader left prepared and resumes its recovery, and checks again every
    /// second for steps that a failed finish left behind.
    async fn on_leadership(self: Arc<Self>, log: RaftLog) {
        let state = &self.state;
        let mut metrics = log.raft().metrics();
        let mut shutdown = state.shutdown.subscribe();
        let mut resumed = false;
        loop {
            let leading = metrics.borrow().state == openraft::ServerState::Leader;
            if leading && log.linearize().await.is_ok() {
                if let Err(e) = views::log_first_view(state, &log).await {
                    tracing::warn!(server = state.id, "the first view is not in the log yet: {e}");
                }
                self.commits.finish_in_flight().await;
                // Once per term: recovery a previous leader left under way.
                if !resumed {
                    self.recovery.resume();
                    self.drain.resume();
                    resumed = true;
                }
            }
            resumed &= leading;
            // Wake when this replica gains or loses the lead (or each second while leading): not at
            // every change of the metrics, which the confirmation above changes itself (quorum ack
            // times), so waking on those made this loop confirm its lead thousands of times a second.
            let role_change = async {
                loop {
                    metrics.changed().await?;
                    if (metrics.borrow().state == openraft::ServerState::Leader) != leading {
                        return Ok::<(), tokio::sync::watch::error::RecvError>(());
                    }
                }
            };
            tokio::select! {
                changed = role_change => if changed.is_err() { return },
                _ = tokio::time::sleep(Duration::from_secs(1)), if leading => {}
                _ = shutdown.recv() => return,
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use cairn_core::placement::ServerSpec;
    use cairn_proto::cluster::{ClusterFile, ServerEntry};
    use cairn_proto::ClusterView;

    /// A cluster view of `active` servers and `spares` spares (ids in that order), one node each,
    /// for unit tests of view changes.
    pub(crate) fn view(active: u32, spares: u32) -> ClusterView {
        let servers = (0..active + spares)
            .map(|id| ServerEntry {
                spec: ServerSpec { id, node: format!("n{id}"), rack: String::new(), spare: id >= active },
                addr: String::new(),
                unix: None,
                host: "h".into(),
                pid: 0,
                memory: 1,
                metrics: None,
            })
            .collect();
        ClusterView::initial(&ClusterFile { secret: "s".into(), servers, redundancy: Default::default(), drain: None })
    }
}
