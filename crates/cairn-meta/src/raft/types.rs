//! openraft's type configuration for the control plane, and short names for its types.

use crate::state::{Cmd, Outcome};
use serde::{Deserialize, Serialize};

/// Raft node id. A server's id in the high 32 bits and an incarnation below, so a server that
/// restarts without its Raft state rejoins as a new node (it must never vote again in a term it
/// may already have voted in).
pub type NodeId = u64;

/// A meta server as Raft knows it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MetaNode {
    /// Staging server id (the leader hint clients are given).
    pub server: u32,
    /// Its address.
    pub addr: String,
}

/// What each log entry's application returns: the outcome of a command (or nothing, for Raft's
/// own blank and membership entries).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Applied(pub Option<Outcome>);

openraft::declare_raft_types!(
    /// The control plane's Raft types: commands in, outcomes out.
    pub MetaTypes:
        D = Cmd,
        R = Applied,
        NodeId = NodeId,
        Node = MetaNode,
        Entry = openraft::Entry<MetaTypes>,
        SnapshotData = std::io::Cursor<Vec<u8>>,
        AsyncRuntime = openraft::TokioRuntime,
);

/// A Raft replica.
pub type Raft = openraft::Raft<MetaTypes>;
/// A log entry.
pub type Entry = openraft::Entry<MetaTypes>;
/// An entry's position.
pub type LogId = openraft::LogId<NodeId>;
/// A vote.
pub type Vote = openraft::Vote<NodeId>;
/// Storage failures (fatal to a replica).
pub type StorageError = openraft::StorageError<NodeId>;
/// The membership as applied.
pub type StoredMembership = openraft::StoredMembership<NodeId, MetaNode>;
/// What a snapshot covers.
pub type SnapshotMeta = openraft::SnapshotMeta<NodeId, MetaNode>;
/// A snapshot.
pub type Snapshot = openraft::Snapshot<MetaTypes>;
