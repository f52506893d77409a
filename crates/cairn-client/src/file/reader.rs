//! The reading side of the file engine: any box from the blocks that intersect it, fetching only
//! the checksum chunks that hold the needed bytes.

use super::layout::Layout;
use crate::engine::ReadEngine;
use cairn_core::assemble::{copy_box, Layout as BufLayout};
use cairn_core::checksum::verify;
use cairn_core::error::IoContext;
use cairn_core::index::{BlockRecord, StepIndex, VarDef};
use cairn_core::{Error, Region, Result};
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Mutex};

/// Reads committed steps of a dataset. Committed steps never change, so their indexes are cached.
#[derive(Debug)]
pub struct FileReader {
    layout: Layout,
    indexes: Mutex<HashMap<u64, Arc<StepIndex>>>,
    files: Mutex<HashMap<String, Arc<File>>>,
}

impl FileReader {
    /// Opens an existing dataset.
    pub fn open(layout: Layout) -> Result<FileReader> {
        layout.require()?;
        Ok(FileReader { layout, indexes: Mutex::default(), files: Mutex::default() })
    }

    fn index(&self, step: u64) -> Result<Arc<StepIndex>> {
        if let Some(i) = self.indexes.lock().unwrap().get(&step) {
            return Ok(i.clone());
        }
        let idx = Arc::new(self.layout.read_step(step)?);
        self.indexes.lock().unwrap().insert(step, idx.clone());
        Ok(idx)
    }

    fn file(&self, rel: &str) -> Result<Arc<File>> {
        if let Some(f) = self.files.lock().unwrap().get(rel) {
            return Ok(f.clone());
        }
        if rel.contains("..") || rel.starts_with('/') {
            return Err(Error::Corrupt(format!("index names data file {rel:?} outside the dataset")));
        }
        let p = self.layout.root.join(rel);
        let f = Arc::new(File::open(&p).ctx(|| format!("opening data file {}", p.display()))?);
        self.files.lock().unwrap().insert(rel.to_string(), f.clone());
        Ok(f)
    }

    /// Reads bytes `[lo, hi)` of a block, widened to whole checksum chunks and verified.
    /// Returns the buffer and the block offset its first byte has.
    fn fetch(&self, b: &BlockRecord, lo: u64, hi: u64, into: Option<&mut [u8]>) -> Result<Option<(Vec<u8>, u64)>> {
        let chunk = b.chunk as u64;
        let c0 = lo / chunk;
        let start = c0 * chunk;
        let end = (hi.div_ceil(chunk) * chunk).min(b.len);
        let f = self.file(&b.file)?;
        let what = || format!("block of '{}' by writer {} in {}", b.var, b.writer, b.file);
        let read = |buf: &mut [u8]| -> Result<()> {
            f.read_exact_at(buf, b.pos + start).map_err(|e| match e.kind() {
                std::io::ErrorKind::UnexpectedEof => {
                    Error::Corrupt(format!("{} is truncated: the index points past its end", what()))
                }
                _ => Error::io(format!("reading {}", what()), e),
            })?;
            verify(buf, c0 as usize, b.chunk, &b.crcs, &what)
        };
        match into {
            Some(out) => read(out).map(|_| None),
            None => {
                let mut buf = vec![0u8; (end - start) as usize];
                read(&mut buf)?;
                Ok(Some((buf, start)))
            }
        }
    }
}

impl ReadEngine for FileReader {
    fn steps(&self) -> Result<Vec<u64>> {
        self.layout.steps()
    }

    fn step_vars(&self, step: u64) -> Result<BTreeMap<String, VarDef>> {
        Ok(self.index(step)?.vars.clone())
    }

    fn blocks(&self, var: &str, step: u64) -> Result<Vec<BlockRecord>> {
        Ok(self.index(step)?.blocks_of(var).cloned().collect())
    }

    fn read_into(&self, b: &BlockRecord, elem: usize, isect: &Region, dst: &Region, out: &mut [u8]) -> Result<()> {
        // A whole block that is one contiguous run of the output is read straight into it.
        if *isect == b.region {
            if let Some(range) = contiguous_run(dst, isect, elem) {
                return self.fetch(b, 0, b.len, Some(&mut out[range])).map(|_| ());
            }
        }
        let (lo, hi) = b.region.byte_span(isect, elem);
        let (buf, base) = self.fetch(b, lo, hi, None)?.expect("fetch without a target returns a buffer");
        copy_box(&buf, BufLayout { layout: &b.region, base }, out, BufLayout { layout: dst, base: 0 }, isect, elem);
        Ok(())
    }
}

/// The byte range `sub` occupies in a C-order buffer laid out as `outer`, if it is contiguous
/// there (its span from first to last element holds nothing else).
fn contiguous_run(outer: &Region, sub: &Region, elem: usize) -> Option<std::ops::Range<usize>> {
    let (lo, hi) = outer.byte_span(sub, elem);
    (hi - lo == sub.volume() * elem as u64).then_some(lo as usize..hi as usize)
}
