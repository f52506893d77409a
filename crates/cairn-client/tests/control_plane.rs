//! Compare-and-set through the control plane: claims are decided once by the Raft leader, the
//! client finds the leader by itself (followers name it, servers without a replica pass it on),
//! and keeps working across a leader's death with nothing lost.

use cairn_client::staging::KvStore;
use cairn_server::testing::TestCluster;
use cairn_server::Limits;
use std::time::{Duration, Instant};

fn leader(c: &TestCluster, ids: &[u32]) -> u32 {
    let start = Instant::now();
    loop {
        if let Some(l) = ids.iter().find(|id| c.state(**id).and_then(|s| s.control.get()).is_some_and(|l| l.role().0 == "leader")) {
            return *l;
        }
        assert!(start.elapsed() < Duration::from_secs(10), "no leader");
        std::thread::sleep(Duration::from_millis(10));
    }
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
