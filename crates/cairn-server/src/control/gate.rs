//! The leadership gate: this server's replica of the control plane's log (meta servers only,
//! once started) and whether it leads. Commits, their reads and the leader's services go
//! through [`Gate::leader`]; reads that take a follower's answer through [`Gate::reader`].

use cairn_core::{Error, ErrorKind, Result};
use cairn_meta::raft::node::Timing;
use cairn_meta::raft::RaftLog;
use cairn_proto::ClusterView;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::RwLock;

/// How this server takes part in the control plane.
#[derive(Debug, Clone, Copy)]
pub struct MetaOptions {
    /// Meta servers in the cluster (the first this many ring slots; all when fewer).
    pub servers: u32,
    /// This server restarted: it rejoins under a new node id instead of bootstrapping.
    pub rejoin: bool,
    /// Raft's heartbeat and election timing.
    pub timing: Timing,
}

impl Default for MetaOptions {
    fn default() -> Self {
        MetaOptions { servers: 3, rejoin: false, timing: Timing::default() }
    }
}

/// The servers of the control plane in `view`: those of its first `servers` live ring slots. A
/// spare that takes one of these slots becomes one, and so does the next live server when a
/// voter is declared down with no spare to take its slot (as etcd promotes a learner): a cluster
/// of 4 servers survives two failures one after the other with its quorum.
pub fn members(view: &ClusterView, servers: u32) -> Vec<u32> {
    view.slots.iter().copied().filter(|s| !view.down.contains(s)).take(servers.max(1) as usize).collect()
}

/// This server's replica and how it takes part in the control plane.
#[derive(Debug)]
pub struct Gate {
    /// This server's id.
    pub id: u32,
    /// How it takes part.
    pub options: MetaOptions,
    /// The replica; a new one (a new node id) replaces it when this server, declared down while
    /// it ran one, rejoins the control plane.
    log: RwLock<Option<RaftLog>>,
    /// Set once the replica is installed, for those waiting on it.
    started: tokio::sync::watch::Sender<bool>,
    /// Raft traffic to and from this server is dropped: a network partition of the control
    /// plane, for tests (`testing::TestCluster::partition`); clients still reach it.
    cut: AtomicBool,
}

impl Gate {
    /// The gate of server `id`, its replica not started yet.
    pub fn new(id: u32, options: MetaOptions) -> Gate {
        Gate { id, options, log: RwLock::new(None), started: tokio::sync::watch::channel(false).0, cut: AtomicBool::new(false) }
    }

    /// Installs the started replica (in place of an earlier one, already shut down).
    pub fn set(&self, log: RaftLog) {
        *self.log.write().unwrap_or_else(|p| p.into_inner()) = Some(log);
        self.started.send_replace(true);
    }

    /// Removes the replica, for this server to rejoin under a new node id.
    pub fn take(&self) -> Option<RaftLog> {
        self.log.write().unwrap_or_else(|p| p.into_inner()).take()
    }

    /// A receiver told when the replica is installed ([`Gate::set`]).
    pub fn started(&self) -> tokio::sync::watch::Receiver<bool> {
        self.started.subscribe()
    }

    /// This server's replica, if it runs one.
    pub fn get(&self) -> Option<RaftLog> {
        self.log.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Whether Raft traffic is cut off (tests).
    pub fn is_cut(&self) -> bool {
        self.cut.load(Ordering::Relaxed)
    }

    /// Cuts Raft traffic to and from this server off, or heals it (tests).
    pub fn set_cut(&self, cut: bool) {
        self.cut.store(cut, Ordering::Relaxed);
    }

    /// This server's replica if it leads the control plane, else the not-leader error naming
    /// the leader it knows (commits and their reads go to the leader).
    pub fn leader(&self) -> Result<RaftLog> {
        let log = self.replica()?;
        // A leader cut off from its majority may have been replaced: its state could be stale.
        log.check_quorum()?;
        match log.role() {
            ("leader", _) => Ok(log),
            (_, leader) => Err(Error::NotLeader {
                message: format!(
                    "server {} does not lead the control plane ({}); retry at the leader",
                    self.id,
                    leader.map_or_else(|| "no leader is known yet".to_string(), |l| format!("server {l} leads"))
                ),
                leader,
            }),
        }
    }

    /// The replica to read committed state from, and whether it is the leader's: the leader
    /// (confirmed with a majority when `linearize`) when this server leads; else, for a request
    /// that takes a follower's answer, this server's own replica while it heard from a leader
    /// within its follower window, so reads of committed steps go on through an election.
    /// Otherwise the not-leader error, which sends the client on to the leader.
    pub async fn reader(&self, linearize: bool, follower: bool) -> Result<(RaftLog, bool)> {
        let led = async {
            let log = self.leader()?;
            if linearize {
                log.linearize().await?;
            }
            Ok::<_, Error>(log)
        };
        match led.await {
            Ok(log) => Ok((log, true)),
            Err(e) if follower && matches!(e.kind(), ErrorKind::NotLeader | ErrorKind::Unavailable) => {
                let log = self.replica()?;
                log.recently_led()?;
                Ok((log, false))
            }
            Err(e) => Err(e),
        }
    }

    /// This server's replica, or the not-leader error a non-meta server answers with.
    pub fn replica(&self) -> Result<RaftLog> {
        self.get().ok_or_else(|| Error::NotLeader {
            message: format!("server {} does not run the control plane; ask one of the first meta servers of the ring", self.id),
            leader: None,
        })
    }

    /// The control-plane members of `view`: its first `options.servers` ring slots.
    pub fn members(&self, view: &ClusterView) -> Vec<u32> {
        members(view, self.options.servers)
    }
}
