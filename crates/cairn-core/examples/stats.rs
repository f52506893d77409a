//! Block statistics against memcpy, on the case writers meet (one block of f64, then f32 and
//! i32): what computing min/max/exact mean adds to a put, which copies the block once anyway.
//! Prints each ratio and writes `bench/results/stats.json`.
//!
//! Run: `cargo run --release -p cairn-core --example stats [-- OUT.json]`

use cairn_core::dtype::DType;
use cairn_core::stats::Acc;
use std::time::Instant;

/// Best of `n` runs of `f`, in seconds.
fn best(n: usize, mut f: impl FnMut()) -> f64 {
    (0..n)
        .map(|_| {
            let t = Instant::now();
            f();
            t.elapsed().as_secs_f64()
        })
        .fold(f64::INFINITY, f64::min)
}

fn main() {
    let out = std::env::args().nth(1).unwrap_or_else(|| "bench/results/stats.json".into());
    let bytes = 128usize << 20;
    let mut rows = Vec::new();
    for (dtype, name) in [(DType::F64, "f8"), (DType::F32, "f4"), (DType::I32, "i4")] {
        let src: Vec<u8> = (0..bytes).map(|i| (i.wrapping_mul(2_654_435_761) >> 7) as u8 & 0x3f).collect();
        let mut dst = vec![0u8; bytes];
        let copy = best(7, || {
            dst.copy_from_slice(std::hint::black_box(&src));
            std::hint::black_box(&mut dst);
        });
        // As writers do: 64 KiB at a time, merged.
        let stats = best(7, || {
            let mut acc = Acc::new(dtype);
            for piece in src.chunks(64 << 10) {
                acc.add(piece);
            }
            std::hint::black_box(acc.finish());
        });
        let gbps = |s: f64| bytes as f64 / s / 1e9;
        println!(
            "{name}: statistics {:.2} GB/s, memcpy {:.2} GB/s: statistics take {:.2}× a memcpy's time",
            gbps(stats),
            gbps(copy),
            stats / copy
        );
        rows.push(format!(
            "{{\"dtype\": \"{name}\", \"bytes\": {bytes}, \"stats_s\": {stats:.6}, \"memcpy_s\": {copy:.6}, \"ratio_to_memcpy\": {:.3}}}",
            stats / copy
        ));
    }
    let json = format!("{{\"bench\": \"stats\", \"rows\": [{}]}}\n", rows.join(", "));
    if let Err(e) = std::fs::write(&out, json) {
        eprintln!("writing {out}: {e}");
    }
}
