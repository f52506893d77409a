//! The staging engine end to end against real servers on loopback (in-process server threads with
//! their own runtimes; the Python suite runs them as separate processes and kills them).

use cairn_client::{Config, DType, ErrorKind, Reader, Writer};
use cairn_server::Limits;
use cairn_testing::{RawConn, TestCluster};
use std::io::{Read, Write};
use std::path::Path;
use std::time::Duration;

struct Cluster {
    _dir: tempfile::TempDir,
    inner: TestCluster,
}

impl std::ops::Deref for Cluster {
    type Target = TestCluster;
    fn deref(&self) -> &TestCluster {
        &self.inner
    }
}

fn start(servers: u32, memory: u64) -> Cluster {
    let dir = tempfile::tempdir().unwrap();
    let inner = TestCluster::start(dir.path(), servers, 0, memory, Limits::default()).unwrap();
    Cluster { _dir: dir, inner }
}

fn cfg(c: &Cluster, object_size: u64) -> Config {
    let mut cfg = Config::default();
    cfg.set("engine", "staging").unwrap();
    cfg.set("cluster", c.file.to_str().unwrap()).unwrap();
    cfg.set("timeout", "5").unwrap();
    cfg.set("object_size", &object_size.to_string()).unwrap();
    cfg
}

fn val(i: u64, j: u64, k: u64, step: u64) -> f64 {
    (i * 10_000 + j * 100 + k) as f64 + step as f64 * 0.5
}

fn block(x0: u64, x1: u64, ny: u64, nz: u64, step: u64) -> Vec<u8> {
    let mut out = Vec::new();
    for i in x0..x1 {
        for j in 0..ny {
            for k in 0..nz {
                out.extend_from_slice(&val(i, j, k, step).to_le_bytes());
            }
        }
    }
    out
}

#[test]
fn many_writers_any_box_back_and_atomic_commit() {
    let c = start(3, 64 << 20);
    let cfg = cfg(&c, 512); // tiny objects: every block splits into many, over every server
    let shape = [20u64, 9, 7];
    let writers = 3u32;
    std::thread::scope(|s| {
        for r in 0..writers {
            let cfg = cfg.clone();
            s.spawn(move || {
                let mut w = Writer::open("sim", &cfg, r, writers, false, "run-1").unwrap();
                w.define("t", DType::F64, Some(shape.to_vec())).unwrap();
                w.define("walkers", DType::I32, None).unwrap();
                let (x0, x1) = (r as u64 * 20 / 3, (r as u64 + 1) * 20 / 3);
                for step in 0..4 {
                    w.begin_step(step).unwrap();
                    w.put("t", DType::F64, &block(x0, x1, 9, 7, step), Some(&[x0, 0, 0]), &[x1 - x0, 9, 7]).unwrap();
                    let ragged: Vec<u8> = (0..(r + 1) * 5 + step as u32).flat_map(|v| (v as i32).to_le_bytes()).collect();
                    w.put("walkers", DType::I32, &ragged, None, &[ragged.len() as u64 / 4]).unwrap();
                    w.end_step().unwrap();
                }
                w.close().unwrap();
            });
        }
    });
    let r = Reader::open("sim", &cfg).unwrap();
    assert_eq!(r.steps().unwrap(), vec![0, 1, 2, 3]);
    for (off, cnt) in [([0u64, 0, 0], [20u64, 9, 7]), ([5, 2, 1], [10, 5, 5]), ([19, 8, 6], [1, 1, 1]), ([3, 0, 2], [14, 9, 1])] {
        let mut out = vec![0u8; (cnt.iter().product::<u64>() * 8) as usize];
        r.get("t", 2, &off, &cnt, &mut out).unwrap();
        let mut want = Vec::new();
        for i in off[0]..off[0] + cnt[0] {
            for j in off[1]..off[1] + cnt[1] {
                for k in off[2]..off[2] + cnt[2] {
                    want.extend_from_slice(&val(i, j, k, 2).to_le_bytes());
                }
            }
        }
        assert_eq!(out, want, "box {off:?}+{cnt:?}");
    }
    let b = r.local_block("walkers", 3, 2).unwrap();
    let mut out = vec![0u8; b.len as usize];
    r.get_local("walkers", 3, 2, &mut out).unwrap();
    assert_eq!(out.len(), (15 + 3) * 4);
    assert_eq!(&out[4..8], &1i32.to_le_bytes());
    let blocks = r.blocks("t", 0).unwrap();
    assert_eq!(blocks.len(), 3);
    assert!(blocks.iter().all(|b| b.objects.len() > 1 && b.stats.min.is_some()));

    // A step two of three writers ended stays invisible, and a writer's restart under a new
    // session replaces the crashed run's leftovers.
    let mut ws: Vec<Writer> = (0..3).map(|r| Writer::open("sim", &cfg, r, 3, true, "run-2").unwrap()).collect();
    for (rank, w) in ws.iter_mut().enumerate() {
        let (x0, x1) = (rank as u64 * 20 / 3, (rank as u64 + 1) * 20 / 3);
        w.define("t", DType::F64, Some(shape.to_vec())).unwrap();
        w.begin_step(4).unwrap();
        w.put("t", DType::F64, &block(x0, x1, 9, 7, 4), Some(&[x0, 0, 0]), &[x1 - x0, 9, 7]).unwrap();
    }
    assert!(!ws[0].end_step().unwrap());
    assert!(!ws[1].end_step().unwrap());
    assert!(!r.wait_step(4, Duration::from_millis(50)).unwrap());
    assert_eq!(r.steps().unwrap().len(), 4);
    assert!(ws[2].end_step().unwrap());
    assert!(r.wait_step(4, Duration::from_secs(5)).unwrap());

    r.release(0).unwrap();
    assert_eq!(r.steps().unwrap(), vec![1, 2, 3, 4]);
    let mut out = vec![0u8; 8];
    assert_eq!(r.get("t", 0, &[0, 0, 0], &[1, 1, 1], &mut out).unwrap_err().kind(), ErrorKind::NotFound);
}

#[test]
fn full_server_refuses_with_capacity_error_and_stays_up() {
    let c = start(1, 1 << 20);
    let mut cfg = cfg(&c, 256 << 10);
    cfg.set("keep_last", "2").unwrap();
    let mut w = Writer::open("big", &cfg, 0, 1, false, "s").unwrap();
    w.define("x", DType::U8, Some(vec![4 << 20])).unwrap();
    w.define("y", DType::U8, Some(vec![300 << 10])).unwrap();
    w.begin_step(0).unwrap();
    let e = w.put("x", DType::U8, &vec![7u8; 4 << 20], None, &[4 << 20]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Capacity, "{e}");
    assert!(e.to_string().contains("server 0") && e.to_string().contains("release"), "{e}");
    // A failed sub-transaction: the step does not end until 'x' is put again, or is aborted.
    let failed = w.failed_puts().to_vec();
    assert_eq!((failed.len(), failed[0].var.as_str(), failed[0].servers.as_slice()), (1, "x", &[0u32][..]));
    w.put("y", DType::U8, &vec![9u8; 300 << 10], None, &[300 << 10]).unwrap();
    let e = w.end_step().unwrap_err();
    assert!(e.kind() == ErrorKind::Conflict && e.to_string().contains("of x could not be stored"), "{e}");
    w.abort_step().unwrap();
    // What arrived before the refusal was freed, and the server still serves: steps rotate
    // under keep_last without ever filling it.
    for step in 0..6 {
        w.begin_step(step).unwrap();
        w.put("y", DType::U8, &vec![step as u8; 300 << 10], None, &[300 << 10]).unwrap();
        w.end_step().unwrap();
    }
    let r = Reader::open("big", &cfg).unwrap();
    assert_eq!(r.steps().unwrap(), vec![4, 5]);
    let mut out = vec![0u8; 300 << 10];
    r.get("y", 5, &[0], &[300 << 10], &mut out).unwrap();
    assert!(out.iter().all(|v| *v == 5));
}

fn raw_exchange(addr: &str, bytes: &[u8]) -> Vec<u8> {
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.write_all(bytes).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    out
}

#[test]
fn bad_frames_and_wrong_secrets_are_refused_and_the_server_stays_up() {
    let c = start(1, 16 << 20);
    let addr = c.addr(0).to_string();
    let reply = raw_exchange(&addr, b"GET / HTTP/1.1\r\n\r\n");
    assert!(String::from_utf8_lossy(&reply).contains("magic"), "{}", String::from_utf8_lossy(&reply));
    let hello = cairn_proto::frame::encode_head(
        &cairn_proto::Request::Hello { mac: "0".repeat(64), client: "t".into(), role: Default::default() },
        0,
    );
    let reply = raw_exchange(&addr, &hello);
    assert!(String::from_utf8_lossy(&reply).contains("wrong cluster secret"));
    // A first frame announcing a large header or payload is refused before anything is allocated.
    let mut huge = hello.clone();
    huge[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(String::from_utf8_lossy(&raw_exchange(&addr, &huge)).contains("exceeds"));
    let mut big_header = hello.clone();
    big_header[4..8].copy_from_slice(&(64u32 << 20).to_le_bytes());
    assert!(String::from_utf8_lossy(&raw_exchange(&addr, &big_header)).contains("header length 67108864 is outside 1 to 4096"));
    let cfg = cfg(&c, 1 << 20);
    let mut w = Writer::open("ok", &cfg, 0, 1, false, "s").unwrap();
    w.define("v", DType::F32, Some(vec![4])).unwrap();
    w.begin_step(0).unwrap();
    w.put("v", DType::F32, &[0u8; 16], None, &[4]).unwrap();
    assert!(w.end_step().unwrap());
}

#[test]
fn a_cluster_file_that_names_nothing_is_a_clear_error() {
    let mut cfg = Config::default();
    cfg.set("engine", "staging").unwrap();
    assert_eq!(Writer::open("x", &cfg, 0, 1, false, "").unwrap_err().kind(), ErrorKind::Config);
    cfg.set("cluster", "/nonexistent/cluster.json").unwrap();
    let e = Reader::open("x", &cfg).unwrap_err();
    assert!(e.to_string().contains("cairn cluster start"), "{e}");
    let _ = Path::new("");
}

#[test]
fn keyed_values_in_large_batches_and_refusals_that_lose_nothing() {
    use cairn_client::staging::KvStore;
    let c = start(2, 32 << 20);
    let kv = KvStore::open(&c.file, Duration::from_secs(10)).unwrap();
    // Tens of thousands of small set members in one call: far more than socket buffers hold as
    // separate replies (the pipelined puts this replaced deadlocked on this shape).
    let members: Vec<(String, Vec<u8>)> =
        (0..40_000u32).map(|i| (format!("memo/{}", i % 997), [i.to_le_bytes().as_slice(), &[7u8; 164]].concat())).collect();
    let items: Vec<(&str, &[u8])> = members.iter().map(|(k, v)| (k.as_str(), v.as_slice())).collect();
    kv.put_many(&items, true).unwrap();
    kv.put_many(&items[..500], true).unwrap();
    let keys: Vec<String> = (0..997).map(|i| format!("memo/{i}")).collect();
    let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
    let got = kv.get_many(&refs, true).unwrap();
    for (i, set) in got.iter().enumerate() {
        let mut want: Vec<&Vec<u8>> = members.iter().filter(|(k, _)| *k == keys[i]).map(|(_, v)| v).collect();
        want.sort();
        assert_eq!(set.iter().collect::<Vec<_>>(), want, "members of {} (added twice, held once)", keys[i]);
    }
    // A value larger than a server is refused before sending; a batch that does not fit is
    // refused whole. Either way nothing is stored and the connections keep working.
    let big = vec![1u8; 40 << 20];
    let e = kv.put_many(&[("big", &big)], false).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Capacity, "{e}");
    let chunk = vec![2u8; 7 << 20];
    let many: Vec<String> = (0..12).map(|i| format!("chunk/{i}")).collect();
    let items: Vec<(&str, &[u8])> = many.iter().map(|k| (k.as_str(), chunk.as_slice())).collect();
    let e = kv.put_many(&items, false).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Capacity, "{e}");
    assert!(e.to_string().contains("server"), "{e}");
    let stored = kv.get_many(&many.iter().map(String::as_str).collect::<Vec<_>>(), false).unwrap();
    assert!(stored.iter().all(|v| v.is_empty() || v[0] == chunk), "values are stored whole or not at all");
    assert_eq!(kv.delete(&["chunk/"], true).unwrap(), stored.iter().filter(|v| !v.is_empty()).count() as u64);
    kv.put_many(&[("after", b"ok")], false).unwrap();
    assert_eq!(kv.get_many(&["after"], false).unwrap(), vec![vec![b"ok".to_vec()]]);
    assert_eq!(kv.delete(&["memo/1", "memo/2", "memo/none"], false).unwrap(), 2);
    assert_eq!(kv.delete(&["memo/"], true).unwrap(), 995);
}

#[test]
fn a_kv_put_whose_sizes_do_not_match_its_payload_is_refused_and_the_connection_kept() {
    use cairn_proto::{Request, Response};
    let c = start(1, 16 << 20);
    let mut conn = RawConn::open(&c.addr(0).to_string(), c.secret()).unwrap();
    let mut call = |req: &Request, payload: &[&[u8]]| conn.call(None, req, payload).unwrap();
    for (keys, sizes) in [(vec!["a", "b"], vec![3u64]), (vec!["a"], vec![2]), (vec!["a"], vec![u64::MAX])] {
        let req = Request::KvPut { keys: keys.iter().map(|k| k.to_string()).collect(), sizes, member: false };
        let e = call(&req, &[b"xyz"]).into_result().unwrap_err();
        assert!(e.to_string().contains("one size per key"), "{e}");
    }
    let e = call(&Request::KvPut { keys: vec![String::new()], sizes: vec![3], member: false }, &[b"xyz"]).into_result().unwrap_err();
    assert!(e.to_string().contains("keys must have"), "{e}");
    call(&Request::KvPut { keys: vec!["a".into()], sizes: vec![3], member: false }, &[b"xyz"]).into_result().unwrap();
    assert!(matches!(call(&Request::KvGet { keys: vec!["a".into()], members: false }, &[]), Response::Values { .. }));
    // A batch is stored whole or not at all: two values that each fit, but not together.
    let put = |keys: &[&str], n: usize| Request::KvPut {
        keys: keys.iter().map(|k| k.to_string()).collect(),
        sizes: vec![n as u64; keys.len()],
        member: false,
    };
    let five = vec![5u8; 5 << 20];
    call(&put(&["fill"], 8 << 20), &[&vec![1u8; 8 << 20]]).into_result().unwrap();
    let e = call(&put(&["x", "y"], 5 << 20), &[&five, &five]).into_result().unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Capacity, "{e}");
    match call(&Request::KvGet { keys: vec!["x".into(), "y".into()], members: false }, &[]) {
        Response::Values { sizes } => assert_eq!(sizes, vec![Vec::<u64>::new(), vec![]], "neither value of the refused batch is stored"),
        other => panic!("{other:?}"),
    }
    call(&put(&["x"], 5 << 20), &[&five]).into_result().unwrap();
}
