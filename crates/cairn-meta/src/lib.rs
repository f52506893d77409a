//! Cairn's control plane: a replicated service in the DAOS `rsvc` sense. Requests become
//! deterministic commands ([`Cmd`]); a log ([`MetaLog`]) orders them and, once committed, every
//! replica applies them to the same pure state machine ([`MetaState`]). Data never passes through
//! it: only cluster views, step fragments and commit records, and small keyed values.
//!
//! # Layout
//! - [`state`]: the state machine: commands, outcomes, queries (pure; tested with no network).
//! - [`claims`]: leases of committed steps to claimers (D²T claims), and the writers' close.
//! - [`queue`]: the writers' queue limit and the streaming readers holding steps (backpressure).
//! - [`log`]: the log trait, and the in-memory log of a single replica.
//! - [`batch`]: group commit: commands proposed together go in one log entry.
//! - [`raft`]: the log replicated by Raft (openraft), and an in-process network for tests.

// openraft's error types are large; they are built only on failure paths.
#![allow(clippy::result_large_err)]

pub mod batch;
pub mod claims;
pub mod log;
pub mod queue;
pub mod raft;
pub mod state;

pub use log::{MemLog, MetaLog};
pub use state::{Cmd, MetaState, Outcome, Prepared};
