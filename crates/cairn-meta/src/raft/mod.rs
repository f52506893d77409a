//! The log replicated by Raft (openraft 0.9): a command is applied on every meta server once a
//! majority holds it. [`RaftLog`] is the [`MetaLog`](crate::MetaLog) over it; a proposal on a
//! server that does not lead fails with a not-leader error naming the leader it knows.
//!
//! - [`types`]: the type configuration (commands, outcomes, node ids, nodes).
//! - [`store`]: the log store (volatile; a durable one writes the vote and entries with fsync).
//! - [`machine`]: the state machine: [`MetaState`](crate::MetaState) applying committed entries,
//!   snapshots as JSON.
//! - [`node`]: one replica: starting it, bootstrapping a cluster, proposing, reading.

pub mod machine;
pub mod node;
pub mod store;
pub mod types;

pub use node::RaftLog;
pub use types::{MetaNode, MetaTypes, NodeId};
