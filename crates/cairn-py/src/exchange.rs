//! The MPI exchange of collective file writers: Rust asks, mpi4py (`cairn._mpi.Exchange`)
//! carries the bytes.

use cairn_client::file::{Exchange, Received};
use cairn_client::{Error, Result};
use numpy::PyUntypedArray;
use pyo3::prelude::*;

/// CPython's `PyBUF_READ` (memoryview flags; not exported by pyo3's ffi).
const PYBUF_READ: std::os::raw::c_int = 0x100;

/// A Python object with `send(dest, memoryview)`, `recv(src) -> numpy uint8 array`,
/// `start(at)` and `reserve(owner, len) -> int` (see `cairn._mpi.Exchange`).
pub(crate) struct PyExchange(pub(crate) Py<PyAny>);

/// A received array, borrowed as bytes for as long as it is held.
struct Held {
    _array: Py<PyAny>,
    ptr: *const u8,
    len: usize,
}

// SAFETY: the array's buffer is only read, and lives while `_array` holds a reference to it.
unsafe impl Send for Held {}

impl AsRef<[u8]> for Held {
    fn as_ref(&self) -> &[u8] {
        if self.len == 0 {
            return &[];
        }
        // SAFETY: see `Held`; `len` bytes from `ptr` are the array's contiguous buffer.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

fn failed(what: String, e: PyErr) -> Error {
    Error::Unavailable(format!("{what}: {e} (an MPI rank of this job failed?)"))
}

impl Exchange for PyExchange {
    fn send(&self, dest: u32, data: &[u8]) -> Result<()> {
        Python::attach(|py| {
            // A read-only view of `data` without copying; mpi4py's Send is done with it when
            // `send` returns.
            // SAFETY: `data` outlives the call; the view is read-only.
            let view = unsafe {
                let p = pyo3::ffi::PyMemoryView_FromMemory(data.as_ptr() as *mut _, data.len() as pyo3::ffi::Py_ssize_t, PYBUF_READ);
                Bound::from_owned_ptr_or_err(py, p)
            }
            .map_err(|e| failed(format!("sending {} bytes to rank {dest}", data.len()), e))?;
            let sent = self.0.call_method1(py, "send", (dest, &view));
            // The view must not outlive `data`: released here, whatever the exchange kept of it.
            let released = view.call_method0("release");
            sent.and(released).map(|_| ()).map_err(|e| failed(format!("sending {} bytes to rank {dest}", data.len()), e))
        })
    }

    fn start(&self, at: u64, ok: bool) -> Result<bool> {
        Python::attach(|py| {
            let all = self.0.call_method1(py, "start", (at, ok)).map_err(|e| failed("starting the group's offsets".into(), e))?;
            all.extract::<bool>(py).map_err(|e| failed("starting the group's offsets".into(), e))
        })
    }

    fn reserve(&self, owner: u32, len: u64) -> Result<u64> {
        Python::attach(|py| {
            let at = self
                .0
                .call_method1(py, "reserve", (owner, len))
                .map_err(|e| failed(format!("reserving {len} bytes at rank {owner}"), e))?;
            at.extract::<u64>(py).map_err(|e| failed(format!("reserving {len} bytes at rank {owner}"), e))
        })
    }

    fn recv(&self, src: u32) -> Result<Received> {
        Python::attach(|py| {
            let obj = self.0.call_method1(py, "recv", (src,)).map_err(|e| failed(format!("receiving from rank {src}"), e))?;
            let array = obj.bind(py).cast::<PyUntypedArray>().map_err(|e| failed(format!("receiving from rank {src}"), e.into()))?;
            let bytes = crate::buffer::bytes_of(array, false).map_err(|e| failed(format!("receiving from rank {src}"), e))?;
            let (ptr, len) = (bytes.as_ptr(), bytes.len());
            Ok(Box::new(Held { _array: obj, ptr, len }) as Received)
        })
    }
}
