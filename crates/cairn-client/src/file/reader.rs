//! The reading side of the file engine: any box from the blocks that intersect it, fetching only
//! the checksum chunks that hold the needed bytes.

use super::{consume, lease};
use crate::engine::ReadEngine;
use cairn_core::assemble::{chunks_touched, copy_box, Layout as BufLayout};
use cairn_core::checksum::verify;
use cairn_core::codec::Pipeline;
use cairn_core::error::IoContext;
use cairn_core::index::{BlockRecord, StepIndex, VarDef};
use cairn_core::{Error, Region, Result};
use cairn_file::layout::Layout;
use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::os::unix::fs::FileExt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Reads committed steps of a dataset. Committed steps never change, so their indexes are cached,
/// each with the identity (inode) of the index file it was read from: a step discarded and
/// written again (`from_step`, by any process) is a new file, and its index is read again.
#[derive(Debug)]
pub struct FileReader {
    layout: Layout,
    indexes: Mutex<HashMap<u64, (Arc<StepIndex>, u64)>>,
    /// Indexes read without their blocks, for listings (steps whose blocks were not read).
    metas: Mutex<HashMap<u64, (Arc<StepIndex>, u64)>>,
    files: Mutex<HashMap<String, Arc<File>>>,
}

impl FileReader {
    /// Opens an existing dataset.
    pub fn open(layout: Layout) -> Result<FileReader> {
        layout.require()?;
        Ok(FileReader { layout, indexes: Mutex::default(), metas: Mutex::default(), files: Mutex::default() })
    }

    /// The inode of `step`'s index file now (0: none).
    fn inode(&self, step: u64) -> u64 {
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata(self.layout.step_path(step)).map_or(0, |m| m.ino())
    }

    /// `step`'s index as cached in `cache`, if it was read from the index file there now.
    fn cached(cache: &Mutex<HashMap<u64, (Arc<StepIndex>, u64)>>, step: u64, ino: u64) -> Option<Arc<StepIndex>> {
        cache.lock().unwrap().get(&step).filter(|(_, at)| *at == ino && ino != 0).map(|(i, _)| i.clone())
    }

    /// Reads `step`'s index (`meta`: without its blocks) with the inode of the file read; read
    /// again if the file was replaced meanwhile.
    fn read_index(&self, step: u64, meta: bool) -> Result<(Arc<StepIndex>, u64)> {
        let mut tries = 0;
        loop {
            let before = self.inode(step);
            let idx = Arc::new(consume::read_visible(&self.layout, step, meta)?);
            tries += 1;
            // Replaced while read (a discard and a rewrite under way): read again; kept uncached
            // (inode 0) if it keeps changing.
            match self.inode(step) {
                now if now == before => return Ok((idx, before)),
                _ if tries >= 3 => return Ok((idx, 0)),
                _ => {}
            }
        }
    }

    fn index(&self, step: u64) -> Result<Arc<StepIndex>> {
        if let Some(i) = Self::cached(&self.indexes, step, self.inode(step)) {
            return Ok(i);
        }
        let (idx, ino) = self.read_index(step, false)?;
        self.indexes.lock().unwrap().insert(step, (idx.clone(), ino));
        self.metas.lock().unwrap().remove(&step);
        Ok(idx)
    }

    /// The index of `step` for listings: `blocks` may be empty (read without them).
    fn meta(&self, step: u64) -> Result<Arc<StepIndex>> {
        let ino = self.inode(step);
        if let Some(i) = Self::cached(&self.indexes, step, ino).or_else(|| Self::cached(&self.metas, step, ino)) {
            return Ok(i);
        }
        let (meta, ino) = self.read_index(step, true)?;
        self.metas.lock().unwrap().insert(step, (meta.clone(), ino));
        Ok(meta)
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

    /// Reads `buf.len()` bytes of block `b` from block offset `at` (a chunk boundary) and
    /// verifies them against the block's chunk checksums.
    fn read_verified(&self, b: &BlockRecord, at: u64, buf: &mut [u8]) -> Result<()> {
        let f = self.file(&b.file)?;
        let what = || format!("block of '{}' by writer {} in {}", b.var, b.writer, b.file);
        f.read_exact_at(buf, b.pos + at).map_err(|e| match e.kind() {
            std::io::ErrorKind::UnexpectedEof => Error::Corrupt(format!("{} is truncated: the index points past its end", what())),
            _ => Error::io(format!("reading {}", what()), e),
        })?;
        verify(buf, (at / b.chunk as u64) as usize, b.chunk, &b.crcs, &what)
    }

    /// A compressed block, read whole, decoded into `raw` (its raw length) and verified against
    /// its raw chunk checksums.
    fn decode_block_into(&self, b: &BlockRecord, raw: &mut [u8]) -> Result<()> {
        let what = || format!("compressed block of '{}' by writer {} in {}", b.var, b.writer, b.file);
        let pipe = Pipeline::parse(b.codec.as_deref().unwrap_or("raw"))?;
        let mut coded = vec![0u8; b.stored as usize];
        self.file(&b.file)?.read_exact_at(&mut coded, b.pos).map_err(|e| match e.kind() {
            std::io::ErrorKind::UnexpectedEof => Error::Corrupt(format!("{} is truncated: the index points past its end", what())),
            _ => Error::io(format!("reading {}", what()), e),
        })?;
        pipe.decode_into(&coded, raw).map_err(|e| Error::Corrupt(format!("{}: {e}", what())))?;
        verify(raw, 0, b.chunk, &b.crcs, &what)
    }

    /// Fetches the checksum chunks of `b` that hold `isect`, verified, into a buffer starting at
    /// the first such chunk (returned as its block offset). Chunks in between that hold none of
    /// `isect` are neither read nor touched (a large zeroed allocation costs no page until used).
    fn fetch_part(&self, b: &BlockRecord, isect: &Region, elem: usize) -> Result<(Vec<u8>, u64)> {
        let chunk = b.chunk as u64;
        let ranges = chunks_touched(&b.region, isect, elem, chunk);
        let start = ranges.first().map_or(0, |r| r.0 * chunk);
        let end = ranges.last().map_or(0, |r| (r.1 * chunk).min(b.len));
        let mut buf = vec![0u8; (end - start) as usize];
        let mut pieces = Vec::new();
        let mut rest: &mut [u8] = &mut buf;
        let mut at = start;
        for (c0, c1) in ranges {
            let (lo, hi) = (c0 * chunk, (c1 * chunk).min(b.len));
            let (_, tail) = std::mem::take(&mut rest).split_at_mut((lo - at) as usize);
            let (piece, tail) = tail.split_at_mut((hi - lo) as usize);
            pieces.push((lo, piece));
            rest = tail;
            at = hi;
        }
        self.read_pieces(b, pieces)?;
        Ok((buf, start))
    }

    /// Reads and verifies `(block offset, buffer)` pieces, sharing large reads among threads:
    /// data usually comes from the page cache, so copying and checksumming scale with cores.
    fn read_pieces(&self, b: &BlockRecord, pieces: Vec<(u64, &mut [u8])>) -> Result<()> {
        let total: usize = pieces.iter().map(|p| p.1.len()).sum();
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()).min(8);
        let threads = cores.min(total / PARALLEL_MIN_BYTES + 1);
        if threads <= 1 {
            return pieces.into_iter().try_for_each(|(at, buf)| self.read_verified(b, at, buf));
        }
        // Groups of about `per` bytes each; pieces are cut at chunk boundaries to fit.
        let chunk = b.chunk as usize;
        let per = total.div_ceil(threads).div_ceil(chunk) * chunk;
        let mut groups: Vec<Vec<(u64, &mut [u8])>> = vec![Vec::new()];
        let mut room = per;
        for (mut at, mut buf) in pieces {
            while !buf.is_empty() {
                if room == 0 {
                    groups.push(Vec::new());
                    room = per;
                }
                let take = buf.len().min(room);
                let (head, tail) = buf.split_at_mut(take);
                groups.last_mut().unwrap().push((at, head));
                room -= take;
                at += take as u64;
                buf = tail;
            }
        }
        std::thread::scope(|s| {
            let handles: Vec<_> = groups
                .into_iter()
                .map(|g| s.spawn(move || g.into_iter().try_for_each(|(at, buf)| self.read_verified(b, at, buf))))
                .collect();
            handles.into_iter().try_for_each(|h| h.join().expect("reader threads do not panic"))
        })
    }

    /// Forgets the cached indexes of steps from `from` on (discarded: a new step of the same
    /// number is other data).
    pub(crate) fn forget_from(&self, from: u64) {
        self.indexes.lock().unwrap().retain(|s, _| *s < from);
        self.metas.lock().unwrap().retain(|s, _| *s < from);
    }
}

/// Reads smaller than this stay on the calling thread (thread start-up would cost more).
const PARALLEL_MIN_BYTES: usize = 8 << 20;

impl ReadEngine for FileReader {
    fn steps(&self) -> Result<Vec<u64>> {
        consume::visible_steps(&self.layout)
    }

    fn listing(&self) -> Result<(Vec<u64>, bool)> {
        // Finished first: steps committed before the last close are then all listed.
        let finished = self.layout.finished()?;
        Ok((self.steps()?, finished))
    }

    fn claim(&self, claimer: &str, lease: Duration) -> Result<(Option<u64>, bool)> {
        lease::claim(&self.layout, claimer, lease)
    }

    fn renew(&self, claimer: &str, lease: Duration) -> Result<Vec<u64>> {
        lease::renew(&self.layout, claimer, lease)
    }

    fn unclaim(&self, claimer: &str) -> Result<()> {
        lease::unclaim(&self.layout, claimer)
    }

    fn step_vars(&self, step: u64) -> Result<BTreeMap<String, VarDef>> {
        Ok(self.meta(step)?.vars.clone())
    }

    fn pending(&self) -> Result<Vec<(u64, u32, u32)>> {
        self.layout.pending()
    }

    fn discard_from(&self, from: u64) -> Result<u64> {
        if let Some((step, _)) = consume::in_flight(&self.layout)?.into_iter().find(|(s, _)| *s >= from) {
            return Err(Error::Conflict(format!(
                "step {step} of {} is being consumed (a consume-and-produce commit is in flight); wait for it, then \
                 discard the steps from {from}",
                self.layout.root.display()
            )));
        }
        self.forget_from(from);
        self.layout.discard_from(from)
    }

    fn release(&self, step: u64) -> Result<()> {
        // Only the index goes: data files are append-only, so the step's bytes stay as dead space.
        let p = self.layout.step_path(step);
        self.indexes.lock().unwrap().remove(&step);
        self.metas.lock().unwrap().remove(&step);
        std::fs::remove_file(&p).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => {
                Error::NotFound(format!("step {step} is not committed in {}; nothing to release", self.layout.root.display()))
            }
            _ => Error::io(format!("releasing step {step} (removing {})", p.display()), e),
        })
    }

    fn step_attrs(&self, step: u64) -> Result<cairn_core::attrs::Attrs> {
        Ok(self.meta(step)?.attrs.clone())
    }

    fn blocks(&self, var: &str, step: u64) -> Result<Vec<BlockRecord>> {
        Ok(self.index(step)?.blocks_of(var).cloned().collect())
    }

    fn read_into(&self, _step: u64, b: &BlockRecord, elem: usize, isect: &Region, dst: &Region, out: &mut [u8]) -> Result<()> {
        // A whole block that is one contiguous run of the output is read (or decoded) straight into it.
        let whole = if *isect == b.region { contiguous_run(dst, isect, elem) } else { None };
        if b.codec.is_some() {
            if let Some(range) = whole {
                return self.decode_block_into(b, &mut out[range]);
            }
            let mut buf = vec![0u8; b.len as usize];
            self.decode_block_into(b, &mut buf)?;
            copy_box(&buf, BufLayout { layout: &b.region, base: 0 }, out, BufLayout { layout: dst, base: 0 }, isect, elem);
            return Ok(());
        }
        if let Some(range) = whole {
            return self.read_pieces(b, vec![(0, &mut out[range])]);
        }
        let (buf, base) = self.fetch_part(b, isect, elem)?;
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
