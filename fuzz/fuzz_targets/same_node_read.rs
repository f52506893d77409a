//! Any runs of client memory a same-node put (`put` or `put_many` with `from`) may name, checked
//! as the server checks them and then read through the pinned image of this process (as a
//! server reads its connected client's): must copy exactly the named bytes or return an error,
//! never crash or touch memory outside the destination. Low addresses stand for offsets into a
//! known buffer, so valid copies are reached as well as unmapped, wrapping and oversized ones.
//! Run: `cargo +nightly fuzz run same_node_read -- -max_total_time=60`.
#![no_main]

use cairn_proto::message::MAX_RUNS;
use cairn_server::cma::Peer;
use libfuzzer_sys::fuzz_target;
use std::sync::OnceLock;

const SRC_LEN: u64 = 1 << 16;

fn src() -> &'static [u8] {
    static SRC: OnceLock<Vec<u8>> = OnceLock::new();
    SRC.get_or_init(|| (0..SRC_LEN).map(|i| (i * 31 % 251) as u8).collect())
}

fuzz_target!(|data: &[u8]| {
    static PEER: OnceLock<Peer> = OnceLock::new();
    let (base, peer) = (src().as_ptr() as u64, PEER.get_or_init(Peer::this_process));
    let runs: Vec<(u64, u64)> = data
        .chunks_exact(16)
        .take(MAX_RUNS + 1)
        .map(|c| {
            let (a, n) = (u64::from_le_bytes(c[..8].try_into().unwrap()), u64::from_le_bytes(c[8..].try_into().unwrap()));
            (if a < 2 * SRC_LEN { base.wrapping_add(a) } else { a }, n)
        })
        .collect();
    let Ok(total) = cairn_server::cmd::check::runs_len(&runs) else { return };
    if total > 1 << 20 {
        return; // the server reserves the object's bytes first; not this target's concern
    }
    let mut local = vec![0u8; total as usize];
    let mut seen = 0usize;
    if peer.read(&runs, &mut local, &mut |b| seen += b.len()).is_ok() {
        assert_eq!(seen, local.len(), "every byte handed on once");
        let mut at = 0usize;
        for &(addr, n) in &runs {
            let inside = addr >= base && addr.checked_add(n).is_some_and(|end| end <= base + SRC_LEN);
            if inside {
                let off = (addr - base) as usize;
                assert_eq!(&local[at..at + n as usize], &src()[off..off + n as usize], "a copy of the named bytes");
            }
            at += n as usize;
        }
    }
    // A wrong total is refused before any read.
    if total > 0 {
        assert!(peer.read(&runs, &mut local[..total as usize - 1], &mut |_| panic!("nothing read")).is_err());
    }
});
