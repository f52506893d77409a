//! A network of Raft nodes in one process: each call goes straight to the target's `Raft`
//! handle. A node can be cut off (both directions, as a partition or a hung host would) and
//! healed, so tests exercise elections, lost quorums and catching up with no sockets.

use cairn_meta::raft::types::{MetaNode, MetaTypes, NodeId, Snapshot, Vote};
use cairn_meta::raft::RaftLog;
use openraft::error::{Fatal, RPCError, RaftError, RemoteError, ReplicationClosed, StreamingError, Unreachable};
use openraft::network::RPCOption;
use openraft::raft::{AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, VoteRequest, VoteResponse};
use openraft::{AnyError, OptionalSend, RaftNetwork, RaftNetworkFactory};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex};

type RpcError = RPCError<NodeId, MetaNode, RaftError<NodeId>>;

/// The nodes of one process and which of them are cut off.
#[derive(Clone, Default)]
pub(crate) struct LocalNet {
    nodes: Arc<Mutex<BTreeMap<NodeId, RaftLog>>>,
    cut: Arc<Mutex<BTreeSet<NodeId>>>,
}

impl std::fmt::Debug for LocalNet {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let cut = self.cut.lock().unwrap_or_else(|p| p.into_inner());
        f.debug_struct("LocalNet").field("cut", &*cut).finish_non_exhaustive()
    }
}

impl LocalNet {
    /// Makes `log` reachable as node `id`; appends reach it as a server's do
    /// ([`RaftLog::append`], which notes the leader's contact).
    pub(crate) fn add(&self, id: NodeId, log: RaftLog) {
        self.nodes.lock().unwrap_or_else(|p| p.into_inner()).insert(id, log);
    }

    /// Removes node `id` (it crashed).
    pub(crate) fn remove(&self, id: NodeId) -> Option<RaftLog> {
        self.nodes.lock().unwrap_or_else(|p| p.into_inner()).remove(&id)
    }

    /// Cuts node `id` off: nothing it sends arrives, nothing reaches it.
    pub(crate) fn cut(&self, id: NodeId) {
        self.cut.lock().unwrap_or_else(|p| p.into_inner()).insert(id);
    }

    /// Reconnects node `id`.
    pub(crate) fn heal(&self, id: NodeId) {
        self.cut.lock().unwrap_or_else(|p| p.into_inner()).remove(&id);
    }

    /// The network as node `from` sees it.
    pub(crate) fn endpoint(&self, from: NodeId) -> LocalEndpoint {
        LocalEndpoint { net: self.clone(), from }
    }

    fn reach(&self, from: NodeId, to: NodeId) -> Result<RaftLog, Unreachable> {
        let cut = self.cut.lock().unwrap_or_else(|p| p.into_inner());
        if cut.contains(&from) || cut.contains(&to) {
            return Err(Unreachable::new(&AnyError::error(format!("node {from} cannot reach node {to}: cut off"))));
        }
        drop(cut);
        self.nodes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&to)
            .cloned()
            .ok_or_else(|| Unreachable::new(&AnyError::error(format!("node {to} is down"))))
    }
}

/// One node's side of the network (a factory of connections to the others).
#[derive(Debug, Clone)]
pub(crate) struct LocalEndpoint {
    net: LocalNet,
    from: NodeId,
}

/// A connection from one node to another.
#[derive(Debug)]
pub(crate) struct LocalConn {
    net: LocalNet,
    from: NodeId,
    to: NodeId,
}

impl RaftNetworkFactory<MetaTypes> for LocalEndpoint {
    type Network = LocalConn;

    async fn new_client(&mut self, target: NodeId, _node: &MetaNode) -> LocalConn {
        LocalConn { net: self.net.clone(), from: self.from, to: target }
    }
}

impl RaftNetwork<MetaTypes> for LocalConn {
    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<MetaTypes>,
        _option: RPCOption,
    ) -> Result<AppendEntriesResponse<NodeId>, RpcError> {
        let peer = self.net.reach(self.from, self.to)?;
        peer.append(rpc).await.map_err(|e| RPCError::RemoteError(RemoteError::new(self.to, e)))
    }

    async fn vote(&mut self, rpc: VoteRequest<NodeId>, _option: RPCOption) -> Result<VoteResponse<NodeId>, RpcError> {
        let peer = self.net.reach(self.from, self.to)?;
        peer.raft().vote(rpc).await.map_err(|e| RPCError::RemoteError(RemoteError::new(self.to, e)))
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: Snapshot,
        _cancel: impl std::future::Future<Output = ReplicationClosed> + OptionalSend + 'static,
        _option: RPCOption,
    ) -> Result<SnapshotResponse<NodeId>, StreamingError<MetaTypes, Fatal<NodeId>>> {
        let peer = self.net.reach(self.from, self.to)?;
        peer.raft().install_full_snapshot(vote, snapshot).await.map_err(|e| StreamingError::RemoteError(RemoteError::new(self.to, e)))
    }
}
