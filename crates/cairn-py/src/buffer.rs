//! Borrowing a numpy array's memory as bytes, without copying.

use numpy::{PyArrayDescrMethods, PyUntypedArray, PyUntypedArrayMethods};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

/// A C-contiguous numpy array's bytes. The Python layer makes arrays contiguous and native-endian
/// before calling in, so this only checks.
// The array owns its memory, not the Python reference we borrow it through; `writable` is checked
// against the array's flags before a mutable view is handed out.
#[allow(clippy::mut_from_ref)]
pub(crate) fn bytes_of<'a>(a: &'a Bound<'_, PyUntypedArray>, writable: bool) -> PyResult<&'a mut [u8]> {
    if !a.is_c_contiguous() {
        return Err(PyValueError::new_err("array must be C-contiguous (use numpy.ascontiguousarray)"));
    }
    let raw = a.as_array_ptr();
    // SAFETY: `raw` is a live PyArrayObject (we hold a reference); `nbytes` bytes from `data` are
    // its contiguous buffer. Writability is checked from the flags before handing out a mutable slice.
    unsafe {
        if writable && (*raw).fields.flags & numpy::npyffi::NPY_ARRAY_WRITEABLE == 0 {
            return Err(PyValueError::new_err("output array is read-only"));
        }
        let n = a.len() * a.dtype().itemsize();
        if n == 0 {
            return Ok(&mut []);
        }
        Ok(std::slice::from_raw_parts_mut((*raw).fields.data as *mut u8, n))
    }
}
