//! `Claimer` and `StreamRegistration`: the client crate's claimers and releasing stream readers
//! (their heartbeats run in Rust threads); see `cairn._claims` and `cairn._queue`.

use crate::errors::to_py;
use crate::reader::clamped_seconds;
use cairn_client::claims::Claimer;
use cairn_client::stream::Registration;
use pyo3::prelude::*;
use std::sync::Mutex;

/// Native D²T claimer (see `cairn.Reader.claims`).
#[pyclass(name = "Claimer", module = "cairn._native")]
pub(crate) struct PyClaimer {
    inner: Mutex<Option<Claimer>>,
}

impl PyClaimer {
    pub(crate) fn new(c: Claimer) -> PyClaimer {
        PyClaimer { inner: Mutex::new(Some(c)) }
    }
}

#[pymethods]
impl PyClaimer {
    /// The next step leased to this claimer, or None (nothing left, or `timeout_s` passed
    /// without a step; None: no limit). Ctrl-C interrupts the wait.
    #[pyo3(signature = (timeout_s))]
    fn next(&self, py: Python<'_>, timeout_s: Option<f64>) -> PyResult<Option<u64>> {
        let timeout = timeout_s.map(|t| clamped_seconds(t, "timeout", 0.0, 1e9)).transpose()?;
        let mut caught: Option<PyErr> = None;
        let got = py.detach(|| {
            let guard = self.inner.lock().unwrap_or_else(|e| e.into_inner());
            let Some(c) = guard.as_ref() else { return Ok(None) };
            c.next(timeout, &mut || match Python::attach(|py| py.check_signals()) {
                Ok(()) => false,
                Err(e) => {
                    caught = Some(e);
                    true
                }
            })
        });
        if let Some(e) = caught {
            return Err(e);
        }
        got.map_err(to_py)
    }

    /// Ends the claimer: the steps it holds and did not consume go back to the others.
    fn end(&self, py: Python<'_>) -> PyResult<()> {
        let c = self.inner.lock().unwrap_or_else(|e| e.into_inner()).take();
        py.detach(|| c.map_or(Ok(()), Claimer::end)).map_err(to_py)
    }
}

/// Native registration of a releasing stream reader (see `cairn.Reader.stream`).
#[pyclass(name = "StreamRegistration", module = "cairn._native")]
pub(crate) struct PyRegistration {
    inner: Mutex<Registration>,
    start: Option<u64>,
}

impl PyRegistration {
    pub(crate) fn new(r: Registration) -> PyRegistration {
        let start = r.start();
        PyRegistration { inner: Mutex::new(r), start }
    }
}

#[pymethods]
impl PyRegistration {
    /// The first step this reader holds: its stream starts there.
    #[getter]
    fn start(&self) -> Option<u64> {
        self.start
    }

    /// Marks `step` passed.
    fn passed(&self, py: Python<'_>, step: u64) {
        py.detach(|| self.inner.lock().unwrap_or_else(|e| e.into_inner()).passed(step))
    }

    /// Ends the registration (again: nothing).
    fn leave(&self, py: Python<'_>) {
        py.detach(|| self.inner.lock().unwrap_or_else(|e| e.into_inner()).leave())
    }
}
