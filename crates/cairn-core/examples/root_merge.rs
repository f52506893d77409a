//! What rank 0 of a collective file writer spends per step at R ranks (the linear term of the
//! commit's critical path, docs/format.md *Collective commit*): parse R fragments as they arrive
//! over MPI (JSON), merge them (every check of a commit, overlaps included) and encode the
//! step index (format 2). One block of 1 MiB per rank, like `python -m cairn.bench file-scale`.
//! Run `cargo run --release -p cairn-core --example root_merge`.

use cairn_core::index::{from_json, to_json, BlockRecord, Fragment, StepIndex, VarDef};
use cairn_core::index_file::encode;
use cairn_core::stats::Stats;
use cairn_core::{DType, Region};
use std::time::Instant;

fn fragments(ranks: u64) -> Vec<Vec<u8>> {
    let rows = 128; // 1 MiB of f64 rows of 1024 per rank
    let def = VarDef::new("field", DType::F64, Some(vec![ranks * rows, 1024])).unwrap();
    (0..ranks)
        .map(|r| {
            let block = BlockRecord {
                var: "field".into(),
                writer: r as u32,
                region: Region::new(vec![r * rows, 0], vec![rows, 1024]).unwrap(),
                file: format!("data/rank-{:06}.8f71d6c56e2a80a4.bin", r / 8 * 8),
                pos: (r % 8) << 20,
                len: 1 << 20,
                chunk: 65536,
                crcs: (0..16).map(|c| ((r * 16 + c).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) as u32).collect(),
                checksum: (r.wrapping_mul(0xff51_afd7_ed55_8ccd) >> 32) as u32,
                stats: Stats { min: Some(r as f64), max: Some(r as f64 + 1.0), mean: Some(r as f64 + 0.5) },
                objects: Vec::new(),
                codec: None,
                stored: 0,
            };
            to_json(&Fragment::new(7, r as u32, ranks as u32, "s".into(), vec![def.clone()], vec![block]))
        })
        .collect()
}

fn main() {
    println!("ranks  parse ms  merge ms  encode ms  total ms  index bytes");
    for ranks in [128u64, 1000, 10_000] {
        let wire = fragments(ranks);
        let mut best = [f64::MAX; 4];
        let mut bytes = 0;
        for _ in 0..5 {
            let t = Instant::now();
            let frags: Vec<Fragment> = wire.iter().map(|b| from_json(b, "fragment").unwrap()).collect();
            let parsed = t.elapsed().as_secs_f64();
            let index = StepIndex::merge(7, frags).unwrap();
            let merged = t.elapsed().as_secs_f64();
            bytes = encode(&index).len();
            let encoded = t.elapsed().as_secs_f64();
            for (b, v) in best.iter_mut().zip([parsed, merged - parsed, encoded - merged, encoded]) {
                *b = b.min(v * 1e3);
            }
        }
        println!("{ranks:>5}  {:>8.2}  {:>8.2}  {:>9.2}  {:>8.2}  {bytes:>11}", best[0], best[1], best[2], best[3]);
    }
}
