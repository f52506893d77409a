//! `cairn._native`: PyO3 bindings over `cairn-client`. Thin by design: argument conversion and
//! GIL release only; checks and logic live in Rust, docstrings and ergonomics in `python/cairn`.
//!
//! # Layout
//! - `errors`: the exception classes and the one conversion from Cairn errors.
//! - `writer`: `Writer`, over `cairn_client::Writer`.
//! - `reader`: `Reader`, over `cairn_client::Reader`.
//! - `attrs`: attributes crossing as JSON text.
//! - `buffer`: borrowing numpy buffers without copying.
//! - `codec`: the compression pipeline (type-specific first pass, byte codec second).
//! - `erasure`: the Reed–Solomon code, for the parity frames of pack containers.
//! - `kv`: keyed values and sets on a staging cluster (`cairn.tasks`).
//! - `staging`: running a staging server, admin requests to a cluster.

mod attrs;
mod buffer;
mod claims;
mod codec;
mod erasure;
mod errors;
mod exchange;
mod kv;
mod reader;
mod staging;
mod writer;

use pyo3::prelude::*;

/// Builds a configuration from an optional file path and keyword overrides.
fn config(path: Option<String>, overrides: Vec<(String, String)>) -> PyResult<cairn_client::Config> {
    cairn_client::Config::load(path.as_deref().map(std::path::Path::new), &overrides).map_err(errors::to_py)
}

/// The resolved configuration (file, environment and overrides) as JSON, for the Python side's
/// embedded cluster launcher.
#[pyfunction]
#[pyo3(signature = (path, overrides))]
fn config_json(path: Option<String>, overrides: Vec<(String, String)>) -> PyResult<String> {
    Ok(serde_json::to_string(&config(path, overrides)?).expect("configs serialize"))
}

/// Whether the job asks the application to stop (see `cairn_client::halt`); `ConfigError` for a
/// variable that does not parse.
#[pyfunction]
fn halt_requested() -> PyResult<bool> {
    cairn_client::halt::requested().map_err(errors::to_py)
}

/// Once per process: why the halt file is stale (older than this process), else None.
#[pyfunction]
fn halt_stale_warning() -> Option<String> {
    cairn_client::halt::stale_warning()
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add("LEASE_RANGE", cairn_client::claims::LEASE_RANGE)?;
    m.add_class::<writer::PyWriter>()?;
    m.add_class::<reader::PyReader>()?;
    m.add_class::<claims::PyClaimer>()?;
    m.add_class::<claims::PyRegistration>()?;
    m.add_class::<kv::PyKvStore>()?;
    m.add_function(wrap_pyfunction!(config_json, m)?)?;
    m.add_function(wrap_pyfunction!(halt_requested, m)?)?;
    m.add_function(wrap_pyfunction!(halt_stale_warning, m)?)?;
    m.add_function(wrap_pyfunction!(codec::compress, m)?)?;
    m.add_function(wrap_pyfunction!(codec::decompress, m)?)?;
    m.add_function(wrap_pyfunction!(codec::crc32c, m)?)?;
    m.add_function(wrap_pyfunction!(codec::erasure_times, m)?)?;
    m.add_function(wrap_pyfunction!(erasure::erasure_parity, m)?)?;
    m.add_function(wrap_pyfunction!(erasure::erasure_decode, m)?)?;
    m.add_function(wrap_pyfunction!(staging::serve, m)?)?;
    m.add_function(wrap_pyfunction!(staging::cluster_request, m)?)?;
    m.add_function(wrap_pyfunction!(staging::cluster_replace, m)?)?;
    m.add_function(wrap_pyfunction!(staging::cluster_add, m)?)?;
    m.add_function(wrap_pyfunction!(staging::cluster_retire, m)?)?;
    m.add_function(wrap_pyfunction!(staging::cluster_rewrite_servers, m)?)?;
    m.add_function(wrap_pyfunction!(staging::parse_size, m)?)?;
    m.add_function(wrap_pyfunction!(staging::parse_duration, m)?)?;
    m.add_function(wrap_pyfunction!(staging::load_topology, m)?)?;
    m.add_function(wrap_pyfunction!(staging::new_secret, m)?)?;
    m.add_function(wrap_pyfunction!(staging::cluster_start, m)?)?;
    m.add_function(wrap_pyfunction!(staging::cluster_stop, m)?)?;
    errors::register(m)
}
