//! `Writer`: one rank's write handle.

use crate::buffer::bytes_of;
use crate::errors::to_py;
use crate::exchange::PyExchange;
use cairn_client::file::Collective;
use cairn_client::{DType, Writer};
use numpy::PyUntypedArray;
use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;
use std::sync::Mutex;

/// A put that could not be stored: (variable, offset, count, servers, error, its exception class).
type FailedTuple = (String, Vec<u64>, Vec<u64>, Vec<u32>, String, &'static str);

/// Native write handle; see `cairn.Writer` for the documented API.
#[pyclass(name = "Writer", module = "cairn._native")]
pub(crate) struct PyWriter {
    inner: Mutex<Option<Writer>>,
}

impl PyWriter {
    fn with<T>(&self, f: impl FnOnce(&mut Writer) -> cairn_client::Result<T>) -> PyResult<T> {
        let mut g = self.inner.lock().unwrap();
        let w = g.as_mut().ok_or_else(|| PyRuntimeError::new_err("the writer is closed"))?;
        f(w).map_err(to_py)
    }
}

#[pymethods]
impl PyWriter {
    #[new]
    /// With `exchange` (a `cairn._mpi.Exchange`) and `nodes` (each rank's node id), the ranks
    /// write collectively (the file engine aggregates, see `[file] aggregation`).
    #[pyo3(signature = (name, config, overrides, rank, nranks, append, session, exchange=None, nodes=None))]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        name: &str,
        config: Option<String>,
        overrides: Vec<(String, String)>,
        rank: u32,
        nranks: u32,
        append: bool,
        session: Option<String>,
        exchange: Option<Py<PyAny>>,
        nodes: Option<Vec<u32>>,
    ) -> PyResult<Self> {
        let cfg = crate::config(config, overrides)?;
        let session = match session {
            Some(s) => s,
            None => cairn_client::session::default_session(rank, nranks).map_err(to_py)?,
        };
        let mut w = match (exchange, nodes) {
            (Some(ex), Some(nodes)) => {
                let group = Collective { exchange: Box::new(PyExchange(ex)), nodes };
                // Collective opens may wait on other ranks: without the GIL.
                py.detach(|| Writer::open_collective(name, &cfg, rank, nranks, append, &session, group))
            }
            _ => Writer::open(name, &cfg, rank, nranks, append, &session),
        }
        .map_err(to_py)?;
        // Python reads a step's failed puts at its end (`StepError`), so small puts may go later.
        w.coalesce_small_puts();
        Ok(PyWriter { inner: Mutex::new(Some(w)) })
    }

    /// Defines a variable; without `redundancy` it gets the cluster's default level. `attrs` is
    /// a JSON object; `constant` makes it step-invariant.
    #[pyo3(signature = (name, dtype, shape, redundancy=None, dims=None, attrs=None, constant=false))]
    #[allow(clippy::too_many_arguments)] // Python's keyword arguments, one each
    fn define(
        &self,
        name: &str,
        dtype: &str,
        shape: Option<Vec<u64>>,
        redundancy: Option<u32>,
        dims: Option<Vec<String>>,
        attrs: Option<&str>,
        constant: bool,
    ) -> PyResult<()> {
        let dtype = DType::parse(dtype).map_err(to_py)?;
        let meta = crate::attrs::parse(attrs, &format!("variable '{name}'"))?;
        let def = cairn_core::index::VarDef::new(name, dtype, shape)
            .and_then(|d| d.with_meta(dims, meta))
            .and_then(|d| d.with_constant(constant))
            .map_err(to_py)?;
        self.with(|w| {
            let level = redundancy.unwrap_or_else(|| w.default_redundancy());
            w.define_var(def.with_redundancy(level))
        })
    }

    /// Sets the dataset's attributes (a JSON object), replacing those set before.
    fn set_attrs(&self, attrs: &str) -> PyResult<()> {
        let attrs = crate::attrs::parse(Some(attrs), "the dataset")?;
        self.with(|w| w.set_attrs(attrs))
    }

    /// The dataset's attributes as JSON.
    fn attrs(&self) -> PyResult<String> {
        self.with(|w| Ok(crate::attrs::to_json(w.attrs())))
    }

    #[getter]
    fn next_step(&self) -> PyResult<u64> {
        self.with(|w| Ok(w.next_step()))
    }

    /// The newest step this rank ended, or None.
    #[getter]
    fn last_ended(&self) -> PyResult<Option<u64>> {
        self.with(|w| Ok(w.last_ended()))
    }

    /// Whether the job asks every rank to stop before `step`: the first rank to ask fixes it.
    fn halt_requested_all(&self, py: Python<'_>, step: u64) -> PyResult<bool> {
        py.detach(|| self.with(|w| w.halt_requested_all(step)))
    }

    // Every call that may reach a server lets go of the GIL: held through a control-plane
    // election, it stalled every other Python thread of the process (a chaos run's readers
    // waited out the writers' elections).
    fn begin_step(&self, py: Python<'_>, step: u64) -> PyResult<()> {
        py.detach(|| self.with(|w| w.begin_step(step)))
    }

    #[pyo3(signature = (var, dtype, data, offset))]
    fn put(&self, py: Python<'_>, var: &str, dtype: &str, data: &Bound<'_, PyUntypedArray>, offset: Option<Vec<u64>>) -> PyResult<()> {
        let dtype = DType::parse(dtype).map_err(to_py)?;
        let count: Vec<u64> = numpy::PyUntypedArrayMethods::shape(data).iter().map(|&n| n as u64).collect();
        let bytes: &[u8] = bytes_of(data, false)?;
        py.detach(|| self.with(|w| w.put(var, dtype, bytes, offset.as_deref(), &count)))
    }

    fn trace(&self, py: Python<'_>, var: &str, dtype: &str, data: &Bound<'_, PyUntypedArray>) -> PyResult<()> {
        let dtype = DType::parse(dtype).map_err(to_py)?;
        let count: Vec<u64> = numpy::PyUntypedArrayMethods::shape(data).iter().map(|&n| n as u64).collect();
        let bytes: &[u8] = bytes_of(data, false)?;
        py.detach(|| self.with(|w| w.trace(var, dtype, bytes, &count)))
    }

    fn flush_traces(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.with(|w| w.flush_traces()))
    }

    fn traced_bytes(&self) -> PyResult<usize> {
        self.with(|w| Ok(w.traced_bytes()))
    }

    fn end_step(&self, py: Python<'_>) -> PyResult<bool> {
        py.detach(|| self.with(|w| w.end_step()))
    }

    /// Each put of the open step that could not be stored.
    fn failed_puts(&self) -> PyResult<Vec<FailedTuple>> {
        self.with(|w| {
            Ok(w.failed_puts()
                .iter()
                .map(|f| {
                    let class = crate::errors::class_name(f.kind);
                    (f.var.clone(), f.region.offset.clone(), f.region.count.clone(), f.servers.clone(), f.error.clone(), class)
                })
                .collect())
        })
    }

    fn consume(&self, py: Python<'_>, datasets: Vec<String>) -> PyResult<()> {
        py.detach(|| self.with(|w| w.consume(datasets)))
    }

    fn abort_step(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| self.with(|w| w.abort_step()))
    }

    /// The first step this rank ended that aborted since, with why (see `Writer::take_aborted`).
    fn take_aborted(&self, py: Python<'_>) -> PyResult<Option<(u64, String)>> {
        py.detach(|| self.with(|w| w.take_aborted()))
    }

    /// Waits up to `timeout_s` for `step` (default: the newest the drain's cadence names) to be
    /// drained to disk; whether it is.
    #[pyo3(signature = (step, timeout_s))]
    fn wait_drained(&self, py: Python<'_>, step: Option<u64>, timeout_s: f64) -> PyResult<bool> {
        let timeout = crate::reader::clamped_seconds(timeout_s, "timeout", 0.0, 1e9)?;
        py.detach(|| self.with(|w| w.wait_drained(step, Some(timeout))))
    }

    /// Sets the dataset's queue limit (0: none) and policy ("block" or "discard_oldest").
    fn define_queue(&self, py: Python<'_>, limit: u64, policy: &str) -> PyResult<()> {
        py.detach(|| self.with(|w| w.define_queue(limit, policy)))
    }

    /// Waits up to `timeout_s` for `step` to commit: ("committed" | "pending" | "aborted", why).
    fn wait_committed(&self, py: Python<'_>, step: u64, timeout_s: f64) -> PyResult<(String, String)> {
        let timeout = crate::reader::clamped_seconds(timeout_s, "timeout", 0.0, 1e9)?;
        py.detach(|| {
            self.with(|w| {
                Ok(match w.wait_committed(step, timeout)? {
                    cairn_client::engine::StepOutcome::Committed => ("committed".into(), String::new()),
                    cairn_client::engine::StepOutcome::Aborted(why) => ("aborted".into(), why),
                    _ => ("pending".into(), String::new()),
                })
            })
        })
    }

    fn close(&self, py: Python<'_>) -> PyResult<()> {
        py.detach(|| {
            let mut g = self.inner.lock().unwrap();
            let Some(w) = g.as_mut() else { return Ok(()) };
            let done = w.finish();
            // Kept after a failed flush, so that close can be retried without losing held steps.
            if done.is_ok() || w.is_finished() {
                g.take();
            }
            done.map_err(to_py)
        })
    }
}
