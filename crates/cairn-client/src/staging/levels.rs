//! Reading a staging dataset whose cluster drains to disk: each step from the level that has it.
//! Steps in memory are read there; steps staging released (`keep_last`, `release`) or lost
//! come from their drained copy; when no server of the cluster answers, every read goes to the
//! drain (with one warning naming the cluster file). `steps()` is the union of both levels.
//!
//! A drained step is served as one this cluster committed only if it carries this cluster's
//! identity: a step the cluster released or lost is read from disk only when the drain there is
//! its own; steps the cluster never had (an earlier run's, continued with mode `"a"`) are the
//! dataset's history and read as they are. With no server answering, another run's step is read
//! only below this cluster's oldest drained step (the history before this run). Where the dataset
//! has an owner record (`owner.json`, written by the first `"w"` or `"a"` open), another
//! cluster's step is served only below the record's `first_step`, and only when the record is
//! this cluster's; any other is refused (`ForeignDrain`, naming both clusters).

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
    /// The cluster's id, which its drained steps carry.
    id: String,
    /// This cluster's oldest drained step, looked up once no server answers.
    first_mine: OnceLock<Option<u64>>,
}

impl Levels {
    pub(crate) fn new(memory: StagingReader, layout: Layout, cluster: PathBuf, id: String) -> Levels {
        Levels { memory, layout, disk: OnceLock::new(), gone: AtomicBool::new(false), cluster, id, first_mine: OnceLock::new() }
    }

    /// Whether drained `step` carries this cluster's identity.
    fn mine(&self, step: u64) -> Result<bool> {
        Ok(self.layout.read_step_meta(step)?.staged.is_some_and(|s| s.cluster == self.id))
    }

    /// Whether another cluster's drained `step`, which this cluster never had, may be served:
    /// by the owner record, history below the step this cluster wrote first (`None`: no record).
    fn history(&self, step: u64) -> Result<Option<bool>> {
        Ok(cairn_file::owner::read(&self.layout)?.map(|o| o.cluster == self.id && step < o.first_step))
    }

    /// The refusal of another cluster's `step` this one may not serve.
    fn foreign(&self, step: u64) -> Error {
        let whose = self.layout.read_step_meta(step).ok().and_then(|i| i.staged).map_or_else(|| "no cluster's".into(), |s| s.cluster);
        let owner = cairn_file::owner::read(&self.layout).ok().flatten().map_or_else(|| "none".into(), |o| o.cluster);
        Error::ForeignDrain(format!(
            "step {step} drained to {} is cluster {whose}'s (another run's), not this cluster {}'s; the dataset's owner record \
             names cluster {owner}: two runs wrote this name into one drain folder. Read that run's steps with \
             `cairn.open(name, \"r\", path=DRAIN)`, or remove the dataset with `cairn rm {} --cluster FILE --all`",
            self.layout.root.display(),
            self.id,
            self.layout.name()
        ))
    }

    /// Whether drained `step` may be served with no server answering: this cluster's, or
    /// history from before this cluster's first drained step (by the owner record, where one is).
    fn servable_alone(&self, step: u64) -> Result<bool> {
        if self.mine(step)? {
            return Ok(true);
        }
        if let Some(ok) = self.history(step)? {
            return Ok(ok);
        }
        let first = match self.first_mine.get() {
            Some(f) => *f,
            None => {
                let mut first = None;
                for s in self.disk_steps()? {
                    if self.mine(s)? {
                        first = Some(s);
                        break;
                    }
                }
                *self.first_mine.get_or_init(|| first)
            }
        };
        Ok(first.is_none_or(|f| step < f))
    }

    fn disk(&self) -> Option<&FileReader> {
        if let Some(d) = self.disk.get() {
            return Some(d);
        }
        let opened = FileReader::open(self.layout.clone()).ok()?;
        Some(self.disk.get_or_init(|| opened))
    }

    /// `f` of the memory level, or `None` once no server answers (then, the first time, a
    /// warning); other errors are the caller's.
    fn memory<T>(&self, f: impl FnOnce(&StagingReader) -> Result<T>) -> Option<Result<T>> {
        if self.gone.load(Ordering::Relaxed) {
            return None;
        }
        match f(&self.memory) {
            // Servers unreachable (not an election or a lost quorum, which say so).
            Err(e) if e.kind() == ErrorKind::Unavailable && e.reason().is_none() => {
                if !self.gone.swap(true, Ordering::Relaxed) {
                    eprintln!(
                        "cairn: no server of the cluster in {} answered ({e}); reading the steps drained to {}",
                        self.cluster.display(),
                        self.layout.root.display()
                    );
                }
                None
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
                    None => self.servable_alone(step)?,
                    Some(_) if committed_here => self.mine(step)?,
                    Some(_) => self.mine(step)? || self.history(step)?.unwrap_or(true),
                };
                match (servable, mem) {
                    (true, _) => f(d),
                    (false, _) if !self.mine(step)? && self.history(step)?.is_some() => Err(self.foreign(step)),
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
            if !gone || self.servable_alone(s)? {
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
