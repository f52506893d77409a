//! The control plane across servers in one process: claims are decided once by the Raft leader,
//! the client finds the leader by itself (followers name it, servers without a replica pass it
//! on) and keeps working across a leader's death with nothing lost; a leader killed in any phase
//! of a step leaves it committed everywhere or nowhere, with views changed through the log; a
//! leader partitioned from its followers commits nothing and catches up when healed.

use cairn_client::staging::KvStore;
use cairn_server::Limits;
use cairn_testing::TestCluster;
use std::time::{Duration, Instant};

fn leader(c: &TestCluster, ids: &[u32]) -> u32 {
    let lead =
        |c: &TestCluster| ids.iter().copied().find(|id| c.control(*id).and_then(|s| s.gate.get()).is_some_and(|l| l.role().0 == "leader"));
    c.until(Duration::from_secs(10), &format!("a leader among {ids:?}"), |c| lead(c).is_some()).unwrap();
    lead(c).expect("led just now")
}

#[test]
fn claims_are_decided_once_and_survive_the_leaders_death() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = TestCluster::start(dir.path(), 4, 0, 16 << 20, Limits::default()).unwrap();
    let kv = KvStore::open(&c.file, Duration::from_secs(10)).unwrap();
    let other = KvStore::open(&c.file, Duration::from_secs(10)).unwrap();
    assert_eq!(kv.cas("claim/step-7", None, Some(b"worker-1")).unwrap(), (true, 1));
    assert_eq!(other.cas("claim/step-7", None, Some(b"worker-2")).unwrap(), (false, 1), "the second claimer loses");
    assert_eq!(other.cas_get("claim/step-7").unwrap(), Some((1, b"worker-1".to_vec())));
    assert_eq!(kv.cas_get("nope").unwrap(), None);
    let e = kv.cas("big", None, Some(&vec![0u8; 100 << 10])).unwrap_err();
    assert!(e.to_string().contains("at most 65536"), "{e}");
    let first = leader(&c, &[0, 1, 2, 3]);
    c.kill(first);
    // The client's cached leader is dead: it finds the new one and the claim is still there.
    assert_eq!(kv.cas("claim/step-7", Some(1), Some(b"worker-1, renewed")).unwrap(), (true, 2));
    assert_eq!(other.cas_get("claim/step-7").unwrap(), Some((2, b"worker-1, renewed".to_vec())));
    assert_eq!(kv.cas("claim/step-7", Some(2), None).unwrap(), (true, 0));
    assert_eq!(other.cas_get("claim/step-7").unwrap(), None);
}

fn cfg(c: &TestCluster) -> cairn_client::Config {
    let mut cfg = cairn_client::Config::default();
    cfg.set("engine", "staging").unwrap();
    cfg.set("cluster", c.file.to_str().unwrap()).unwrap();
    cfg.set("object_size", "4096").unwrap();
    cfg.set("timeout", "5").unwrap();
    cfg
}

/// Writes `step` from 4 writers (rank r puts elements r*n..(r+1)*n of value step*10+r), running
/// `kill` after `kill_after` of them have ended it; returns each writer's end-of-step result.
fn step_of_four(cfg: &cairn_client::Config, step: u64, kill_after: usize, kill: impl FnOnce()) -> Vec<cairn_client::Result<bool>> {
    use cairn_client::{DType, Writer};
    let n = 4096u64;
    let mut ws: Vec<Writer> = (0..4).map(|r| Writer::open("f", cfg, r, 4, step > 0, "run").unwrap()).collect();
    for (r, w) in ws.iter_mut().enumerate() {
        w.define("x", DType::U8, Some(vec![4 * n])).unwrap();
        w.begin_step(step).unwrap();
        w.put("x", DType::U8, &vec![(step * 10) as u8 + r as u8; n as usize], Some(&[r as u64 * n]), &[n]).unwrap();
    }
    let mut kill = Some(kill);
    let mut ends = Vec::new();
    for (i, w) in ws.iter_mut().enumerate() {
        if i == kill_after {
            kill.take().expect("once")();
        }
        ends.push(w.end_step());
    }
    if let Some(k) = kill {
        k();
    }
    ends
}

/// Waits until `server` is a voter under a joiner's node id in place of `gone`, as `at` sees it.
fn joined(c: &TestCluster, at: u32, server: u32, gone: u32) {
    let voters = |c: &TestCluster| c.control(at).unwrap().gate.get().unwrap().voters();
    c.until(Duration::from_secs(15), &format!("server {server} to join in place of {gone}"), |c| {
        let v = voters(c);
        let of = |s: u32| v.iter().any(|v| (v >> 32) as u32 == s);
        v.iter().any(|v| (v >> 32) as u32 == server && v & 0xffff_ffff != 0) && !of(gone) && v.len() == 5
    })
    .unwrap_or_else(|e| panic!("{e}: voters {:x?}", voters(c)));
}

/// A spare takes `dead`'s slot: one view change through the log, which every live server learns.
fn replace(c: &TestCluster, live: &[u32], dead: u32, spare: u32) -> cairn_proto::ClusterView {
    let mut conn = cairn_testing::RawConn::open(&c.addr(live[0]).to_string(), c.secret()).unwrap();
    let cairn_proto::Response::View { view } = conn.call(None, &cairn_proto::Request::View, &[]).unwrap() else { panic!() };
    let next = view.replace(dead, spare).unwrap();
    c.set_view(&next).unwrap();
    c.await_epoch(next.epoch, Duration::from_secs(5)).unwrap();
    next
}

#[test]
fn a_leader_killed_in_any_phase_leaves_each_step_committed_everywhere_or_nowhere() {
    use cairn_client::Reader;
    let dir = tempfile::tempdir().unwrap();
    let mut c = TestCluster::start_meta(dir.path(), 5, 2, 64 << 20, Limits::default(), 5).unwrap();
    let cfg = cfg(&c);
    let mut live: Vec<u32> = (0..5).collect();
    assert!(step_of_four(&cfg, 0, 4, || {}).into_iter().any(|r| r.unwrap()));
    let r = Reader::open("f", &cfg).unwrap();
    // (a) between the puts and the ends; (b) after two of four writers ended the step. Spares
    // 5 and 6 take the dead servers' slots.
    for (spare, (step, kill_after)) in [(5u32, (1u64, 0usize)), (6, (2, 2))] {
        let dead = leader(&c, &live);
        let ends = step_of_four(&cfg, step, kill_after, || c.kill(dead));
        live.retain(|s| *s != dead);
        let next = leader(&c, &live);
        assert_ne!(next, dead);
        let told = ends.iter().any(|e| matches!(e, Ok(true)));
        assert_eq!(r.steps().unwrap().contains(&step), told, "step {step} is visible exactly when a writer was told so: {ends:?}");
        if !told {
            let e = ends.iter().find_map(|e| e.as_ref().err()).unwrap_or_else(|| panic!("the last writer hears why: {ends:?}"));
            assert!(e.to_string().contains(&format!("server {dead}")), "{e}");
        }
        let view = replace(&c, &live, dead, spare);
        live.push(spare);
        // The spare that took the dead server's slot joins the control plane in its place, so
        // the next failure still leaves a majority. Restarted empty, the dead server learns the
        // current view from the others, down in it, and stays out of the control plane.
        joined(&c, next, spare, dead);
        c.restart(dead).unwrap();
        c.await_epoch(view.epoch, Duration::from_secs(5)).unwrap();
        assert!(c.state(dead).unwrap().view().unwrap().down.contains(&dead));
        assert!(c.control(dead).unwrap().gate.get().is_none());
    }
    // The writers' next step commits with both spares in place, and reads back whole.
    assert!(step_of_four(&cfg, 3, 4, || {}).into_iter().any(|r| r.unwrap()));
    let mut out = vec![0u8; 4 * 4096];
    r.get("x", 3, &[0], &[4 * 4096], &mut out).unwrap();
    assert!(out.chunks(4096).enumerate().all(|(rank, c)| c.iter().all(|v| *v == 30 + rank as u8)));
    // (c) right after a commit: the step stays committed under the next leader, its index
    // readable.
    let dead = leader(&c, &live);
    c.kill(dead);
    live.retain(|s| *s != dead);
    assert!(r.steps().unwrap().contains(&3));
    assert_eq!(r.blocks("x", 3).unwrap().len(), 4);
    assert!(r.steps().unwrap().starts_with(&[0]));
}

#[test]
fn a_partitioned_leader_commits_nothing_and_catches_up_when_healed() {
    use cairn_core::ErrorKind;
    use cairn_proto::{Request, Response};
    let dir = tempfile::tempdir().unwrap();
    let c = TestCluster::start(dir.path(), 3, 0, 16 << 20, Limits::default()).unwrap();
    let kv = KvStore::open(&c.file, Duration::from_secs(5)).unwrap();
    assert_eq!(kv.cas("before", None, Some(b"1")).unwrap(), (true, 1));
    let old = c.leader(Duration::from_secs(10)).unwrap();
    c.partition(old, true);
    // Cut off from both followers, the leader commits nothing: it says it lost its quorum.
    let started = Instant::now();
    let mut conn = cairn_testing::RawConn::open(&c.addr(old).to_string(), c.secret()).unwrap();
    let cas = Request::MetaCas { key: "cut".into(), expect: None, delete: false, call: None };
    match conn.call(None, &cas, &[b"x"]).unwrap() {
        Response::Error { kind: ErrorKind::NotLeader, reason, message, .. } => {
            assert_eq!(reason, Some(cairn_core::Reason::LostQuorum), "{message}")
        }
        other => panic!("a cut-off leader must not commit: {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(4), "told within {:?}", started.elapsed());
    // The majority elects a leader and goes on; the client finds it.
    assert_eq!(kv.cas("after", None, Some(b"2")).unwrap(), (true, 1));
    let others: Vec<u32> = (0..3).filter(|s| *s != old).collect();
    assert_ne!(leader(&c, &others), old);
    // Healed, the old leader follows the new one and catches up; what it could not commit is gone.
    c.partition(old, false);
    let log = c.control(old).unwrap().gate.get().unwrap();
    let has = |k: &str| cairn_meta::log::query(&log, |s| s.kv(k).is_some());
    c.until(Duration::from_secs(10), &format!("server {old} to catch up"), |_| log.role().0 == "follower" && has("after") && has("before"))
        .unwrap_or_else(|e| panic!("{e}: {:?}", log.role()));
    assert!(!has("cut"));
    assert_eq!(kv.cas_get("cut").unwrap(), None);
}

#[test]
fn committed_steps_stay_readable_while_no_leader_is_confirmed_then_fail_when_alone_too_long() {
    use cairn_client::Reader;
    use cairn_core::ErrorKind;
    use cairn_proto::{Request, Response};
    let dir = tempfile::tempdir().unwrap();
    let c = TestCluster::start(dir.path(), 3, 0, 16 << 20, Limits::default()).unwrap();
    let cfg = cfg(&c);
    assert!(step_of_four(&cfg, 0, 4, || {}).into_iter().any(|r| r.unwrap()));
    let old = c.leader(Duration::from_secs(10)).unwrap();
    let follower = (0..3).find(|s| *s != old).unwrap();
    // The commit reaches the follower's state a moment after the writer is told.
    let log = c.control(follower).unwrap().gate.get().unwrap();
    c.until(Duration::from_secs(10), &format!("server {follower} to apply the commit"), |_| {
        cairn_meta::log::query(&log, |s| s.is_committed("f", 0))
    })
    .unwrap();
    // Asked for a follower read, a follower answers from its own state and says so; the leader
    // answers as the leader; a plain read is sent on to the leader.
    let ask = |at: u32, follower: bool| {
        let mut conn = cairn_testing::RawConn::open(&c.addr(at).to_string(), c.secret()).unwrap();
        conn.call(None, &Request::Index { dataset: "f".into(), step: 0, follower }, &[]).unwrap()
    };
    assert!(matches!(ask(follower, true), Response::Index { follower: true, .. }));
    assert!(matches!(ask(old, true), Response::Index { follower: false, .. }));
    assert!(matches!(ask(follower, false), Response::Error { kind: ErrorKind::NotLeader, .. }));
    // Every meta server cut off from the others: no leader can be elected. A reader that has
    // not read step 0 yet still lists it, reads its index from a follower, and gets every byte
    // (the data servers are up), without waiting for an election that cannot come.
    for s in 0..3 {
        c.partition(s, true);
    }
    let cut = Instant::now();
    let r = Reader::open("f", &cfg).unwrap();
    assert_eq!(r.steps().unwrap(), vec![0]);
    let mut out = vec![0u8; 4 * 4096];
    r.get("x", 0, &[0], &[4 * 4096], &mut out).unwrap();
    assert!(out.chunks(4096).enumerate().all(|(rank, c)| c.iter().all(|v| *v == rank as u8)));
    assert!(cut.elapsed() < Duration::from_secs(2), "read within the follower window, took {:?}", cut.elapsed());
    // Alone longer than the window (2 s), the replicas stop answering: stale state is not
    // served for ever, and the error says why. Nothing changes when the window closes (time
    // passes), so this is the one wait that polls.
    let e = loop {
        match Reader::open("f", &cfg).unwrap().steps() {
            Ok(steps) => assert_eq!(steps, vec![0]),
            Err(e) => break e,
        }
        assert!(cut.elapsed() < Duration::from_secs(20), "follower reads went on for {:?}", cut.elapsed());
        std::thread::sleep(Duration::from_millis(100));
    };
    assert!(cut.elapsed() >= Duration::from_millis(1500), "refused after {:?}", cut.elapsed());
    assert_eq!(e.reason(), Some(cairn_core::Reason::LostQuorum), "{e}");
    // Healed, a leader is elected and reads are the leader's again.
    for s in 0..3 {
        c.partition(s, false);
    }
    let r = Reader::open("f", &cfg).unwrap();
    assert_eq!(r.steps().unwrap(), vec![0]);
}
