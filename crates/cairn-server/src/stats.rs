//! What Prometheus scrapes of a server beside its state (rendered by `metrics`): requests and
//! their time by op (the wire request's name), bytes clients put and got, step commit times,
//! steps drained, open connections, and with `metrics_datasets` bytes by dataset. Each is an
//! atomic add or a histogram bucket per event.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use std::time::Duration;

/// The `op` label of a request.
pub type OpLabel = Vec<(String, String)>;

/// The `dataset` label of a per-dataset counter.
pub type DatasetLabel = Vec<(String, String)>;

/// Datasets given a label of their own at most; bytes of later ones count under
/// [`OTHER_DATASETS`] (a series per name a client chose must not grow without bound).
pub const MAX_DATASET_LABELS: usize = 256;

/// The label of the datasets beyond [`MAX_DATASET_LABELS`].
pub const OTHER_DATASETS: &str = "(other)";

/// Buckets from 10 µs to 42 s, ×4 each.
fn latency() -> Histogram {
    Histogram::new(exponential_buckets(1e-5, 4.0, 12))
}

/// The server's counters.
#[derive(Debug)]
pub struct Stats {
    /// Requests served, by op.
    pub requests: Family<OpLabel, Counter>,
    /// Their time from read to reply, by op.
    pub request_seconds: Family<OpLabel, Histogram, fn() -> Histogram>,
    /// Object bytes clients put here (copies and shards a writer sent).
    pub put_bytes: Counter,
    /// Object bytes sent back to clients' gets.
    pub get_bytes: Counter,
    /// Steps this server committed as the leader: time from the last writer's end to commit.
    pub commit_seconds: Histogram,
    /// Steps this server drained to disk as the leader.
    pub drain_steps: Counter,
    /// Connections open.
    pub connections: Gauge,
    /// With `metrics_datasets`: object bytes put and got, by dataset.
    pub datasets: Option<DatasetBytes>,
    /// Each op's counters by the kind of its request ([`Stats::op`]).
    ops: std::sync::RwLock<std::collections::HashMap<OpKey, OpStats>>,
}

/// A kind of request: its family (client, peer, Raft) and a hash of its variant.
pub type OpKey = (u8, u64);

/// One op's request count and time, found once per kind: a label set built and looked up in
/// both families for every request cost two allocations and two hashed lookups each.
#[derive(Debug, Clone)]
pub struct OpStats {
    requests: Counter,
    seconds: Histogram,
}

impl OpStats {
    /// Counts one request that took `took`.
    pub fn done(&self, took: Duration) {
        self.requests.inc();
        self.seconds.observe(took.as_secs_f64());
    }
}

/// Object bytes put and got, by dataset (`metrics_datasets`).
#[derive(Debug, Default)]
pub struct DatasetBytes {
    /// Bytes clients put, by dataset.
    pub put: Family<DatasetLabel, Counter>,
    /// Bytes sent to gets, by dataset.
    pub get: Family<DatasetLabel, Counter>,
    /// Datasets labelled so far.
    named: std::sync::Mutex<std::collections::BTreeSet<String>>,
}

impl DatasetBytes {
    /// The label `dataset`'s bytes count under: its name, or [`OTHER_DATASETS`] once
    /// [`MAX_DATASET_LABELS`] others have one.
    fn label(&self, dataset: &str) -> DatasetLabel {
        let mut named = crate::sync::lock(&self.named);
        let known = named.contains(dataset) || (named.len() < MAX_DATASET_LABELS && named.insert(dataset.to_string()));
        vec![("dataset".to_string(), if known { dataset } else { OTHER_DATASETS }.to_string())]
    }
}

impl Default for Stats {
    fn default() -> Stats {
        Stats::new(false)
    }
}

impl Stats {
    /// The counters, with per-dataset bytes when `per_dataset`.
    pub fn new(per_dataset: bool) -> Stats {
        Stats {
            requests: Family::default(),
            request_seconds: Family::new_with_constructor(latency as fn() -> Histogram),
            put_bytes: Counter::default(),
            get_bytes: Counter::default(),
            commit_seconds: latency(),
            drain_steps: Counter::default(),
            connections: Gauge::default(),
            datasets: per_dataset.then(DatasetBytes::default),
            ops: Default::default(),
        }
    }

    /// Counts `bytes` put to `dataset`.
    pub fn put(&self, dataset: &str, bytes: u64) {
        self.put_bytes.inc_by(bytes);
        if let Some(d) = &self.datasets {
            d.put.get_or_create(&d.label(dataset)).inc_by(bytes);
        }
    }

    /// Counts `bytes` sent to a get of `dataset` (`None`: not known, counted in the total only).
    pub fn got(&self, dataset: Option<&str>, bytes: u64) {
        self.get_bytes.inc_by(bytes);
        if let (Some(d), Some(name)) = (&self.datasets, dataset) {
            d.get.get_or_create(&d.label(name)).inc_by(bytes);
        }
    }

    /// The counters of requests of kind `key`, named `name()` (the wire request's name) the
    /// first time.
    pub fn op(&self, key: OpKey, name: impl FnOnce() -> String) -> OpStats {
        if let Some(o) = self.ops.read().unwrap_or_else(|p| p.into_inner()).get(&key) {
            return o.clone();
        }
        let label = vec![("op".to_string(), name())];
        let o =
            OpStats { requests: self.requests.get_or_create(&label).clone(), seconds: self.request_seconds.get_or_create(&label).clone() };
        self.ops.write().unwrap_or_else(|p| p.into_inner()).insert(key, o.clone());
        o
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_ops_counters_are_the_families_series() {
        let st = Stats::default();
        let named = std::cell::Cell::new(0);
        let name = || {
            named.set(named.get() + 1);
            "put".to_string()
        };
        st.op((0, 7), name).done(Duration::from_millis(2));
        st.op((0, 7), name).done(Duration::from_millis(3));
        assert_eq!(named.get(), 1, "named once per kind");
        let label = vec![("op".to_string(), "put".to_string())];
        assert_eq!(st.requests.get_or_create(&label).get(), 2);
    }

    #[test]
    fn dataset_labels_are_bounded_and_off_by_default() {
        let off = Stats::default();
        off.put("secret-run", 8);
        assert!(off.datasets.is_none() && off.put_bytes.get() == 8);
        let on = Stats::new(true);
        for i in 0..MAX_DATASET_LABELS + 3 {
            on.put(&format!("d{i}"), 1);
        }
        on.put("d0", 1);
        on.got(Some("d0"), 5);
        let d = on.datasets.as_ref().unwrap();
        let label = |n: &str| vec![("dataset".to_string(), n.to_string())];
        assert_eq!(d.put.get_or_create(&label("d0")).get(), 2);
        assert_eq!(d.put.get_or_create(&label(OTHER_DATASETS)).get(), 3, "the names beyond the bound share one series");
        assert_eq!(d.get.get_or_create(&label("d0")).get(), 5);
        assert_eq!((on.put_bytes.get(), on.get_bytes.get()), (MAX_DATASET_LABELS as u64 + 4, 5));
    }
}
