//! Replicated variables on real servers in one process: with `redundancy = r` every object has
//! `r + 1` copies in different failure domains, reads fall back to a copy when a server is gone,
//! and only losing every copy of an object loses it, by name, while the rest still reads.

use cairn_client::{Config, DType, Reader, Writer};
use cairn_core::corec::{Policy, Scheme};
use cairn_core::index::Redundancy;
use cairn_server::Limits;
use cairn_testing::TestCluster;
use std::time::Duration;

const N: u64 = 8192;

fn cfg(c: &TestCluster) -> Config {
    let mut cfg = Config::default();
    cfg.set("engine", "staging").unwrap();
    cfg.set("cluster", c.file.to_str().unwrap()).unwrap();
    cfg.set("object_size", "4096").unwrap();
    cfg.set("timeout", "2").unwrap();
    cfg
}

fn start(dir: &std::path::Path, n: u32, policy: Policy) -> TestCluster {
    TestCluster::start_with(dir, n, 0, 64 << 20, Limits::default(), 3, policy).unwrap()
}

/// Reads every object of every step on its own: the ones that must read back exactly do, and
/// the others fail with `DataLoss` naming the object; returns how many were lost.
fn check_all(r: &Reader, lost_if: impl Fn(&cairn_core::index::ObjectRef) -> bool) -> usize {
    let mut lost = 0;
    for step in 0..3 {
        for b in r.blocks("x", step).unwrap() {
            for o in &b.objects {
                let mut out = vec![0u8; o.region.volume() as usize];
                match r.get("x", step, &o.region.offset, &o.region.count, &mut out) {
                    Ok(()) => assert!(out.iter().all(|v| *v == (step * 10) as u8 + b.writer as u8), "step {step} {o:?}"),
                    Err(e) => {
                        assert!(lost_if(o), "{o:?} should have read: {e}");
                        assert_eq!(e.kind(), cairn_core::ErrorKind::DataLoss, "{e}");
                        assert!(e.to_string().contains("is lost") && e.to_string().contains(&format!("{:#x}", o.id)), "{e}");
                        lost += 1;
                    }
                }
            }
        }
    }
    lost
}

/// Two writers put steps 0..3 of `x` (u8, 2·N elements; writer r's half holds step·10 + r).
fn write(cfg: &Config, redundancy: u32) {
    let mut ws: Vec<Writer> = (0..2).map(|r| Writer::open("d", cfg, r, 2, false, "s").unwrap()).collect();
    for step in 0..3u64 {
        for (r, w) in ws.iter_mut().enumerate() {
            if step == 0 {
                let def = cairn_core::index::VarDef::new("x", DType::U8, Some(vec![2 * N])).unwrap().with_redundancy(redundancy);
                w.define_var(def).unwrap();
            }
            w.begin_step(step).unwrap();
            w.put("x", DType::U8, &vec![(step * 10) as u8 + r as u8; N as usize], Some(&[r as u64 * N]), &[N]).unwrap();
        }
        for w in &mut ws {
            w.end_step().unwrap();
        }
    }
}

fn expected(step: u64) -> Vec<u8> {
    (0..2 * N).map(|i| (step * 10) as u8 + (i / N) as u8).collect()
}

#[test]
fn every_object_has_its_copies_in_other_domains_and_reads_survive_a_lost_server() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = start(dir.path(), 4, Policy { scheme: Scheme::Replicate, ..Policy::default() });
    let cfg = cfg(&c);
    write(&cfg, 1);
    let r = Reader::open("d", &cfg).unwrap();
    for b in r.blocks("x", 0).unwrap() {
        for o in &b.objects {
            let Redundancy::Replicated { servers } = &o.redundancy else { panic!("{o:?} has one copy") };
            assert_eq!(servers.len(), 2);
            assert_ne!(servers[0], servers[1], "copies on distinct servers (each its own node here)");
        }
    }
    // Every server holds copies: twice the data in all.
    let used: u64 = (0..4).map(|s| c.state(s).unwrap().store.used()).sum();
    assert_eq!(used, 2 * 3 * 2 * N);
    // Server 3 (not a meta server) dies: every box of every step still reads back exactly.
    c.kill(3);
    for step in 0..3 {
        let mut out = vec![0u8; 2 * N as usize];
        r.get("x", step, &[0], &[2 * N], &mut out).unwrap();
        assert!(out == expected(step), "step {step}");
    }
    // A second failure (server 2) loses the objects whose two copies were on 2 and 3, by name;
    // a box elsewhere still reads.
    c.kill(2);
    for s in [3, 2] {
        c.declared_down(s, Duration::from_secs(30)).unwrap();
    }
    let lost = check_all(&r, |o| o.holders().iter().all(|s| [2, 3].contains(s)));
    assert!(lost > 0, "with 4 servers some object had its copies on exactly 2 and 3");
}

#[test]
fn a_level_the_cluster_cannot_hold_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let c = TestCluster::start(dir.path(), 2, 0, 16 << 20, Limits::default()).unwrap();
    let mut w = Writer::open("d", &cfg(&c), 0, 1, false, "s").unwrap();
    w.define_var(cairn_core::index::VarDef::new("x", DType::U8, Some(vec![8])).unwrap().with_redundancy(2)).unwrap();
    w.begin_step(0).unwrap();
    let e = w.put("x", DType::U8, &[1; 8], None, &[8]).and_then(|()| w.end_step().map(|_| ())).unwrap_err();
    assert!(e.to_string().contains("'x' asks to survive 2 server failures") && e.to_string().contains("2 active"), "{e}");
}

#[test]
fn cold_objects_are_encoded_and_read_through_one_failure_then_lost_by_name_past_it() {
    let dir = tempfile::tempdir().unwrap();
    let policy = Policy { scheme: Scheme::Corec, rs_data: 4, min_efficiency: 0.3, hot_steps: 1, ..Policy::default() };
    let mut c = start(dir.path(), 6, policy);
    let cfg = cfg(&c);
    write(&cfg, 1);
    // Steps 0 and 1 were superseded by the next step's writes of the same boxes: cold, encoded
    // in the background into 4 + 1 shards; step 2 stays replicated (hot).
    let encoded = |step| {
        let r = Reader::open("d", &cfg).unwrap();
        r.block_states("x", step).unwrap().1.iter().all(|s| *s == "encoded")
    };
    c.until(Duration::from_secs(20), "steps 0 and 1 encoded", |_| encoded(0) && encoded(1)).unwrap();
    let r = Reader::open("d", &cfg).unwrap();
    for b in r.blocks("x", 0).unwrap() {
        for o in &b.objects {
            let Redundancy::Encoded { k, m, shards } = &o.redundancy else { panic!("{o:?} not encoded") };
            assert_eq!((*k, *m, shards.len()), (4, 1, 5));
        }
    }
    assert!(r.block_states("x", 2).unwrap().1.iter().all(|s| *s == "replicated"));
    // Copies made redundant are dropped: servers hold shards, and less than two copies' worth.
    c.until(Duration::from_secs(20), "copies of encoded objects dropped", |c| {
        let used: u64 = (0..6).map(|s| c.state(s).unwrap().store.used()).sum();
        used < 2 * 3 * 2 * N
    })
    .unwrap();
    assert!((0..6).map(|s| c.state(s).unwrap().store.copies().1).sum::<u64>() >= 2 * 2 * 5);
    // Server 5 (not a meta server) dies: every box of every step reads back exactly, encoded
    // objects decoded from their other shards.
    c.kill(5);
    assert_eq!(check_all(&r, |_| false), 0);
    // Server 4 too: objects with pieces on both are lost by name; everything else still reads.
    c.kill(4);
    for s in [5, 4] {
        c.declared_down(s, Duration::from_secs(30)).unwrap();
    }
    let lost = check_all(&r, |o| o.servers().contains(&4) && o.servers().contains(&5));
    assert!(lost > 0, "some object had pieces on both 4 and 5");
}

#[test]
fn the_erasure_scheme_encodes_on_the_write_path() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = start(dir.path(), 4, Policy { scheme: Scheme::Erasure, rs_data: 2, ..Policy::default() });
    let cfg = cfg(&c);
    write(&cfg, 1);
    let r = Reader::open("d", &cfg).unwrap();
    for step in 0..3 {
        for b in r.blocks("x", step).unwrap() {
            assert!(b.objects.iter().all(|o| matches!(o.redundancy, Redundancy::Encoded { k: 2, m: 1, .. })), "{b:?}");
        }
    }
    // 1.5 × the data stored (2 + 1 shards of half an object each).
    let used: u64 = (0..4).map(|s| c.state(s).unwrap().store.used()).sum();
    assert_eq!(used, 3 * 2 * N * 3 / 2);
    c.kill(3);
    assert_eq!(check_all(&r, |_| false), 0);
}

#[test]
fn a_step_commits_with_a_server_down_only_if_every_object_keeps_its_level_elsewhere() {
    let dir = tempfile::tempdir().unwrap();
    let policy = Policy { scheme: Scheme::Replicate, ..Policy::default() };
    let mut c = TestCluster::start_with(dir.path(), 4, 0, 64 << 20, Limits::default(), 1, policy).unwrap();
    let cfg = cfg(&c);
    let leader = c.leader(Duration::from_secs(10)).unwrap();
    let victim = (0..4).find(|s| *s != leader).unwrap();
    // Blocks larger than the writer coalesces (those go at the step's end), so that they are
    // on the servers before one dies.
    const LEN: u64 = 16 * N;
    // Two writers, each of its own dataset: `x` survives one failure, `y` keeps one copy.
    let open = |name: &str, var: &str, level: u32| {
        let mut w = Writer::open(name, &cfg, 0, 1, false, "s").unwrap();
        w.define_var(cairn_core::index::VarDef::new(var, DType::U8, Some(vec![LEN])).unwrap().with_redundancy(level)).unwrap();
        w.begin_step(0).unwrap();
        w.put(var, DType::U8, &vec![7u8; LEN as usize], Some(&[0]), &[LEN]).unwrap();
        w
    };
    let (mut wx, mut wy) = (open("dx", "x", 1), open("dy", "y", 0));
    // A server dies after the puts, before the steps are sealed.
    c.kill(victim);
    assert!(wx.end_step().unwrap(), "every object of x still has a copy");
    let mut out = vec![0u8; LEN as usize];
    Reader::open("dx", &cfg).unwrap().get("x", 0, &[0], &[LEN], &mut out).unwrap();
    assert!(out.iter().all(|v| *v == 7));
    let e = wy.end_step().unwrap_err();
    assert!(e.to_string().contains("cannot commit") && e.to_string().contains("'y'"), "{e}");
    assert!(Reader::open("dy", &cfg).unwrap().steps().unwrap().is_empty(), "the step stays invisible");
}
