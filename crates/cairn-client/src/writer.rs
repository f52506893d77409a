//! [`Writer`]: one rank's handle for writing steps. It checks every request (names, dtypes, boxes,
//! step order) before an engine sees it, so all engines and all languages behave the same.

use crate::config::{Config, EngineKind};
use crate::engine::{BlockData, StepOutcome, StepPart, WriteEngine};
use crate::file::{AggWriter, Collective, FileWriter, Layout};
use crate::names::{check_name, unknown_var};
use crate::small::{Coalesced, SMALL};
use crate::staging::StagingWriter;
use crate::subtx::{FailedPut, Failures};
use crate::trace::TraceBuffer;
use cairn_core::attrs::{check_attrs, Attrs};
use cairn_core::index::VarDef;
use cairn_core::region::BoxSet;
use cairn_core::{DType, Error, Region, Result};
use std::collections::{BTreeMap, BTreeSet};

/// Writes named n-D arrays, step after step, as rank `rank` of `nranks`.
pub struct Writer {
    /// The dataset's name.
    name: String,
    /// The step each constant variable was (or is being) written in.
    constants: BTreeMap<String, u64>,
    engine: Box<dyn WriteEngine>,
    vars: BTreeMap<String, VarDef>,
    /// Attributes of the dataset, published with every step.
    attrs: Attrs,
    /// The step after the last one committed when opened (0 for a new dataset).
    next_step: u64,
    rank: u32,
    nranks: u32,
    step: Option<u64>,
    /// Boxes this rank put in the open step, per variable (to refuse overlaps early).
    put: BTreeMap<String, BoxSet>,
    /// Trace records not yet written.
    traces: TraceBuffer,
    /// Datasets whose same step the open step's commit releases (D²T consume-and-produce).
    consume: Vec<String>,
    /// Puts of the open step that could not be stored (failed sub-transactions).
    failures: Failures,
    /// Small blocks of the open step not yet sent.
    small: Coalesced,
    /// Whether small blocks are coalesced (see [`Writer::coalesce_small_puts`]).
    coalesce: bool,
    /// Steps this rank ended that wait for the trace flush, with what they publish.
    held: Vec<(u64, StepPart)>,
    /// Flush traces every this many ended steps.
    trace_flush: u32,
    /// Steps ended since opening: flushes fall on every `trace_flush`-th, on every rank alike.
    ended: u64,
    /// Steps this rank ended without committing them (other ranks' ends were still to come):
    /// what became of them is looked up at the next begin, end or close ([`Writer::take_aborted`]).
    unsettled: BTreeSet<u64>,
    /// This launch of the application, as every rank passed it (keys the ranks' agreements).
    session: String,
    /// The newest step this rank ended (held for a trace flush or not).
    last_ended: Option<u64>,
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer").field("rank", &self.rank).field("nranks", &self.nranks).field("step", &self.step).finish()
    }
}

impl Writer {
    /// Opens dataset `name` for writing with the engine `cfg` names. `append` carries the
    /// definitions and attributes of its last committed step over. `session` identifies this
    /// launch of the application: every rank of one launch passes the same value, and a restart
    /// passes a new one (see [`crate::session`]), so a crashed run's leftovers never mix in.
    /// Without `append` a dataset with committed steps opens too (claimers share a
    /// destination); its committed steps are immutable either way.
    pub fn open(name: &str, cfg: &Config, rank: u32, nranks: u32, append: bool, session: &str) -> Result<Writer> {
        Self::open_in(name, cfg, rank, nranks, append, session, None)
    }

    /// [`Writer::open`] for ranks that share an MPI communicator: with the file engine (and
    /// `[file] aggregation` not `none`) groups of ranks write one data file each and rank 0
    /// commits the fragments gathered over `group`; steps are then ended collectively. Other
    /// engines ignore `group`.
    pub fn open_collective(
        name: &str,
        cfg: &Config,
        rank: u32,
        nranks: u32,
        append: bool,
        session: &str,
        group: Collective,
    ) -> Result<Writer> {
        Self::open_in(name, cfg, rank, nranks, append, session, Some(group))
    }

    fn open_in(name: &str, cfg: &Config, rank: u32, nranks: u32, append: bool, session: &str, group: Option<Collective>) -> Result<Writer> {
        if nranks == 0 || rank >= nranks || nranks > cairn_core::index::MAX_RANKS {
            return Err(Error::InvalidArgument(format!(
                "rank {rank} of {nranks} writers: rank must be in 0..nranks and nranks from 1 to {}",
                cairn_core::index::MAX_RANKS
            )));
        }
        check_name(name)?;
        let engine: Box<dyn WriteEngine> = match cfg.engine {
            EngineKind::File => {
                let layout = Layout::new(&cfg.file.path, name);
                match group {
                    Some(g) if cfg.file.aggregation != "none" => {
                        Box::new(AggWriter::open(layout, rank, nranks, &cfg.file, session.to_string(), g)?)
                    }
                    _ => Box::new(FileWriter::open(layout, rank, nranks, append, &cfg.file, session.to_string())?),
                }
            }
            EngineKind::Staging => Box::new(StagingWriter::open(&cfg.staging, name, rank, nranks, session.to_string(), append)?),
        };
        // A restart carries on with the definitions and attributes of the last committed step.
        let last = if append { engine.last_index()? } else { None };
        let next_step = last.as_ref().map_or(0, |i| i.step.saturating_add(1));
        let (vars, attrs) = last.map(|i| (i.vars, i.attrs)).unwrap_or_default();
        Ok(Writer {
            name: name.to_string(),
            constants: BTreeMap::new(),
            engine,
            vars,
            attrs,
            next_step,
            rank,
            nranks,
            step: None,
            put: BTreeMap::new(),
            traces: TraceBuffer::default(),
            consume: Vec::new(),
            failures: Failures::default(),
            small: Coalesced::default(),
            coalesce: false,
            held: Vec::new(),
            trace_flush: cfg.trace_flush.max(1),
            ended: 0,
            unsettled: BTreeSet::new(),
            session: session.to_string(),
            last_ended: None,
        })
    }

    /// Sends small blocks together (see [`crate::small`]) when the engine gains by it. Their
    /// puts then return before they are stored, and one that cannot be stored shows at the
    /// step's end in [`Writer::failed_puts`] (with the other puts of its batch): for callers that
    /// read those there (the Python API), not for those that retry the put whose call failed.
    pub fn coalesce_small_puts(&mut self) {
        self.coalesce = self.engine.coalesces_small_puts();
    }

    /// This writer's rank.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// Where a restarted writer resumes: the step after the last one committed when it opened
    /// (0 for a new dataset, or one opened with `append` false).
    pub fn next_step(&self) -> u64 {
        self.next_step
    }

    /// The step this handle writes next as far as a halt is concerned: the one after the newest
    /// step it ended, else [`Writer::next_step`].
    pub fn halt_step(&self) -> u64 {
        self.last_ended.map_or(self.next_step, |s| s.saturating_add(1))
    }

    /// The newest step this rank ended, if any.
    pub fn last_ended(&self) -> Option<u64> {
        self.last_ended
    }

    /// Whether the job asks this writer to stop before `step` (see [`crate::halt::requested`]),
    /// one answer for every rank of its session: the first rank to ask for `step` fixes it
    /// (one rank: its own answer). Ranks that share an MPI communicator may agree by an
    /// allreduce instead.
    pub fn halt_requested_all(&self, step: u64) -> Result<bool> {
        let mine = crate::halt::requested()?;
        if self.nranks <= 1 {
            return Ok(mine);
        }
        self.engine.agree(&format!("halt.{}.{step}", self.session), mine)
    }

    /// Waits until `step` (default: the newest committed step) is drained to disk; a staging
    /// writer's wait asks the drain for it whatever the cadence (a job's last checkpoint).
    pub fn wait_drained(&self, step: Option<u64>, timeout: Option<std::time::Duration>) -> Result<bool> {
        self.engine.wait_drained(step, timeout)
    }

    /// Attributes of the dataset this writer publishes.
    pub fn attrs(&self) -> &Attrs {
        &self.attrs
    }

    /// Sets the attributes of the dataset (replacing those set before), published with every
    /// step this writer ends from now on.
    pub fn set_attrs(&mut self, attrs: Attrs) -> Result<()> {
        check_attrs(&attrs, "the dataset")?;
        self.attrs = attrs;
        Ok(())
    }

    /// Sets attribute `key` to `value`: the dataset's (`var` None) or a defined variable's, before
    /// any committed step holds it (a committed definition is immutable: redefining it differs).
    pub fn set_attr(&mut self, var: Option<&str>, key: &str, value: serde_json::Value) -> Result<()> {
        let Some(var) = var else {
            let mut attrs = self.attrs.clone();
            attrs.insert(key.to_string(), value);
            return self.set_attrs(attrs);
        };
        let def = self.vars.get(var).ok_or_else(|| unknown_var(var, self.vars.keys()))?;
        if self.engine.committed_def(var)?.is_some() {
            return Err(Error::Conflict(format!(
                "variable '{var}' is in a committed step already, where its attributes are fixed; set attribute '{key}' \
                 before the variable's first step (or set it on the dataset)"
            )));
        }
        let mut attrs = def.attrs.clone();
        attrs.insert(key.to_string(), value);
        let changed = def.clone().with_meta(def.dims.clone(), attrs)?;
        self.vars.insert(var.to_string(), changed);
        Ok(())
    }

    /// Defines a variable: a global array of `shape`, or a local (ragged) one when `shape` is None.
    /// Defining it again identically is allowed; differently is a conflict.
    pub fn define(&mut self, name: &str, dtype: DType, shape: Option<Vec<u64>>) -> Result<()> {
        self.define_var(VarDef::new(name, dtype, shape)?)
    }

    /// Defines a step-invariant global variable (see [`VarDef::constant`]).
    pub fn define_constant(&mut self, name: &str, dtype: DType, shape: Vec<u64>) -> Result<()> {
        self.define_var(VarDef::new(name, dtype, Some(shape))?.with_constant(true)?)
    }

    /// Redundancy level of variables that do not name one (the staging cluster's default, or
    /// `[staging] redundancy`; 0 for files).
    pub fn default_redundancy(&self) -> u32 {
        self.engine.default_redundancy()
    }

    /// [`Writer::define`] of a full definition (with its redundancy level, which the staging
    /// engine honours by keeping that many extra copies of each object, each in another failure
    /// domain).
    pub fn define_var(&mut self, def: VarDef) -> Result<()> {
        let most = cairn_core::corec::MAX_REDUNDANCY;
        if def.redundancy > most {
            return Err(Error::InvalidArgument(format!("'{}': redundancy={} server failures; give 0 to {most}", def.name, def.redundancy)));
        }
        let name = def.name.clone();
        let name = name.as_str();
        let earlier = match self.vars.get(name) {
            Some(d) => Some(d.clone()),
            None => self.engine.committed_def(name)?,
        };
        if let Some(prev) = earlier {
            if prev != def {
                return Err(Error::Conflict(format!(
                    "variable '{name}' is already defined as {}; cannot redefine it as {}",
                    prev.describe(),
                    def.describe()
                )));
            }
        }
        self.vars.insert(name.to_string(), def);
        Ok(())
    }

    /// Element type of a defined variable.
    pub fn dtype_of(&self, var: &str) -> Result<DType> {
        self.vars.get(var).map(|d| d.dtype).ok_or_else(|| unknown_var(var, self.vars.keys()))
    }

    /// Sets the dataset's queue limit (committed steps not yet released; 0: none) and policy:
    /// "block" (`begin_step` waits for room, up to the staging timeout) or "discard_oldest"
    /// (the oldest committed step is released). The file engine keeps every step: no effect.
    pub fn define_queue(&mut self, limit: u64, policy: &str) -> Result<()> {
        self.engine.define_queue(limit, cairn_core::queue::Policy::parse(policy)?)
    }

    /// Opens step `step`. Its blocks become visible only when every rank has ended it.
    pub fn begin_step(&mut self, step: u64) -> Result<()> {
        if let Some(open) = self.step {
            return Err(Error::Conflict(format!("step {open} is still open; end it before beginning step {step}")));
        }
        if self.held.iter().any(|(s, ..)| *s == step) {
            return Err(Error::AlreadyExists(format!(
                "step {step} was already ended and waits for its trace flush; write a new step number"
            )));
        }
        // Backpressure: under a full `block` queue, wait for readers to release a step.
        self.engine.wait_queue()?;
        if self.engine.is_committed(step)? {
            // Before anything of the step is written: nothing is left behind.
            return Err(Error::AlreadyExists(format!(
                "step {step} of '{}' is already committed (in memory, or on disk where a drain or the file engine put it), and \
                 committed steps are immutable: write a new step number, open the dataset with mode \"a\" to continue after \
                 its last step, or remove it first (`cairn rm {}`)",
                self.name, self.name
            )));
        }
        self.step = Some(step);
        self.put.clear();
        self.consume.clear();
        self.failures.clear();
        self.small.clear();
        Ok(())
    }

    /// Makes the open step's commit release the same step of each dataset in `datasets` (of
    /// the same staging cluster, or beside this one under the same `[file] path`), in one
    /// transaction: both happen or neither. The step is refused at its end if one of them no
    /// longer holds the step (another claimer consumed it).
    pub fn consume(&mut self, datasets: Vec<String>) -> Result<()> {
        let step = self.step.ok_or_else(|| Error::Conflict("consume without an open step; call begin_step first".into()))?;
        for d in &datasets {
            check_name(d)?;
        }
        if datasets.len() > cairn_proto::message::MAX_CONSUME {
            return Err(Error::InvalidArgument(format!(
                "step {step} consumes {} datasets; at most {} may be consumed by one step",
                datasets.len(),
                cairn_proto::message::MAX_CONSUME
            )));
        }
        self.consume = datasets;
        Ok(())
    }

    /// Puts a block: `bytes` (C order, little-endian) of `dtype` with extents `count`, at `offset`
    /// of a global variable, or (offset `None`) as this rank's block of a local variable.
    pub fn put(&mut self, var: &str, dtype: DType, bytes: &[u8], offset: Option<&[u64]>, count: &[u64]) -> Result<()> {
        let step = self
            .step
            .ok_or_else(|| Error::Conflict(format!("put of '{var}' outside a step; call begin_step (Python: `with f.step(n):`) first")))?;
        let def = self.vars.get(var).ok_or_else(|| unknown_var(var, self.vars.keys()))?;
        if def.constant {
            let written = match self.constants.get(var) {
                Some(s) => Some(*s),
                None => self.engine.written_in(var)?,
            };
            if let Some(first) = written.filter(|s| *s != step) {
                return Err(Error::Conflict(format!(
                    "'{var}' is constant: it was written in step {first}, and a constant is written in one step only; \
                     read it with get(\"{var}\") (no step), or define a per-step variable"
                )));
            }
            self.constants.insert(var.to_string(), step);
        }
        let def = self.vars.get(var).ok_or_else(|| unknown_var(var, self.vars.keys()))?;
        if dtype != def.dtype {
            return Err(Error::InvalidArgument(format!(
                "dtype mismatch: '{var}' is defined as {} but the data is {dtype}; convert it (e.g. numpy astype) first",
                def.dtype
            )));
        }
        let region = match (&def.shape, offset) {
            (Some(shape), Some(off)) => {
                let r = Region::new(off.to_vec(), count.to_vec())?;
                r.check_within(shape, &format!("block of '{var}'"))?;
                r
            }
            (Some(shape), None) => {
                if count != shape.as_slice() {
                    return Err(Error::InvalidArgument(format!(
                        "'{var}' is a global array of shape {shape:?}: give the offset of this {count:?} block"
                    )));
                }
                Region::whole(shape)
            }
            (None, Some(_)) => {
                return Err(Error::InvalidArgument(format!(
                    "'{var}' is a local variable: put it without an offset (each writer has its own block)"
                )))
            }
            (None, None) => {
                check_local_dims(def, count)?;
                Region::new(vec![0; count.len()], count.to_vec())?
            }
        };
        let want = region.volume().checked_mul(dtype.size() as u64);
        if want != Some(bytes.len() as u64) {
            return Err(Error::InvalidArgument(format!(
                "block of '{var}' has {} bytes but count {count:?} of {dtype} needs {want:?}",
                bytes.len()
            )));
        }
        let mine = self.put.get(var);
        if def.is_local() && (mine.is_some_and(|m| !m.is_empty()) || self.traces.has(var, step)) {
            return Err(Error::Conflict(format!("local variable '{var}' was already put in step {step} by this writer")));
        }
        if let Some(prev) = mine.and_then(|m| m.meeting(&region)) {
            return Err(Error::Conflict(format!(
                "block of '{var}' at offset {:?} count {:?} overlaps one this writer already put in step {step} \
                 (offset {:?} count {:?})",
                region.offset, region.count, prev.offset, prev.count
            )));
        }
        let local = def.is_local();
        if self.coalesce && bytes.len() <= SMALL {
            self.engine.admits(def)?;
            self.failures.stored(var, &region, local);
            self.put.entry(var.to_string()).or_default().insert(region.clone());
            if self.small.push(var, region, bytes) {
                // A batch that cannot be stored fails its puts, this one among them; any other
                // refusal keeps them for the step's end, which reports it.
                match self.send_small() {
                    Err(e) if Failures::is_storage(e.kind()) => return Err(e),
                    _ => {}
                }
            }
            return Ok(());
        }
        // Recorded only once stored, so a put refused for lack of space can be retried; until
        // then the step does not end (a failed sub-transaction).
        if let Err(e) = self.engine.put(step, BlockData { def, region: region.clone(), bytes }) {
            if Failures::is_storage(e.kind()) {
                self.failures.failed(FailedPut::new(var.to_string(), region, self.engine.failed_servers(), &e), local);
            }
            return Err(e);
        }
        self.failures.stored(var, &region, local);
        self.put.entry(var.to_string()).or_default().insert(region);
        Ok(())
    }

    /// Sends the coalesced small blocks of the open step as one batch. If it cannot be stored
    /// (full or failed servers), each of its blocks becomes a failed put of the step (and may be
    /// put again); any other refusal (the step was committed by another writer meanwhile) keeps
    /// them for the next try, which meets it again: a step never ends without them.
    fn send_small(&mut self) -> Result<()> {
        let Some(step) = self.step else { return Ok(()) };
        if self.small.is_empty() {
            return Ok(());
        }
        let pending = self.small.take();
        let blocks =
            pending.iter().map(|(var, region, bytes)| (step, BlockData { def: &self.vars[var], region: region.clone(), bytes })).collect();
        let Err(e) = self.engine.put_batch(blocks) else { return Ok(()) };
        if !Failures::is_storage(e.kind()) {
            self.small.put_back(pending);
            return Err(e);
        }
        let servers = self.engine.failed_servers();
        for (var, region, _) in pending {
            let local = self.vars[&var].is_local();
            if let Some(boxes) = self.put.get_mut(&var) {
                boxes.remove(&region);
                if boxes.is_empty() {
                    self.put.remove(&var);
                }
            }
            self.failures.failed(FailedPut::new(var, region, servers.clone(), &e), local);
        }
        Err(e)
    }

    /// Puts of the open step that could not be stored and were not put again since: the step
    /// does not end until they are (D²T sub-transactions).
    pub fn failed_puts(&self) -> &[FailedPut] {
        self.failures.list()
    }

    /// Appends trace records of `var` to the open step: `count[0]` records, each of extents
    /// `count[1..]`, with a different number per writer and per step. They are buffered and
    /// written every `trace_flush` steps as one write; a step with buffered records commits at
    /// that flush. `var` is defined as a local variable on first use if it is not yet.
    pub fn trace(&mut self, var: &str, dtype: DType, bytes: &[u8], count: &[u64]) -> Result<()> {
        let step = self.step.ok_or_else(|| {
            Error::Conflict(format!("trace of '{var}' outside a step; call begin_step (Python: `with f.step(n):`) first"))
        })?;
        if count.is_empty() {
            return Err(Error::InvalidArgument(format!("trace records of '{var}' need at least one axis (the records)")));
        }
        // Built (and so checked) now: a shape the flush would refuse must not block every later flush.
        let records = Region::new(vec![0; count.len()], count.to_vec())?;
        match self.vars.get(var) {
            Some(def) if !def.is_local() => {
                return Err(Error::InvalidArgument(format!(
                    "'{var}' is a global array; traces are per-writer records: trace under another name"
                )))
            }
            Some(_) => {}
            None => self.define(var, dtype, None)?,
        }
        let def = &self.vars[var];
        check_local_dims(def, count)?;
        if dtype != def.dtype {
            return Err(Error::InvalidArgument(format!(
                "dtype mismatch: trace '{var}' holds {} but the records are {dtype}; convert them (e.g. numpy astype) first",
                def.dtype
            )));
        }
        let want = count.iter().try_fold(dtype.size() as u64, |n, &c| n.checked_mul(c));
        if want != Some(bytes.len() as u64) {
            return Err(Error::InvalidArgument(format!(
                "trace of '{var}' has {} bytes but count {count:?} of {dtype} needs {want:?}",
                bytes.len()
            )));
        }
        if self.put.contains_key(var) {
            return Err(Error::Conflict(format!(
                "'{var}' already has this writer's block in step {step} (put, or traced and flushed); a step holds one block per writer"
            )));
        }
        self.traces.append(var, step, bytes, records)
    }

    /// Bytes of trace records waiting for the next flush.
    pub fn traced_bytes(&self) -> usize {
        self.traces.len()
    }

    /// Ends the open step. Returns whether this call committed it (this rank was the last); a
    /// step held for the trace flush is not committed yet.
    pub fn end_step(&mut self) -> Result<bool> {
        let step = self.step.ok_or_else(|| Error::Conflict("end_step without an open step; call begin_step first".into()))?;
        // A batch that cannot be stored becomes failed puts, reported just below.
        if let Err(e) = self.send_small() {
            if !Failures::is_storage(e.kind()) {
                return Err(e);
            }
        }
        if let Some(e) = self.failures.refusal(step) {
            return Err(e);
        }
        let part = StepPart { defs: self.vars.values().cloned().collect(), attrs: self.attrs.clone(), consume: self.consume.clone() };
        let ended = self.ended + 1;
        let waiting = !self.traces.is_empty() || !self.held.is_empty();
        if waiting && !ended.is_multiple_of(u64::from(self.trace_flush)) {
            self.step = None;
            self.ended = ended;
            self.consume.clear();
            self.held.push((step, part));
            self.last_ended = self.last_ended.max(Some(step));
            return Ok(false);
        }
        // Flush while the step still counts as open, so a failed write leaves it abortable.
        self.flush_traces()?;
        let committed = self.engine.end_step(step, &part)?;
        self.step = None;
        self.ended = ended;
        self.last_ended = self.last_ended.max(Some(step));
        if !committed {
            self.unsettled.insert(step);
        }
        Ok(committed)
    }

    /// The first step this rank ended that aborted since (a failed seal at another rank's end,
    /// another rank's abort), with why; steps found committed are forgotten. The bindings call
    /// it at every begin, end and close, so that every rank hears of a step that aborted.
    pub fn take_aborted(&mut self) -> Result<Option<(u64, String)>> {
        let steps: Vec<u64> = self.unsettled.iter().copied().collect();
        for step in steps {
            if let StepOutcome::Aborted(why) = self.settle(step)? {
                return Ok(Some((step, why)));
            }
        }
        Ok(None)
    }

    /// What became of `step`, forgotten once decided. `Unknown` is `Aborted` for a step this
    /// rank ended (its fragment was taken, so the record of its outcome is gone), else `Pending`
    /// (no rank of this session ended it yet).
    fn settle(&mut self, step: u64) -> Result<StepOutcome> {
        let outcome = match self.engine.outcome(step)? {
            StepOutcome::Unknown if self.unsettled.contains(&step) => {
                StepOutcome::Aborted("the control plane has no record of it any more (aborted long ago)".into())
            }
            StepOutcome::Unknown => StepOutcome::Pending,
            o => o,
        };
        if outcome != StepOutcome::Pending {
            self.unsettled.remove(&step);
        }
        Ok(outcome)
    }

    /// Waits up to `timeout` for `step` to commit: `Committed`, `Aborted(why)`, or `Pending`
    /// (also for a step no rank of this session ended yet) once the timeout passes.
    pub fn wait_committed(&mut self, step: u64, timeout: std::time::Duration) -> Result<StepOutcome> {
        let until = std::time::Instant::now() + timeout;
        loop {
            let outcome = self.settle(step)?;
            if outcome != StepOutcome::Pending {
                return Ok(outcome);
            }
            let left = until.saturating_duration_since(std::time::Instant::now());
            if left.is_zero() {
                return Ok(outcome);
            }
            std::thread::sleep(left.min(std::time::Duration::from_millis(50)));
        }
    }

    /// Writes all buffered trace records now as one write and publishes the steps that waited
    /// for them, in order. Records of the open step are written too; it commits when it ends.
    pub fn flush_traces(&mut self) -> Result<()> {
        if !self.traces.is_empty() {
            let blocks: Vec<_> = self
                .traces
                .pieces()
                .map(|(var, p, bytes)| (p.step, BlockData { def: &self.vars[var], region: p.region.clone(), bytes }))
                .collect();
            // Written records belong to their steps now; the open step must not get them again.
            let open: Vec<(String, Region)> =
                blocks.iter().filter(|(s, _)| Some(*s) == self.step).map(|(_, b)| (b.def.name.clone(), b.region.clone())).collect();
            self.engine.put_batch(blocks)?;
            for (var, r) in open {
                self.put.entry(var).or_default().insert(r);
            }
            self.traces.clear();
        }
        // In order, in one exchange where the engine can; a step that fails to publish stays
        // held with those after it, for a retry.
        if self.held.is_empty() {
            return Ok(());
        }
        let held = std::mem::take(&mut self.held);
        let (ended, error) = self.engine.end_steps(&held.iter().map(|(s, p)| (*s, p)).collect::<Vec<_>>());
        for ((step, _), committed) in held.iter().zip(&ended) {
            if !committed {
                self.unsettled.insert(*step);
            }
        }
        self.held = held.into_iter().skip(ended.len()).collect();
        error.map_or(Ok(()), Err)
    }

    /// Abandons the open step (its blocks and trace records never become visible); a no-op
    /// without one. Steps already ended stay held for the next flush.
    pub fn abort_step(&mut self) -> Result<()> {
        self.failures.clear();
        self.small.clear();
        match self.step.take() {
            Some(step) => {
                self.traces.drop_step(step);
                // A constant first put in the aborted step may be written in the next one.
                self.constants.retain(|_, s| *s != step);
                self.engine.abort_step(step)
            }
            None => Ok(()),
        }
    }

    /// Closes the writer: flushes buffered traces, which commits the steps that waited for them.
    /// A step still open is abandoned and reported, since its data is lost.
    pub fn close(mut self) -> Result<()> {
        self.finish()
    }

    /// Whether nothing is left to publish: no open step, no held step, no buffered record.
    pub fn is_finished(&self) -> bool {
        self.step.is_none() && self.held.is_empty() && self.traces.is_empty()
    }

    /// What [`Writer::close`] does, leaving the writer in place: on an error (a full server, a
    /// full disk) the held steps stay held and `finish` may be called again.
    pub fn finish(&mut self) -> Result<()> {
        let open = self.step;
        let aborted = self.abort_step();
        self.flush_traces()?;
        aborted?;
        match open {
            Some(step) => {
                Err(Error::Conflict(format!("step {step} was still open at close and was abandoned; end each step before closing")))
            }
            // Everything is published: streams and claims of the dataset may end. Best effort:
            // with the cluster unreachable nothing is lost, and they end by their timeout.
            None => match self.engine.close() {
                Err(e) if e.kind() == cairn_core::ErrorKind::Unavailable => Ok(()),
                r => r,
            },
        }
    }
}

impl Drop for Writer {
    /// A writer dropped without `close` still publishes the steps it ended (best effort: there is
    /// no one to report an error to).
    fn drop(&mut self) {
        if !self.held.is_empty() || !self.traces.is_empty() {
            let _ = self.abort_step();
            let _ = self.flush_traces();
        }
    }
}

/// A block of local variable `def` must have as many dimensions as it names.
fn check_local_dims(def: &VarDef, count: &[u64]) -> Result<()> {
    match &def.dims {
        Some(dims) if dims.len() != count.len() => Err(Error::InvalidArgument(format!(
            "block of '{}' has {} dimensions {count:?} but the variable names {} ({}); put blocks of that many dimensions",
            def.name,
            count.len(),
            dims.len(),
            dims.join(", ")
        ))),
        _ => Ok(()),
    }
}
