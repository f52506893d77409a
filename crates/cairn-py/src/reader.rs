//! `Reader`: read handle over committed steps.

use crate::buffer::bytes_of;
use crate::errors::to_py;
use cairn_client::Reader;
use numpy::PyUntypedArray;
use pyo3::prelude::*;
use std::sync::Arc;

/// A block: (writer, offset, count, min, max, mean, checksum, raw bytes, stored bytes, codec).
/// A block: (writer, offset, count, min, max, mean, checksum, bytes, stored, codec, redundancy, state).
type BlockTuple =
    (u32, Vec<u64>, Vec<u64>, Option<f64>, Option<f64>, Option<f64>, u32, u64, u64, Option<String>, u32, (&'static str, &'static str));

/// A variable's description: (name, dtype name, shape or None, dims or None, attributes as JSON,
/// whether it is constant).
type VarTuple = (String, String, Option<Vec<u64>>, Option<Vec<String>>, String, bool);

/// Native read handle; see `cairn.Reader` for the documented API.
#[pyclass(name = "Reader", module = "cairn._native")]
pub(crate) struct PyReader {
    /// Shared with the heartbeats of its claimers and stream registrations.
    inner: Arc<Reader>,
}

#[pymethods]
impl PyReader {
    #[new]
    #[pyo3(signature = (name, config, overrides))]
    fn new(name: &str, config: Option<String>, overrides: Vec<(String, String)>) -> PyResult<Self> {
        let cfg = crate::config(config, overrides)?;
        Ok(PyReader { inner: Arc::new(Reader::open(name, &cfg).map_err(to_py)?) })
    }

    fn steps(&self, py: Python<'_>) -> PyResult<Vec<u64>> {
        py.detach(|| self.inner.steps()).map_err(to_py)
    }

    fn wait_step(&self, py: Python<'_>, step: u64, timeout_s: f64) -> PyResult<bool> {
        let t = clamped_seconds(timeout_s, "timeout", 0.0, 1e9)?;
        py.detach(|| self.inner.wait_step(step, t)).map_err(to_py)
    }

    #[pyo3(signature = (step, timeout_s))]
    fn wait_drained(&self, py: Python<'_>, step: Option<u64>, timeout_s: f64) -> PyResult<bool> {
        let t = clamped_seconds(timeout_s, "timeout", 0.0, 1e9)?;
        py.detach(|| self.inner.wait_drained(step, Some(t))).map_err(to_py)
    }

    fn release(&self, py: Python<'_>, step: u64) -> PyResult<()> {
        py.detach(|| self.inner.release(step)).map_err(to_py)
    }

    fn pending(&self, py: Python<'_>) -> PyResult<Vec<(u64, u32, u32)>> {
        py.detach(|| self.inner.pending()).map_err(to_py)
    }

    fn listing(&self, py: Python<'_>) -> PyResult<(Vec<u64>, bool)> {
        py.detach(|| self.inner.listing()).map_err(to_py)
    }

    /// Removes the dataset whole from its staging cluster; the committed steps it had.
    fn remove(&self, py: Python<'_>) -> PyResult<u64> {
        py.detach(|| self.inner.remove()).map_err(to_py)
    }

    /// Discards the committed steps from `step` on, on every level; how many went.
    fn discard_from(&self, py: Python<'_>, step: u64) -> PyResult<u64> {
        py.detach(|| self.inner.discard_from(step)).map_err(to_py)
    }

    /// Leases the lowest free committed step to `claimer` for `lease_s` seconds (one ask; see
    /// `Claimer`).
    fn claim(&self, py: Python<'_>, claimer: &str, lease_s: f64) -> PyResult<(Option<u64>, bool)> {
        let lease = clamped_seconds(lease_s, "lease", 0.001, 86_400.0)?;
        py.detach(|| self.inner.claim(claimer, lease)).map_err(to_py)
    }

    /// A new claimer whose leases last `lease_s` seconds, renewed in the background.
    fn claimer(&self, py: Python<'_>, lease_s: f64) -> PyResult<crate::claims::PyClaimer> {
        let lease = clamped_seconds(lease_s, "lease", 0.0, 1e9)?;
        let reader = self.inner.clone();
        let c = py.detach(|| cairn_client::claims::Claimer::start(reader, lease)).map_err(to_py)?;
        Ok(crate::claims::PyClaimer::new(c))
    }

    /// Registers a releasing stream reader at `start` (None: the oldest kept step).
    #[pyo3(signature = (start))]
    fn stream_register(&self, py: Python<'_>, start: Option<u64>) -> PyResult<crate::claims::PyRegistration> {
        let reader = self.inner.clone();
        let r = py.detach(|| cairn_client::stream::Registration::join(reader, start)).map_err(to_py)?;
        Ok(crate::claims::PyRegistration::new(r))
    }

    /// (name, dtype name, shape or None, dims or None, attributes JSON) of every variable.
    fn variables(&self, py: Python<'_>) -> PyResult<Vec<VarTuple>> {
        let vars = py.detach(|| self.inner.variables()).map_err(to_py)?;
        Ok(vars
            .into_values()
            .map(|v| (v.name, v.dtype.name().to_string(), v.shape, v.dims, crate::attrs::to_json(&v.attrs), v.constant))
            .collect())
    }

    /// The dataset's attributes (as of the last committed step) as JSON.
    fn attrs(&self, py: Python<'_>) -> PyResult<String> {
        Ok(crate::attrs::to_json(&py.detach(|| self.inner.attrs()).map_err(to_py)?))
    }

    // Calls that may read a step's index from the cluster let go of the GIL (see the writer's).
    fn var(&self, py: Python<'_>, var: &str, step: u64) -> PyResult<(String, Option<Vec<u64>>)> {
        let v = py.detach(|| self.inner.var(var, step)).map_err(to_py)?;
        Ok((v.dtype.name().to_string(), v.shape))
    }

    fn constant_step(&self, py: Python<'_>, var: &str) -> PyResult<u64> {
        py.detach(|| self.inner.constant_step(var)).map_err(to_py)
    }

    fn blocks(&self, py: Python<'_>, var: &str, step: u64) -> PyResult<Vec<BlockTuple>> {
        let (blocks, (level, states)) = py
            .detach(|| Ok::<_, cairn_client::Error>((self.inner.blocks(var, step)?, self.inner.block_states(var, step)?)))
            .map_err(to_py)?;
        Ok(blocks
            .into_iter()
            .zip(states)
            .map(|(b, state)| {
                let stored = if b.codec.is_some() { b.stored } else { b.len };
                (
                    b.writer,
                    b.region.offset,
                    b.region.count,
                    b.stats.min,
                    b.stats.max,
                    b.stats.mean,
                    b.checksum,
                    b.len,
                    stored,
                    b.codec,
                    level,
                    // Its state, and where it is read from: a drained block (or a file engine's)
                    // names its data file, one in memory its objects.
                    (state, if b.objects.is_empty() { "disk" } else { "memory" }),
                )
            })
            .collect())
    }

    fn get_into(
        &self,
        py: Python<'_>,
        var: &str,
        step: u64,
        offset: Vec<u64>,
        count: Vec<u64>,
        out: &Bound<'_, PyUntypedArray>,
    ) -> PyResult<()> {
        let out = bytes_of(out, true)?;
        py.detach(|| self.inner.get(var, step, &offset, &count, out)).map_err(to_py)
    }

    fn local_count(&self, py: Python<'_>, var: &str, step: u64, writer: u32) -> PyResult<Vec<u64>> {
        Ok(py.detach(|| self.inner.local_block(var, step, writer)).map_err(to_py)?.region.count)
    }

    fn trace_count(&self, py: Python<'_>, var: &str, step: u64, writer: u32) -> PyResult<(String, Vec<u64>)> {
        let (dtype, count) = py.detach(|| self.inner.trace_count(var, step, writer)).map_err(to_py)?;
        Ok((dtype.name().to_string(), count))
    }

    fn get_local_into(&self, py: Python<'_>, var: &str, step: u64, writer: u32, out: &Bound<'_, PyUntypedArray>) -> PyResult<()> {
        let out = bytes_of(out, true)?;
        py.detach(|| self.inner.get_local(var, step, writer, out)).map_err(to_py)
    }
}

/// `s` seconds, clamped to `lo..=hi`; NaN is an error (it would panic in `Duration`).
pub(crate) fn clamped_seconds(s: f64, what: &str, lo: f64, hi: f64) -> PyResult<std::time::Duration> {
    if s.is_nan() {
        return Err(to_py(cairn_core::Error::InvalidArgument(format!("{what} = NaN: give seconds from {lo} to {hi}"))));
    }
    Ok(std::time::Duration::from_secs_f64(s.clamp(lo, hi)))
}
