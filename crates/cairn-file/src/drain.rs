//! A staging step written out as a `file`-engine step (the drain of multi-level checkpoints):
//! its blocks go into one data file of the drainer, encoded with the file engine's codecs, and
//! its index (same step number, variables, attributes, writers, boxes and block statistics, and
//! the step's identity: the cluster's id and every block's staged objects with their crc32c) is
//! committed as any file-engine step is: one no-replace link, so the step on disk is whole or
//! absent. A drainer killed midway leaves only an unreferenced data file; the next one writes
//! the step again. A step found on disk is this cluster's step only if its identity matches the
//! committed index's; any other (another run's, one without an identity) is refused, never
//! taken (docs/format.md, *Drained steps*).

use crate::beneath::Dir;
use crate::block::{encode, stored_len, write_all_vectored, BlockData};
use crate::layout::{parse_index, Layout};
use cairn_core::codec::Policy;
use cairn_core::index::{BlockRecord, Staged, StepIndex};
use cairn_core::index_file;
use cairn_core::{Error, ErrorKind, Result};
use std::io::Write;

/// What a drain of one step wrote.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Drained {
    /// Bytes of the step's blocks.
    pub bytes: u64,
    /// Bytes written to the data file (after compression).
    pub stored: u64,
    /// The step was on disk already (an earlier drainer of this cluster committed it): nothing
    /// was written.
    pub found: bool,
}

/// The points of a step's drain where a test may kill the drainer (`CAIRN_FAILPOINTS`, servers
/// built with the `failpoints` feature): a part's writer before its data file and after it is
/// flushed; the committer before the index, after its temporary file and after its link (the
/// commit); and (the server's) before the record in the log.
pub const FAIL_POINTS: [&str; 6] =
    ["drain.before_data", "drain.part_written", "drain.before_commit", "drain.after_index_tmp", "drain.after_link", "drain.before_record"];

/// How drained steps are written.
#[derive(Clone, Copy)]
pub struct DrainOptions<'a> {
    /// The codec pipeline of `[file] compression` (none: raw).
    pub compression: Option<Policy>,
    /// Checksum chunk size (`[file] chunk_size`).
    pub chunk: u32,
    /// Flush data and index to the device before the step counts as drained.
    pub fsync: bool,
    /// Tells this drainer's data files apart from others' (the server id).
    pub tag: u32,
    /// The draining cluster's id, recorded in the step's identity.
    pub cluster: &'a str,
    /// Called at each of [`FAIL_POINTS`] this function passes (a no-op outside tests).
    pub hook: &'a (dyn Fn(&'static str) + Sync),
}

impl std::fmt::Debug for DrainOptions<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DrainOptions").field("chunk", &self.chunk).field("tag", &self.tag).field("cluster", &self.cluster).finish()
    }
}

/// The dataset's directories a drain writes in, each reached beneath the drain folder (no
/// symlink, owned by this server's uid; see [`beneath`](crate::beneath)).
struct Dirs {
    steps: Dir,
    data: Dir,
}

impl Dirs {
    fn open(layout: &Layout) -> Result<Dirs> {
        let folder = layout.root.parent().expect("a dataset directory lies in a drain folder");
        let ds = Dir::root(folder)?.sub(&layout.name(), true)?.expect("made");
        // `pending` too: a file-engine writer appending to the drained dataset lists it.
        ds.sub("pending", true)?;
        Ok(Dirs { steps: ds.sub("steps", true)?.expect("made"), data: ds.sub("data", true)?.expect("made") })
    }
}

/// What one drainer wrote of a step: the records of its blocks (with their data file and
/// position set), in the order asked, and the bytes they hold and take on disk.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Part {
    /// One record per block written, in the order of the positions asked.
    pub records: Vec<BlockRecord>,
    /// Bytes of the blocks.
    pub bytes: u64,
    /// Bytes written to the data file (after compression).
    pub stored: u64,
}

/// Whether step `index` is on disk already: `Some` if it is this cluster's (an earlier drainer
/// committed it), None if there is none, [`Error::ForeignDrain`] if another run's is there.
pub fn on_disk(layout: &Layout, index: &StepIndex, cluster: &str) -> Result<Option<Drained>> {
    let dirs = Dirs::open(layout)?;
    if dirs.steps.exists(&Layout::step_file(index.step))? {
        return found(&dirs, layout, index, cluster).map(Some);
    }
    Ok(None)
}

/// Writes blocks `blocks` (positions in `index.blocks`) of committed staging step `index` into
/// one new data file of drainer `opts.tag` (`data/drain-<step>.s<tag>.<nonce>.bin`: one file
/// per drainer and step, never appended to by another, so a drainer that writes the part again
/// after a crash writes its own), the bytes of each from `fetch`, and flushes it. The next
/// block is fetched while one is written. On an error the file is removed. Nothing refers to
/// the file until [`commit`] publishes the step's index.
pub fn write_part(
    layout: &Layout,
    index: &StepIndex,
    blocks: &[usize],
    opts: DrainOptions<'_>,
    fetch: impl Fn(usize) -> Result<Vec<u8>> + Sync,
) -> Result<Part> {
    let dirs = Dirs::open(layout)?;
    (opts.hook)("drain.before_data");
    let nonce = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos() as u64);
    let data_name = format!("drain-{:012}.s{:06}.{nonce:016x}.bin", index.step, opts.tag);
    let data_rel = format!("data/{data_name}");
    let path = dirs.data.path(&data_name);
    let mut data = dirs.data.create_new(&data_name)?;
    let written = std::thread::scope(|scope| {
        // One block ahead: a fetched block waits while the one before it is written.
        let (tx, rx) = std::sync::mpsc::sync_channel::<Result<Vec<u8>>>(1);
        let fetch = &fetch;
        scope.spawn(move || {
            for &at in blocks {
                let r = fetch(at);
                let failed = r.is_err();
                if tx.send(r).is_err() || failed {
                    return;
                }
            }
        });
        let mut part = Part { records: Vec::with_capacity(blocks.len()), ..Part::default() };
        for &at in blocks {
            let b = index.blocks.get(at).ok_or_else(|| Error::InvalidArgument(format!("step {} has no block {at}", index.step)))?;
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
            record.pos = part.stored;
            part.stored += stored_len(&record);
            part.bytes += b.len;
            part.records.push(record);
        }
        if opts.fsync {
            data.sync_data().map_err(|e| disk_error(&path, e))?;
        }
        Ok(part)
    });
    match written {
        Ok(part) => {
            (opts.hook)("drain.part_written");
            Ok(part)
        }
        Err(e) => {
            // Nothing references it: give the space back at once (a full disk needs it).
            dirs.data.remove(&data_name);
            Err(e)
        }
    }
}

/// Commits step `index` from its drainers' `records` (one per block of `index`, in its order):
/// the index (blocks and statistics as committed in staging, plus the step's identity) is
/// published with one no-replace rename, so the step on disk is whole or absent. If another
/// drainer committed the step meanwhile, the records' data files are removed and the step on
/// disk is taken only if it is this one ([`is_this_step`]).
pub fn commit(layout: &Layout, index: &StepIndex, records: Vec<BlockRecord>, opts: DrainOptions<'_>) -> Result<Drained> {
    let dirs = Dirs::open(layout)?;
    if records.len() != index.blocks.len() {
        return Err(Error::InvalidArgument(format!(
            "step {} has {} blocks, {} records given",
            index.step,
            index.blocks.len(),
            records.len()
        )));
    }
    (opts.hook)("drain.before_commit");
    let (bytes, stored) = records.iter().fold((0, 0), |(b, s), r| (b + r.len, s + stored_len(r)));
    let out = StepIndex { blocks: records, staged: Some(Staged::of(opts.cluster, index)), ..index.clone() };
    let unreferenced = || discard(layout, &out.blocks);
    match publish(&dirs.steps, &Layout::step_file(index.step), &index_file::encode(&out), opts) {
        Ok(true) => {
            (opts.hook)("drain.after_link");
            Ok(Drained { bytes, stored, found: false })
        }
        // Another drainer (a leader before this one) committed the step meanwhile.
        Ok(false) => {
            unreferenced();
            found(&dirs, layout, index, opts.cluster)
        }
        Err(e) => {
            unreferenced();
            Err(e)
        }
    }
}

/// Removes the data files `records` name (parts written for a step that is not committed:
/// nothing refers to them); best effort.
pub fn discard(layout: &Layout, records: &[BlockRecord]) {
    let Ok(dirs) = Dirs::open(layout) else { return };
    let files: std::collections::BTreeSet<&str> = records.iter().filter_map(|r| r.file.strip_prefix("data/")).collect();
    for f in files {
        dirs.data.remove(f);
    }
}

/// Commits a step index as `name` in `steps` unless one is there: a temporary file beside it,
/// then one no-replace rename (the commit); returns whether it placed it.
fn publish(steps: &Dir, name: &str, bytes: &[u8], opts: DrainOptions<'_>) -> Result<bool> {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = format!(".tmp-{}-{}-{n}-{name}", std::process::id(), opts.tag);
    let written = steps.create_new(&tmp).and_then(|mut f| {
        f.write_all(bytes).map_err(|e| disk_error(&steps.path(&tmp), e))?;
        if opts.fsync {
            f.sync_all().map_err(|e| disk_error(&steps.path(&tmp), e))?;
        }
        Ok(())
    });
    if let Err(e) = written {
        steps.remove(&tmp);
        return Err(e);
    }
    (opts.hook)("drain.after_index_tmp");
    let placed = steps.rename_new(&tmp, name);
    if !matches!(placed, Ok(true)) {
        steps.remove(&tmp);
    }
    let placed = placed?;
    if placed && opts.fsync {
        steps.sync()?;
    }
    Ok(placed)
}

/// Removes drained step `step` of `layout` (a step drained while the dataset was removed), the
/// same way beneath the drain folder.
pub fn remove_drained(layout: &Layout, step: u64) -> Result<()> {
    let folder = layout.root.parent().expect("a dataset directory lies in a drain folder");
    if let Some(steps) = Dir::root(folder)?.sub(&layout.name(), false)?.map(|d| d.sub("steps", false)).transpose()?.flatten() {
        steps.remove(&Layout::step_file(step));
    }
    Ok(())
}

/// Removes the drained steps of `layout` from `from` on (a restart from an older step), newest
/// first so a crash midway leaves a prefix, the same way beneath the drain folder; returns how
/// many went (none when nothing of the dataset was drained).
pub fn discard_drained(layout: &Layout, from: u64) -> Result<u64> {
    remove_drained_where(layout, |s| s >= from)
}

/// Removes those of drained steps `steps` of `layout` that are on disk and were drained by
/// cluster `cluster` (a discard a killed leader left half done; another run's step of the same
/// number is left alone), newest first; returns how many went.
pub fn discard_steps(layout: &Layout, steps: &[u64], cluster: &str) -> Result<u64> {
    let ours = |s: u64| layout.read_step_meta(s).is_ok_and(|i| i.staged.is_some_and(|st| st.cluster == cluster));
    remove_drained_where(layout, |s| steps.binary_search(&s).is_ok() && ours(s))
}

fn remove_drained_where(layout: &Layout, gone: impl Fn(u64) -> bool) -> Result<u64> {
    let steps = match layout.steps() {
        Ok(s) => s,
        Err(e) if e.kind() == ErrorKind::NotFound => return Ok(0),
        Err(e) => return Err(e),
    };
    let gone: Vec<u64> = steps.into_iter().filter(|s| gone(*s)).rev().collect();
    for step in &gone {
        remove_drained(layout, *step)?;
    }
    Ok(gone.len() as u64)
}

/// Whether `disk`, a step found on disk, is committed staging step `index` as drained by cluster
/// `cluster`: the same cluster id and, block by block in order, the same staged objects (ids,
/// boxes, crc32c). A step without an identity (drained by an older Cairn, or written by the
/// `file` engine) is never taken for one.
pub fn is_this_step(disk: &StepIndex, index: &StepIndex, cluster: &str) -> bool {
    disk.staged.as_ref().is_some_and(|s| *s == Staged::of(cluster, index))
}

/// The step is on disk already: drained by an earlier leader of this cluster (the same
/// identity), or written by another run into the same folder, which is refused rather than
/// taken for this step.
fn found(dirs: &Dirs, layout: &Layout, index: &StepIndex, cluster: &str) -> Result<Drained> {
    let name = Layout::step_file(index.step);
    let bytes = dirs.steps.read(&name)?.ok_or_else(|| Error::NotFound(format!("{} went meanwhile", dirs.steps.path(&name).display())))?;
    let disk = parse_index(&bytes, &format!("index of step {} ({})", index.step, dirs.steps.path(&name).display()), true)?;
    if is_this_step(&disk, index, cluster) {
        return Ok(Drained { found: true, ..Drained::default() });
    }
    let whose = match &disk.staged {
        Some(s) if s.cluster == cluster => "this cluster's, but of other bytes (the dataset was removed and written again?)".to_string(),
        Some(s) => format!("cluster {}'s (another run)", s.cluster),
        None => "without a drain's identity (an older Cairn's drain, or a `file`-engine writer)".to_string(),
    };
    Err(Error::ForeignDrain(format!(
        "step {} of {} is on disk already, {whose}: it is not this cluster's step {} and is never taken for it; drain to \
         another folder (--drain), or remove that dataset (`cairn rm {} --cluster FILE --all`)",
        index.step,
        layout.root.display(),
        index.step,
        layout.name(),
    )))
}

/// The committed steps of the drained dataset at `layout` that cluster `cluster` did not drain
/// (another run's, or without a drain's identity), oldest first.
pub fn foreign_steps(layout: &Layout, cluster: &str) -> Result<Vec<u64>> {
    let mut foreign = Vec::new();
    if !layout.root.join("steps").is_dir() {
        return Ok(foreign);
    }
    for step in layout.steps()? {
        match layout.read_step_meta(step) {
            Ok(i) if i.staged.as_ref().is_some_and(|s| s.cluster == cluster) => {}
            Ok(_) => foreign.push(step),
            // Removed meanwhile (`cairn rm`): not there.
            Err(e) if e.kind() == ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
    }
    Ok(foreign)
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
    use cairn_core::index::VarDef;
    use cairn_core::{DType, Region};

    /// A whole step drained by one drainer, as the servers' leader and parts do together:
    /// [`on_disk`], one [`write_part`] of every block, [`commit`].
    fn drain_step(
        layout: &Layout,
        index: &StepIndex,
        opts: DrainOptions<'_>,
        fetch: impl Fn(&BlockRecord) -> Result<Vec<u8>> + Sync,
    ) -> Result<Drained> {
        if let Some(d) = on_disk(layout, index, opts.cluster)? {
            return Ok(d);
        }
        let all: Vec<usize> = (0..index.blocks.len()).collect();
        let part = write_part(layout, index, &all, opts, |at| fetch(&index.blocks[at]))?;
        commit(layout, index, part.records, opts)
    }

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
            // As staging commits it: one object per block, its crc32c the block's.
            r.objects = vec![cairn_core::index::ObjectRef {
                id: u64::from(w) << 32,
                region: region.clone(),
                server: 0,
                checksum: r.checksum,
                redundancy: Default::default(),
            }];
            blocks.push(r);
            bytes.push(raw);
        }
        let frag = cairn_core::index::Fragment::new(step, 0, 1, "s".into(), vec![def], blocks);
        (StepIndex::merge(step, vec![frag]).unwrap(), bytes)
    }

    #[test]
    fn a_drained_step_is_committed_with_its_writers_statistics_and_bytes() {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout::new(dir.path(), "d");
        let (index, bytes) = staged(3);
        let opts = DrainOptions { compression: None, chunk: 1 << 20, fsync: false, tag: 7, cluster: "c1", hook: &|_| {} };
        let d = drain_step(&layout, &index, opts, |b| Ok(bytes[b.writer as usize].clone())).unwrap();
        assert_eq!((d.bytes, d.found), (64, false));
        assert_eq!(layout.steps().unwrap(), vec![3]);
        let blocks = layout.read_step(3).unwrap().blocks;
        assert_eq!(blocks.iter().map(|b| b.writer).collect::<Vec<_>>(), vec![0, 1]);
        for (b, orig) in blocks.iter().zip(&index.blocks) {
            assert_eq!((&b.region, &b.stats), (&orig.region, &orig.stats));
            let data = std::fs::read(layout.root.join(&b.file)).unwrap();
            assert_eq!(&data[b.pos as usize..(b.pos + b.len) as usize], &bytes[b.writer as usize][..]);
        }
        // Again (a new leader): found on disk, nothing written.
        let again = drain_step(&layout, &index, opts, |_| panic!("not fetched")).unwrap();
        assert!(again.found);
        // Another run's step 3 (other values) is refused, not taken for this one.
        let (other, _) = staged(4);
        let other = StepIndex { step: 3, ..other };
        let e = drain_step(&layout, &other, opts, |_| panic!("not fetched")).unwrap_err();
        assert_eq!((e.kind(), e.reason()), (ErrorKind::AlreadyExists, Some(cairn_core::Reason::ForeignDrain)), "{e}");
        // The same blocks drained by another cluster are not this cluster's step either.
        let e = drain_step(&layout, &index, DrainOptions { cluster: "c2", ..opts }, |_| panic!("not fetched")).unwrap_err();
        assert!(e.to_string().contains("cluster c1's"), "{e}");
        assert_eq!(foreign_steps(&layout, "c2").unwrap(), vec![3]);
        assert_eq!(foreign_steps(&layout, "c1").unwrap(), Vec::<u64>::new());
    }

    #[test]
    fn identity_is_the_objects_crcs_not_the_statistics() {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout::new(dir.path(), "d");
        let (index, bytes) = staged(1);
        let points = std::sync::Mutex::new(Vec::new());
        let hook = |p: &'static str| points.lock().unwrap().push(p);
        let opts = DrainOptions { compression: None, chunk: 1 << 20, fsync: false, tag: 0, cluster: "c1", hook: &hook };
        drain_step(&layout, &index, opts, |b| Ok(bytes[b.writer as usize].clone())).unwrap();
        let mut want = FAIL_POINTS.to_vec();
        want.pop();
        assert_eq!(*points.lock().unwrap(), want, "every fail point of the writer is passed, in order");
        assert!(drain_step(&layout, &index, opts, |_| panic!("not fetched")).unwrap().found);
        // Same statistics and boxes, other bytes (one object's crc differs): refused.
        let mut other = index.clone();
        other.blocks[1].objects[0].checksum ^= 1;
        let e = drain_step(&layout, &other, opts, |_| panic!("not fetched")).unwrap_err();
        assert!(e.to_string().contains("this cluster's, but of other bytes"), "{e}");
    }

    #[test]
    fn a_failed_fetch_leaves_no_step_and_no_data_file() {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout::new(dir.path(), "d");
        let (index, bytes) = staged(0);
        let opts = DrainOptions { compression: None, chunk: 1 << 20, fsync: false, tag: 0, cluster: "c1", hook: &|_| {} };
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
