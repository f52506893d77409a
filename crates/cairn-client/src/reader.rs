//! [`Reader`]: reads any box of any committed step, from any number of processes.

use crate::config::{Config, EngineKind};
use crate::engine::ReadEngine;
use crate::file::{FileReader, Layout};
use crate::names::{check_name, unknown_var};
use crate::staging;
use cairn_core::index::{BlockRecord, VarDef};
use cairn_core::{DType, Error, Region, Result};
use std::collections::BTreeMap;

/// Reads committed steps of one dataset.
pub struct Reader {
    engine: Box<dyn ReadEngine>,
    /// The dataset's name (for messages).
    name: String,
}

impl std::fmt::Debug for Reader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reader").finish_non_exhaustive()
    }
}

impl Reader {
    /// Opens dataset `name` with the engine `cfg` names.
    pub fn open(name: &str, cfg: &Config) -> Result<Reader> {
        check_name(name)?;
        let engine: Box<dyn ReadEngine> = match cfg.engine {
            EngineKind::File => Box::new(FileReader::open(Layout::new(&cfg.file.path, name))?),
            EngineKind::Staging => staging::reader(&cfg.staging, name)?,
        };
        Ok(Reader { engine, name: name.to_string() })
    }

    /// Committed steps, sorted.
    pub fn steps(&self) -> Result<Vec<u64>> {
        self.engine.steps()
    }

    /// Waits until `step` (default: the newest committed step the drain's cadence names) is
    /// drained to disk: true once it is, false at `timeout` (none: no limit), the drain's error
    /// if it failed (a full disk: [`Error::Capacity`]). Always true for the file engine.
    pub fn wait_drained(&self, step: Option<u64>, timeout: Option<std::time::Duration>) -> Result<bool> {
        self.engine.wait_drained(step, timeout)
    }

    /// Waits until `step` is committed or `timeout` passes; returns whether it is.
    pub fn wait_step(&self, step: u64, timeout: std::time::Duration) -> Result<bool> {
        self.engine.wait_step(step, timeout)
    }

    /// Steps some writers ended but that are not committed: (step, ranks that ended it, ranks it
    /// waits for). A step all ranks ended still shows while its commit waits (staging: for seals).
    pub fn pending(&self) -> Result<Vec<(u64, u32, u32)>> {
        self.engine.pending()
    }

    /// Frees a committed step for every reader: in every server (staging engine), or its index
    /// (file engine: the step's bytes stay in the append-only data files); later reads of it fail.
    pub fn release(&self, step: u64) -> Result<()> {
        self.engine.release(step)
    }

    /// Committed steps, and whether the writers closed the dataset (no more steps come).
    pub fn listing(&self) -> Result<(Vec<u64>, bool)> {
        self.engine.listing()
    }

    /// Leases the lowest committed step that no live claimer holds to `claimer` for `lease`
    /// (D²T claims: each step goes to one claimer; a claimer that stops renewing loses its
    /// steps to the others). Returns the step, if one was free, and whether nothing will ever be
    /// free for this claimer (the writers closed the dataset and every step left is its own).
    pub fn claim(&self, claimer: &str, lease: std::time::Duration) -> Result<(Option<u64>, bool)> {
        self.engine.claim(claimer, lease)
    }

    /// Extends every lease `claimer` holds to `lease` from now; returns the steps it still holds.
    pub fn renew(&self, claimer: &str, lease: std::time::Duration) -> Result<Vec<u64>> {
        self.engine.renew(claimer, lease)
    }

    /// Removes the dataset whole from its staging cluster (see [`crate::engine::ReadEngine::remove`]);
    /// returns how many committed steps it had.
    pub fn remove(&self) -> Result<u64> {
        self.engine.remove()
    }

    /// Discards the committed steps from `from` on (a restart from an older step, when the
    /// newest are bad): staging releases them, forgets them in the control plane (claims,
    /// commit records, released steps; readers of one get `Released`), moves the drained mark
    /// back and deletes their drained copies, in one control-plane command, refused while a
    /// step is begun and not ended; the file engine removes their indexes and the fragments
    /// and leases of steps from `from` on. Returns how many committed steps went.
    /// A step past the newest committed one + 1 is refused (`InvalidArgument`, naming the newest).
    pub fn discard_from(&self, from: u64) -> Result<u64> {
        let newest = self.engine.steps()?.last().copied();
        if from > newest.map_or(0, |n| n.saturating_add(1)) {
            let has = newest.map_or_else(|| "has no committed step".to_string(), |n| format!("has committed steps up to {n}"));
            let upto = newest.map_or(0, |n| n + 1);
            return Err(Error::InvalidArgument(format!(
                "from_step={from}: '{}' {has}; go back to a step from 0 to {upto} ({upto}: discard nothing and continue)",
                self.name
            )));
        }
        self.engine.discard_from(from)
    }

    /// Registers streaming reader `reader` of the dataset, moves it to `next` (the first step it
    /// has not passed), renews it (`next` none), or with `leave` ends its registration; steps
    /// every registered reader passed are released. Returns how long a registration lasts
    /// unrenewed (renew well within it) and the reader's mark: the first step it holds (a new
    /// registration, or one that lapsed and came back, starts at the oldest kept step).
    pub fn stream_at(&self, reader: &str, next: Option<u64>, leave: bool) -> Result<(std::time::Duration, Option<u64>)> {
        self.engine.stream_at(reader, next, leave)
    }

    /// Gives back every step `claimer` holds, for other claimers to take.
    pub fn unclaim(&self, claimer: &str) -> Result<()> {
        self.engine.unclaim(claimer)
    }

    /// Variables across committed steps (the latest definition of each).
    pub fn variables(&self) -> Result<BTreeMap<String, VarDef>> {
        let mut all = BTreeMap::new();
        for s in self.steps()? {
            all.extend(self.engine.step_vars(s)?);
        }
        Ok(all)
    }

    /// Variables of committed `step` (their definitions there).
    pub fn step_variables(&self, step: u64) -> Result<BTreeMap<String, VarDef>> {
        self.engine.step_vars(step).map_err(|e| self.not_committed(e, step))
    }

    /// Attributes of the dataset as committed `step` has them.
    pub fn step_attrs(&self, step: u64) -> Result<cairn_core::attrs::Attrs> {
        self.engine.step_attrs(step).map_err(|e| self.not_committed(e, step))
    }

    /// Attributes of the dataset, as of the last committed step (none before the first).
    pub fn attrs(&self) -> Result<cairn_core::attrs::Attrs> {
        match self.steps()?.last() {
            Some(&s) => self.engine.step_attrs(s),
            None => Ok(Default::default()),
        }
    }

    /// Definition of `var` in a committed `step`.
    pub fn var(&self, var: &str, step: u64) -> Result<VarDef> {
        let vars = self.engine.step_vars(step).map_err(|e| self.not_committed(e, step))?;
        vars.get(var).cloned().ok_or_else(|| unknown_var(var, vars.keys()))
    }

    fn not_committed(&self, e: Error, step: u64) -> Error {
        match e {
            // A released step is not coming back: the engine's word for it stands.
            Error::NotFound(_) => {
                let steps = self.steps().unwrap_or_default();
                let have = match (steps.first(), steps.last()) {
                    (Some(a), Some(b)) => format!("committed: {} steps, {a} to {b}", steps.len()),
                    _ => "no step is committed yet".into(),
                };
                match self.engine.note() {
                    Some(note) => Error::NotFound(format!("step {step} is not there: {note}; {have}")),
                    None => Error::NotFound(format!("step {step} is not committed ({have}); wait for the writers to end it")),
                }
            }
            e => e,
        }
    }

    /// The redundancy level of `var` at `step`, and the state of each of its blocks (in
    /// [`Reader::blocks`] order): `degraded` when a copy of one of its objects is on a server the
    /// cluster records as down, else `encoded` when an object is erasure coded, else
    /// `replicated` (whole copies; one for level 0).
    pub fn block_states(&self, var: &str, step: u64) -> Result<(u32, Vec<&'static str>)> {
        let level = self.var(var, step)?.redundancy;
        // Objects may have been encoded since the index was read.
        self.engine.forget(step);
        let blocks = self.blocks(var, step)?;
        let down = if level > 0 { self.engine.down_servers() } else { Vec::new() };
        let states = blocks
            .iter()
            .map(|b| {
                if b.objects.iter().any(|o| o.servers().iter().any(|s| down.contains(s))) {
                    "degraded"
                } else if b.objects.iter().any(|o| matches!(o.redundancy, cairn_core::index::Redundancy::Encoded { .. })) {
                    "encoded"
                } else {
                    "replicated"
                }
            })
            .collect();
        Ok((level, states))
    }

    /// The step constant variable `var` was written in (the first kept step holding blocks of
    /// it), to read it without naming a step. A per-step variable is refused: it needs a step.
    pub fn constant_step(&self, var: &str) -> Result<u64> {
        let def = self.variables()?.remove(var).ok_or_else(|| unknown_var(var, self.variables().unwrap_or_default().keys()))?;
        if !def.constant {
            return Err(Error::InvalidArgument(format!(
                "'{var}' is written every step: give the step (get(name, step)); only constant variables are read without one"
            )));
        }
        for step in self.steps()? {
            if self.engine.step_vars(step)?.contains_key(var) && !self.engine.blocks(var, step)?.is_empty() {
                return Ok(step);
            }
        }
        Err(Error::NotFound(format!("constant '{var}' is defined but no kept step holds it: no rank has put it yet")))
    }

    /// Blocks of `var` at `step`, sorted by writer then offset.
    pub fn blocks(&self, var: &str, step: u64) -> Result<Vec<BlockRecord>> {
        self.var(var, step)?;
        let mut b = self.engine.blocks(var, step)?;
        b.sort_by(|x, y| (x.writer, &x.region.offset).cmp(&(y.writer, &y.region.offset)));
        Ok(b)
    }

    /// Reads the box `offset + count` of global variable `var` at `step` into `out` (C order).
    /// Every element must have been written: a box reaching unwritten parts is refused.
    pub fn get(&self, var: &str, step: u64, offset: &[u64], count: &[u64], out: &mut [u8]) -> Result<()> {
        let def = self.var(var, step)?;
        let Some(shape) = &def.shape else {
            return Err(Error::InvalidArgument(format!("'{var}' is a local variable; read it with get_local(var, step, writer)")));
        };
        let want = Region::new(offset.to_vec(), count.to_vec())?;
        want.check_within(shape, &format!("requested box of '{var}'"))?;
        let elem = def.dtype.size();
        if out.len() as u64 != want.volume() * elem as u64 {
            return Err(Error::InvalidArgument(format!(
                "output buffer has {} bytes but the box {count:?} of {} needs {}",
                out.len(),
                def.dtype,
                want.volume() * elem as u64
            )));
        }
        let mut covered = 0u64;
        for b in self.engine.blocks(var, step)? {
            if let Some(isect) = b.region.intersect(&want) {
                self.engine.read_into(step, &b, elem, &isect, &want, out)?;
                covered += isect.volume();
            }
        }
        if covered != want.volume() {
            return Err(Error::NotFound(format!(
                "box offset {offset:?} count {count:?} of '{var}' at step {step} is only partly written \
                 ({covered} of {} elements); read a box inside the blocks listed by blocks()",
                want.volume()
            )));
        }
        Ok(())
    }

    /// The block writer `writer` put for local variable `var` at `step`.
    pub fn local_block(&self, var: &str, step: u64, writer: u32) -> Result<BlockRecord> {
        let def = self.var(var, step)?;
        if !def.is_local() {
            return Err(Error::InvalidArgument(format!("'{var}' is a global array; read it with get(var, step, offset, count)")));
        }
        self.engine
            .blocks(var, step)?
            .into_iter()
            .find(|b| b.writer == writer)
            .ok_or_else(|| Error::NotFound(format!("writer {writer} put no block of '{var}' at step {step}")))
    }

    /// Reads writer `writer`'s block of local variable `var` at `step` into `out`.
    pub fn get_local(&self, var: &str, step: u64, writer: u32, out: &mut [u8]) -> Result<()> {
        let b = self.local_block(var, step, writer)?;
        if out.len() as u64 != b.len {
            return Err(Error::InvalidArgument(format!("output buffer has {} bytes but the block has {}", out.len(), b.len)));
        }
        let elem = self.var(var, step)?.dtype.size();
        self.engine.read_into(step, &b, elem, &b.region.clone(), &b.region, out)
    }

    /// Element type and extents of the trace records writer `writer` appended to `var` at
    /// `step`. A writer that traced none that step has zero records (extents `[0, ...]`, the
    /// record shape taken from other writers' records); read non-empty ones with `get_local`.
    pub fn trace_count(&self, var: &str, step: u64, writer: u32) -> Result<(DType, Vec<u64>)> {
        let vars = self.engine.step_vars(step).map_err(|e| self.not_committed(e, step))?;
        let Some(def) = vars.get(var) else {
            // Traced later in the run: an empty trace here, not an unknown name.
            let all = self.variables()?;
            let def = all.get(var).ok_or_else(|| unknown_var(var, all.keys()))?;
            return Ok((def.dtype, vec![0]));
        };
        if !def.is_local() {
            return Err(Error::InvalidArgument(format!(
                "'{var}' is a global array, not a trace; read it with get(var, step, offset, count)"
            )));
        }
        let blocks = self.engine.blocks(var, step)?;
        let count = match blocks.iter().find(|b| b.writer == writer) {
            Some(b) => b.region.count.clone(),
            None => {
                let mut c = blocks.first().map(|b| b.region.count.clone()).filter(|c| !c.is_empty()).unwrap_or_else(|| vec![0]);
                c[0] = 0;
                c
            }
        };
        Ok((def.dtype, count))
    }
}
