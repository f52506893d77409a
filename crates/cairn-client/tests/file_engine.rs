//! The file engine end to end: writers as threads (each its own rank), readers of other shapes.

use cairn_client::{Config, DType, ErrorKind, Reader, Writer};
use std::path::Path;

fn cfg(dir: &Path) -> Config {
    let mut c = Config::default();
    c.set("path", dir.to_str().unwrap()).unwrap();
    c.set("chunk_size", "64").unwrap(); // small chunks so partial reads cross many of them
    c
}

/// Ground truth: value at a global index for a step.
fn val(p: &[u64], shape: &[u64], step: u64) -> f64 {
    p.iter().zip(shape).fold(0f64, |a, (i, n)| a * *n as f64 + *i as f64) + 1000.0 * step as f64
}

fn bytes_of(region_off: &[u64], count: &[u64], shape: &[u64], step: u64) -> Vec<u8> {
    let mut out = Vec::new();
    let vol: u64 = count.iter().product();
    for lin in 0..vol {
        let mut rem = lin;
        let mut p = vec![0u64; count.len()];
        for d in (0..count.len()).rev() {
            p[d] = region_off[d] + rem % count[d];
            rem /= count[d];
        }
        out.extend_from_slice(&val(&p, shape, step).to_le_bytes());
    }
    out
}

/// Splits `n` into `parts` nearly equal pieces (irregular when it does not divide).
fn split(n: u64, parts: u64) -> Vec<(u64, u64)> {
    (0..parts).map(|i| (i * n / parts, (i + 1) * n / parts - i * n / parts)).collect()
}

fn write_all(dir: &Path, shape: &[u64], writers: u64, steps: u64) {
    std::thread::scope(|s| {
        for r in 0..writers {
            let c = cfg(dir);
            s.spawn(move || {
                let mut w = Writer::open("ds", &c, r as u32, writers as u32, false, "s1").unwrap();
                w.define("field", DType::F64, Some(shape.to_vec())).unwrap();
                w.define("walkers", DType::F64, None).unwrap();
                let (o, n) = split(shape[0], writers)[r as usize];
                for step in 0..steps {
                    w.begin_step(step).unwrap();
                    let mut off = vec![0; shape.len()];
                    let mut cnt = shape.to_vec();
                    off[0] = o;
                    cnt[0] = n;
                    w.put("field", DType::F64, &bytes_of(&off, &cnt, shape, step), Some(&off), &cnt).unwrap();
                    let walkers: Vec<u8> = (0..(r + step) * 3).flat_map(|i| (i as f64 + r as f64).to_le_bytes()).collect();
                    w.put("walkers", DType::F64, &walkers, None, &[(r + step), 3]).unwrap();
                    w.end_step().unwrap();
                }
                w.close().unwrap();
            });
        }
    });
}

#[test]
fn any_box_of_any_dimension_reads_back_exactly() {
    for shape in [vec![100u64], vec![100, 7], vec![10, 9, 8], vec![5, 4, 6, 3], vec![7, 3, 2, 4, 3]] {
        let dir = tempfile::tempdir().unwrap();
        write_all(dir.path(), &shape, 3, 2);
        let r = Reader::open("ds", &cfg(dir.path())).unwrap();
        assert_eq!(r.steps().unwrap(), vec![0, 1]);
        // Boxes that cut across writer boundaries in every dimension.
        for k in 0..4u64 {
            let off: Vec<u64> = shape.iter().map(|n| (k * 3) % n).collect();
            let cnt: Vec<u64> = shape.iter().zip(&off).map(|(n, o)| ((n - o) / 2).max(1)).collect();
            let mut out = vec![0u8; cnt.iter().product::<u64>() as usize * 8];
            r.get("field", 1, &off, &cnt, &mut out).unwrap();
            assert_eq!(out, bytes_of(&off, &cnt, &shape, 1), "shape {shape:?} box {off:?}+{cnt:?}");
        }
        let b = r.blocks("field", 1).unwrap();
        assert_eq!(b.len(), 3);
        let lo = b.iter().map(|b| b.stats.min.unwrap()).fold(f64::MAX, f64::min);
        assert_eq!(lo, 1000.0);
        let local = r.local_block("walkers", 1, 2).unwrap();
        assert_eq!(local.region.count, vec![3, 3]);
        let mut w = vec![0u8; local.len as usize];
        r.get_local("walkers", 1, 2, &mut w).unwrap();
        assert_eq!(f64::from_le_bytes(w[8..16].try_into().unwrap()), 3.0);
    }
}

#[test]
fn a_step_is_invisible_until_every_rank_ends_it() {
    let dir = tempfile::tempdir().unwrap();
    let c = cfg(dir.path());
    let mut w0 = Writer::open("ds", &c, 0, 2, false, "s1").unwrap();
    let mut w1 = Writer::open("ds", &c, 1, 2, false, "s1").unwrap();
    for w in [&mut w0, &mut w1] {
        w.define("x", DType::I32, Some(vec![4])).unwrap();
        w.begin_step(0).unwrap();
    }
    w0.put("x", DType::I32, &[0u8; 8], Some(&[0]), &[2]).unwrap();
    assert!(!w0.end_step().unwrap());
    let r = Reader::open("ds", &c).unwrap();
    assert!(r.steps().unwrap().is_empty());
    let e = r.get("x", 0, &[0], &[2], &mut [0u8; 8]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound);
    assert!(e.to_string().contains("not committed"), "{e}");
    w1.put("x", DType::I32, &[1u8; 8], Some(&[2]), &[2]).unwrap();
    assert!(w1.end_step().unwrap());
    assert_eq!(r.steps().unwrap(), vec![0]);
}

#[test]
fn bad_requests_are_named_and_lose_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let c = cfg(dir.path());
    let mut w = Writer::open("ds", &c, 0, 1, false, "s1").unwrap();
    w.define("x", DType::F32, Some(vec![4, 4])).unwrap();
    let err = |e: cairn_client::Error| e.to_string();
    assert!(err(w.put("x", DType::F32, &[0; 16], Some(&[0, 0]), &[2, 2]).unwrap_err()).contains("outside a step"));
    w.begin_step(0).unwrap();
    assert!(err(w.put("y", DType::F32, &[0; 16], Some(&[0, 0]), &[2, 2]).unwrap_err()).contains("unknown variable 'y'"));
    assert!(err(w.put("x", DType::F64, &[0; 32], Some(&[0, 0]), &[2, 2]).unwrap_err()).contains("dtype mismatch"));
    assert!(err(w.put("x", DType::F32, &[0; 16], Some(&[3, 0]), &[2, 2]).unwrap_err()).contains("outside the global shape"));
    assert!(err(w.define("x", DType::F64, Some(vec![4, 4])).unwrap_err()).contains("redefine"));
    w.put("x", DType::F32, &[0; 16], Some(&[0, 0]), &[2, 2]).unwrap();
    assert!(err(w.put("x", DType::F32, &[0; 16], Some(&[1, 1]), &[2, 2]).unwrap_err()).contains("overlaps"));
    w.put("x", DType::F32, &[0; 16], Some(&[2, 2]), &[2, 2]).unwrap();
    w.end_step().unwrap();
    let r = Reader::open("ds", &c).unwrap();
    // The step committed with its two good blocks; the refused ones left no trace.
    assert_eq!(r.blocks("x", 0).unwrap().len(), 2);
    let e = r.get("x", 0, &[0, 0], &[4, 4], &mut [0; 64]).unwrap_err();
    assert!(e.to_string().contains("partly written"), "{e}");
    // Mode "w" opens a dataset with steps (claimers share a destination), but committed steps
    // are immutable.
    let mut again = Writer::open("ds", &c, 0, 1, false, "s2").unwrap();
    assert_eq!(again.begin_step(0).unwrap_err().kind(), ErrorKind::AlreadyExists);
    assert_eq!(Reader::open("nope", &c).unwrap_err().kind(), ErrorKind::NotFound);
}

/// The data file of `rank` of dataset `ds` (one per session; these tests write one session).
fn data_file(dir: &Path, rank: u32) -> std::path::PathBuf {
    let prefix = format!("rank-{rank:06}.");
    let files: Vec<_> = std::fs::read_dir(dir.join("ds/data"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_string_lossy().starts_with(&prefix))
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    files[0].clone()
}

#[test]
fn damaged_data_is_reported_as_corrupt() {
    let dir = tempfile::tempdir().unwrap();
    write_all(dir.path(), &[64, 8], 2, 1);
    let data = data_file(dir.path(), 1);
    let mut bytes = std::fs::read(&data).unwrap();
    bytes[100] ^= 0xff;
    std::fs::write(&data, &bytes).unwrap();
    let r = Reader::open("ds", &cfg(dir.path())).unwrap();
    let mut out = vec![0u8; 64 * 8 * 8];
    let e = r.get("field", 0, &[0, 0], &[64, 8], &mut out).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Corrupt);
    assert!(e.to_string().contains("rank-000001"), "{e}");
    // Rank 0's half is intact and still readable.
    r.get("field", 0, &[0, 0], &[32, 8], &mut out[..32 * 64]).unwrap();
}

#[test]
fn append_recovers_after_a_crash_mid_step() {
    let dir = tempfile::tempdir().unwrap();
    write_all(dir.path(), &[8], 2, 1);
    let c = cfg(dir.path());
    // Rank 1 ended step 1, rank 0 "crashed" before ending it: step 1 must stay invisible.
    let mut w1 = Writer::open("ds", &c, 1, 2, true, "crashed").unwrap();
    w1.define("field", DType::F64, Some(vec![8])).unwrap();
    w1.begin_step(1).unwrap();
    w1.put("field", DType::F64, &[0u8; 32], Some(&[4]), &[4]).unwrap();
    assert!(!w1.end_step().unwrap());
    drop(w1);
    // The restarted run rewrites step 1 from both ranks; rank 1's stale fragment is dropped on open.
    write_again(&c);
    let r = Reader::open("ds", &c).unwrap();
    assert_eq!(r.steps().unwrap(), vec![0, 1]);
    let mut out = vec![0u8; 64];
    r.get("field", 1, &[0], &[8], &mut out).unwrap();
    assert!(out.chunks(8).all(|v| f64::from_le_bytes(v.try_into().unwrap()) == 7.0));
}

fn write_again(c: &Config) {
    for r in [1u32, 0] {
        let mut w = Writer::open("ds", c, r, 2, true, "restart").unwrap();
        w.define("field", DType::F64, Some(vec![8])).unwrap();
        w.begin_step(1).unwrap();
        let v: Vec<u8> = (0..4).flat_map(|_| 7.0f64.to_le_bytes()).collect();
        w.put("field", DType::F64, &v, Some(&[4 * r as u64]), &[4]).unwrap();
        w.end_step().unwrap();
        w.close().unwrap();
    }
}

#[test]
fn large_reads_shared_among_threads_are_exact_and_verified() {
    // 12 MiB blocks: above the threshold where reads are split among threads.
    let dir = tempfile::tempdir().unwrap();
    let shape = [1536u64, 1024];
    write_all(dir.path(), &shape, 1, 1);
    let r = Reader::open("ds", &cfg(dir.path())).unwrap();
    for (off, cnt) in [([0u64, 0u64], shape), ([7, 3], [1500, 1000])] {
        let mut out = vec![0u8; (cnt[0] * cnt[1] * 8) as usize];
        r.get("field", 0, &off, &cnt, &mut out).unwrap();
        assert!(out == bytes_of(&off, &cnt, &shape, 0), "box {off:?}+{cnt:?}");
    }
    let data = data_file(dir.path(), 0);
    let mut bytes = std::fs::read(&data).unwrap();
    let n = bytes.len();
    bytes[n - 100] ^= 1; // damage near the end: read by the last thread
    std::fs::write(&data, &bytes).unwrap();
    let r = Reader::open("ds", &cfg(dir.path())).unwrap();
    let mut out = vec![0u8; (shape[0] * shape[1] * 8) as usize];
    assert_eq!(r.get("field", 0, &[0, 0], &shape, &mut out).unwrap_err().kind(), ErrorKind::Corrupt);
}

/// Trace records of `writer` at `step`: a different number per writer and step, none for some.
fn records(writer: u64, step: u64) -> Vec<f64> {
    let n = (writer * 7 + step * 3) % 5;
    (0..n * 2).map(|i| (writer * 1000 + step * 10 + i) as f64).collect()
}

#[test]
fn traces_are_buffered_commit_at_the_flush_and_read_back_exactly() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = cfg(dir.path());
    c.set("trace_flush", "3").unwrap();
    let writers = 3u64;
    let mut ws: Vec<Writer> = (0..writers).map(|r| Writer::open("ds", &c, r as u32, writers as u32, false, "s1").unwrap()).collect();
    let data_len = || std::fs::metadata(data_file(dir.path(), 0)).map_or(0, |m| m.len());
    for step in 0..7u64 {
        for (r, w) in ws.iter_mut().enumerate() {
            w.define("t", DType::U64, Some(vec![4])).unwrap();
            w.begin_step(step).unwrap();
            let off = [r as u64];
            if r < 4 {
                w.put("t", DType::U64, &(step * 10 + r as u64).to_le_bytes(), Some(&off), &[1]).unwrap();
            }
            let rec = records(r as u64, step);
            if !rec.is_empty() {
                // Two appends in one step are one block; records are pairs.
                let (a, b) = rec.split_at(2);
                let raw = |v: &[f64]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
                w.trace("pos", DType::F64, &raw(a), &[1, 2]).unwrap();
                w.trace("pos", DType::F64, &raw(b), &[b.len() as u64 / 2, 2]).unwrap();
            }
        }
        let before = data_len();
        for w in ws.iter_mut() {
            w.end_step().unwrap();
        }
        let committed = Reader::open("ds", &c).unwrap().steps().unwrap();
        // Steps 0..=2 wait for the flush at the third ended step, 3..=5 for the sixth; the last at close.
        let want: Vec<u64> = (0..(step + 1) / 3 * 3).collect();
        assert_eq!(committed, want, "after ending step {step}");
        if step % 3 != 2 {
            assert_eq!(data_len(), before, "records wait in the buffer until the flush (step {step})");
        }
    }
    // Writing a variable as both a global and a trace is refused, as is an unknown shape change.
    let w = &mut ws[0];
    w.begin_step(7).unwrap();
    let e = w.trace("t", DType::U64, &[0; 8], &[1]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    let e = w.trace("pos", DType::F32, &[0; 8], &[1, 2]).unwrap_err();
    assert!(e.to_string().contains("dtype mismatch"), "{e}");
    w.abort_step().unwrap();
    for w in ws {
        w.close().unwrap();
    }
    let rd = Reader::open("ds", &c).unwrap();
    assert_eq!(rd.steps().unwrap(), (0..7).collect::<Vec<_>>());
    for step in 0..7u64 {
        for r in 0..writers {
            let want = records(r, step);
            let (dtype, count) = rd.trace_count("pos", step, r as u32).unwrap();
            assert_eq!(dtype, DType::F64);
            assert_eq!(count[0] * 2, want.len() as u64, "writer {r} step {step}");
            if want.is_empty() {
                continue;
            }
            assert_eq!(count, vec![want.len() as u64 / 2, 2]);
            let mut out = vec![0u8; want.len() * 8];
            rd.get_local("pos", step, r as u32, &mut out).unwrap();
            let got: Vec<f64> = out.chunks(8).map(|b| f64::from_le_bytes(b.try_into().unwrap())).collect();
            assert_eq!(got, want);
        }
    }
    assert_eq!(rd.trace_count("nope", 0, 0).unwrap_err().kind(), ErrorKind::NotFound);
}

fn f64s(v: &[f64]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Rank `rank` of 2 puts `value` into its half of a 4-element array at `step` and ends it.
fn write_half(w: &mut Writer, step: u64, value: f64) -> cairn_client::Result<bool> {
    w.define("x", DType::F64, Some(vec![4]))?;
    w.begin_step(step)?;
    w.put("x", DType::F64, &f64s(&[value; 2]), Some(&[2 * w.rank() as u64]), &[2])?;
    w.end_step()
}

fn read_x(c: &Config, step: u64) -> Vec<f64> {
    let mut out = vec![0u8; 32];
    Reader::open("ds", c).unwrap().get("x", step, &[0], &[4], &mut out).unwrap();
    out.chunks(8).map(|b| f64::from_le_bytes(b.try_into().unwrap())).collect()
}

#[test]
fn a_second_writer_of_a_rank_in_one_session_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let c = cfg(dir.path());
    let mut first = Writer::open("ds", &c, 0, 2, false, "s1").unwrap();
    // While the first is open, a second one of its rank cannot open: it would share its data file.
    for append in [false, true] {
        let e = Writer::open("ds", &c, 0, 2, append, "s1").unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Conflict);
        assert!(e.to_string().contains("rank 0 ") && e.to_string().contains("session \"s1\""), "{e}");
    }
    assert!(!write_half(&mut first, 0, 1.0).unwrap());
    first.close().unwrap();
    // Once the first has ended step 0: "w" would truncate the data its part points at.
    let e = Writer::open("ds", &c, 0, 2, false, "s1").unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Conflict);
    assert!(e.to_string().contains("step 0 ") && e.to_string().contains("session \"s1\""), "{e}");
    // "a" keeps the data; its own part of step 0 is refused at end_step, naming step, rank, session.
    let mut second = Writer::open("ds", &c, 0, 2, true, "s1").unwrap();
    let e = write_half(&mut second, 0, 5.0).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Conflict);
    let msg = e.to_string();
    assert!(msg.contains("step 0 ") && msg.contains("rank 0 ") && msg.contains("session \"s1\""), "{msg}");
    second.abort_step().unwrap();
    drop(second);
    // The first writer's part is intact: rank 1 commits step 0 with it.
    let mut other = Writer::open("ds", &c, 1, 2, true, "s1").unwrap();
    assert!(write_half(&mut other, 0, 2.0).unwrap());
    assert_eq!(read_x(&c, 0), [1.0, 1.0, 2.0, 2.0]);
    // Another session's leftover of the rank is no conflict: a restart replaces it.
    let mut crashed = Writer::open("ds", &c, 0, 2, true, "crashed").unwrap();
    assert!(!write_half(&mut crashed, 1, 3.0).unwrap());
    drop(crashed);
    let mut restarted = Writer::open("ds", &c, 0, 2, true, "restart").unwrap();
    assert!(!write_half(&mut restarted, 1, 4.0).unwrap());
}

#[test]
fn an_end_step_retried_after_a_failed_commit_publishes_the_same_part() {
    let dir = tempfile::tempdir().unwrap();
    let c = cfg(dir.path());
    let mut w0 = Writer::open("ds", &c, 0, 2, false, "s1").unwrap();
    // A damaged fragment of rank 1 makes the commit attempt fail after rank 0 published its part.
    let junk = |step: u64| dir.path().join(format!("ds/pending/step-{step:012}.rank-000001.json"));
    std::fs::write(junk(0), b"{").unwrap();
    assert_eq!(write_half(&mut w0, 0, 1.0).unwrap_err().kind(), ErrorKind::Corrupt);
    std::fs::remove_file(junk(0)).unwrap();
    // Retrying end_step publishes the same part again (not an empty one).
    assert!(!w0.end_step().unwrap());
    // After an abort instead, the writer may rewrite its own part of the step.
    std::fs::write(junk(1), b"{").unwrap();
    assert_eq!(write_half(&mut w0, 1, 6.0).unwrap_err().kind(), ErrorKind::Corrupt);
    w0.abort_step().unwrap();
    std::fs::remove_file(junk(1)).unwrap();
    assert!(!write_half(&mut w0, 1, 7.0).unwrap());
    w0.close().unwrap();
    let mut w1 = Writer::open("ds", &c, 1, 2, true, "s1").unwrap();
    assert!(write_half(&mut w1, 0, 2.0).unwrap());
    assert!(write_half(&mut w1, 1, 2.0).unwrap());
    assert_eq!(read_x(&c, 0), [1.0, 1.0, 2.0, 2.0]);
    assert_eq!(read_x(&c, 1), [7.0, 7.0, 2.0, 2.0]);
}
