//! The Raft log store: the vote, the entries, and what was purged. This one is volatile: a
//! replica using it must rejoin under a new node id after a restart (see `docs/protocol.md`).

use super::types::{Entry, LogId, MetaTypes, StorageError, Vote};
use openraft::storage::{LogFlushed, RaftLogStorage};
use openraft::{LogState, OptionalSend, RaftLogId, RaftLogReader};
use std::collections::BTreeMap;
use std::fmt::Debug;
use std::ops::RangeBounds;
use std::sync::Arc;
use tokio::sync::Mutex;

#[derive(Debug, Default)]
struct Inner {
    last_purged: Option<LogId>,
    log: BTreeMap<u64, Entry>,
    committed: Option<LogId>,
    vote: Option<Vote>,
}

/// A log in memory; clones share it.
#[derive(Debug, Clone, Default)]
pub struct MemStore {
    inner: Arc<Mutex<Inner>>,
}

impl RaftLogReader<MetaTypes> for MemStore {
    async fn try_get_log_entries<RB: RangeBounds<u64> + Clone + Debug + OptionalSend>(
        &mut self,
        range: RB,
    ) -> Result<Vec<Entry>, StorageError> {
        Ok(self.inner.lock().await.log.range(range).map(|(_, e)| e.clone()).collect())
    }
}

impl RaftLogStorage<MetaTypes> for MemStore {
    type LogReader = Self;

    async fn get_log_state(&mut self) -> Result<LogState<MetaTypes>, StorageError> {
        let inner = self.inner.lock().await;
        let last = inner.log.values().next_back().map(|e| *e.get_log_id());
        Ok(LogState { last_purged_log_id: inner.last_purged, last_log_id: last.or(inner.last_purged) })
    }

    async fn get_log_reader(&mut self) -> Self::LogReader {
        self.clone()
    }

    async fn save_vote(&mut self, vote: &Vote) -> Result<(), StorageError> {
        self.inner.lock().await.vote = Some(*vote);
        Ok(())
    }

    async fn read_vote(&mut self) -> Result<Option<Vote>, StorageError> {
        Ok(self.inner.lock().await.vote)
    }

    async fn save_committed(&mut self, c: Option<LogId>) -> Result<(), StorageError> {
        self.inner.lock().await.committed = c;
        Ok(())
    }

    async fn read_committed(&mut self) -> Result<Option<LogId>, StorageError> {
        Ok(self.inner.lock().await.committed)
    }

    async fn append<I>(&mut self, entries: I, callback: LogFlushed<MetaTypes>) -> Result<(), StorageError>
    where
        I: IntoIterator<Item = Entry> + OptionalSend,
        I::IntoIter: OptionalSend,
    {
        let mut inner = self.inner.lock().await;
        for e in entries {
            inner.log.insert(e.log_id.index, e);
        }
        callback.log_io_completed(Ok(()));
        Ok(())
    }

    async fn truncate(&mut self, log_id: LogId) -> Result<(), StorageError> {
        self.inner.lock().await.log.split_off(&log_id.index);
        Ok(())
    }

    async fn purge(&mut self, log_id: LogId) -> Result<(), StorageError> {
        let mut inner = self.inner.lock().await;
        inner.last_purged = Some(log_id);
        inner.log = inner.log.split_off(&(log_id.index + 1));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::raft::machine::Machine;
    use openraft::testing::{StoreBuilder, Suite};

    struct Build;

    impl StoreBuilder<MetaTypes, MemStore, Arc<Machine>, ()> for Build {
        async fn build(&self) -> Result<((), MemStore, Arc<Machine>), StorageError> {
            Ok(((), MemStore::default(), Arc::default()))
        }
    }

    /// openraft's own conformance suite for log stores and state machines.
    #[test]
    fn passes_openraft_storage_suite() {
        Suite::test_all(Build).unwrap();
    }
}
