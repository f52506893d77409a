//! This server's part in the control plane: the first `meta` servers of the ring (different
//! failure domains) run a Raft replica of the control plane's log (`cairn-meta`), talking to each
//! other over the staging protocol (`raft` requests). Their state is volatile: a meta server that
//! restarts rejoins under a new node id (server id in the high 32 bits, a random incarnation
//! below) through a membership change on the leader, so it never votes twice in a term.

use crate::state::State;
use cairn_core::{Error, ErrorKind, Result};
use cairn_meta::raft::node::Timing;
use cairn_meta::raft::types::{MetaTypes, Snapshot, Vote};
use cairn_meta::raft::{MetaNode, NodeId, RaftLog};
use cairn_proto::async_io::{read_head, write_frame};
use cairn_proto::message::{Envelope, RaftRpc, Request, Response, MAX_RAFT_PAYLOAD};
use cairn_proto::ClusterView;
use cairn_proto::MAX_HEADER;
use openraft::error::{Fatal, NetworkError, RPCError, RaftError, RemoteError, ReplicationClosed, StreamingError, Unreachable};
use openraft::network::RPCOption;
use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, VoteRequest, VoteResponse};
use openraft::{AnyError, OptionalSend, RaftNetwork, RaftNetworkFactory};
use serde::de::DeserializeOwned;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

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

/// The servers of the control plane in `view`: those of its first `servers` ring slots (a spare
/// that takes one of these slots becomes one).
pub fn members(view: &ClusterView, servers: u32) -> Vec<u32> {
    view.slots.iter().copied().take(servers.max(1) as usize).collect()
}

/// Starts this server's replica once the cluster view is known, if it is a meta server, or
/// later, once a view change gives it a meta server's slot (a spare replacing a failed one).
pub fn start(state: Arc<State>) {
    tokio::spawn(async move {
        let mut shutdown = state.shutdown.subscribe();
        let first = loop {
            if let Ok(v) = state.view() {
                break v;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        if state.meta_options.rejoin {
            crate::views::refresh(&state);
        }
        // One of the first members starts with the cluster; any other joins the running one.
        let founding = !state.meta_options.rejoin && members(&first, state.meta_options.servers).contains(&state.id);
        let view = loop {
            let v = state.view().unwrap_or(first.clone());
            // A restarted server first learns the current view (its slot may be a spare's now).
            let settled = !state.view_refreshing.load(std::sync::atomic::Ordering::Acquire);
            if founding || (settled && members(&v, state.meta_options.servers).contains(&state.id) && v.is_live(state.id)) {
                break v;
            }
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                _ = shutdown.recv() => return,
            }
        };
        let members = members(&view, state.meta_options.servers);
        let incarnation = if founding { 0 } else { u64::from(rand_u32().max(1)) };
        let id = (u64::from(state.id) << 32) | incarnation;
        let net = PeerNet { state: Arc::downgrade(&state), idle: Arc::default() };
        let log = match RaftLog::start(id, state.meta_options.timing, net).await {
            Ok(l) => l,
            Err(e) => return eprintln!("cairn server {}: control plane did not start: {e}", state.id),
        };
        let _ = state.control.set(log.clone());
        tokio::spawn(on_leadership(state.clone(), log.clone()));
        tokio::spawn(crate::views::follow(state.clone(), log.clone()));
        tokio::spawn(crate::detect::run(state.clone()));
        let node = |s: u32| view.server(s).map(|e| MetaNode { server: s, addr: e.addr.clone() });
        if founding {
            if members.first() == Some(&state.id) {
                let all: Option<BTreeMap<NodeId, MetaNode>> = members.iter().map(|s| Some((u64::from(*s) << 32, node(*s).ok()?))).collect();
                if let Some(all) = all {
                    if let Err(e) = log.bootstrap(all).await {
                        eprintln!("cairn server {}: control plane bootstrap failed: {e}", state.id);
                    }
                }
            }
            return;
        }
        // A restart or a replacement: ask the meta servers (any; followers name the leader) to
        // take this node in.
        let Ok(me) = node(state.id) else { return };
        let join = Request::MetaJoin { node: id, server: state.id, addr: me.addr };
        loop {
            let now = state.view().unwrap_or(view.clone());
            for s in self::members(&now, state.meta_options.servers).iter().filter(|s| **s != state.id) {
                if crate::peer::call(&state, *s, &join).await.is_ok() {
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
async fn on_leadership(state: Arc<State>, log: RaftLog) {
    let mut metrics = log.raft().metrics();
    let mut shutdown = state.shutdown.subscribe();
    let mut resumed = false;
    loop {
        let leading = metrics.borrow().state == openraft::ServerState::Leader;
        if leading && log.linearize().await.is_ok() {
            if let Err(e) = crate::views::log_first_view(&state, &log).await {
                eprintln!("cairn server {}: the first view is not in the log yet: {e}", state.id);
            }
            crate::cmd::commit::finish_in_flight(&state).await;
            // Once per term: recovery a previous leader left under way.
            if !resumed {
                state.recovery.resume(&state);
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

/// The leader's side of a join: node `id` of server `node.server` becomes a voter if the view
/// gives that server a meta slot, in place of its earlier nodes and of voters whose servers lost
/// their meta slots (so the control plane keeps its size as spares replace failed servers).
pub async fn admit(state: &State, log: &RaftLog, id: NodeId, node: MetaNode) -> Result<()> {
    let view = state.view()?;
    let members = members(&view, state.meta_options.servers);
    if !members.contains(&node.server) || !view.is_live(node.server) {
        return Err(Error::Unavailable(format!(
            "server {} holds no control-plane slot in view {} (members {members:?}); it joins once a view gives it one",
            node.server, view.epoch
        )));
    }
    log.rejoin(id, node, |s| members.contains(&s)).await
}

fn rand_u32() -> u32 {
    let mut b = [0u8; 4];
    // Without randomness the incarnation is 1: still a new id, unless the same server restarts
    // twice on such a host.
    let _ = getrandom::fill(&mut b);
    u32::from_le_bytes(b)
}

/// The Raft network of a server: connections to the other meta servers.
#[derive(Debug, Clone)]
pub struct PeerNet {
    state: Weak<State>,
    /// Idle connections by peer address. openraft makes a client for every leadership check
    /// (each linearized read), and a fresh authenticated connection per check costs more than
    /// the check itself.
    idle: Arc<std::sync::Mutex<HashMap<String, Vec<TcpStream>>>>,
}

/// Idle connections kept per peer.
const IDLE_PER_PEER: usize = 4;

/// One meta server as a Raft peer, over one kept, authenticated connection.
#[derive(Debug)]
pub struct PeerRaft {
    state: Weak<State>,
    target: NodeId,
    node: MetaNode,
    conn: Option<TcpStream>,
    idle: Arc<std::sync::Mutex<HashMap<String, Vec<TcpStream>>>>,
}

impl Drop for PeerRaft {
    /// A connection that completed its last exchange goes back to the idle ones.
    fn drop(&mut self) {
        if let Some(c) = self.conn.take() {
            let mut idle = self.idle.lock().unwrap_or_else(|p| p.into_inner());
            let kept = idle.entry(self.node.addr.clone()).or_default();
            if kept.len() < IDLE_PER_PEER {
                kept.push(c);
            }
        }
    }
}

impl RaftNetworkFactory<MetaTypes> for PeerNet {
    type Network = PeerRaft;

    async fn new_client(&mut self, target: NodeId, node: &MetaNode) -> PeerRaft {
        let conn = self.idle.lock().unwrap_or_else(|p| p.into_inner()).get_mut(&node.addr).and_then(Vec::pop);
        PeerRaft { state: self.state.clone(), target, node: node.clone(), conn, idle: self.idle.clone() }
    }
}

/// Why an RPC failed: the peer could not be reached, or the exchange broke.
enum Failure {
    Unreachable(String),
    Network(String),
}

impl PeerRaft {
    async fn exchange(&mut self, kind: RaftRpc, head: Option<serde_json::Value>, body: &[u8]) -> Result<Vec<u8>, Failure> {
        let state = self.state.upgrade().ok_or_else(|| Failure::Unreachable("this server is stopping".into()))?;
        if state.raft_cut.load(std::sync::atomic::Ordering::Relaxed) {
            self.conn = None;
            return Err(Failure::Unreachable("cut off from the other meta servers".into()));
        }
        // The connection is owned by this exchange until it completes: if openraft drops the
        // call (its own deadline), the socket goes with it, so a late reply can never be read
        // as the answer to the next request.
        let mut conn = match self.conn.take() {
            Some(s) => s,
            None => crate::peer::connect(&state, &self.node.addr).await.map_err(|e| Failure::Unreachable(e.to_string()))?,
        };
        let s = &mut conn;
        let env = Envelope { epoch: None, req: Request::Raft { kind, target: self.target, head } };
        let broke = |e: Error| Failure::Network(e.to_string());
        write_frame(s, &env, body).await.map_err(broke)?;
        let (resp, p) = read_head::<Response>(s, MAX_HEADER, MAX_RAFT_PAYLOAD)
            .await
            .map_err(broke)?
            .ok_or_else(|| Failure::Network("closed".into()))?;
        let mut out = vec![0u8; p.payload_len as usize];
        s.read_exact(&mut out).await.map_err(|e| Failure::Network(e.to_string()))?;
        self.conn = Some(conn);
        match resp {
            Response::Raft => Ok(out),
            other => Err(Failure::Network(format!("{:?}", other.into_result().err()))),
        }
    }

    /// One RPC within `ttl`: the reply decoded as the peer's `Result`. A failed connection is
    /// dropped, so the next RPC reconnects.
    async fn rpc<T: DeserializeOwned, E: DeserializeOwned>(
        &mut self,
        kind: RaftRpc,
        head: Option<serde_json::Value>,
        body: Vec<u8>,
        ttl: Duration,
    ) -> Result<Result<T, E>, Failure> {
        let r = match tokio::time::timeout(ttl, self.exchange(kind, head, &body)).await {
            Ok(r) => r,
            Err(_) => Err(Failure::Network(format!("no answer within {ttl:?}"))),
        };
        let bytes = r.inspect_err(|_| self.conn = None)?;
        serde_json::from_slice(&bytes).map_err(|e| Failure::Network(format!("bad raft reply: {e}")))
    }
}

type RpcError = RPCError<NodeId, MetaNode, RaftError<NodeId>>;

fn rpc_error(f: Failure) -> RpcError {
    match f {
        Failure::Unreachable(m) => RPCError::Unreachable(Unreachable::new(&AnyError::error(m))),
        Failure::Network(m) => RPCError::Network(NetworkError::new(&AnyError::error(m))),
    }
}

fn body<T: serde::Serialize>(v: &T) -> Vec<u8> {
    serde_json::to_vec(v).expect("raft messages serialize")
}

impl RaftNetwork<MetaTypes> for PeerRaft {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<MetaTypes>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RpcError> {
        match self.rpc(RaftRpc::Append, None, body(&rpc), option.hard_ttl()).await.map_err(rpc_error)? {
            Ok(r) => Ok(r),
            Err(e) => Err(RPCError::RemoteError(RemoteError::new(self.target, e))),
        }
    }

    async fn vote(&mut self, rpc: VoteRequest<NodeId>, option: RPCOption) -> Result<VoteResponse<NodeId>, RpcError> {
        match self.rpc(RaftRpc::Vote, None, body(&rpc), option.hard_ttl()).await.map_err(rpc_error)? {
            Ok(r) => Ok(r),
            Err(e) => Err(RPCError::RemoteError(RemoteError::new(self.target, e))),
        }
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: Snapshot,
        _cancel: impl std::future::Future<Output = ReplicationClosed> + OptionalSend + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<NodeId>, StreamingError<MetaTypes, Fatal<NodeId>>> {
        let head = serde_json::json!({"vote": vote, "meta": snapshot.meta});
        let data = snapshot.snapshot.into_inner();
        match self.rpc::<SnapshotResponse<NodeId>, Fatal<NodeId>>(RaftRpc::Snapshot, Some(head), data, option.hard_ttl()).await {
            Ok(Ok(r)) => Ok(r),
            Ok(Err(e)) => Err(StreamingError::RemoteError(RemoteError::new(self.target, e))),
            Err(Failure::Unreachable(m)) => Err(StreamingError::Unreachable(Unreachable::new(&AnyError::error(m)))),
            Err(Failure::Network(m)) => Err(StreamingError::Network(NetworkError::new(&AnyError::error(m)))),
        }
    }
}

/// Serves a Raft RPC from another meta server: the payload in, the result (as JSON) out.
pub async fn serve_rpc(state: &State, kind: RaftRpc, target: NodeId, head: Option<serde_json::Value>, payload: Vec<u8>) -> Result<Vec<u8>> {
    let log = state
        .control
        .get()
        .ok_or_else(|| Error::Unavailable(format!("server {} is not a meta server (or its control plane is starting)", state.id)))?;
    if state.raft_cut.load(std::sync::atomic::Ordering::Relaxed) {
        return Err(Error::Unavailable(format!("server {} is cut off from the other meta servers", state.id)));
    }
    if log.id() != target {
        return Err(Error::Unavailable(format!(
            "server {} is meta node {:#x} now, not node {target:#x} (it restarted and rejoins under the new id)",
            state.id,
            log.id()
        )));
    }
    let bad = |e: serde_json::Error| Error::InvalidArgument(format!("raft {kind:?} does not parse: {e}"));
    let raft = log.raft();
    Ok(match kind {
        RaftRpc::Append => body(&log.append(serde_json::from_slice(&payload).map_err(bad)?).await),
        RaftRpc::Vote => body(&raft.vote(serde_json::from_slice(&payload).map_err(bad)?).await),
        RaftRpc::Snapshot => {
            #[derive(serde::Deserialize)]
            struct Head {
                vote: Vote,
                meta: cairn_meta::raft::types::SnapshotMeta,
            }
            let h: Head = serde_json::from_value(head.unwrap_or_default()).map_err(bad)?;
            let snapshot = Snapshot { meta: h.meta, snapshot: Box::new(std::io::Cursor::new(payload)) };
            body(&raft.install_full_snapshot(h.vote, snapshot).await)
        }
    })
}

/// This server's replica if it leads the control plane, else the not-leader error naming the
/// leader it knows (commits and their reads go to the leader).
pub fn leader(state: &State) -> Result<&RaftLog> {
    let log = replica(state)?;
    // A leader cut off from its majority may have been replaced: its state could be stale.
    log.check_quorum()?;
    match log.role() {
        ("leader", _) => Ok(log),
        (_, leader) => Err(Error::NotLeader {
            message: format!(
                "server {} does not lead the control plane ({}); retry at the leader",
                state.id,
                leader.map_or_else(|| "no leader is known yet".to_string(), |l| format!("server {l} leads"))
            ),
            leader,
        }),
    }
}

/// The replica to read committed state from, and whether it is the leader's: the leader
/// (confirmed with a majority when `linearize`) when this server leads; else, for a request that
/// takes a follower's answer, this server's own replica while it heard from a leader within its
/// follower window, so reads of committed steps go on through an election. Otherwise the
/// not-leader error, which sends the client on to the leader.
pub async fn reader(state: &State, linearize: bool, follower: bool) -> Result<(&RaftLog, bool)> {
    let led = async {
        let log = leader(state)?;
        if linearize {
            log.linearize().await?;
        }
        Ok::<_, Error>(log)
    };
    match led.await {
        Ok(log) => Ok((log, true)),
        Err(e) if follower && matches!(e.kind(), ErrorKind::NotLeader | ErrorKind::Unavailable) => {
            let log = replica(state)?;
            log.recently_led()?;
            Ok((log, false))
        }
        Err(e) => Err(e),
    }
}

/// This server's replica, or the not-leader error a non-meta server answers with.
fn replica(state: &State) -> Result<&RaftLog> {
    state.control.get().ok_or_else(|| Error::NotLeader {
        message: format!("server {} does not run the control plane; ask one of the first meta servers of the ring", state.id),
        leader: None,
    })
}

/// A compare-and-set through the log (the leader only).
pub async fn cas(state: &State, key: String, expect: Option<u64>, value: Option<Vec<u8>>, op: Option<String>) -> Result<Response> {
    use cairn_meta::{Cmd, MetaLog, Outcome};
    match replica(state)?.propose(Cmd::KvCas { key, expect, value, op }).await? {
        Outcome::Cas { ok, version } => Ok(Response::Cas { ok, version }),
        other => Err(Error::Corrupt(format!("the control plane answered a compare-and-set with {other:?}"))),
    }
}

/// A compare-and-set value, read at the leader once it has confirmed it leads.
pub async fn cas_get(state: &State, key: &str) -> Result<crate::cmd::Reply> {
    let log = replica(state)?;
    log.linearize().await?;
    let found = cairn_meta::log::query(log, |s| s.kv(key).map(|(v, b)| (v, b.to_vec())));
    let (ok, version, value) = found.map_or((false, 0, Vec::new()), |(v, b)| (true, v, b));
    Ok(crate::cmd::Reply::WithPayload(Response::Cas { ok, version }, crate::cmd::Payload::Owned(value)))
}
