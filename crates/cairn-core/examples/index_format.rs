//! Measures committed step index formats at 10,000 blocks per step, 16 crcs each: bytes, encode,
//! decode (+ validate) and listing times of format 1 (JSON, the baseline), format 2 as written
//! (binary blocks, zstd level 1, crcs apart) and the alternatives considered for its blocks
//! section. Run `cargo run --release -p cairn-core --example index_format [-- OUT.json]`; with OUT
//! it saves the rows (`bench/results/index-format.json`).

use cairn_core::index::{from_json, to_json, BlockRecord, StepIndex, VarDef, FORMAT_VERSION};
use cairn_core::index_file::{decode, decode_meta, encode_with, BLOCKS_LEVEL};
use cairn_core::stats::Stats;
use cairn_core::{DType, Region};
use std::time::Instant;

const WRITERS: u64 = 1000;
const VARS: u64 = 10;
const CRCS: u64 = 16;
const REPEAT: usize = 15;

fn index() -> StepIndex {
    let len = CRCS * 65536;
    let names: Vec<String> = (0..VARS).map(|v| format!("field_{v:02}")).collect();
    let vars = names.iter().map(|n| (n.clone(), VarDef::new(n, DType::F64, Some(vec![WRITERS, len / 8])).unwrap())).collect();
    let mut blocks = Vec::new();
    for w in 0..WRITERS {
        for (v, name) in names.iter().enumerate() {
            let i = w * VARS + v as u64;
            blocks.push(BlockRecord {
                var: name.clone(),
                writer: w as u32,
                region: Region::new(vec![w, 0], vec![1, len / 8]).unwrap(),
                file: format!("data/rank-{w:06}.8f71d6c56e2a80a4.bin"),
                pos: v as u64 * len,
                len,
                chunk: 65536,
                // crc32c values look random: a pseudo-random sequence, not a compressible one.
                crcs: (0..CRCS).map(|c| ((i * CRCS + c).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 32) as u32).collect(),
                checksum: (i.wrapping_mul(0xff51_afd7_ed55_8ccd) >> 32) as u32,
                stats: Stats { min: Some(-1.0 - i as f64 / 3.0), max: Some(1e5 + i as f64 * 0.7), mean: Some(i as f64 / 7.0) },
                objects: Vec::new(),
                codec: None,
                stored: 0,
            });
        }
    }
    StepIndex { format: FORMAT_VERSION, step: 42, nranks: WRITERS as u32, vars, blocks, attrs: Default::default(), consumed: None }
}

/// Median milliseconds of `REPEAT` runs of `f`.
fn time<T>(mut f: impl FnMut() -> T) -> f64 {
    let mut ms: Vec<f64> = (0..REPEAT)
        .map(|_| {
            let t = Instant::now();
            std::hint::black_box(f());
            t.elapsed().as_secs_f64() * 1e3
        })
        .collect();
    ms.sort_by(f64::total_cmp);
    ms[REPEAT / 2]
}

struct Row {
    format: &'static str,
    bytes: usize,
    encode_ms: f64,
    decode_ms: f64,
    parse_ms: f64,
    listing_ms: f64,
}

fn main() {
    let idx = index();
    let path = std::env::temp_dir().join(format!("cairn-index-format-{}.json", std::process::id()));
    // Listing: what `variables()` does for a step not cached, reading the file (page cache).
    let listing = |bytes: &[u8], meta_only: bool| {
        std::fs::write(&path, bytes).unwrap();
        time(|| {
            let b = std::fs::read(&path).unwrap();
            if meta_only { decode_meta(&b, "x").unwrap() } else { decode(&b, "x").unwrap() }.vars.len()
        })
    };
    let mut rows = Vec::new();
    let v1 = to_json(&idx);
    rows.push(Row {
        format: "v1 JSON (baseline)",
        bytes: v1.len(),
        encode_ms: time(|| to_json(&idx)),
        decode_ms: time(|| from_json::<StepIndex>(&v1, "x").unwrap().validate().unwrap()),
        parse_ms: time(|| from_json::<StepIndex>(&v1, "x").unwrap()),
        listing_ms: listing(&v1, false),
    });
    let v1_meta = listing(&v1, true);
    let written = format!("v2 binary + zstd {BLOCKS_LEVEL} (written)");
    for (name, level) in [(written.as_str(), Some(BLOCKS_LEVEL)), ("v2 binary raw", None), ("v2 binary + zstd 3", Some(3))] {
        let b = encode_with(&idx, level);
        assert_eq!(to_json(&decode(&b, "x").unwrap()), v1, "round trip");
        rows.push(Row {
            format: Box::leak(name.to_string().into_boxed_str()),
            bytes: b.len(),
            encode_ms: time(|| encode_with(&idx, level)),
            decode_ms: time(|| decode(&b, "x").unwrap().validate().unwrap()),
            parse_ms: time(|| decode(&b, "x").unwrap()),
            listing_ms: listing(&b, true),
        });
    }
    // The alternative head: the JSON index with its crcs emptied, zstd-compressed, beside the same
    // raw crc table (whose copy into records is timed with it).
    let json_head = |level: i32| {
        let mut head = idx.clone();
        let table: Vec<u8> = head.blocks.iter_mut().flat_map(|b| std::mem::take(&mut b.crcs)).flat_map(u32::to_le_bytes).collect();
        let mut out = zstd::bulk::compress(&to_json(&head), level).unwrap();
        out.extend_from_slice(&table);
        (out, table.len())
    };
    let (jh, table_len) = json_head(3);
    let decode_jh = |b: &[u8]| {
        let (z, table) = b.split_at(b.len() - table_len);
        let mut i: StepIndex = from_json(&zstd::bulk::decompress(z, 64 << 20).unwrap(), "x").unwrap();
        let mut crcs = table.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap()));
        for b in &mut i.blocks {
            b.crcs = crcs.by_ref().take(CRCS as usize).collect();
        }
        i
    };
    std::fs::write(&path, &jh).unwrap();
    rows.push(Row {
        format: "alt: zstd 3 JSON head + crc table",
        bytes: jh.len(),
        encode_ms: time(|| json_head(3)),
        decode_ms: time(|| decode_jh(&jh).validate().unwrap()),
        parse_ms: time(|| decode_jh(&jh)),
        listing_ms: time(|| decode_jh(&std::fs::read(&path).unwrap()).vars.len()),
    });
    let _ = std::fs::remove_file(&path);

    let base = (rows[0].bytes as f64, rows[0].encode_ms, rows[0].decode_ms, rows[0].parse_ms, rows[0].listing_ms);
    println!("{} blocks per step, {CRCS} crcs each; median of {REPEAT} runs (ms); ratios are v2/v1", idx.blocks.len());
    println!(
        "{:<36} {:>9} {:>6} {:>7} {:>6} {:>7} {:>6} {:>7} {:>6} {:>8} {:>6}",
        "format", "bytes", "ratio", "encode", "ratio", "decode", "ratio", "parse", "ratio", "listing", "ratio"
    );
    let mut json_rows = Vec::new();
    for r in &rows {
        let ratios = (r.bytes as f64 / base.0, r.encode_ms / base.1, r.decode_ms / base.2, r.parse_ms / base.3, r.listing_ms / base.4);
        println!(
            "{:<36} {:>9} {:>6.3} {:>7.2} {:>6.3} {:>7.2} {:>6.3} {:>7.2} {:>6.3} {:>8.2} {:>6.3}",
            r.format, r.bytes, ratios.0, r.encode_ms, ratios.1, r.decode_ms, ratios.2, r.parse_ms, ratios.3, r.listing_ms, ratios.4
        );
        json_rows.push(serde_json::json!({
            "format": r.format, "bytes": r.bytes, "encode_ms": r.encode_ms, "decode_ms": r.decode_ms, "parse_ms": r.parse_ms,
            "listing_ms": r.listing_ms, "bytes_vs_v1": ratios.0, "encode_vs_v1": ratios.1, "decode_vs_v1": ratios.2,
            "parse_vs_v1": ratios.3, "listing_vs_v1": ratios.4,
        }));
    }
    println!("v1 listing with its blocks skipped by the parser (what v2's reader does on v1 files): {v1_meta:.2} ms");
    if let Some(out) = std::env::args().nth(1) {
        let doc = serde_json::json!({
            "benchmark": "index-format",
            "date": date(),
            "machine": {"cpus": std::thread::available_parallelism().map_or(1, |n| n.get()), "platform": platform()},
            "params": {
                "blocks": idx.blocks.len(), "writers": WRITERS, "variables": VARS, "crcs_per_block": CRCS, "repeat": REPEAT,
                "timing": "median ms; decode = parse + StepIndex::validate (what a reader does to read blocks); listing = read the file from the page cache and \
                           decode what variables() needs (v1: the whole JSON document, as Cairn before format 2 did)",
                "v1_listing_blocks_skipped_ms": v1_meta,
            },
            "rows": json_rows,
        });
        std::fs::write(&out, serde_json::to_string_pretty(&doc).unwrap() + "\n").unwrap();
        println!("saved {out}");
    }
}

/// UTC now as `YYYY-MM-DD HH:MM:SS`.
fn date() -> String {
    let s = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64;
    let (days, rem) = (s.div_euclid(86400), s.rem_euclid(86400));
    // Civil date from days since the epoch (Howard Hinnant's algorithm).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!("{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}", rem / 3600, rem / 60 % 60, rem % 60)
}

fn platform() -> String {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    format!("{}-{}-{}", std::env::consts::OS, release.trim(), std::env::consts::ARCH)
}
