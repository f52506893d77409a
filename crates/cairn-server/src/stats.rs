//! What Prometheus scrapes of a server beside its state (rendered by `metrics`): requests and
//! their time by op (the wire request's name), bytes clients put and got, step commit times,
//! steps drained, open connections. Each is an atomic add or a histogram bucket per event.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use std::time::Duration;

/// The `op` label of a request.
pub type OpLabel = Vec<(String, String)>;

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
}

impl Default for Stats {
    fn default() -> Stats {
        Stats {
            requests: Family::default(),
            request_seconds: Family::new_with_constructor(latency as fn() -> Histogram),
            put_bytes: Counter::default(),
            get_bytes: Counter::default(),
            commit_seconds: latency(),
            drain_steps: Counter::default(),
            connections: Gauge::default(),
        }
    }
}

impl Stats {
    /// Counts one request of `op` that took `took`.
    pub fn request(&self, op: &str, took: Duration) {
        let label = vec![("op".to_string(), op.to_string())];
        self.requests.get_or_create(&label).inc();
        self.request_seconds.get_or_create(&label).observe(took.as_secs_f64());
    }
}
