//! Staging servers that nothing can hang or exhaust (issue 14), against in-process clusters:
//! pipelined reads of a thousand objects, malformed fragments, stalled uploads, reply bounds,
//! crashed sessions' leftovers, duplicate ranks, balanced placement, view epochs, deadlines, and
//! servers killed and restarted. Real processes (SIGSTOP, idle connections, RSS) are in the Python
//! suite.

use cairn_client::{Config, DType, ErrorKind, Reader, Writer};
use cairn_core::index::Fragment;
use cairn_proto::message::{ObjectPut, PutItem};
use cairn_proto::{ClusterView, Request, Response};
use cairn_server::Limits;
use cairn_testing::{RawConn, TestCluster};
use std::time::{Duration, Instant};

struct Cluster {
    c: TestCluster,
    _dir: tempfile::TempDir,
}

fn start(active: u32, spares: u32, memory: u64, limits: Limits) -> Cluster {
    let dir = tempfile::tempdir().unwrap();
    Cluster { c: TestCluster::start(dir.path(), active, spares, memory, limits).unwrap(), _dir: dir }
}

fn cfg(c: &TestCluster, object_size: u64) -> Config {
    let mut cfg = Config::default();
    cfg.set("engine", "staging").unwrap();
    cfg.set("cluster", c.file.to_str().unwrap()).unwrap();
    cfg.set("object_size", &object_size.to_string()).unwrap();
    cfg.set("timeout", "5").unwrap();
    cfg
}

fn used(c: &TestCluster, id: u32) -> u64 {
    c.state(id).unwrap().store.used()
}

fn write_step(cfg: &Config, name: &str, step: u64, session: &str, data: &[u8], append: bool) -> bool {
    let mut w = Writer::open(name, cfg, 0, 1, append, session).unwrap();
    w.define("x", DType::U8, Some(vec![data.len() as u64])).unwrap();
    w.begin_step(step).unwrap();
    w.put("x", DType::U8, data, None, &[data.len() as u64]).unwrap();
    let done = w.end_step().unwrap();
    w.close().unwrap();
    done
}

#[test]
fn a_block_of_a_thousand_objects_reads_back_without_deadlock() {
    let cl = start(2, 0, 256 << 20, Limits::default());
    let c = &cl.c;
    // A thousand get requests written before any reply is read fill a Unix socket's buffers
    // while the server waits to write a reply.
    let cfg = cfg(c, 65536);
    let n = 64usize << 20;
    let data: Vec<u8> = (0..n).map(|i| (i % 251) as u8).collect();
    assert!(write_step(&cfg, "big", 0, "s", &data, false));
    let r = Reader::open("big", &cfg).unwrap();
    assert!(r.blocks("x", 0).unwrap()[0].objects.len() >= 1024);
    let mut out = vec![0u8; n];
    r.get("x", 0, &[0], &[n as u64], &mut out).unwrap();
    assert!(out == data);
}

#[test]
fn a_malformed_fragment_costs_its_sender_an_error_and_nobody_else_anything() {
    let cl = start(1, 0, 64 << 20, Limits::default());
    let c = &cl.c;
    let cfg = cfg(c, 1 << 20);
    assert!(write_step(&cfg, "d", 0, "s", &[1; 100], false));
    let mut raw = RawConn::open(&c.addr(0).to_string(), c.secret()).unwrap();
    let r = Reader::open("d", &cfg).unwrap();
    let def = cairn_core::index::VarDef::new("x", DType::U8, Some(vec![100])).unwrap();
    let good = Fragment::new(1, 0, 1, "s".into(), vec![def], r.blocks("x", 0).unwrap());
    let req = Request::EndStep { dataset: "d".into(), fragment: good.clone(), shares: vec![], keep_last: None };
    let mut bad = serde_json::to_value(cairn_proto::Envelope { epoch: Some(1), req }).unwrap();
    // An object region with `offset: []`: once a panic under the coordinator's lock.
    bad["fragment"]["blocks"][0]["objects"][0]["region"]["offset"] = serde_json::json!([]);
    let frame = serde_json::to_vec(&bad).unwrap();
    let mut head = b"CRN3".to_vec();
    head.extend_from_slice(&(frame.len() as u32).to_le_bytes());
    head.extend_from_slice(&0u64.to_le_bytes());
    head.extend_from_slice(&frame);
    use std::io::Write;
    raw.stream.write_all(&head).unwrap();
    let (resp, _) = raw.recv().unwrap();
    let e = resp.into_result().unwrap_err();
    assert!(e.to_string().contains("offset has 0 dimensions"), "{e}");
    // A fragment that parses but names an undefined variable: an error, the connection kept.
    let mut f = good;
    f.blocks[0].var = "nope".into();
    let mut raw = RawConn::open(&c.addr(0).to_string(), c.secret()).unwrap();
    let req = Request::EndStep { dataset: "d".into(), fragment: f, shares: vec![], keep_last: None };
    let e = raw.call(Some(1), &req, &[]).unwrap().into_result().unwrap_err();
    assert!(e.to_string().contains("without defining it"), "{e}");
    assert!(matches!(raw.call(Some(1), &Request::Steps { dataset: "d".into(), follower: false }, &[]).unwrap(), Response::Steps { .. }));
    // Everyone else is served: the coordinator's lock is intact.
    assert!(write_step(&cfg, "d", 1, "s", &[2; 100], true));
    assert_eq!(r.steps().unwrap(), vec![0, 1]);
}

#[test]
fn a_stalled_upload_gives_its_reservation_back_by_the_deadline() {
    let limits = Limits { io_timeout: Duration::from_millis(300), ..Limits::default() };
    let cl = start(1, 0, 8 << 20, limits);
    let c = &cl.c;
    let mut raw = RawConn::open(&c.addr(0).to_string(), c.secret()).unwrap();
    let put = Request::Put(ObjectPut {
        dataset: "d".into(),
        step: 0,
        session: "x".into(),
        object: PutItem {
            var: "x".into(),
            id: 1,
            region: cairn_core::Region::new(vec![0], vec![6 << 20]).unwrap(),
            elem: 1,
            checksum: 0,
            copy: 0,
        },
        writer: 0,
        shard: 0,
        from: None,
        stripe: None,
    });
    let head = cairn_proto::frame::encode_head(&cairn_proto::Envelope { epoch: Some(1), req: put }, 6 << 20);
    use std::io::Write;
    raw.stream.write_all(&head).unwrap();
    raw.stream.write_all(&[0u8; 1 << 20]).unwrap();
    c.until(Duration::from_secs(5), "the reservation is held while the payload flows", |c| used(c, 0) >= 6 << 20).unwrap();
    // The uploader stalls: a legitimate writer finds the server full and waits for room (flow
    // control), served once the stalled connection hits its deadline and gives its space back.
    let cfg = cfg(c, 8 << 20);
    let started = Instant::now();
    assert!(write_step(&cfg, "other", 0, "s", &vec![1; 4 << 20], false));
    assert!(started.elapsed() >= Duration::from_millis(100), "served before the stalled upload was cut: {:?}", started.elapsed());
    assert_eq!(used(c, 0), 4 << 20, "only the served step's bytes are held");
}

#[test]
fn a_reply_is_bounded_however_often_a_request_names_a_key() {
    let cl = start(1, 0, 64 << 20, Limits::default());
    let c = &cl.c;
    let kv = cairn_client::staging::KvStore::open(&c.file, Duration::from_secs(5)).unwrap();
    let mib = vec![7u8; 1 << 20];
    kv.put_many(&[("k", &mib)], false).unwrap();
    let mut raw = RawConn::open(&c.addr(0).to_string(), c.secret()).unwrap();
    let e = raw.call(Some(1), &Request::KvGet { keys: vec!["k".into(); 2000], members: false }, &[]).unwrap().into_result().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Capacity, "{e}");
    assert!(e.to_string().contains("fewer keys"), "{e}");
    let e = raw.call(Some(1), &Request::KvGet { keys: vec!["k".into(); 9000], members: false }, &[]).unwrap().into_result().unwrap_err();
    assert!(e.to_string().contains("at most 8192"), "{e}");
    assert_eq!(kv.get_many(&["k"; 40], false).unwrap().len(), 40, "within the bound it is served");
}

#[test]
fn a_crashed_sessions_objects_are_dropped_everywhere_at_the_next_commit() {
    let cl = start(4, 0, 64 << 20, Limits::default());
    let c = &cl.c;
    let cfg = cfg(c, 4096);
    let mut w = Writer::open("run", &cfg, 0, 1, false, "crashed").unwrap();
    w.define("x", DType::U8, Some(vec![128 << 10])).unwrap();
    w.begin_step(0).unwrap();
    w.put("x", DType::U8, &vec![1; 128 << 10], None, &[128 << 10]).unwrap();
    std::mem::forget(w); // killed mid-step: nothing ends or aborts it
    assert!((0..4).all(|s| used(c, s) > 0), "the crashed session's objects are on every server");
    // The restart writes step 0 again, smaller: its objects reach one server only.
    let mut cfg2 = cfg.clone();
    cfg2.set("object_size", "1048576").unwrap();
    assert!(write_step(&cfg2, "run", 0, "restarted", &[2; 1000], true));
    c.until(Duration::from_secs(5), "only the restart's 1000 bytes stay", |c| (0..4).map(|s| used(c, s)).sum::<u64>() == 1000).unwrap();
}

#[test]
fn two_writers_started_as_one_rank_are_refused_by_name() {
    let cl = start(2, 0, 64 << 20, Limits::default());
    let c = &cl.c;
    let cfg = cfg(c, 1 << 20);
    let mut ws: Vec<Writer> = (0..2).map(|_| Writer::open("dup", &cfg, 0, 2, false, "sess-7").unwrap()).collect();
    for (i, w) in ws.iter_mut().enumerate() {
        w.define("x", DType::U8, Some(vec![10])).unwrap();
        w.begin_step(0).unwrap();
        w.put("x", DType::U8, &[i as u8; 5], Some(&[0]), &[5]).unwrap();
    }
    assert!(!ws[0].end_step().unwrap());
    let e = ws[1].end_step().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Conflict, "{e}");
    let msg = e.to_string();
    assert!(msg.contains("rank 0") && msg.contains("sess-7") && msg.contains("step 0"), "{msg}");
}

#[test]
fn a_regular_decomposition_fills_every_server_alike() {
    let cl = start(4, 0, 256 << 20, Limits::default());
    let c = &cl.c;
    let cfg = cfg(c, 256 << 10);
    let writers = 4u32;
    std::thread::scope(|s| {
        for r in 0..writers {
            let cfg = cfg.clone();
            s.spawn(move || {
                let mut w = Writer::open("field", &cfg, r, writers, false, "s").unwrap();
                w.define("p", DType::F64, Some(vec![u64::from(writers) * 96 * 1024])).unwrap();
                w.define("q", DType::F64, Some(vec![u64::from(writers) * 40 * 1024])).unwrap();
                for step in 0..6 {
                    w.begin_step(step).unwrap();
                    let off = u64::from(r);
                    w.put("p", DType::F64, &vec![0u8; 96 * 1024 * 8], Some(&[off * 96 * 1024]), &[96 * 1024]).unwrap();
                    w.put("q", DType::F64, &vec![0u8; 40 * 1024 * 8], Some(&[off * 40 * 1024]), &[40 * 1024]).unwrap();
                    w.end_step().unwrap();
                }
                w.close().unwrap();
            });
        }
    });
    let per: Vec<u64> = (0..4).map(|s| used(c, s)).collect();
    let mean = per.iter().sum::<u64>() as f64 / 4.0;
    assert!(per.iter().all(|&u| (u as f64 - mean).abs() <= 0.1 * mean), "memory per server {per:?} is not within 10% of {mean}");
}

#[test]
fn a_client_on_an_old_view_is_redirected_and_places_by_the_new_one() {
    let cl = start(3, 1, 64 << 20, Limits::default());
    let c = &cl.c;
    let cfg = cfg(c, 4096);
    let data = vec![3u8; 64 << 10];
    assert!(write_step(&cfg, "v", 0, "s", &data, false));
    let r = Reader::open("v", &cfg).unwrap();
    assert_eq!(used(c, 3), 0, "the spare holds nothing");
    // Spare 3 takes server 2's slot through the control plane's log: every server learns view
    // 2 (the non-meta spare by the leader's push), clients still hold view 1.
    let mut conn = RawConn::open(&c.addr(0).to_string(), c.secret()).unwrap();
    let Response::View { view } = conn.call(None, &Request::View, &[]).unwrap() else { panic!("no view") };
    let next: ClusterView = view.replace(2, 3).unwrap();
    c.set_view(&next).unwrap();
    c.await_epoch(2, Duration::from_secs(5)).unwrap();
    let mut conn = RawConn::open(&c.addr(c.leader(Duration::from_secs(5)).unwrap()).to_string(), c.secret()).unwrap();
    let mut stale = RawConn::open(&c.addr(0).to_string(), c.secret()).unwrap();
    match stale.call(Some(1), &Request::Steps { dataset: "v".into(), follower: false }, &[]).unwrap() {
        Response::Error { kind, view: Some(v), .. } => assert_eq!((kind, v.epoch), (ErrorKind::StaleEpoch, 2)),
        other => panic!("expected stale_epoch, got {other:?}"),
    }
    let older = conn
        .call(None, &Request::SetView(cairn_proto::message::ViewChange { view: view.clone() }), &[])
        .unwrap()
        .into_result()
        .unwrap_err();
    assert_eq!(older.kind(), ErrorKind::Conflict, "an older view is refused: {older}");
    let mut follower = RawConn::open(&c.addr(3).to_string(), c.secret()).unwrap();
    let e = follower.call(None, &Request::SetView(cairn_proto::message::ViewChange { view: next.clone() }), &[]).unwrap();
    assert!(matches!(e, Response::Error { kind: ErrorKind::NotLeader, .. }), "only the leader changes views: {e:?}");
    // The reader on view 1 is told, refreshes and goes on; the next step lands on the spare.
    assert_eq!(r.steps().unwrap(), vec![0]);
    assert!(write_step(&cfg, "v", 1, "s", &data, true));
    assert!(used(c, 3) > 0, "the spare took its slot");
    let mut out = vec![0u8; data.len()];
    r.get("x", 1, &[0], &[data.len() as u64], &mut out).unwrap();
    assert!(out == data);
}

#[test]
fn a_server_that_never_answers_is_named_within_the_deadline() {
    // A listener nobody accepts on: connections complete in the kernel, nothing is ever said.
    let mute = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("cluster.json");
    let entry = serde_json::json!({"id": 0, "node": "n", "rack": "", "spare": false, "addr": mute.local_addr().unwrap().to_string()});
    std::fs::write(&file, serde_json::json!({"secret": "s", "servers": [entry]}).to_string()).unwrap();
    let mut cfg = Config::default();
    cfg.set("engine", "staging").unwrap();
    cfg.set("cluster", file.to_str().unwrap()).unwrap();
    cfg.set("timeout", "0.5").unwrap();
    let started = Instant::now();
    let e = Reader::open("d", &cfg).and_then(|r| r.steps()).unwrap_err();
    assert!(started.elapsed() < Duration::from_millis(1500), "{:?}", started.elapsed());
    assert_eq!(e.kind(), ErrorKind::Unavailable);
    let msg = e.to_string();
    assert!(msg.contains("server 0") && msg.contains(&mute.local_addr().unwrap().to_string()) && msg.contains("within 0.5 s"), "{msg}");
}

#[test]
fn a_killed_server_is_named_and_a_restarted_one_serves_again() {
    // Three servers, all meta: any one may die and the other two keep the control plane.
    let mut cl = start(3, 0, 64 << 20, Limits::default());
    let cfg = cfg(&cl.c, 4096);
    let data = vec![5u8; 64 << 10];
    assert!(write_step(&cfg, "k", 0, "s", &data, false));
    let r = Reader::open("k", &cfg).unwrap();
    let holders: Vec<u32> = r.blocks("x", 0).unwrap()[0].objects.iter().map(|o| o.server).collect();
    let victim = holders[0];
    cl.c.kill(victim);
    let mut out = vec![0u8; data.len()];
    let e = r.get("x", 0, &[0], &[data.len() as u64], &mut out).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "gone, but not declared down yet: {e}");
    assert!(e.to_string().contains(&format!("server {victim}")), "{e}");
    cl.c.declared_down(victim, Duration::from_secs(30)).unwrap();
    let e = r.get("x", 0, &[0], &[data.len() as u64], &mut out).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::DataLoss, "its one copy died with it: {e}");
    assert!(e.to_string().contains(&format!("server {victim}")), "{e}");
    cl.c.restart(victim).unwrap();
    // Its memory is gone (one copy): the block is lost, and the error names the server (declared
    // down, it rejoins empty).
    let e = r.get("x", 0, &[0], &[data.len() as u64], &mut out).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::DataLoss, "{e}");
    assert!(e.to_string().contains(&format!("server {victim}")) && e.to_string().contains("is lost"), "{e}");
    assert!(write_step(&cfg, "k", 1, "s", &data, true));
    r.get("x", 1, &[0], &[data.len() as u64], &mut out).unwrap();
    assert!(out == data);
}

#[test]
fn a_replayed_hello_is_refused() {
    let cl = start(1, 0, 1 << 20, Limits::default());
    let c = &cl.c;
    let addr = c.addr(0).to_string();
    let mut s = std::net::TcpStream::connect(&addr).unwrap();
    let (challenge, _) = cairn_proto::sync_io::read_head::<Response>(&mut s, 0).unwrap();
    let Response::Challenge { nonce, .. } = challenge else { panic!() };
    let captured = Request::Hello { client: "t".into(), mac: cairn_proto::auth::answer(c.secret(), &nonce), role: Default::default() };
    // Replayed on a new connection (another nonce), the captured answer fails.
    let mut s2 = std::net::TcpStream::connect(&addr).unwrap();
    let _ = cairn_proto::sync_io::read_head::<Response>(&mut s2, 0).unwrap();
    cairn_proto::sync_io::write_frame(&mut s2, &captured, &[]).unwrap();
    let (reply, _) = cairn_proto::sync_io::read_head::<Response>(&mut s2, 0).unwrap();
    assert!(reply.into_result().unwrap_err().to_string().contains("wrong cluster secret"));
    cairn_proto::sync_io::write_frame(&mut s, &captured, &[]).unwrap();
    let (reply, _) = cairn_proto::sync_io::read_head::<Response>(&mut s, 0).unwrap();
    assert!(matches!(reply, Response::Welcome { .. }), "{reply:?}");
}

/// Stores on `server` 100 unsealed bytes of session "s", step 0 of dataset "run", under an id no
/// writer uses: what a put that failed there and was placed again elsewhere may leave.
fn plant_leftover(c: &TestCluster, server: u32) {
    let st = c.state(server).unwrap();
    let leftover = cairn_server::store::Object {
        var: "x".into(),
        region: cairn_core::Region::new(vec![0], vec![100]).unwrap(),
        elem: 1,
        session: "s".into(),
        writer: 0,
        checksum: 0,
        data: std::sync::Arc::new(cairn_server::segment::Memory::Heap(vec![9; 100])),
        sealed: false,
        copy: 0,
        stripe: None,
    };
    st.store.insert("run", 0, (u64::MAX, 0), leftover, st.store.reserve(100).unwrap()).unwrap();
}

#[test]
fn a_leftover_of_a_put_placed_again_elsewhere_is_freed_at_commit_not_counted() {
    let cl = start(2, 0, 64 << 20, Limits::default());
    let c = &cl.c;
    let cfg = cfg(c, 4096);
    // What a put that failed towards server 0 (say across a view change) and was placed again
    // elsewhere may have left there: an object of the writing session that no index names.
    plant_leftover(c, 0);
    let data: Vec<u8> = (0..128u32 << 10).map(|i| i as u8).collect();
    assert!(write_step(&cfg, "run", 0, "s", &data, false), "the commit does not count the leftover against the writers");
    assert_eq!(used(c, 0) + used(c, 1), data.len() as u64, "the leftover is freed");
    let mut out = vec![0u8; data.len()];
    Reader::open("run", &cfg).unwrap().get("x", 0, &[0], &[data.len() as u64], &mut out).unwrap();
    assert_eq!(out, data);
}

#[test]
fn leftovers_on_a_server_the_commit_does_not_seal_are_swept() {
    let cl = start(3, 0, 64 << 20, Limits::default());
    let c = &cl.c;
    let cfg = cfg(c, 1 << 20);
    // One small object: it lands on one server; the other two take no part in the commit.
    (0..3).for_each(|s| plant_leftover(c, s));
    assert!(write_step(&cfg, "run", 0, "s", &[1; 1000], false));
    c.until(Duration::from_secs(5), "only the step's 1000 bytes stay", |c| (0..3).map(|s| used(c, s)).sum::<u64>() == 1000).unwrap();
}

#[test]
fn a_put_many_that_does_not_add_up_or_arrives_damaged_is_refused_and_the_connection_kept() {
    use cairn_proto::message::{PutItem, MAX_PUT_MANY};
    let cl = start(1, 0, 8 << 20, Limits::default());
    let c = &cl.c;
    let mut raw = RawConn::open(&c.addr(0).to_string(), c.secret()).unwrap();
    let item = |id: u64, bytes: &[u8]| PutItem {
        var: "x".into(),
        id,
        region: cairn_core::Region::new(vec![id * 4], vec![4]).unwrap(),
        elem: 1,
        checksum: cairn_core::checksum::crc(bytes),
        copy: 0,
    };
    let many = |objects: Vec<PutItem>| Request::PutMany {
        dataset: "d".into(),
        step: 0,
        session: "s".into(),
        writer: 0,
        objects,
        from: None,
        leases: None,
    };
    let (a, b, d) = ([1u8; 4], [2u8; 4], [3u8; 4]);
    // Three objects' boxes, the bytes of two.
    let e = raw.call(Some(1), &many(vec![item(0, &a), item(1, &b), item(2, &d)]), &[&a, &b]).unwrap().into_result().unwrap_err();
    assert!(e.kind() == ErrorKind::InvalidArgument && e.to_string().contains("add up to"), "{e}");
    let e = raw.call(Some(1), &many((0..=MAX_PUT_MANY as u64).map(|i| item(i, &a)).collect()), &[]).unwrap().into_result().unwrap_err();
    assert!(e.to_string().contains("send 1 to 1024"), "{e}");
    // The second object's checksum is wrong: refused by name, the rest of the payload skipped,
    // and the connection still reads frames where they start.
    let mut bad = item(1, &b);
    bad.checksum ^= 1;
    let e = raw.call(Some(1), &many(vec![item(0, &a), bad, item(2, &d)]), &[&a, &b, &d]).unwrap().into_result().unwrap_err();
    assert!(e.kind() == ErrorKind::Corrupt && e.to_string().contains("object 0x1"), "{e}");
    assert!(used(c, 0) <= 4, "only the first object may be stored: {} bytes held", used(c, 0));
    assert_eq!(raw.call(Some(1), &many(vec![item(3, &a), item(4, &b)]), &[&a, &b]).unwrap().into_result().unwrap(), Response::Ok);
    assert!(used(c, 0) >= 8);
}

#[test]
fn a_writer_that_leases_segments_and_hangs_gives_them_back_by_the_deadline() {
    let limits = Limits { io_timeout: Duration::from_millis(300), ..Limits::default() };
    let cl = start(1, 0, 8 << 20, limits);
    let c = &cl.c;
    let mut raw = RawConn::open_unix(c, 0).unwrap();
    let leased = raw.call(Some(1), &Request::Lease { sizes: vec![3 << 20, 3 << 20], release: vec![] }, &[]).unwrap();
    let Response::Leased { leases, .. } = leased else { panic!("not leased: {leased:?}") };
    assert_eq!(leases.len(), 2);
    assert_eq!(used(c, 0), 6 << 20, "a lease reserves its segment's space");
    // The writer hangs before its put (as a SIGSTOPped one would): a connection holding leases
    // is never idle, so the deadline drops it, and the leases and their space come back.
    let start = Instant::now();
    c.until(Duration::from_secs(5), "the hung lessee's space is given back", |c| used(c, 0) == 0).unwrap();
    assert!(start.elapsed() >= Duration::from_millis(200), "not before the deadline: {:?}", start.elapsed());
    let cfg = cfg(c, 8 << 20);
    assert!(write_step(&cfg, "d", 0, "s", &[7; 6 << 20], false), "the space serves the next writer");
}

#[test]
fn a_put_refused_for_a_stale_view_while_a_server_is_down_is_placed_again() {
    // Issue 40, defect 2: a put refused as `stale_epoch` failed its step when the placement by
    // the newer view met a server that was down too (the SIGSTOP case: views change while
    // servers hang). It is placed again, around the dead server, and the step commits.
    let mut cl = start(3, 0, 64 << 20, Limits::default());
    let cfg = cfg(&cl.c, 4096);
    let data: Vec<u8> = (0..(256usize << 10)).map(|i| (i % 251) as u8).collect();
    let mut w = Writer::open("sv", &cfg, 0, 1, false, "s").unwrap();
    w.define("x", DType::U8, Some(vec![data.len() as u64])).unwrap();
    w.begin_step(0).unwrap();
    w.put("x", DType::U8, &data, None, &[data.len() as u64]).unwrap();
    assert!(w.end_step().unwrap());
    w.begin_step(1).unwrap();
    let leader = cl.c.leader(Duration::from_secs(5)).unwrap();
    cl.c.kill((leader + 1) % 3);
    let mut conn = RawConn::open(&cl.c.addr(leader).to_string(), cl.c.secret()).unwrap();
    let Response::View { mut view } = conn.call(None, &Request::View, &[]).unwrap() else { panic!("no view") };
    view.epoch += 1;
    conn.call(None, &Request::SetView(cairn_proto::message::ViewChange { view: view.clone() }), &[]).unwrap().into_result().unwrap();
    cl.c.await_epoch(view.epoch, Duration::from_secs(5)).unwrap();
    w.put("x", DType::U8, &data, None, &[data.len() as u64]).unwrap();
    assert!(w.end_step().unwrap_or_else(|e| panic!("the step failed on a view change: {e}")));
    w.close().unwrap();
    let r = Reader::open("sv", &cfg).unwrap();
    let mut out = vec![0u8; data.len()];
    r.get("x", 1, &[0], &[data.len() as u64], &mut out).unwrap();
    assert!(out == data);
}

#[test]
fn a_client_connection_cannot_name_a_peer_operation() {
    let cl = start(1, 0, 64 << 20, Limits::default());
    let c = &cl.c;
    let seal = cairn_proto::PeerRequest::Seal { dataset: "d".into(), step: 0, session: "s".into(), keys: vec![], bytes: 0 };
    // As a client: the header does not parse as any client request; the connection ends.
    let mut client = RawConn::open(&c.addr(0).to_string(), c.secret()).unwrap();
    let e = client.call(None, &seal, &[]).unwrap().into_result().unwrap_err();
    assert!(e.kind() == ErrorKind::Corrupt && e.to_string().contains("unknown variant `seal`"), "{e}");
    assert!(client.call(None, &Request::Status, &[]).is_err(), "a client naming a peer's operation loses its connection");
    // As a peer (the hello says so), the same request is served, and so are clients' requests.
    let mut peer = RawConn::open_as(&c.addr(0).to_string(), c.secret(), cairn_proto::Role::Peer).unwrap();
    assert!(matches!(peer.call(None, &seal, &[]).unwrap(), Response::Ok));
    assert!(matches!(peer.call(None, &Request::Status, &[]).unwrap(), Response::Status { .. }));
}
