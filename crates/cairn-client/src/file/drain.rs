//! A staging step written out as a `file`-engine step (the drain of multi-level checkpoints):
//! its blocks go into one data file of the drainer, encoded with the file engine's codecs, and
//! its index (same step number, variables, attributes, writers, boxes and block statistics) is
//! committed as any file-engine step is: one no-replace link, so the step on disk is whole or
//! absent. A drainer killed midway leaves only an unreferenced data file; the next one writes
//! the step again.

use super::layout::Layout;
use super::writer::{commit_index, encode, stored_len, write_all_vectored};
use crate::engine::BlockData;
use cairn_core::codec::Policy;
use cairn_core::error::IoContext;
use cairn_core::index::{BlockRecord, StepIndex};
use cairn_core::{Error, ErrorKind, Result};
use std::fs::OpenOptions;

/// What a drain of one step wrote.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Drained {
    /// Bytes of the step's blocks.
    pub bytes: u64,
    /// Bytes written to the data file (after compression).
    pub stored: u64,
    /// The step was on disk already (an earlier drainer committed it): nothing was written.
    pub found: bool,
}

/// How drained steps are written.
#[derive(Debug, Clone, Copy)]
pub struct DrainOptions {
    /// The codec pipeline of `[file] compression` (none: raw).
    pub compression: Option<Policy>,
    /// Checksum chunk size (`[file] chunk_size`).
    pub chunk: u32,
    /// Flush data and index to the device before the step counts as drained.
    pub fsync: bool,
    /// Tells this drainer's data files apart from others' (the server id).
    pub tag: u32,
}

/// Writes committed staging step `index` into `layout` (created if need be), the bytes of each
/// block from `fetch`. A step already on disk is left as it is. The next block is fetched while
/// one is written (the read from memory took a tenth of a step's drain, measured by
/// `python -m cairn.bench drain`).
pub fn drain_step(
    layout: &Layout,
    index: &StepIndex,
    opts: DrainOptions,
    fetch: impl Fn(&BlockRecord) -> Result<Vec<u8>> + Sync,
) -> Result<Drained> {
    if layout.step_path(index.step).exists() {
        return found(layout, index);
    }
    layout.create()?;
    // One file per step and drainer, never appended to by another: a new leader that drains the
    // step again after a crash writes its own.
    let nonce = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    let data_rel = format!("data/drain-{:012}.s{:06}.{nonce:016x}.bin", index.step, opts.tag);
    let path = layout.root.join(&data_rel);
    let mut data = OpenOptions::new().create_new(true).append(true).open(&path).ctx(|| format!("creating {}", path.display()))?;
    let written = std::thread::scope(|scope| {
        // One block ahead: a fetched block waits while the one before it is written.
        let (tx, rx) = std::sync::mpsc::sync_channel::<Result<Vec<u8>>>(1);
        let fetch = &fetch;
        scope.spawn(move || {
            for b in &index.blocks {
                let r = fetch(b);
                let failed = r.is_err();
                if tx.send(r).is_err() || failed {
                    return;
                }
            }
        });
        let mut out = StepIndex { blocks: Vec::with_capacity(index.blocks.len()), ..index.clone() };
        let (mut end, mut bytes) = (0u64, 0u64);
        for b in &index.blocks {
            let def = index.vars.get(&b.var).ok_or_else(|| Error::Corrupt(format!("step {} names no variable {}", index.step, b.var)))?;
            let raw = rx.recv().map_err(|_| Error::Corrupt("the drain's reader stopped early".into()))??;
            if raw.len() as u64 != b.len {
                return Err(Error::Corrupt(format!(
                    "block of {} (writer {}) of step {}: {} bytes fetched, {} expected",
                    b.var,
                    b.writer,
                    index.step,
                    raw.len(),
                    b.len
                )));
            }
            let (mut record, coded) =
                encode(&BlockData { def, region: b.region.clone(), bytes: &raw }, b.writer, opts.chunk, opts.compression)?;
            write_all_vectored(&mut data, &[coded.as_deref().unwrap_or(&raw)]).map_err(|e| disk_error(&path, e))?;
            record.file.clone_from(&data_rel);
            record.pos = end;
            end += stored_len(&record);
            bytes += b.len;
            out.blocks.push(record);
        }
        if opts.fsync {
            data.sync_data().map_err(|e| disk_error(&path, e))?;
        }
        Ok((out, bytes, end))
    });
    let (out, bytes, stored) = match written {
        Ok(w) => w,
        Err(e) => {
            // Nothing references it: give the space back at once (a full disk needs it).
            let _ = std::fs::remove_file(&path);
            return Err(e);
        }
    };
    match commit_index(layout, out, "drain", Vec::new(), opts.fsync, opts.tag) {
        Ok(_) => Ok(Drained { bytes, stored, found: false }),
        // Another drainer (a leader before this one) committed the step meanwhile: it is on disk.
        Err(e) if e.kind() == ErrorKind::AlreadyExists => {
            let _ = std::fs::remove_file(&path);
            found(layout, index)
        }
        Err(e) => {
            let _ = std::fs::remove_file(&path);
            Err(e)
        }
    }
}

/// The step is on disk already: drained by an earlier leader (the same blocks), or written by
/// another run into the same folder, which is refused rather than taken for this step.
fn found(layout: &Layout, index: &StepIndex) -> Result<Drained> {
    let disk = layout.read_step(index.step)?;
    let shape = |i: &StepIndex| -> Vec<(String, u32, cairn_core::Region, u64)> {
        let mut v: Vec<_> = i.blocks.iter().map(|b| (b.var.clone(), b.writer, b.region.clone(), b.len)).collect();
        v.sort_by(|a, b| (&a.0, a.1, &a.2.offset).cmp(&(&b.0, b.1, &b.2.offset)));
        v
    };
    // Compared as printed: statistics of the same bytes are equal, NaNs included.
    let same_stats = disk.blocks.iter().all(|d| {
        let stats = format!("{:?}", d.stats);
        index.blocks.iter().any(|b| b.var == d.var && b.writer == d.writer && b.region == d.region && format!("{:?}", b.stats) == stats)
    });
    if shape(&disk) != shape(index) || !same_stats {
        return Err(Error::AlreadyExists(format!(
            "step {} is on disk in {} already, with other blocks than the cluster's: another run wrote there; drain \
             to another folder (--drain) or move that dataset away",
            index.step,
            layout.root.display()
        )));
    }
    Ok(Drained { found: true, ..Drained::default() })
}

/// A write error of the drain: a full disk or quota is a capacity error, named as such.
fn disk_error(path: &std::path::Path, e: std::io::Error) -> Error {
    let full = matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT));
    if full {
        Error::Capacity(format!(
            "the drain cannot write {}: the disk is full ({e}); free space there and the drain resumes (nothing in memory is dropped meanwhile)",
            path.display()
        ))
    } else {
        Error::io(format!("writing {} (the drain resumes once it can write there)", path.display()), e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::ReadEngine;
    use crate::file::FileReader;
    use cairn_core::index::VarDef;
    use cairn_core::{DType, Region};

    fn staged(step: u64) -> (StepIndex, Vec<Vec<u8>>) {
        let def = VarDef::new("t", DType::F64, Some(vec![8])).unwrap();
        let mut blocks = Vec::new();
        let mut bytes = Vec::new();
        for w in 0..2u32 {
            let vals: Vec<f64> = (0..4).map(|i| f64::from(w * 4 + i) + step as f64).collect();
            let raw: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
            let region = Region::new(vec![u64::from(w) * 4], vec![4]).unwrap();
            let (mut r, _) = encode(&BlockData { def: &def, region: region.clone(), bytes: &raw }, w, 1 << 20, None).unwrap();
            r.file.clear();
            blocks.push(r);
            bytes.push(raw);
        }
        let frag = cairn_core::index::Fragment::new(step, 0, 1, "s".into(), vec![def], blocks);
        (StepIndex::merge(step, vec![frag]).unwrap(), bytes)
    }

    #[test]
    fn a_drained_step_reads_back_through_the_file_engine_with_its_writers_and_statistics() {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout::new(dir.path(), "d");
        let (index, bytes) = staged(3);
        let opts = DrainOptions { compression: Some(Policy::parse("zstd").unwrap()), chunk: 1 << 20, fsync: false, tag: 7 };
        let d = drain_step(&layout, &index, opts, |b| Ok(bytes[b.writer as usize].clone())).unwrap();
        assert_eq!((d.bytes, d.found), (64, false));
        let r = FileReader::open(layout.clone()).unwrap();
        assert_eq!(r.steps().unwrap(), vec![3]);
        let blocks = r.blocks("t", 3).unwrap();
        assert_eq!(blocks.iter().map(|b| b.writer).collect::<Vec<_>>(), vec![0, 1]);
        for (b, orig) in blocks.iter().zip(&index.blocks) {
            assert_eq!((&b.region, &b.stats), (&orig.region, &orig.stats));
        }
        let mut out = vec![0u8; 32];
        let whole = Region::new(vec![4], vec![4]).unwrap();
        r.read_into(3, &blocks[1], 8, &whole, &whole, &mut out).unwrap();
        assert_eq!(out, bytes[1]);
        // Again (a new leader): found on disk, nothing written.
        let again = drain_step(&layout, &index, opts, |_| panic!("not fetched")).unwrap();
        assert!(again.found);
        // Another run's step 3 (other values) is refused, not taken for this one.
        let (other, _) = staged(4);
        let other = StepIndex { step: 3, ..other };
        let e = drain_step(&layout, &other, opts, |_| panic!("not fetched")).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::AlreadyExists, "{e}");
    }

    #[test]
    fn a_failed_fetch_leaves_no_step_and_no_data_file() {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout::new(dir.path(), "d");
        let (index, bytes) = staged(0);
        let opts = DrainOptions { compression: None, chunk: 1 << 20, fsync: false, tag: 0 };
        let e = drain_step(&layout, &index, opts, |b| {
            if b.writer == 1 {
                Err(Error::Unavailable("server gone".into()))
            } else {
                Ok(bytes[0].clone())
            }
        })
        .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unavailable);
        assert!(!layout.step_path(0).exists());
        assert_eq!(layout.list("data").unwrap(), Vec::<String>::new());
    }
}
