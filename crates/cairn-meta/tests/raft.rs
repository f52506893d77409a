//! The control plane's log replicated by Raft, with 3 replicas in one process on a network whose
//! links tests cut: commits need a majority, a killed leader is replaced and its prepared step
//! finished, a cut-off follower commits nothing and catches up when healed, a lost majority is a
//! clear error within the deadline, and nothing committed is ever lost.

mod common;

use cairn_core::index::{BlockRecord, Fragment, ObjectRef, VarDef};
use cairn_core::{DType, ErrorKind, Region};
use cairn_meta::log::query;
use cairn_meta::raft::node::Timing;
use cairn_meta::raft::{MetaNode, NodeId, RaftLog};
use cairn_meta::{Cmd, MetaLog, Outcome};
use cairn_proto::message::Share;
use common::LocalNet;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

fn timing() -> Timing {
    Timing {
        heartbeat: Duration::from_millis(50),
        election: (Duration::from_millis(150), Duration::from_millis(300)),
        write: Duration::from_secs(2),
    }
}

struct Cluster {
    net: LocalNet,
    logs: BTreeMap<NodeId, RaftLog>,
}

impl Cluster {
    async fn start(n: u64) -> Cluster {
        Cluster::start_timed(n, timing()).await
    }

    async fn start_timed(n: u64, timing: Timing) -> Cluster {
        let net = LocalNet::default();
        let mut logs = BTreeMap::new();
        for id in 1..=n {
            let log = RaftLog::start(id, timing, net.endpoint(id)).await.unwrap();
            net.add(id, log.clone());
            logs.insert(id, log);
        }
        let members = (1..=n).map(|id| (id, MetaNode { server: id as u32 - 1, addr: String::new() })).collect();
        logs[&1].bootstrap(members).await.unwrap();
        Cluster { net, logs }
    }

    /// The leader every live, connected replica agrees on.
    async fn leader(&self, among: &[NodeId]) -> NodeId {
        let start = Instant::now();
        loop {
            let seen: Vec<Option<NodeId>> = among.iter().map(|id| self.logs[id].leader()).collect();
            if let Some(Some(l)) = seen.first() {
                if among.contains(l) && seen.iter().all(|s| *s == Some(*l)) {
                    return *l;
                }
            }
            assert!(start.elapsed() < Duration::from_secs(10), "no agreed leader among {among:?}: {seen:?}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn kill(&mut self, id: NodeId) {
        self.net.remove(id);
        self.logs.remove(&id).unwrap().shutdown().await;
    }

    async fn caught_up(&self, id: NodeId, with: NodeId) {
        let start = Instant::now();
        while self.logs[&id].applied() < self.logs[&with].applied() {
            assert!(start.elapsed() < Duration::from_secs(10), "node {id} did not catch up with {with}");
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }

    async fn stop(self) {
        for log in self.logs.values() {
            log.shutdown().await;
        }
    }
}

fn fragment(step: u64, w: u32, n: u32) -> Cmd {
    let region = Region::new(vec![u64::from(w)], vec![1]).unwrap();
    let block = BlockRecord {
        var: "x".into(),
        writer: w,
        region: region.clone(),
        file: String::new(),
        pos: 0,
        len: 8,
        chunk: 0,
        crcs: Vec::new(),
        checksum: 1,
        stats: Default::default(),
        objects: vec![ObjectRef { id: u64::from(w) << 32, region, server: w, checksum: 1, redundancy: Default::default() }],
        codec: None,
        stored: 0,
    };
    let def = VarDef::new("x", DType::F64, Some(vec![u64::from(n)])).unwrap();
    Cmd::AddFragment {
        dataset: "d".into(),
        fragment: Fragment::new(step, w, n, "s".into(), vec![def], vec![block]),
        shares: vec![Share { server: w, objects: 1, bytes: 8 }],
    }
}

fn commit(step: u64) -> Cmd {
    Cmd::Commit { dataset: "d".into(), step, session: "s".into(), keep_last: None, drain_every: None, now_ms: 0 }
}

/// Writes `step` with 2 writers through `log` and commits it.
async fn write_step(log: &RaftLog, step: u64) {
    log.propose(fragment(step, 0, 2)).await.unwrap();
    assert!(matches!(log.propose(fragment(step, 1, 2)).await.unwrap(), Outcome::Prepared { .. }));
    assert!(matches!(log.propose(commit(step)).await.unwrap(), Outcome::Committed { .. }));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_majority_commits_and_followers_name_the_leader() {
    let c = Cluster::start(3).await;
    let leader = c.leader(&[1, 2, 3]).await;
    write_step(&c.logs[&leader], 0).await;
    for id in [1, 2, 3] {
        c.caught_up(id, leader).await;
        assert_eq!(query(&c.logs[&id], |s| s.steps("d")), vec![0], "replica {id} applied the commit");
    }
    let follower = [1, 2, 3].into_iter().find(|id| *id != leader).unwrap();
    let e = c.logs[&follower].propose(commit(7)).await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotLeader);
    match e {
        cairn_core::Error::NotLeader { leader: hint, .. } => {
            assert_eq!(hint, Some(leader as u32 - 1), "the hint names the leader's server")
        }
        other => panic!("{other:?}"),
    }
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_leaders_prepared_step_is_finished_by_the_next_and_nothing_is_lost() {
    let mut c = Cluster::start(3).await;
    let first = c.leader(&[1, 2, 3]).await;
    write_step(&c.logs[&first], 0).await;
    // Step 1 is prepared (both fragments in) when its coordinator dies before the commit.
    c.logs[&first].propose(fragment(1, 0, 2)).await.unwrap();
    assert!(matches!(c.logs[&first].propose(fragment(1, 1, 2)).await.unwrap(), Outcome::Prepared { .. }));
    let killed = Instant::now();
    c.kill(first).await;
    let rest: Vec<NodeId> = c.logs.keys().copied().collect();
    let next = c.leader(&rest).await;
    assert_ne!(next, first);
    let log = &c.logs[&next];
    let in_flight = query(log, |s| s.in_flight());
    assert_eq!(in_flight.iter().map(|p| p.index.step).collect::<Vec<_>>(), vec![1], "the new leader finds the prepared step");
    assert!(matches!(log.propose(commit(1)).await.unwrap(), Outcome::Committed { .. }));
    assert!(killed.elapsed() < Duration::from_secs(2), "failover to the next commit took {:?}", killed.elapsed());
    write_step(log, 2).await;
    for id in &rest {
        c.caught_up(*id, next).await;
        assert_eq!(query(&c.logs[id], |s| s.steps("d")), vec![0, 1, 2]);
    }
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cut_off_follower_commits_nothing_and_catches_up_when_healed() {
    let c = Cluster::start(3).await;
    let leader = c.leader(&[1, 2, 3]).await;
    let lonely = [1, 2, 3].into_iter().find(|id| *id != leader).unwrap();
    c.net.cut(lonely);
    let e = c.logs[&lonely].propose(fragment(0, 0, 1)).await.unwrap_err();
    assert!(matches!(e.kind(), ErrorKind::NotLeader | ErrorKind::Unavailable), "{e}");
    for step in 0..5 {
        write_step(&c.logs[&leader], step).await;
    }
    assert!(query(&c.logs[&lonely], |s| s.steps("d")).is_empty(), "nothing reaches a cut-off replica");
    c.net.heal(lonely);
    let leader = c.leader(&[1, 2, 3]).await;
    c.caught_up(lonely, leader).await;
    assert_eq!(query(&c.logs[&lonely], |s| s.steps("d")), vec![0, 1, 2, 3, 4]);
    c.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_majority_is_a_clear_error_within_the_deadline_and_loses_nothing() {
    let c = Cluster::start(3).await;
    let leader = c.leader(&[1, 2, 3]).await;
    write_step(&c.logs[&leader], 0).await;
    for id in [1, 2, 3].into_iter().filter(|id| *id != leader) {
        c.net.cut(id);
    }
    let t = Instant::now();
    let e = c.logs[&leader].propose(fragment(1, 0, 1)).await.unwrap_err();
    assert!(t.elapsed() < timing().write + Duration::from_secs(1), "{:?}", t.elapsed());
    assert!(e.reason() == Some(cairn_core::Reason::LostQuorum) || e.kind() == ErrorKind::NotLeader, "{e}");
    assert_eq!(query(&c.logs[&leader], |s| s.steps("d")), vec![0], "what was committed stays");
    c.stop().await;
}

/// Long elections, so that standing early is told apart from openraft's own timer: the voters'
/// lease on a leader is 800 ms, and a follower would stand 400–800 ms after it.
fn slow_elections() -> Timing {
    Timing { heartbeat: Duration::from_millis(50), election: (Duration::from_millis(400), Duration::from_millis(800)), ..timing() }
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn followers_that_saw_a_killed_leader_hang_up_elect_the_next_once_its_lease_runs_out() {
    let mut c = Cluster::start_timed(3, slow_elections()).await;
    let old = c.leader(&[1, 2, 3]).await;
    write_step(&c.logs[&old], 0).await;
    let rest: Vec<NodeId> = (1..=3).filter(|i| *i != old).collect();
    c.kill(old).await;
    let killed = tokio::time::Instant::now();
    for id in &rest {
        c.logs[id].leader_hung_up();
    }
    let next = c.leader(&rest).await;
    let took = killed.elapsed();
    // The last append came at most a heartbeat before the kill: openraft alone elects no
    // sooner than 800 + 400 - 50 ms after it; standing early, within 800 + 30 + 100 ms.
    assert!(took <= Duration::from_millis(930), "the next leader took {took:?}");
    // Nothing committed is lost, and the new leader commits.
    assert_eq!(query(&c.logs[&next], |s| s.steps("d")), vec![0]);
    write_step(&c.logs[&next], 1).await;
    c.stop().await;
}

#[tokio::test(flavor = "current_thread", start_paused = true)]
async fn a_leader_that_appends_on_after_a_connection_closed_is_not_challenged() {
    let c = Cluster::start_timed(3, slow_elections()).await;
    let leader = c.leader(&[1, 2, 3]).await;
    let term = c.logs[&leader].raft().metrics().borrow().current_term;
    for id in (1..=3).filter(|i| *i != leader) {
        c.logs[&id].leader_hung_up();
    }
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(c.leader(&[1, 2, 3]).await, leader);
    assert_eq!(c.logs[&leader].raft().metrics().borrow().current_term, term, "an election was held");
    write_step(&c.logs[&leader], 0).await;
    c.stop().await;
}
