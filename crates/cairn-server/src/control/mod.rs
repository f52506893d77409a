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
pub mod story;
pub mod views;
pub mod worker;

use crate::state::State;
use cairn_meta::raft::{MetaNode, NodeId, RaftLog};
use cairn_proto::message::RaftRequest;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

pub use gate::{members, Gate, MetaOptions};

/// How long a leader left out of the control plane's members keeps its replica at most, for it
/// to commit its own removal and step down.
const STEP_DOWN_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

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
        let corec = Arc::new(corec::Corec::new(state.clone(), gate.clone(), meta.clone()));
        let recovery = Arc::new(recovery::Recovery::new(state.clone(), gate.clone(), meta.clone(), corec.clone()));
        let drain = Arc::new(drain::Drain::new(state.clone(), gate.clone(), meta.clone(), corec.clone(), drain));
        let told = commit::Told { corec: corec.clone(), recovery: recovery.clone(), drain: drain.clone() };
        let commits = Arc::new(commit::Commits::new(state.clone(), gate.clone(), meta.clone(), told));
        let views = Arc::new(views::Views::new(state.clone(), gate.clone(), recovery.clone()));
        let detector = Arc::new(detect::Detector::new(state.clone(), gate.clone(), views.clone(), recovery.clone()));
        Arc::new(Control { state, gate, meta, commits, corec, recovery, drain, views, detector })
    }

    /// Starts this server's replica once the cluster view is known, if it is a meta server, or
    /// later, once a view change gives it a meta server's slot (a spare replacing a failed one,
    /// or the next live server promoted in a failed voter's place). A server declared down while
    /// it runs a replica (cut off, or stopped, for longer than the failure timeout) has had its
    /// vote taken away: it shuts that replica down (a removed voter would stand for election
    /// for ever) and joins again under a new node id once a view gives it a slot again.
    pub fn start(self: &Arc<Self>) {
        let ctl = self.clone();
        tokio::spawn(async move {
            let mut rejoin = ctl.gate.options.rejoin;
            // Declared down since the replica started (the view that did so may already be
            // followed by the one taking this server back as a spare).
            let mut downs = ctl.state.downs();
            while ctl.join(rejoin, &mut downs).await && ctl.evicted(&mut downs).await {
                rejoin = true;
            }
        });
    }

    /// Waits until this server's replica has lost its vote, and shuts it down (a leader once it
    /// stepped down, or after [`STEP_DOWN_WAIT`]): a view leaves
    /// the server out of the control plane's members (a spare or a lower live slot took its
    /// place; the leader removes it as it admits that one), or declares it down (`downs`
    /// changes: the view giving it a slot again may already have followed). `false` when the
    /// server stops first.
    async fn evicted(&self, downs: &mut tokio::sync::watch::Receiver<u64>) -> bool {
        let state = &self.state;
        let (mut epochs, mut shutdown) = (state.epochs(), state.shutdown.subscribe());
        loop {
            let out = state.view().is_ok_and(|v| !self.gate.members(&v).contains(&state.id));
            if out || downs.has_changed().unwrap_or(false) {
                break;
            }
            tokio::select! {
                changed = epochs.changed() => if changed.is_err() { return false },
                changed = downs.changed() => if changed.is_err() { return false } else { break },
                _ = shutdown.recv() => return false,
            }
        }
        // A leader left out (retired, say) still commits the membership that removes it and
        // what the call that retired it proposes next; it steps down once that is done.
        // Stopped before, those proposals failed ("raft stopped").
        if let Some(log) = self.gate.get() {
            let (mut metrics, wait) = (log.raft().metrics(), tokio::time::sleep(STEP_DOWN_WAIT));
            tokio::pin!(wait);
            while log.leader() == Some(log.id()) {
                tokio::select! {
                    changed = metrics.changed() => if changed.is_err() { break },
                    () = &mut wait => break,
                    _ = shutdown.recv() => return false,
                }
            }
        }
        if let Some(old) = self.gate.take() {
            tracing::warn!(
                server = state.id,
                "no longer a control-plane member: its replica stops, to rejoin under a new node id when it is one again"
            );
            old.shutdown().await;
        }
        true
    }

    /// Starts a replica once a view gives this server a control-plane slot: founding the
    /// control plane with the first members, else (`rejoin`, or not a first member) joining the
    /// running one under a new node id. `false` when the server stops first.
    async fn join(self: &Arc<Self>, rejoin: bool, downs: &mut tokio::sync::watch::Receiver<u64>) -> bool {
        let (state, gate) = (&self.state, &self.gate);
        let mut shutdown = state.shutdown.subscribe();
        // The first view is the cluster file's, once server 0 has written it (a file, so it is
        // looked for; every later view comes as a message, and is waited for).
        let first = loop {
            if let Ok(v) = state.view() {
                break v;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        if rejoin {
            self.views.refresh();
        }
        // One of the first members starts with the cluster; any other joins the running one.
        let founding = !rejoin && gate.members(&first).contains(&state.id);
        let view = loop {
            let v = state.view().unwrap_or(first.clone());
            // A restarted server first learns the current view (its slot may be a spare's now).
            let settled = !self.views.refreshing();
            if founding || (settled && gate.members(&v).contains(&state.id) && v.is_live(state.id)) {
                break v;
            }
            // Woken by the next view (or to look again once the refresh settled).
            tokio::select! {
                _ = state.view_at(v.epoch + 1, Duration::from_millis(200)) => {}
                _ = shutdown.recv() => return false,
            }
        };
        let members = gate.members(&view);
        // Declared down before this point concerns no replica: only later ones evict this one.
        downs.borrow_and_update();
        let incarnation = if founding { 0 } else { u64::from(raft::rand_u32().max(1)) };
        let id = (u64::from(state.id) << 32) | incarnation;
        let net = raft::PeerNet::new(state, gate);
        let log = match RaftLog::start(id, gate.options.timing, net).await {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(server = state.id, "control plane did not start: {e}");
                return false;
            }
        };
        gate.set(log.clone());
        tokio::spawn(self.clone().on_leadership(log.clone()));
        tokio::spawn(story::leadership(state.clone(), log.clone()));
        tokio::spawn(self.views.clone().follow(log.clone()));
        self.detector.start();
        let node = |s: u32| view.server(s).map(|e| MetaNode { server: s, addr: e.addr.clone() });
        if founding {
            if members.first() == Some(&state.id) {
                let all: Option<BTreeMap<NodeId, MetaNode>> = members.iter().map(|s| Some((u64::from(*s) << 32, node(*s).ok()?))).collect();
                if let Some(all) = all {
                    if let Err(e) = log.bootstrap(all).await {
                        tracing::error!(server = state.id, "control plane bootstrap failed: {e}");
                    }
                }
            }
            return true;
        }
        // A restart or a replacement: ask the meta servers (any; followers name the leader) to
        // take this node in, until one does or this server is declared down again.
        let Ok(me) = node(state.id) else { return true };
        let join = RaftRequest::MetaJoin { node: id, server: state.id, addr: me.addr };
        loop {
            let now = state.view().unwrap_or(view.clone());
            if now.down.contains(&state.id) {
                return true;
            }
            for s in gate.members(&now).iter().filter(|s| **s != state.id) {
                if crate::peer::call(state, *s, &join).await.is_ok() {
                    return true;
                }
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                _ = shutdown.recv() => return false,
            }
        }
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
                    self.drain.lead();
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
