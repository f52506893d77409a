//! One replica of the control plane's log: starting it, bootstrapping a new cluster, proposing
//! commands (committed by a majority, then applied) and reading the applied state.

use super::machine::Machine;
use super::store::MemStore;
use super::types::{MetaNode, MetaTypes, NodeId, Raft};
use crate::log::{MetaLog, Proposal};
use crate::state::{Cmd, MetaState, Outcome};
use cairn_core::{Error, Result};
use openraft::error::{ClientWriteError, InitializeError, RaftError};
use openraft::{Config, RaftNetworkFactory};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

/// Raft's clock: how often the leader heartbeats, and how long followers wait before they elect.
#[derive(Debug, Clone, Copy)]
pub struct Timing {
    /// Leader heartbeat interval (also each append RPC's deadline).
    pub heartbeat: Duration,
    /// Election timeout, drawn between these.
    pub election: (Duration, Duration),
    /// How long a proposal may wait to be committed before it fails as unavailable.
    pub write: Duration,
}

impl Default for Timing {
    /// 100 ms heartbeats and 250–500 ms elections. A follower keeps its leader's lease for the
    /// longest election timeout, then stands after a drawn one (openraft), so a dead leader is
    /// replaced within 0.75–1 s, or 0.55–0.65 s when its connections closed as it died
    /// ([`RaftLog::leader_hung_up`]): measured under `cairn chaos`, each killed leader stalled
    /// commits and index reads for 1.5–1.8 s with 0.5–1 s elections, which was most of the
    /// read and write overhead of lazy recovery. Followers still tolerate 7 missed heartbeats.
    fn default() -> Self {
        Timing {
            heartbeat: Duration::from_millis(100),
            election: (Duration::from_millis(250), Duration::from_millis(500)),
            write: Duration::from_secs(5),
        }
    }
}

/// How long after the voters' lease on a silent leader runs out a follower that saw it hang up
/// stands (their clocks started at the same append, give or take its delivery).
const LEASE_MARGIN: Duration = Duration::from_millis(30);

/// A replica of the log, and the [`MetaLog`] over it.
#[derive(Clone)]
pub struct RaftLog {
    id: NodeId,
    raft: Raft,
    machine: Arc<Machine>,
    write: Duration,
    timing: Timing,
    /// When a leader's append (a heartbeat, entries) last reached this replica as a follower.
    contact: Arc<std::sync::Mutex<Option<tokio::time::Instant>>>,
    /// An early election is scheduled ([`RaftLog::leader_hung_up`]).
    standing: Arc<std::sync::atomic::AtomicBool>,
}

impl std::fmt::Debug for RaftLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RaftLog").field("id", &self.id).finish_non_exhaustive()
    }
}

fn unavailable(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Unavailable(format!("the control plane could not {what}: {e}"))
}

impl RaftLog {
    /// Starts replica `id` on `network` with a volatile log (a new replica, or a rejoin under a
    /// new id). Must run inside a tokio runtime.
    pub async fn start<N: RaftNetworkFactory<MetaTypes>>(id: NodeId, timing: Timing, network: N) -> Result<RaftLog> {
        let ms = |d: Duration| d.as_millis().max(1) as u64;
        let config = Config {
            cluster_name: "cairn-meta".into(),
            heartbeat_interval: ms(timing.heartbeat),
            election_timeout_min: ms(timing.election.0),
            election_timeout_max: ms(timing.election.1),
            install_snapshot_timeout: 10_000,
            ..Default::default()
        }
        .validate()
        .map_err(|e| Error::Config(format!("control plane timing: {e}")))?;
        let machine = Arc::new(Machine::default());
        let raft =
            Raft::new(id, Arc::new(config), network, MemStore::default(), machine.clone()).await.map_err(|e| unavailable("start", e))?;
        Ok(RaftLog { id, raft, machine, write: timing.write, timing, contact: Arc::default(), standing: Arc::default() })
    }

    /// Makes `members` the voters of a new cluster. Call it on one replica, once; a replica that
    /// is already part of a cluster ignores it.
    pub async fn bootstrap(&self, members: BTreeMap<NodeId, MetaNode>) -> Result<()> {
        match self.raft.initialize(members).await {
            Ok(()) => {
                // The founding replica stands at once instead of after an election timeout, and
                // again every two heartbeats while its peers are still starting (a vote they
                // could not answer): a new cluster has its leader ~0.5–1 s sooner.
                for _ in 0..10 {
                    self.raft.trigger().elect().await.map_err(|e| unavailable("bootstrap", e))?;
                    let wait = self.raft.wait(Some(2 * self.timing.heartbeat));
                    if wait.metrics(|m| m.current_leader.is_some(), "a leader").await.is_ok() {
                        break;
                    }
                }
                Ok(())
            }
            Err(RaftError::APIError(InitializeError::NotAllowed(_))) => Ok(()),
            Err(e) => Err(unavailable("bootstrap", e)),
        }
    }

    /// This replica's node id.
    pub fn id(&self) -> NodeId {
        self.id
    }

    /// The openraft handle (membership changes, metrics).
    pub fn raft(&self) -> &Raft {
        &self.raft
    }

    /// The leader this replica knows of.
    pub fn leader(&self) -> Option<NodeId> {
        self.raft.metrics().borrow().current_leader
    }

    /// This replica's part (`leader`, `follower`, `candidate`, `learner`; `none` once shut
    /// down) and the server it knows to lead.
    pub fn role(&self) -> (&'static str, Option<u32>) {
        let m = self.raft.metrics().borrow().clone();
        let role = match m.state {
            openraft::ServerState::Leader => "leader",
            openraft::ServerState::Follower => "follower",
            openraft::ServerState::Candidate => "candidate",
            openraft::ServerState::Learner => "learner",
            openraft::ServerState::Shutdown => "none",
        };
        let leader = m.current_leader.and_then(|l| m.membership_config.membership().get_node(&l).map(|n| n.server));
        (role, leader)
    }

    /// The servers of the current membership's voters.
    pub fn voter_servers(&self) -> Vec<u32> {
        let m = self.raft.metrics().borrow().membership_config.clone();
        m.membership().voter_ids().filter_map(|id| m.membership().get_node(&id).map(|n| n.server)).collect()
    }

    /// Voters of the current membership.
    pub fn voters(&self) -> Vec<NodeId> {
        self.raft.metrics().borrow().membership_config.membership().voter_ids().collect()
    }

    /// Adds node `id` (server `node.server`) as a voter in place of that server's earlier nodes
    /// (a meta server that restarted without its Raft state) and of the voters on servers
    /// `keep` rejects (a failed meta server whose place a spare took). Only the leader can.
    pub async fn rejoin(&self, id: NodeId, node: MetaNode, keep: impl Fn(u32) -> bool) -> Result<()> {
        let server = node.server;
        let fail = |e: RaftError<NodeId, ClientWriteError<NodeId, MetaNode>>| match e {
            RaftError::APIError(ClientWriteError::ForwardToLeader(f)) => not_leader(self.id, f.leader_node.map(|n| n.server)),
            e => unavailable("change its membership", e),
        };
        let run = async {
            self.raft.add_learner(id, node, true).await.map_err(fail)?;
            let old: std::collections::BTreeSet<NodeId> = {
                let m = self.raft.metrics().borrow().clone();
                let membership = m.membership_config.membership();
                membership
                    .voter_ids()
                    .filter(|v| *v != id && membership.get_node(v).is_some_and(|n| n.server == server || !keep(n.server)))
                    .collect()
            };
            self.raft.change_membership(openraft::ChangeMembers::AddVoterIds([id].into()), false).await.map_err(fail)?;
            if !old.is_empty() {
                self.raft.change_membership(openraft::ChangeMembers::RemoveVoters(old), false).await.map_err(fail)?;
            }
            Ok(())
        };
        tokio::time::timeout(self.write * 2, run).await.unwrap_or_else(|_| {
            Err(no_quorum(format!("a membership change did not commit within {:.1} s", (self.write * 2).as_secs_f64())))
        })
    }

    /// The index of the last entry applied here.
    pub fn applied(&self) -> Option<u64> {
        self.machine.last_applied().map(|l| l.index)
    }

    /// Hands a leader's append to this replica, noting the contact when it came from a current
    /// leader (anything but a vote newer than the sender's), for [`RaftLog::recently_led`].
    pub async fn append(
        &self,
        req: openraft::raft::AppendEntriesRequest<MetaTypes>,
    ) -> std::result::Result<openraft::raft::AppendEntriesResponse<NodeId>, RaftError<NodeId>> {
        let resp = self.raft.append_entries(req).await;
        if matches!(&resp, Ok(r) if !matches!(r, openraft::raft::AppendEntriesResponse::HigherVote(_))) {
            *self.contact.lock().unwrap_or_else(|p| p.into_inner()) = Some(tokio::time::Instant::now());
        }
        resp
    }

    /// A connection that brought leader appends closed (its process died, or it dropped an idle
    /// connection). If the leader then stays silent until the voters' lease on it runs out
    /// (the longest election timeout after its last append), this follower stands for election
    /// at once, rather than after a further drawn election timeout as openraft would: a killed
    /// leader is replaced in ~0.55–0.65 s instead of 0.75–1 s. Only silence counts, so a leader
    /// that merely closed a connection and appends on is never challenged; a jitter of up to
    /// 100 ms, drawn per replica, keeps the followers that saw the same hang-up from splitting
    /// the vote.
    pub fn leader_hung_up(&self) {
        use std::sync::atomic::Ordering;
        if tokio::runtime::Handle::try_current().is_err() {
            return; // the server is stopping
        }
        let m = self.raft.metrics().borrow().clone();
        let (Some(leader), openraft::ServerState::Follower) = (m.current_leader, m.state) else { return };
        let Some(seen) = *self.contact.lock().unwrap_or_else(|p| p.into_inner()) else { return };
        if self.standing.swap(true, Ordering::AcqRel) {
            return;
        }
        let nanos = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.subsec_nanos());
        let jitter = Duration::from_millis(((self.id ^ u64::from(nanos)).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 32) % 101);
        let at = seen + self.timing.election.1 + LEASE_MARGIN + jitter;
        let me = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep_until(at).await;
            let m = me.raft.metrics().borrow().clone();
            let silent = *me.contact.lock().unwrap_or_else(|p| p.into_inner()) == Some(seen);
            if silent && m.state == openraft::ServerState::Follower && m.current_leader == Some(leader) {
                let _ = me.raft.trigger().elect().await;
            }
            me.standing.store(false, Ordering::Release);
        });
    }

    /// How long a replica that cannot confirm a leader still answers reads of committed state
    /// from its own (follower reads): four of the longest election timeouts, so an election
    /// (a dead leader is replaced within 1 s) never stalls them, while a replica cut off
    /// from the majority stops within 2 s.
    pub fn follower_window(&self) -> Duration {
        4 * self.timing.election.1
    }

    /// Whether this replica's applied state is recent enough for a follower read: it leads and
    /// a majority answered it, or a leader's append reached it, within [`RaftLog::follower_window`];
    /// otherwise the lost-quorum error saying how long it has been alone.
    pub fn recently_led(&self) -> Result<()> {
        let window = self.follower_window();
        let m = self.raft.metrics().borrow().clone();
        let since = match m.state {
            openraft::ServerState::Leader => m.millis_since_quorum_ack.map(Duration::from_millis),
            _ => self.contact.lock().unwrap_or_else(|p| p.into_inner()).map(|t| t.elapsed()),
        };
        match since {
            Some(s) if s <= window => Ok(()),
            Some(s) => Err(no_quorum(format!("meta node {:#x} last heard from a leader {:.1} s ago", self.id, s.as_secs_f64()))),
            None => Err(no_quorum(format!("meta node {:#x} has not heard from a leader", self.id))),
        }
    }

    /// Confirms with a majority that this replica still leads, so a read of its state that
    /// follows sees every committed command.
    pub async fn linearize(&self) -> Result<()> {
        match self.unless_quorum_lost(self.raft.ensure_linearizable()).await? {
            Ok(_) => Ok(()),
            Err(e) => Err(match e.forward_to_leader() {
                Some(f) => not_leader(self.id, f.leader_node.as_ref().map(|n| n.server)),
                None => unavailable("confirm its leader", e),
            }),
        }
    }

    /// How long ago a majority last answered this leader, if it leads and that is longer than
    /// the longest election timeout: by then the followers could have elected another leader, so
    /// nothing this one proposes can commit.
    fn quorum_lost_for(&self) -> Option<Duration> {
        let m = self.raft.metrics().borrow().clone();
        let since = Duration::from_millis(m.millis_since_quorum_ack?);
        (m.state == openraft::ServerState::Leader && since > self.timing.election.1).then_some(since)
    }

    /// The not-leader error ("lost quorum") of a leader that no majority has answered for
    /// longer than an election timeout: it may have been replaced, so neither its commits nor
    /// its state can be trusted.
    pub fn check_quorum(&self) -> Result<()> {
        match self.quorum_lost_for() {
            Some(since) => {
                Err(no_quorum(format!("no majority of its meta servers has answered its leader for {:.1} s", since.as_secs_f64())))
            }
            None => Ok(()),
        }
    }

    /// Runs `f` within the write deadline, failing early (checked every heartbeat) once the
    /// quorum is lost, so clients hear why well within their own deadline.
    async fn unless_quorum_lost<T>(&self, f: impl std::future::Future<Output = T>) -> Result<T> {
        let lost = async {
            loop {
                if let Err(e) = self.check_quorum() {
                    return e;
                }
                tokio::time::sleep(self.timing.heartbeat).await;
            }
        };
        tokio::select! {
            r = tokio::time::timeout(self.write, f) => {
                r.map_err(|_| no_quorum(format!("it did not commit within {:.1} s", self.write.as_secs_f64())))
            }
            e = lost => Err(e),
        }
    }

    /// Stops the replica.
    pub async fn shutdown(&self) {
        let _ = self.raft.shutdown().await;
    }

    async fn write(&self, cmd: Cmd) -> Result<Outcome> {
        // On a lost quorum the command may still commit later: commands are idempotent or
        // checked (a commit of a step already committed is refused), so the writer's retry is safe.
        match self.unless_quorum_lost(self.raft.client_write(cmd)).await? {
            Ok(r) => r.data.0.ok_or_else(|| Error::Corrupt("a command's entry applied without an outcome".into()))?.into_result(),
            Err(RaftError::APIError(ClientWriteError::ForwardToLeader(f))) => Err(not_leader(self.id, f.leader_node.map(|n| n.server))),
            Err(e) => Err(unavailable("commit a command", e)),
        }
    }
}

fn not_leader(id: NodeId, leader: Option<u32>) -> Error {
    let hint =
        leader.map_or_else(|| "no leader is known yet (an election is under way); retry shortly".into(), |l| format!("server {l} leads"));
    Error::NotLeader { message: format!("meta node {id:#x} does not lead the control plane: {hint}"), leader }
}

/// A leader cut off from its majority: a not-leader answer (with no hint), so that clients look
/// for a leader elsewhere, and say why if there is none.
fn no_quorum(why: String) -> Error {
    Error::LostQuorum(format!(
        "the control plane cannot commit: {why}; a majority of its meta servers is unreachable (lost quorum). Nothing \
         committed before is lost; restart or reconnect the meta servers"
    ))
}

impl MetaLog for RaftLog {
    fn propose(&self, cmd: Cmd) -> Proposal<'_> {
        Box::pin(self.write(cmd))
    }

    fn read(&self, f: &mut dyn FnMut(&MetaState)) {
        self.machine.read(|s| f(s));
    }
}
