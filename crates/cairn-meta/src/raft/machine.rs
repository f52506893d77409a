//! The state machine Raft applies committed entries to: the pure [`MetaState`], plus what Raft
//! needs to know of it (last applied entry, membership) and its snapshots (JSON).

use super::types::{Applied, Entry, LogId, MetaTypes, Snapshot, SnapshotMeta, StorageError, StoredMembership};
use crate::state::MetaState;
use openraft::storage::RaftStateMachine;
use openraft::{EntryPayload, OptionalSend, RaftSnapshotBuilder, StorageIOError};
use std::io::Cursor;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};

/// What the machine holds.
#[derive(Debug, Default, Clone)]
pub struct Data {
    /// The last entry applied.
    pub last_applied: Option<LogId>,
    /// The membership as of that entry.
    pub last_membership: StoredMembership,
    /// The control plane's state.
    pub state: MetaState,
}

/// The state machine; Raft owns one `Arc`, the server reads through another.
#[derive(Debug, Default)]
pub struct Machine {
    data: RwLock<Data>,
    current: Mutex<Option<(SnapshotMeta, Vec<u8>)>>,
    snapshots: AtomicU64,
}

impl Machine {
    /// Runs `f` on the applied state. (No lock is held across an await: `f` is synchronous.)
    pub fn read<T>(&self, f: impl FnOnce(&MetaState) -> T) -> T {
        f(&self.data.read().unwrap_or_else(|p| p.into_inner()).state)
    }

    /// The last entry applied.
    pub fn last_applied(&self) -> Option<LogId> {
        self.data.read().unwrap_or_else(|p| p.into_inner()).last_applied
    }
}

impl RaftSnapshotBuilder<MetaTypes> for Arc<Machine> {
    async fn build_snapshot(&mut self) -> Result<Snapshot, StorageError> {
        let (bytes, last_applied, last_membership) = {
            let d = self.data.read().unwrap_or_else(|p| p.into_inner());
            let bytes = serde_json::to_vec(&d.state).map_err(|e| StorageIOError::read_state_machine(&e))?;
            (bytes, d.last_applied, d.last_membership.clone())
        };
        let n = self.snapshots.fetch_add(1, Ordering::Relaxed) + 1;
        let snapshot_id = match last_applied {
            Some(l) => format!("{}-{}-{n}", l.leader_id, l.index),
            None => format!("--{n}"),
        };
        let meta = SnapshotMeta { last_log_id: last_applied, last_membership, snapshot_id };
        *self.current.lock().unwrap_or_else(|p| p.into_inner()) = Some((meta.clone(), bytes.clone()));
        Ok(Snapshot { meta, snapshot: Box::new(Cursor::new(bytes)) })
    }
}

impl RaftStateMachine<MetaTypes> for Arc<Machine> {
    type SnapshotBuilder = Self;

    async fn applied_state(&mut self) -> Result<(Option<LogId>, StoredMembership), StorageError> {
        let d = self.data.read().unwrap_or_else(|p| p.into_inner());
        Ok((d.last_applied, d.last_membership.clone()))
    }

    async fn apply<I>(&mut self, entries: I) -> Result<Vec<Applied>, StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut d = self.data.write().unwrap_or_else(|p| p.into_inner());
        let mut out = Vec::new();
        for e in entries {
            d.last_applied = Some(e.log_id);
            out.push(match e.payload {
                EntryPayload::Blank => Applied(None),
                EntryPayload::Normal(cmd) => Applied(Some(d.state.apply(cmd))),
                EntryPayload::Membership(m) => {
                    d.last_membership = StoredMembership::new(Some(e.log_id), m);
                    Applied(None)
                }
            });
        }
        Ok(out)
    }

    async fn get_snapshot_builder(&mut self) -> Self::SnapshotBuilder {
        self.clone()
    }

    async fn begin_receiving_snapshot(&mut self) -> Result<Box<Cursor<Vec<u8>>>, StorageError> {
        Ok(Box::new(Cursor::new(Vec::new())))
    }

    async fn install_snapshot(&mut self, meta: &SnapshotMeta, snapshot: Box<Cursor<Vec<u8>>>) -> Result<(), StorageError> {
        let bytes = snapshot.into_inner();
        let state: MetaState = serde_json::from_slice(&bytes).map_err(|e| StorageIOError::read_snapshot(Some(meta.signature()), &e))?;
        *self.data.write().unwrap_or_else(|p| p.into_inner()) =
            Data { last_applied: meta.last_log_id, last_membership: meta.last_membership.clone(), state };
        *self.current.lock().unwrap_or_else(|p| p.into_inner()) = Some((meta.clone(), bytes));
        Ok(())
    }

    async fn get_current_snapshot(&mut self) -> Result<Option<Snapshot>, StorageError> {
        let current = self.current.lock().unwrap_or_else(|p| p.into_inner());
        Ok(current.as_ref().map(|(m, b)| Snapshot { meta: m.clone(), snapshot: Box::new(Cursor::new(b.clone())) }))
    }
}
