//! The compression pipeline of `cairn-core`, for `cairn.pack` and the benchmarks.

use crate::buffer::bytes_of;
use crate::errors::to_py;
use cairn_core::codec::{self, Element, Pipeline, Policy};
use numpy::PyUntypedArray;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

/// Compresses a uint8 array as `policy` says (`aware`, `zstd[:L]`, `gzip[:L]`, `raw`); `elem` is the
/// numpy dtype string of the values (`<f8`, `>i4`) when known. Returns `(spec, bytes)`.
#[pyfunction]
#[pyo3(signature = (data, elem, policy))]
pub(crate) fn compress<'py>(
    py: Python<'py>,
    data: &Bound<'py, PyUntypedArray>,
    elem: Option<&str>,
    policy: &str,
) -> PyResult<(String, Bound<'py, PyBytes>)> {
    let policy = Policy::parse(policy).map_err(to_py)?;
    // Element types the model does not know (strings, compounds) are compressed as bytes.
    let elem = elem.and_then(|e| Element::parse(e).ok());
    let src: &[u8] = bytes_of(data, false)?;
    let (pipe, out) = py.detach(|| codec::compress(src, elem, policy)).map_err(to_py)?;
    Ok((pipe.to_string(), PyBytes::new(py, &out)))
}

/// Decodes `data` (compressed by `spec`) into `out`, a writable uint8 array of the raw length.
/// Seconds for `repeat` encodings of `nbytes` random bytes into `k + m` shards: Cairn's encode
/// path (an object cut into data shards, parity computed) and the bare `reed-solomon-erasure`
/// call on the same bytes already cut, into buffers already allocated.
#[pyfunction]
pub(crate) fn erasure_times(py: Python<'_>, k: usize, m: usize, nbytes: usize, repeat: usize) -> PyResult<(f64, f64)> {
    py.detach(|| {
        let code = cairn_core::erasure::Code::new(k, m)?;
        let data: Vec<u8> = (0..nbytes).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
        let n = code.shard_len(nbytes);
        let mut padded = data.clone();
        padded.resize(n * k, 0);
        let shards: Vec<&[u8]> = padded.chunks(n).collect();
        let mut parity = vec![vec![0u8; n]; m];
        let mut best = (f64::MAX, f64::MAX);
        for _ in 0..repeat.max(1) {
            // As the writer does: the parity shards go out, then their buffers are reused.
            let t = std::time::Instant::now();
            let p = std::hint::black_box(code.parity(&data));
            cairn_core::erasure::recycle(p);
            best.0 = best.0.min(t.elapsed().as_secs_f64());
            let t = std::time::Instant::now();
            code.parity_of_shards(&shards, &mut parity)?;
            std::hint::black_box(&parity);
            best.1 = best.1.min(t.elapsed().as_secs_f64());
        }
        Ok::<_, cairn_core::Error>(best)
    })
    .map_err(to_py)
}

#[pyfunction]
pub(crate) fn decompress(py: Python<'_>, spec: &str, data: &Bound<'_, PyUntypedArray>, out: &Bound<'_, PyUntypedArray>) -> PyResult<()> {
    let pipe = Pipeline::parse(spec).map_err(to_py)?;
    let src: &[u8] = bytes_of(data, false)?;
    let dst = bytes_of(out, true)?;
    py.detach(|| pipe.decode_into(src, dst)).map_err(to_py)
}

/// crc32c of a uint8 array (hardware-accelerated), continuing from `seed`.
#[pyfunction]
#[pyo3(signature = (data, seed = 0))]
pub(crate) fn crc32c(py: Python<'_>, data: &Bound<'_, PyUntypedArray>, seed: u32) -> PyResult<u32> {
    let src: &[u8] = bytes_of(data, false)?;
    Ok(py.detach(|| ::cairn_core::checksum::crc_append(seed, src)))
}
