//! Reading a staging dataset whose cluster drains to disk: each step from the level that has it.
//! Steps in memory are read there; steps staging released (`keep_last`, `release`) or lost
//! come from their drained copy; when no server of the cluster answers, reads fail with
//! `Unavailable` saying where the drain is, unless the cluster file was marked stopped since: then
//! every read goes to the drain. `steps()` is the union of both levels.
//!
//! A step the cluster released or lost is read from disk only when the drain there is its own;
//! with no server answering (the cluster stopped), [`Owned`] decides which drained steps it serves.

use super::owned::Owned;
use super::reader::StagingReader;
use crate::engine::ReadEngine;
use crate::file::{FileReader, Layout};
use cairn_core::attrs::Attrs;
use cairn_core::index::{BlockRecord, VarDef};
use cairn_core::{Error, ErrorKind, Region, Result};
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;
use std::time::Duration;

/// A staging reader with the drained copy of its dataset behind it.
pub(crate) struct Levels {
    memory: StagingReader,
    layout: Layout,
    /// Opened once the drained dataset exists (the first drain may come after this reader).
    disk: OnceLock<FileReader>,
    /// No server answered: the memory level is not asked again by this reader.
    gone: AtomicBool,
    cluster: PathBuf,
    /// Which drained steps are this cluster's to serve.
    owned: Owned,
}

impl Levels {
    pub(crate) fn new(memory: StagingReader, layout: Layout, cluster: PathBuf, id: String) -> Levels {
        let owned = Owned::new(layout.clone(), id);
        Levels { memory, layout, disk: OnceLock::new(), gone: AtomicBool::new(false), cluster, owned }
    }

    fn disk(&self) -> Option<&FileReader> {
        if let Some(d) = self.disk.get() {
            return Some(d);
        }
        let opened = FileReader::open(self.layout.clone()).ok()?;
        Some(self.disk.get_or_init(|| opened))
    }

    /// `f` of the memory level, or `None` once no server answers and the cluster file says it
    /// was stopped; other errors are the caller's.
    fn memory<T>(&self, f: impl FnOnce(&StagingReader) -> Result<T>) -> Option<Result<T>> {
        if self.gone.load(Ordering::Relaxed) {
            return None;
        }
        match f(&self.memory) {
            // Servers unreachable (not an election or a lost quorum, which say so). Only a stopped
            // cluster's reader reads the drain alone: servers that do not answer may be crashed,
            // hung or cut off, and a warning on stderr is one a notebook never shows.
            Err(e) if e.kind() == ErrorKind::Unavailable && e.reason().is_none() => {
                if cairn_proto::cluster::StoppedFile::load(&self.cluster).is_some() {
                    self.gone.store(true, Ordering::Relaxed);
                    return None;
                }
                let (file, drain) = (self.cluster.display(), self.layout.root.parent().unwrap_or(&self.layout.root).display());
                Some(Err(Error::Unavailable(format!(
                    "no server of the cluster in {file} answered ({e}); the steps it drained are in {drain}: read them with \
                     path=\"{drain}\" (the file engine), or mark the cluster stopped (`cairn cluster stop --file {file}`) and \
                     open it again"
                ))))
            }
            r => Some(r),
        }
    }

    /// `f` of the level that has `step`: memory, else the drained copy when memory does not
    /// hold it (released, lost, or no server answers).
    fn at<T>(&self, step: u64, f: impl Fn(&dyn ReadEngine) -> Result<T>) -> Result<T> {
        let mem = match self.memory(|m| f(m)) {
            Some(Ok(v)) => return Ok(v),
            Some(Err(e)) if !matches!(e.kind(), ErrorKind::NotFound | ErrorKind::DataLoss) => return Err(e),
            m => m,
        };
        // Committed here and then released or lost: only this cluster's own drain of it will do.
        let committed_here = matches!(&mem, Some(Err(e)) if e.kind() == ErrorKind::DataLoss || e.reason().is_some());
        match self.disk() {
            Some(d) if d.steps()?.contains(&step) => {
                let servable = match &mem {
                    None => self.owned.servable_alone(step)?,
                    Some(_) if committed_here => self.owned.mine(step)?,
                    Some(_) => self.owned.mine(step)? || self.owned.history(step)?.unwrap_or(true),
                };
                match (servable, mem) {
                    (true, _) => f(d),
                    (false, _) if !self.owned.mine(step)? && self.owned.history(step)?.is_some() => Err(self.owned.foreign(step)),
                    (false, Some(Err(e))) => Err(e),
                    (false, _) => Err(Error::NotFound(format!(
                        "step {step} drained to {} is another cluster's (another run's), not this cluster's step {step}; \
                         no server of this cluster answers to give its own",
                        self.layout.root.display()
                    ))),
                }
            }
            _ => match mem {
                Some(Err(e)) => Err(e),
                _ => Err(Error::NotFound(format!(
                    "step {step} is neither in the cluster's memory (no server answers) nor drained to {}",
                    self.layout.root.display()
                ))),
            },
        }
    }

    fn disk_steps(&self) -> Result<Vec<u64>> {
        self.disk().map_or(Ok(Vec::new()), |d| d.steps())
    }
}

impl ReadEngine for Levels {
    fn steps(&self) -> Result<Vec<u64>> {
        let mut steps = match self.memory(|m| m.steps()) {
            Some(r) => r?,
            None if self.disk().is_some() => Vec::new(),
            None => {
                return Err(Error::Unavailable(format!(
                    "no server of the cluster in {} answered, and nothing of this dataset is drained to {} yet",
                    self.cluster.display(),
                    self.layout.root.display()
                )))
            }
        };
        let gone = self.gone.load(Ordering::Relaxed);
        for s in self.disk_steps()? {
            if !gone || self.owned.servable_alone(s)? {
                steps.push(s);
            }
        }
        steps.sort_unstable();
        steps.dedup();
        Ok(steps)
    }

    fn step_vars(&self, step: u64) -> Result<BTreeMap<String, VarDef>> {
        self.at(step, |e| e.step_vars(step))
    }

    fn step_attrs(&self, step: u64) -> Result<Attrs> {
        self.at(step, |e| e.step_attrs(step))
    }

    fn blocks(&self, var: &str, step: u64) -> Result<Vec<BlockRecord>> {
        self.at(step, |e| e.blocks(var, step))
    }

    fn read_into(&self, step: u64, block: &BlockRecord, elem: usize, isect: &Region, dst: &Region, out: &mut [u8]) -> Result<()> {
        // A drained block names its data file; a block in memory, its objects.
        if block.objects.is_empty() && !block.file.is_empty() {
            let d = self.disk().ok_or_else(|| Error::NotFound(format!("no drained dataset at {}", self.layout.root.display())))?;
            return d.read_into(step, block, elem, isect, dst, out);
        }
        self.memory.read_into(step, block, elem, isect, dst, out)
    }

    fn wait_step(&self, step: u64, timeout: Duration) -> Result<bool> {
        match self.memory(|m| m.wait_step(step, timeout)) {
            Some(r) => r,
            None => Ok(self.disk_steps()?.contains(&step)),
        }
    }

    fn forget(&self, step: u64) {
        self.memory.forget(step);
    }

    fn down_servers(&self) -> Vec<u32> {
        if self.gone.load(Ordering::Relaxed) {
            return Vec::new();
        }
        self.memory.down_servers()
    }

    fn release(&self, step: u64) -> Result<()> {
        self.memory.release(step)
    }

    fn pending(&self) -> Result<Vec<(u64, u32, u32)>> {
        self.memory(|m| m.pending()).unwrap_or(Ok(Vec::new()))
    }

    fn listing(&self) -> Result<(Vec<u64>, bool)> {
        let finished = self.memory(|m| m.listing()).transpose()?.is_some_and(|(_, f)| f);
        Ok((self.steps()?, finished))
    }

    fn claim(&self, claimer: &str, lease: Duration) -> Result<(Option<u64>, bool)> {
        self.memory.claim(claimer, lease)
    }

    fn renew(&self, claimer: &str, lease: Duration) -> Result<Vec<u64>> {
        self.memory.renew(claimer, lease)
    }

    fn unclaim(&self, claimer: &str) -> Result<()> {
        self.memory.unclaim(claimer)
    }

    fn wait_drained(&self, step: Option<u64>, timeout: Option<Duration>) -> Result<bool> {
        self.memory.wait_drained(step, timeout)
    }

    fn remove(&self) -> Result<u64> {
        self.memory.remove()
    }

    fn discard_from(&self, from: u64) -> Result<u64> {
        // The leader deletes the drained copies; this reader forgets what it cached of them.
        let n = self.memory.discard_from(from)?;
        if let Some(d) = self.disk.get() {
            d.forget_from(from);
        }
        Ok(n)
    }

    fn stream_at(&self, reader: &str, next: Option<u64>, leave: bool) -> Result<(Duration, Option<u64>)> {
        self.memory.stream_at(reader, next, leave)
    }
}
