//! Prometheus metrics over HTTP: `GET /metrics` at the server entry's `metrics` address answers
//! the text exposition format. Every server gives its own series (`cairn_up`, memory, objects,
//! bytes, requests by op, connections, `cairn_is_leader`); the control plane's leader adds the
//! cluster's (`cairn_cluster_health`, objects by state, commit times, drain and recovery). No
//! authentication: it binds where the server binds and exposes no data and no dataset names
//! (threat model in docs/protocol.md). A connection has 2 s to send its request head (8 KiB at
//! most); at most 64 wait for theirs, and a new one closes the one that waited longest, so idle
//! connections never starve a scrape; 8 scrapes are answered at a time.

use crate::control::Control;
use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

/// Scrapes answered at once.
const SCRAPES: usize = 8;
/// Connections waiting for their request head at once.
const WAITING: usize = 64;
/// Longest request head read.
const MAX_HEAD: usize = 8 << 10;
/// Time a connection has to send its request head.
const HEAD_TIMEOUT: Duration = Duration::from_secs(2);
/// Time a scrape has for a slot and its reply once its head is in.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(5);

/// Connections still sending their head, oldest first: each is closed when its sender drops.
type Waiting = Arc<Mutex<VecDeque<(u64, oneshot::Sender<()>)>>>;

/// Answers scrapes on `listener` until the server shuts down.
pub async fn serve(listener: TcpListener, ctl: Arc<Control>) {
    let slots = Arc::new(tokio::sync::Semaphore::new(SCRAPES));
    let waiting: Waiting = Arc::default();
    let mut shutdown = ctl.state.shutdown.subscribe();
    for id in 0u64.. {
        let mut sock = tokio::select! {
            r = listener.accept() => match r {
                Ok((sock, _)) => sock,
                Err(_) => continue,
            },
            _ = shutdown.recv() => return,
        };
        let (close, closed) = oneshot::channel();
        {
            let mut w = waiting.lock().unwrap_or_else(|p| p.into_inner());
            if w.len() >= WAITING {
                w.pop_front(); // the longest waiting goes: its sender dropped closes it
            }
            w.push_back((id, close));
        }
        let (ctl, slots, waiting) = (ctl.clone(), slots.clone(), waiting.clone());
        tokio::spawn(async move {
            let head = tokio::select! {
                h = tokio::time::timeout(HEAD_TIMEOUT, read_head(&mut sock)) => h,
                _ = closed => return,
            };
            waiting.lock().unwrap_or_else(|p| p.into_inner()).retain(|(i, _)| *i != id);
            let _ = tokio::time::timeout(SCRAPE_TIMEOUT, async {
                match head {
                    Ok(Ok(Some(head))) => {
                        let Ok(_permit) = slots.acquire_owned().await else { return Ok(()) };
                        answer(&mut sock, &head, ctl).await
                    }
                    Ok(Ok(None)) => reply(&mut sock, "431 Request Header Fields Too Large", "text/plain", b"request head too long\n").await,
                    _ => Ok(()), // closed, failed or too slow
                }
            })
            .await;
        });
    }
}

/// The request head, `None` past [`MAX_HEAD`]; an error if the peer closed before its end.
async fn read_head(sock: &mut TcpStream) -> std::io::Result<Option<Vec<u8>>> {
    let mut head = Vec::with_capacity(512);
    let mut chunk = [0u8; 1024];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") {
        let n = sock.read(&mut chunk).await?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        head.extend_from_slice(&chunk[..n]);
        if head.len() > MAX_HEAD {
            return Ok(None);
        }
    }
    Ok(Some(head))
}

async fn answer(sock: &mut TcpStream, head: &[u8], ctl: Arc<Control>) -> std::io::Result<()> {
    let line = head.split(|b| *b == b'\r').next().unwrap_or_default();
    let mut parts = line.split(|b| *b == b' ');
    match (parts.next(), parts.next()) {
        (Some(b"GET"), Some(b"/metrics")) => {
            // The leader's census reads every committed index: off the runtime's threads.
            let body = tokio::task::spawn_blocking(move || render(&ctl)).await.unwrap_or_default();
            reply(sock, "200 OK", "text/plain; version=0.0.4; charset=utf-8", body.as_bytes()).await
        }
        (Some(b"GET"), _) => reply(sock, "404 Not Found", "text/plain", b"only /metrics is here\n").await,
        _ => reply(sock, "405 Method Not Allowed", "text/plain", b"GET /metrics\n").await,
    }
}

async fn reply(sock: &mut TcpStream, status: &str, kind: &str, body: &[u8]) -> std::io::Result<()> {
    let head = format!("HTTP/1.1 {status}\r\nContent-Type: {kind}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n", body.len());
    sock.write_all(head.as_bytes()).await?;
    sock.write_all(body).await?;
    sock.shutdown().await
}

fn gauge(reg: &mut Registry, name: &str, help: &str, value: i64) {
    let g = Gauge::<i64>::default();
    g.set(value);
    reg.register(name, help, g);
}

fn by_label(reg: &mut Registry, name: &str, help: &str, label: &str, values: &[(&str, i64)]) {
    let f = Family::<Vec<(String, String)>, Gauge>::default();
    for (l, v) in values {
        f.get_or_create(&vec![(label.to_string(), l.to_string())]).set(*v);
    }
    reg.register(name, help, f);
}

/// The series of this server (and, on the leader, of the cluster) in the text format.
pub fn render(ctl: &Control) -> String {
    let state = &ctl.state;
    let stats = &state.stats;
    let mut reg = Registry::default();
    let i = |n: u64| i64::try_from(n).unwrap_or(i64::MAX);
    gauge(&mut reg, "cairn_up", "1 while the server serves", 1);
    gauge(&mut reg, "cairn_memory_used_bytes", "Bytes of objects held (pending ones too)", i(state.store.used()));
    gauge(&mut reg, "cairn_memory_limit_bytes", "The server's memory limit", i(state.store.limit()));
    let (objects, _) = state.store.counts();
    let (_, shards, _) = state.store.copies();
    by_label(
        &mut reg,
        "cairn_objects",
        "Objects held, whole copies or erasure-code shards",
        "kind",
        &[("copy", i(objects.saturating_sub(shards))), ("shard", i(shards))],
    );
    reg.register("cairn_put_bytes", "Object bytes clients put here", stats.put_bytes.clone());
    reg.register("cairn_get_bytes", "Object bytes sent to clients' gets", stats.get_bytes.clone());
    reg.register("cairn_requests", "Requests served, by op (the wire request's name)", stats.requests.clone());
    reg.register("cairn_request_seconds", "Time from a request read to its reply sent, by op", stats.request_seconds.clone());
    reg.register("cairn_connections", "Connections open", stats.connections.clone());
    if let Some(d) = &stats.datasets {
        reg.register("cairn_dataset_put_bytes", "Object bytes clients put here, by dataset (metrics_datasets)", d.put.clone());
        reg.register("cairn_dataset_get_bytes", "Object bytes sent to clients' gets, by dataset (metrics_datasets)", d.get.clone());
    }
    let leader = ctl.gate.get().is_some_and(|r| r.role().0 == "leader");
    gauge(&mut reg, "cairn_is_leader", "1 on the control plane's leader", i64::from(leader));
    if let Some((census, health)) = crate::cmd::admin::cluster_health(ctl) {
        let level = match health.state {
            cairn_proto::health::HealthState::Ok => 0,
            cairn_proto::health::HealthState::Warn => 1,
            cairn_proto::health::HealthState::Err => 2,
        };
        gauge(&mut reg, "cairn_cluster_health", "The cluster's health: 0 ok, 1 warn, 2 err (cairn cluster status)", level);
        by_label(
            &mut reg,
            "cairn_cluster_objects",
            "Objects of the cluster by state",
            "state",
            &[
                ("committed", i(census.committed)),
                ("degraded", i(census.degraded)),
                ("lost", i(ctl.recovery.lost())),
                ("pending", i(ctl.recovery.pending())),
            ],
        );
        reg.register("cairn_commit_seconds", "Step commits this leader made: last writer's end to commit", stats.commit_seconds.clone());
        if let Ok(log) = ctl.gate.leader() {
            gauge(
                &mut reg,
                "cairn_drain_pending_bytes",
                "Bytes of committed steps still to drain to disk",
                i(ctl.drain.status(&log).pending_bytes),
            );
        }
        let drained: Counter = stats.drain_steps.clone();
        reg.register("cairn_drain_steps", "Steps this leader drained to disk", drained);
        gauge(&mut reg, "cairn_recovery_pending_objects", "Objects of lost servers still to rebuild", i(ctl.recovery.pending()));
    }
    let mut out = String::new();
    let _ = encode(&mut out, &reg);
    prometheus_text(&out)
}

/// The Prometheus text format of `openmetrics` (what the client library writes): a counter's
/// family is named with its `_total` suffix, as its samples are, and there is no `# EOF`, so
/// that Prometheus's text parser and `promtool check metrics` see one family per counter.
fn prometheus_text(openmetrics: &str) -> String {
    let counters: std::collections::BTreeSet<&str> =
        openmetrics.lines().filter_map(|l| l.strip_prefix("# TYPE ")?.strip_suffix(" counter")).collect();
    let mut out = String::with_capacity(openmetrics.len() + 16 * counters.len());
    for line in openmetrics.lines().filter(|l| *l != "# EOF") {
        let meta = ["# HELP ", "# TYPE "].into_iter().find_map(|p| Some((p, line.strip_prefix(p)?)));
        match meta {
            Some((p, rest)) if rest.split(' ').next().is_some_and(|n| counters.contains(n)) => {
                let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
                out.push_str(&format!("{p}{name}_total {tail}\n"));
            }
            _ => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_are_named_with_their_total_and_there_is_no_eof() {
        let om = "# HELP a_bytes Bytes.\n# TYPE a_bytes counter\na_bytes_total 5\n# HELP b Up.\n# TYPE b gauge\nb 1\n# EOF\n";
        assert_eq!(
            prometheus_text(om),
            "# HELP a_bytes_total Bytes.\n# TYPE a_bytes_total counter\na_bytes_total 5\n# HELP b Up.\n# TYPE b gauge\nb 1\n"
        );
    }
}
