//! The staging servers' Reed–Solomon code (`cairn_core::erasure`), for the parity frames of
//! `cairn.pack` containers: shards in, shards out; grouping and checking stay in Python.

use crate::errors::to_py;
use cairn_core::erasure::Code;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

/// The `m` parity shards of `k` = `len(shards)` data shards of equal length.
#[pyfunction]
pub(crate) fn erasure_parity<'py>(py: Python<'py>, shards: Vec<Bound<'py, PyBytes>>, m: usize) -> PyResult<Vec<Bound<'py, PyBytes>>> {
    // Borrowed, not copied: `bytes` are immutable and `shards` keeps them alive.
    let refs: Vec<&[u8]> = shards.iter().map(|b| b.as_bytes()).collect();
    let n = refs.first().map_or(0, |r| r.len());
    let parity = py
        .detach(|| {
            let code = Code::new(refs.len(), m)?;
            let mut parity = vec![vec![0u8; n]; m];
            code.parity_of_shards(&refs, &mut parity)?;
            Ok::<_, cairn_core::Error>(parity)
        })
        .map_err(to_py)?;
    Ok(parity.iter().map(|p| PyBytes::new(py, p)).collect())
}

/// The `k` data shards, concatenated, from `k + m` shards of equal length (`None` where missing
/// or damaged): `NotFoundError` when fewer than `k` are left.
#[pyfunction]
pub(crate) fn erasure_decode<'py>(py: Python<'py>, shards: Vec<Option<Bound<'py, PyBytes>>>, k: usize) -> PyResult<Bound<'py, PyBytes>> {
    let mut shards: Vec<Option<Vec<u8>>> = shards.iter().map(|s| s.as_ref().map(|b| b.as_bytes().to_vec())).collect();
    let n = shards.iter().flatten().map(Vec::len).next().unwrap_or(0);
    let out = py
        .detach(|| {
            let code = Code::new(k, shards.len().saturating_sub(k))?;
            code.decode(&mut shards, n * k)
        })
        .map_err(to_py)?;
    Ok(PyBytes::new(py, &out))
}
