//! Raft between meta servers: its transport over the staging protocol (`raft` requests, served
//! by [`serve_rpc`]), the leader's side of a join ([`admit`]), and compare-and-set values kept
//! in the log.

use super::gate::Gate;
use crate::reply::{Payload, Reply};
use crate::state::State;
use cairn_core::{Error, Result};
use cairn_meta::raft::types::{MetaTypes, Snapshot, Vote};
use cairn_meta::raft::{MetaNode, NodeId};
use cairn_proto::async_io::{read_head, write_frame};
use cairn_proto::message::{Envelope, RaftRequest, RaftRpc, Response, MAX_RAFT_PAYLOAD};
use cairn_proto::MAX_HEADER;
use openraft::error::{Fatal, NetworkError, RPCError, RaftError, RemoteError, ReplicationClosed, StreamingError, Unreachable};
use openraft::network::RPCOption;
use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, VoteRequest, VoteResponse};
use openraft::{AnyError, OptionalSend, RaftNetwork, RaftNetworkFactory};
use serde::de::DeserializeOwned;
use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

/// The leader's side of a join: node `id` of server `node.server` becomes a voter if the view
/// gives that server a meta slot, in place of its earlier nodes and of voters whose servers lost
/// their meta slots (so the control plane keeps its size as spares replace failed servers).
pub async fn admit(state: &State, gate: &Gate, id: NodeId, node: MetaNode) -> Result<()> {
    let log = &gate.replica()?;
    let view = state.view()?;
    let members = gate.members(&view);
    if !members.contains(&node.server) || !view.is_live(node.server) {
        return Err(Error::Unavailable(format!(
            "server {} holds no control-plane slot in view {} (members {members:?}); it joins once a view gives it one",
            node.server, view.epoch
        )));
    }
    log.rejoin(id, node, |s| members.contains(&s)).await
}

/// A random incarnation for a rejoining node id.
pub fn rand_u32() -> u32 {
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
    gate: Weak<Gate>,
    /// Idle connections by peer address. openraft makes a client for every leadership check
    /// (each linearized read), and a fresh authenticated connection per check costs more than
    /// the check itself.
    idle: Arc<std::sync::Mutex<HashMap<String, Vec<TcpStream>>>>,
}

impl PeerNet {
    /// The network of the server with `state`, its replica behind `gate`.
    pub fn new(state: &Arc<State>, gate: &Arc<Gate>) -> PeerNet {
        PeerNet { state: Arc::downgrade(state), gate: Arc::downgrade(gate), idle: Arc::default() }
    }
}

/// Idle connections kept per peer.
const IDLE_PER_PEER: usize = 4;

/// One meta server as a Raft peer, over one kept, authenticated connection.
#[derive(Debug)]
pub struct PeerRaft {
    state: Weak<State>,
    gate: Weak<Gate>,
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
        PeerRaft { state: self.state.clone(), gate: self.gate.clone(), target, node: node.clone(), conn, idle: self.idle.clone() }
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
        if self.gate.upgrade().is_none_or(|g| g.is_cut()) {
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
        let env = Envelope { epoch: None, req: RaftRequest::Raft { kind, target: self.target, head } };
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
pub async fn serve_rpc(gate: &Gate, kind: RaftRpc, target: NodeId, head: Option<serde_json::Value>, payload: Vec<u8>) -> Result<Vec<u8>> {
    let log = gate
        .get()
        .ok_or_else(|| Error::Unavailable(format!("server {} is not a meta server (or its control plane is starting)", gate.id)))?;
    if gate.is_cut() {
        return Err(Error::Unavailable(format!("server {} is cut off from the other meta servers", gate.id)));
    }
    if log.id() != target {
        return Err(Error::Unavailable(format!(
            "server {} is meta node {:#x} now, not node {target:#x} (it restarted and rejoins under the new id)",
            gate.id,
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

/// A compare-and-set through the log (the leader only).
pub async fn cas(gate: &Gate, key: String, expect: Option<u64>, value: Option<Vec<u8>>, op: Option<String>) -> Result<Response> {
    use cairn_meta::{Cmd, MetaLog, Outcome};
    match gate.replica()?.propose(Cmd::KvCas { key, expect, value, op }).await? {
        Outcome::Cas { ok, version } => Ok(Response::Cas { ok, version }),
        other => Err(Error::Corrupt(format!("the control plane answered a compare-and-set with {other:?}"))),
    }
}

/// A compare-and-set value, read at the leader once it has confirmed it leads.
pub async fn cas_get(gate: &Gate, key: &str) -> Result<Reply> {
    let log = &gate.replica()?;
    log.linearize().await?;
    let found = cairn_meta::log::query(log, |s| s.kv(key).map(|(v, b)| (v, b.to_vec())));
    let (ok, version, value) = found.map_or((false, 0, Vec::new()), |(v, b)| (true, v, b));
    Ok(Reply::WithPayload(Response::Cas { ok, version }, Payload::Owned(value)))
}
