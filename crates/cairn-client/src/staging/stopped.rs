//! Reading a stopped cluster's dataset: the steps it drained to disk, with a note of which.

use cairn_core::{Error, Result};

/// A reader of a stopped cluster's dataset: the steps it drained to disk, read as they are.
pub(super) fn reader(
    file: &std::path::Path,
    stopped: cairn_proto::cluster::StoppedFile,
    dataset: &str,
) -> Result<Box<dyn crate::engine::ReadEngine>> {
    let Some(drain) = stopped.drain else {
        return Err(Error::Unavailable(format!(
            "the cluster of {} is stopped and drained nothing to disk: its steps are gone; start a cluster with `cairn cluster \
             start --file {}`",
            file.display(),
            file.display()
        )));
    };
    let layout = crate::file::Layout::new(&drain.path, dataset);
    let cadence = drain.every.map_or("the steps its automatic cadence chose".to_string(), |e| {
        if e <= 1 {
            "every step".to_string()
        } else {
            format!("every {e} steps: 0, {e}, {}, …", 2 * e)
        }
    });
    let note = format!(
        "the cluster of {} is stopped: only the steps it drained to {} are there ({cadence})",
        file.display(),
        layout.root.display()
    );
    // Which of them are this cluster's to serve (a file stopped before clusters recorded their id: all).
    let owned = stopped.id.map(|id| super::owned::Owned::new(layout.clone(), id));
    let reader = crate::file::FileReader::open(layout).map_err(|e| match e.kind() {
        cairn_core::ErrorKind::NotFound => Error::NotFound(format!("no drained steps of {dataset}: {note}")),
        _ => e,
    })?;
    Ok(Box::new(Noted { inner: reader, note, owned }))
}

/// A read engine whose "not committed" errors carry a note (a stopped cluster's: which steps
/// its drain kept), serving only the steps that are the cluster's (see [`super::owned`]).
struct Noted<E> {
    inner: E,
    note: String,
    owned: Option<super::owned::Owned>,
}

impl<E: crate::engine::ReadEngine> Noted<E> {
    fn noted<T>(&self, r: Result<T>) -> Result<T> {
        r.map_err(|e| match e {
            Error::NotFound(m) => Error::NotFound(format!("{m}; {}", self.note)),
            e => e,
        })
    }

    /// `f` of `step`, when it is the cluster's to serve (another run's is refused by name).
    fn served<T>(&self, step: u64, f: impl FnOnce() -> Result<T>) -> Result<T> {
        if let Some(o) = &self.owned {
            if self.inner.steps()?.contains(&step) && !o.servable_alone(step)? {
                return Err(o.foreign(step));
            }
        }
        self.noted(f())
    }
}

impl<E: crate::engine::ReadEngine> crate::engine::ReadEngine for Noted<E> {
    fn steps(&self) -> Result<Vec<u64>> {
        let steps = self.inner.steps()?;
        let Some(o) = &self.owned else { return Ok(steps) };
        let mut served = Vec::with_capacity(steps.len());
        for s in steps {
            if o.servable_alone(s)? {
                served.push(s);
            }
        }
        Ok(served)
    }
    fn note(&self) -> Option<&str> {
        Some(&self.note)
    }
    fn step_vars(&self, step: u64) -> Result<std::collections::BTreeMap<String, cairn_core::index::VarDef>> {
        self.served(step, || self.inner.step_vars(step))
    }
    fn step_attrs(&self, step: u64) -> Result<cairn_core::attrs::Attrs> {
        self.served(step, || self.inner.step_attrs(step))
    }
    fn blocks(&self, var: &str, step: u64) -> Result<Vec<cairn_core::index::BlockRecord>> {
        self.served(step, || self.inner.blocks(var, step))
    }
    fn read_into(
        &self,
        step: u64,
        block: &cairn_core::index::BlockRecord,
        elem: usize,
        isect: &cairn_core::Region,
        dst: &cairn_core::Region,
        out: &mut [u8],
    ) -> Result<()> {
        self.noted(self.inner.read_into(step, block, elem, isect, dst, out))
    }
    fn release(&self, step: u64) -> Result<()> {
        self.inner.release(step)
    }
    fn discard_from(&self, from: u64) -> Result<u64> {
        self.inner.discard_from(from)
    }
    fn pending(&self) -> Result<Vec<(u64, u32, u32)>> {
        self.inner.pending()
    }
    fn claim(&self, claimer: &str, lease: std::time::Duration) -> Result<(Option<u64>, bool)> {
        self.inner.claim(claimer, lease)
    }
    fn renew(&self, claimer: &str, lease: std::time::Duration) -> Result<Vec<u64>> {
        self.inner.renew(claimer, lease)
    }
    fn unclaim(&self, claimer: &str) -> Result<()> {
        self.inner.unclaim(claimer)
    }
}
