//! The writing side of the file engine, for one rank.

use super::{claim, consume};
use crate::config::FileConfig;
use crate::engine::{BlockData, StepPart, WriteEngine};
use cairn_core::codec::Policy;
use cairn_core::error::IoContext;
use cairn_core::index::{from_json, to_json, BlockRecord, Fragment, StepIndex};
use cairn_core::index_file;
use cairn_core::{Error, Result};
use cairn_file::block::{encode, stored_len, write_all_vectored};
use cairn_file::layout::{digest, publish, publish_new, Layout};
use std::collections::BTreeMap;
use std::fs::{File, OpenOptions};

/// Age after which a temporary file in a dataset is taken for a crashed writer's leftover.
pub(super) const ORPHANED: std::time::Duration = std::time::Duration::from_secs(3600);

/// Appends one rank's blocks to `data/rank-<r>.bin` and publishes its step fragments.
#[derive(Debug)]
pub struct FileWriter {
    layout: Layout,
    rank: u32,
    nranks: u32,
    data: File,
    data_rel: String,
    /// Bytes in the data file; the next block starts here.
    end: u64,
    fsync: bool,
    chunk: u32,
    compression: Option<Policy>,
    session: String,
    /// Blocks of each unpublished step.
    blocks: BTreeMap<u64, Vec<BlockRecord>>,
    /// Digest of the fragment this writer last published for each step not seen committed yet.
    published: BTreeMap<u64, u64>,
}

impl FileWriter {
    /// Opens rank `rank` of `nranks` for writing. `append` takes the definitions of the last
    /// committed step over (see [`crate::Writer::open`]); committed steps are immutable either way,
    /// so several claimers may open one destination (each its own session and data file).
    /// Refused while another writer has this rank of this session open, and (without `append`)
    /// when this rank has ended steps of `session` that did not commit yet.
    pub fn open(layout: Layout, rank: u32, nranks: u32, append: bool, cfg: &FileConfig, session: String) -> Result<FileWriter> {
        let compression = cfg.compression()?;
        layout.create()?;
        let data_rel = Layout::data_rel(rank, &session);
        let path = layout.root.join(&data_rel);
        // Only appended to: the session's earlier blocks stay where committed indexes point.
        let data = OpenOptions::new()
            .create(true)
            .append(true)
            .truncate(false)
            .open(&path)
            .ctx(|| format!("opening data file {}", path.display()))?;
        claim::lock_data_file(&data, &path, rank, &session)?;
        if !append {
            claim::check_no_pending_part(&layout, rank, &session)?;
        }
        layout.reopen_rank(rank)?;
        let end = data.metadata().ctx(|| format!("reading size of {}", path.display()))?.len();
        let (fsync, chunk) = (cfg.fsync, cfg.chunk_size);
        let (blocks, published) = (BTreeMap::new(), BTreeMap::new());
        let w = FileWriter { layout, rank, nranks, data, data_rel, end, fsync, chunk, compression, session, blocks, published };
        w.recover()?;
        Ok(w)
    }

    /// Cleans up after a crashed run: completes merges whose fragments (of one session) are all
    /// present, and drops this rank's fragments of other sessions for steps that never committed.
    fn recover(&self) -> Result<()> {
        consume::recover_destination(&self.layout)?;
        if self.rank == 0 {
            self.layout.sweep_temporaries(ORPHANED);
        }
        let dir = self.layout.root.join("pending");
        let mine = format!(".rank-{:06}.json", self.rank);
        let entries: Vec<_> = std::fs::read_dir(&dir).ctx(|| format!("listing {}", dir.display()))?.flatten().collect();
        for e in entries {
            let name = e.file_name().to_string_lossy().into_owned();
            let Some(step) = name.strip_prefix("step-").and_then(|s| s.get(..12)).and_then(|s| s.parse::<u64>().ok()) else {
                continue;
            };
            if self.try_commit(step, None).unwrap_or(false) {
                continue;
            }
            if name.ends_with(&mine) {
                let stale = std::fs::read(e.path()).ok().and_then(|b| from_json::<Fragment>(&b, "fragment").ok());
                if stale.is_none_or(|f| f.session != self.session) {
                    let _ = std::fs::remove_file(e.path());
                }
            }
        }
        Ok(())
    }

    /// Publishes this writer's fragment of `step`, unless another writer of this rank and session
    /// already published a different one.
    fn publish_part(&mut self, step: u64, bytes: &[u8]) -> Result<()> {
        claim::check_part(&self.layout, step, self.rank, &self.session, bytes, self.published.get(&step).copied())?;
        // Committed steps are never written again: their digests are not needed any more.
        self.published.retain(|s, _| !self.layout.step_path(*s).exists());
        // Recorded before publishing: if the rename happens but a later flush fails, the file
        // still counts as this writer's.
        self.published.insert(step, digest(bytes));
        publish(&self.layout.fragment_path(step, self.rank), bytes, self.fsync, self.rank)
    }

    /// Merges and publishes `step` if every rank's fragment of one session is present: of
    /// `session` if given, else of any session (recovering). Returns whether the step is
    /// committed now. A step another session committed meanwhile is refused.
    fn try_commit(&self, step: u64, session: Option<&str>) -> Result<bool> {
        let dest = self.layout.step_path(step);
        if session.is_none() && dest.exists() {
            return Ok(true);
        }
        let dir = self.layout.root.join("pending");
        let prefix = Layout::fragment_prefix(step);
        let names: Vec<_> = std::fs::read_dir(&dir)
            .ctx(|| format!("listing {}", dir.display()))?
            .filter_map(|e| Some(e.ok()?.path()))
            .filter(|p| p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(&prefix)))
            .collect();
        let mut sessions: BTreeMap<String, Vec<Fragment>> = BTreeMap::new();
        for p in &names {
            match std::fs::read(p) {
                Ok(bytes) => {
                    let f = from_json::<Fragment>(&bytes, &format!("fragment {}", p.display()))?;
                    sessions.entry(f.session.clone()).or_default().push(f);
                }
                // Another writer merged and cleaned up between our listing and this read.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(dest.exists()),
                Err(e) => return Err(Error::io(format!("reading {}", p.display()), e)),
            }
        }
        let complete = sessions
            .into_iter()
            .find(|(s, frags)| session.is_none_or(|want| want == s) && frags.first().is_some_and(|f| frags.len() as u32 >= f.nranks));
        let Some((session, frags)) = complete else {
            return Ok(false);
        };
        let consume: Vec<String> = frags.iter().flat_map(|f| f.consume.iter().cloned()).collect();
        let index = StepIndex::merge(step, frags)?;
        if !commit_index(&self.layout, index, &session, consume, self.fsync, self.rank)? {
            return Ok(false);
        }
        // Fragments of every session are done with: the step is committed and immutable.
        for p in names {
            let _ = std::fs::remove_file(p);
        }
        Ok(true)
    }
}

impl Drop for FileWriter {
    /// A writer that wrote nothing (a step refused at `begin_step`, a run that never put) leaves
    /// no empty data file behind.
    fn drop(&mut self) {
        if self.end == 0 && self.blocks.is_empty() {
            let _ = std::fs::remove_file(self.layout.root.join(&self.data_rel));
        }
    }
}

impl WriteEngine for FileWriter {
    fn last_index(&self) -> Result<Option<StepIndex>> {
        self.layout.steps()?.last().map(|&s| self.layout.read_step(s)).transpose()
    }

    fn written_in(&self, var: &str) -> Result<Option<u64>> {
        self.layout.written_in(var)
    }

    fn is_committed(&self, step: u64) -> Result<bool> {
        Ok(self.layout.step_path(step).exists())
    }

    fn agree(&self, key: &str, mine: bool) -> Result<bool> {
        agree(&self.layout, key, mine)
    }

    fn put_batch(&mut self, blocks: Vec<(u64, BlockData<'_>)>) -> Result<()> {
        let encoded = blocks.iter().map(|(_, b)| encode(b, self.rank, self.chunk, self.compression)).collect::<Result<Vec<_>>>()?;
        let stored: Vec<&[u8]> = blocks.iter().zip(&encoded).map(|((_, b), (_, c))| c.as_deref().unwrap_or(b.bytes)).collect();
        if let Err(e) = write_all_vectored(&mut self.data, &stored) {
            let total: usize = stored.iter().map(|s| s.len()).sum();
            let names: Vec<&str> = blocks.iter().map(|(_, b)| b.def.name.as_str()).collect();
            let what = format!(
                "writing {total} bytes of {} to {} (is the disk full? earlier steps are intact)",
                names.join(", "),
                self.layout.root.join(&self.data_rel).display()
            );
            // A partial write left bytes behind: later blocks start after them.
            self.end = self.data.metadata().map_or(self.end, |m| m.len());
            return Err(Error::io(what, e));
        }
        for ((step, _), (mut record, _)) in blocks.iter().zip(encoded) {
            record.file.clone_from(&self.data_rel);
            record.pos = self.end;
            self.end += stored_len(&record);
            self.blocks.entry(*step).or_default().push(record);
        }
        Ok(())
    }

    fn end_step(&mut self, step: u64, part: &StepPart) -> Result<bool> {
        if self.fsync {
            self.data.sync_data().ctx(|| format!("flushing {}", self.data_rel))?;
        }
        let blocks = self.blocks.remove(&step).unwrap_or_default();
        let mut frag = Fragment::new(step, self.rank, self.nranks, self.session.clone(), part.defs.clone(), blocks);
        frag.attrs = part.attrs.clone();
        frag.consume = part.consume.clone();
        let done = self.publish_part(step, &to_json(&frag)).and_then(|()| self.try_commit(step, Some(&self.session)));
        if done.is_err() {
            // Kept also when only the commit failed, so that a retry publishes this writer's
            // blocks again rather than an empty fragment over them.
            self.blocks.insert(step, frag.blocks);
        }
        done
    }

    fn close(&mut self) -> Result<()> {
        self.layout.close_rank(self.rank, self.nranks, &self.session, self.fsync)
    }

    fn abort_step(&mut self, step: u64) -> Result<()> {
        // The bytes stay in the data file unreferenced; no index will ever point at them.
        self.blocks.remove(&step);
        Ok(())
    }
}

/// Commits a merged step index (releasing the step in the datasets of `consume` with it, as one
/// transaction); returns whether it is committed. Two ranks of one session may both commit (the
/// same bytes); a step another session committed is never replaced.
pub(super) fn commit_index(layout: &Layout, index: StepIndex, session: &str, consume: Vec<String>, fsync: bool, tag: u32) -> Result<bool> {
    if !consume.is_empty() {
        return consume::commit(layout, index, session, consume, fsync, tag);
    }
    let (step, dest) = (index.step, layout.step_path(index.step));
    let bytes = index_file::encode(&index);
    if !publish_new(&dest, &bytes, fsync, tag)? && std::fs::read(&dest).ok().as_deref() != Some(&bytes[..]) {
        return Err(Error::AlreadyExists(format!(
            "step {step} of {} was committed meanwhile by another writer session; a step commits once, so this \
             writer's part is dropped: write a new step number",
            layout.root.display()
        )));
    }
    Ok(true)
}

/// The file engine's agreement of a writer session's ranks (see `WriteEngine::agree`): the first
/// rank creates `agree.<key>` in the dataset's folder exclusively (`O_EXCL`, which NFS and Lustre
/// honour) holding its answer; the others read it.
pub(crate) fn agree(layout: &Layout, key: &str, mine: bool) -> Result<bool> {
    let name: String = key.chars().map(|c| if c.is_ascii_alphanumeric() || "-_.".contains(c) { c } else { '_' }).collect();
    let path = layout.root.join(format!("agree.{name}"));
    match std::fs::OpenOptions::new().write(true).create_new(true).open(&path) {
        Ok(mut f) => {
            use std::io::Write;
            f.write_all(if mine { b"1" } else { b"0" }).map_err(|e| Error::io(format!("writing {}", path.display()), e))?;
            return Ok(mine);
        }
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(Error::io(format!("creating {}", path.display()), e)),
    }
    // The first rank created it and writes its byte right after: wait for the byte.
    let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
    loop {
        let got = std::fs::read(&path).map_err(|e| Error::io(format!("reading {}", path.display()), e))?;
        if let Some(b) = got.first() {
            return Ok(*b == b'1');
        }
        if std::time::Instant::now() >= until {
            return Err(Error::Unavailable(format!(
                "{} stayed empty for 30 s: the rank that created it died before writing its answer; remove it",
                path.display()
            )));
        }
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}
