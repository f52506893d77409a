//! [`Writer`]: one rank's handle for writing steps. It checks every request (names, dtypes, boxes,
//! step order) before an engine sees it, so all engines and all languages behave the same.

use crate::config::{Config, EngineKind};
use crate::engine::{BlockData, WriteEngine};
use crate::file::{FileWriter, Layout};
use crate::staging::StagingWriter;
use cairn_core::index::VarDef;
use cairn_core::{DType, Error, Region, Result};
use std::collections::BTreeMap;

/// Writes named n-D arrays, step after step, as rank `rank` of `nranks`.
pub struct Writer {
    engine: Box<dyn WriteEngine>,
    vars: BTreeMap<String, VarDef>,
    rank: u32,
    nranks: u32,
    step: Option<u64>,
    /// Boxes this rank put in the open step, per variable (to refuse overlaps early).
    put: BTreeMap<String, Vec<Region>>,
}

impl std::fmt::Debug for Writer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Writer").field("rank", &self.rank).field("nranks", &self.nranks).field("step", &self.step).finish()
    }
}

impl Writer {
    /// Opens dataset `name` for writing with the engine `cfg` names. `append` adds steps to an
    /// existing dataset; otherwise it must hold no committed steps. `session` identifies this
    /// launch of the application: every rank of one launch passes the same value, and a restart
    /// passes a new one (see [`default_session`]), so a crashed run's leftovers never mix in.
    pub fn open(name: &str, cfg: &Config, rank: u32, nranks: u32, append: bool, session: &str) -> Result<Writer> {
        if nranks == 0 || rank >= nranks {
            return Err(Error::InvalidArgument(format!(
                "rank {rank} of {nranks} writers: rank must be in 0..nranks and nranks at least 1"
            )));
        }
        check_name(name)?;
        let engine: Box<dyn WriteEngine> = match cfg.engine {
            EngineKind::File => {
                Box::new(FileWriter::open(Layout::new(&cfg.file.path, name), rank, nranks, append, &cfg.file, session.to_string())?)
            }
            EngineKind::Staging => Box::new(StagingWriter::open(&cfg.staging, name, rank, nranks, append, session.to_string())?),
        };
        Ok(Writer { engine, vars: BTreeMap::new(), rank, nranks, step: None, put: BTreeMap::new() })
    }

    /// This writer's rank.
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// Defines a variable: a global array of `shape`, or a local (ragged) one when `shape` is None.
    /// Defining it again identically is allowed; differently is a conflict.
    pub fn define(&mut self, name: &str, dtype: DType, shape: Option<Vec<u64>>) -> Result<()> {
        let def = VarDef::new(name, dtype, shape)?;
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

    /// Opens step `step`. Its blocks become visible only when every rank has ended it.
    pub fn begin_step(&mut self, step: u64) -> Result<()> {
        if let Some(open) = self.step {
            return Err(Error::Conflict(format!("step {open} is still open; end it before beginning step {step}")));
        }
        if self.engine.is_committed(step)? {
            return Err(Error::AlreadyExists(format!(
                "step {step} is already committed; committed steps are immutable, write a new step number"
            )));
        }
        self.step = Some(step);
        self.put.clear();
        Ok(())
    }

    /// Puts a block: `bytes` (C order, little-endian) of `dtype` with extents `count`, at `offset`
    /// of a global variable, or (offset `None`) as this rank's block of a local variable.
    pub fn put(&mut self, var: &str, dtype: DType, bytes: &[u8], offset: Option<&[u64]>, count: &[u64]) -> Result<()> {
        let step = self
            .step
            .ok_or_else(|| Error::Conflict(format!("put of '{var}' outside a step; call begin_step (Python: `with f.step(n):`) first")))?;
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
            (None, None) => Region::new(vec![0; count.len()], count.to_vec())?,
        };
        let want = region.volume().checked_mul(dtype.size() as u64);
        if want != Some(bytes.len() as u64) {
            return Err(Error::InvalidArgument(format!(
                "block of '{var}' has {} bytes but count {count:?} of {dtype} needs {want:?}",
                bytes.len()
            )));
        }
        let mine = self.put.get(var).map(Vec::as_slice).unwrap_or_default();
        if def.is_local() && !mine.is_empty() {
            return Err(Error::Conflict(format!("local variable '{var}' was already put in step {step} by this writer")));
        }
        if let Some(prev) = mine.iter().find(|p| p.intersect(&region).is_some()) {
            return Err(Error::Conflict(format!(
                "block of '{var}' at offset {:?} count {:?} overlaps one this writer already put in step {step} \
                 (offset {:?} count {:?})",
                region.offset, region.count, prev.offset, prev.count
            )));
        }
        // Recorded only once stored, so a put refused for lack of space can be retried.
        self.engine.put(step, BlockData { def, region: region.clone(), bytes })?;
        self.put.entry(var.to_string()).or_default().push(region);
        Ok(())
    }

    /// Ends the open step. Returns whether this call committed it (this rank was the last).
    pub fn end_step(&mut self) -> Result<bool> {
        let step = self.step.take().ok_or_else(|| Error::Conflict("end_step without an open step; call begin_step first".into()))?;
        let defs: Vec<VarDef> = self.vars.values().cloned().collect();
        self.engine.end_step(step, &defs)
    }

    /// Abandons the open step (its blocks never become visible); a no-op without one.
    pub fn abort_step(&mut self) -> Result<()> {
        match self.step.take() {
            Some(step) => self.engine.abort_step(step),
            None => Ok(()),
        }
    }

    /// Closes the writer. A step still open is abandoned and reported, since its data is lost.
    pub fn close(mut self) -> Result<()> {
        match self.step {
            Some(step) => {
                self.abort_step()?;
                Err(Error::Conflict(format!("step {step} was still open at close and was abandoned; end each step before closing")))
            }
            None => Ok(()),
        }
    }
}

/// The session of this launch as the MPI or batch launcher names it (PMIx namespace, Open MPI's
/// HNP URI, Slurm job and step), or empty when started by hand: then ranks started separately
/// should agree on a session themselves (Python: `comm=` or `session=`).
pub fn default_session() -> String {
    let env = |k: &str| std::env::var(k).ok().filter(|v| !v.is_empty());
    env("PMIX_NAMESPACE")
        .or_else(|| env("OMPI_MCA_orte_hnp_uri"))
        .or_else(|| env("PMI_KVSNAME"))
        .or_else(|| Some(format!("slurm-{}.{}", env("SLURM_JOB_ID")?, env("SLURM_STEP_ID").unwrap_or_default())))
        .unwrap_or_default()
}

pub(crate) fn unknown_var<'a>(var: &str, known: impl Iterator<Item = &'a String>) -> Error {
    let known: Vec<&str> = known.map(String::as_str).collect();
    Error::NotFound(format!("unknown variable '{var}'; defined: [{}]", known.join(", ")))
}

pub(crate) fn check_name(name: &str) -> Result<()> {
    if name.is_empty() || name.contains('/') || name == "." || name == ".." {
        return Err(Error::InvalidArgument(format!("invalid dataset name {name:?}: use a plain name without '/'")));
    }
    Ok(())
}
