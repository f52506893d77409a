//! The data plane's shared state: what every connection of a server shares, control plane or
//! not: its id, the secret, the limits, the cluster view, the store, the keyed values, peer
//! connections, counters and the shutdown signal. The control plane's services
//! ([`crate::control::Control`]) sit above it and are handed to the requests that use them.

use crate::kv::Kv;
use crate::pool::Peers;
use crate::store::Store;
use cairn_core::Result;
use cairn_proto::cluster::ClusterFile;
use cairn_proto::ClusterView;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, OnceLock, RwLock};
use std::time::{Duration, Instant};
use tokio::sync::broadcast;

/// Deadlines and bounds of one server.
#[derive(Debug, Clone)]
pub struct Limits {
    /// Once a frame has started, each read of it (and each write of a reply) must progress
    /// within this; a stalled upload loses its connection and its reservation.
    pub io_timeout: Duration,
    /// A new connection must complete its hello within this.
    pub hello_timeout: Duration,
    /// Deadline of each call to another server (seal, drop), connecting included.
    pub peer_timeout: Duration,
    /// A member the control plane's leader has not heard from for this long is declared down
    /// (and a spare takes its slot).
    pub failure_timeout: Duration,
    /// Recovery onto a spare spreads its work over `recovery_deadline` (lazy) instead of
    /// rebuilding everything at once (aggressive).
    pub recovery_lazy: bool,
    /// Lazy recovery rebuilds every object of a lost server within this (when not given: a
    /// quarter of `mtbf`, else 60 s; see [`Limits::recovery_deadline`]).
    pub recovery_deadline: Option<Duration>,
    /// Bytes per second recovery may send (0: no limit), so client requests keep priority.
    pub recovery_rate: u64,
    /// The mean time between failures the cluster is sized for, when known.
    pub mtbf: Option<Duration>,
    /// Authenticated connections served at once; more get `busy`.
    pub max_connections: usize,
    /// Connections still in their hello; a new one beyond this evicts the oldest, so idle
    /// unauthenticated connections can never lock authenticated clients out.
    pub max_unauthenticated: usize,
    /// Same-node copies and leases for clients of other users than the server's (refused by
    /// default: see the threat model in docs/protocol.md).
    pub same_node_other_users: bool,
    /// Prometheus byte counters per dataset, labelled with its name (`metrics_datasets`).
    pub metrics_datasets: bool,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            io_timeout: Duration::from_secs(10),
            hello_timeout: Duration::from_secs(3),
            peer_timeout: Duration::from_secs(5),
            failure_timeout: Duration::from_secs(3),
            recovery_lazy: true,
            recovery_deadline: None,
            recovery_rate: 256 << 20,
            mtbf: None,
            max_connections: 1024,
            max_unauthenticated: 512,
            same_node_other_users: false,
            metrics_datasets: false,
        }
    }
}

impl Limits {
    /// The time lazy recovery has: as set, else a quarter of the MTBF (recovered well before
    /// the next failure is likely), else 60 s.
    pub fn recovery_deadline(&self) -> Duration {
        self.recovery_deadline.or(self.mtbf.map(|m| m / 4)).unwrap_or(Duration::from_secs(60))
    }
}

/// Shared server state.
#[derive(Debug)]
pub struct State {
    /// This server's id.
    pub id: u32,
    /// The cluster secret.
    pub secret: String,
    /// Deadlines and bounds.
    pub limits: Limits,
    /// The cluster file (read when the view is first needed).
    pub cluster_path: PathBuf,
    view: RwLock<Option<Arc<ClusterView>>>,
    /// The epoch of the view installed, for those waiting on a newer one.
    epoch: tokio::sync::watch::Sender<u64>,
    /// How many views have declared this server down (the control plane takes its vote away).
    downs: tokio::sync::watch::Sender<u64>,
    /// Objects held here.
    pub store: Store,
    /// Keyed values and sets.
    pub kv: Kv,
    /// Pooled connections to other servers.
    pub peers: Peers,
    /// Requests served.
    pub requests: AtomicU64,
    /// Of those, requests from clients (not peers' or the control plane's): planned moves yield
    /// to them.
    pub client_requests: AtomicU64,
    /// Object bytes copied straight from or to local clients' memory.
    pub same_node_bytes: AtomicU64,
    /// Gets answered with a mapping of a shared segment (same-node readers).
    pub mapped_gets: AtomicU64,
    /// What Prometheus scrapes beside the state (`metrics`).
    pub stats: crate::stats::Stats,
    /// The cluster's redundancy settings (from the cluster file, read when first needed).
    policy: OnceLock<cairn_core::corec::Policy>,
    /// One encoding at a time on this server: encoding takes at most one core's share.
    pub encoding: tokio::sync::Semaphore,
    /// Start time.
    pub started: Instant,
    /// Fires once when the server should stop.
    pub shutdown: broadcast::Sender<()>,
}

impl State {
    /// New state for server `id` with `memory` bytes of room.
    pub fn new(id: u32, secret: String, cluster_path: PathBuf, memory: u64, limits: Limits) -> Arc<State> {
        let stats = crate::stats::Stats::new(limits.metrics_datasets);
        Arc::new(State {
            id,
            secret,
            limits,
            cluster_path,
            view: RwLock::new(None),
            epoch: tokio::sync::watch::channel(0).0,
            downs: tokio::sync::watch::channel(0).0,
            store: Store::new(id, memory),
            kv: Kv::default(),
            peers: Peers::default(),
            requests: AtomicU64::new(0),
            client_requests: AtomicU64::new(0),
            same_node_bytes: AtomicU64::new(0),
            mapped_gets: AtomicU64::new(0),
            stats,
            policy: OnceLock::new(),
            encoding: tokio::sync::Semaphore::new(1),
            started: Instant::now(),
            shutdown: broadcast::channel(1).0,
        })
    }

    /// The cluster's redundancy settings.
    pub fn policy(&self) -> Result<cairn_core::corec::Policy> {
        if let Some(p) = self.policy.get() {
            return Ok(p.clone());
        }
        let p = ClusterFile::load(&self.cluster_path)?.redundancy;
        Ok(self.policy.get_or_init(|| p).clone())
    }

    /// The current cluster view; the first one comes from the cluster file once it is complete.
    pub fn view(&self) -> Result<Arc<ClusterView>> {
        if let Some(v) = &*self.view.read().unwrap_or_else(|p| p.into_inner()) {
            return Ok(v.clone());
        }
        let loaded = Arc::new(ClusterView::initial(&ClusterFile::load(&self.cluster_path)?));
        let mut v = self.view.write().unwrap_or_else(|p| p.into_inner());
        Ok(v.get_or_insert(loaded).clone())
    }

    /// Installs a committed view if it is newer than this server's; returns the view it
    /// replaced if it was. A view that declares this server down empties it: whatever it held
    /// may have been rebuilt elsewhere, changed or released meanwhile, and it rejoins as a new
    /// member. (The control plane's [`crate::control::views`] installs views through this and
    /// follows up: keyed values move, recovery is queued.)
    pub fn install(&self, next: ClusterView) -> Result<Option<Arc<ClusterView>>> {
        next.validate()?;
        let current = self.view()?;
        let down = next.down.contains(&self.id);
        {
            let mut v = self.view.write().unwrap_or_else(|p| p.into_inner());
            if next.epoch <= v.as_ref().map_or(current.epoch, |v| v.epoch) {
                return Ok(None);
            }
            // Once per view on every server: who is down and which spare took which slot.
            let newly_down: Vec<u32> = next.down.iter().copied().filter(|s| !current.down.contains(s)).collect();
            tracing::info!(
                server = self.id,
                event = "view_changed",
                epoch = next.epoch,
                down = ?next.down,
                newly_down = ?newly_down,
                took = ?next.took,
                slots = ?next.slots,
                "view {} installed",
                next.epoch
            );
            self.epoch.send_replace(next.epoch);
            *v = Some(Arc::new(next));
        }
        if down && !current.down.contains(&self.id) {
            let freed = self.store.clear();
            let keys = self.kv.delete(&self.store, &[String::new()], true);
            tracing::warn!(server = self.id, "declared down; dropped {freed} bytes of objects and {keys} keys, rejoining empty");
            self.downs.send_modify(|n| *n += 1);
        }
        Ok(Some(current))
    }

    /// A receiver of how many views have declared this server down.
    pub fn downs(&self) -> tokio::sync::watch::Receiver<u64> {
        self.downs.subscribe()
    }

    /// A receiver told of every view installed later (its epoch).
    pub fn epochs(&self) -> tokio::sync::watch::Receiver<u64> {
        self.epoch.subscribe()
    }

    /// Waits (at most `limit`) until this server's view is at `epoch` or newer; whether it is.
    pub async fn view_at(&self, epoch: u64, limit: std::time::Duration) -> bool {
        let mut rx = self.epoch.subscribe();
        if self.view().is_ok_and(|v| v.epoch >= epoch) {
            return true;
        }
        tokio::time::timeout(limit, rx.wait_for(|e| *e >= epoch)).await.is_ok_and(|r| r.is_ok())
    }

    /// Refuses data requests while this server is declared down.
    pub fn check_member(&self) -> Result<()> {
        let view = self.view()?;
        if view.down.contains(&self.id) {
            return Err(cairn_core::Error::ServerGone(format!(
                "server {} was declared down in view {} and holds nothing; read the cluster view again",
                self.id, view.epoch
            )));
        }
        Ok(())
    }
}

impl crate::prefault::Filled for State {
    fn fresh(&self) -> &Arc<crate::prefault::Fresh> {
        self.store.fresh()
    }

    fn room(&self) -> u64 {
        crate::prefault::room(self.store.limit(), self.store.used() + self.store.pooled_bytes())
    }

    fn add(&self, seg: crate::segment::Segment) {
        if crate::prefault::Filled::room(self) >= seg.len() as u64 {
            self.store.add_fresh(seg);
        }
    }

    fn id(&self) -> u32 {
        self.id
    }

    fn moved(&self) -> u64 {
        self.stats.put_bytes.get() + self.stats.get_bytes.get() + self.store.fresh().served()
    }
}
