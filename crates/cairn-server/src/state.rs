//! What every connection of a server shares: its id, the secret, the store, the keyed values,
//! the coordinator metadata, counters, the cluster view (loaded when first needed) and the shutdown signal.

use crate::kv::Kv;
use crate::meta::Meta;
use crate::store::Store;
use cairn_core::Result;
use cairn_proto::cluster::ClusterFile;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::sync::broadcast;

/// Shared server state.
#[derive(Debug)]
pub struct State {
    /// This server's id.
    pub id: u32,
    /// The cluster secret.
    pub secret: String,
    /// The cluster file (read when peers or the ring are first needed).
    pub cluster_path: PathBuf,
    cluster: Mutex<Option<Arc<ClusterFile>>>,
    /// Objects held here.
    pub store: Store,
    /// Keyed values and sets.
    pub kv: Kv,
    /// Datasets coordinated here.
    pub meta: Meta,
    /// Requests served.
    pub requests: AtomicU64,
    /// Start time.
    pub started: Instant,
    /// Fires once when the server should stop.
    pub shutdown: broadcast::Sender<()>,
}

impl State {
    /// New state for server `id` with `memory` bytes of room.
    pub fn new(id: u32, secret: String, cluster_path: PathBuf, memory: u64) -> Arc<State> {
        Arc::new(State {
            id,
            secret,
            cluster_path,
            cluster: Mutex::new(None),
            store: Store::new(id, memory),
            kv: Kv::default(),
            meta: Meta::default(),
            requests: AtomicU64::new(0),
            started: Instant::now(),
            shutdown: broadcast::channel(1).0,
        })
    }

    /// The cluster file, read once it is complete.
    pub fn cluster(&self) -> Result<Arc<ClusterFile>> {
        let mut c = self.cluster.lock().expect("cluster lock");
        if let Some(c) = &*c {
            return Ok(c.clone());
        }
        let loaded = Arc::new(ClusterFile::load(&self.cluster_path)?);
        *c = Some(loaded.clone());
        Ok(loaded)
    }
}
