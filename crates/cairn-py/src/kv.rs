//! `KvStore`: keyed values and sets on a staging cluster, the store behind `cairn.tasks`.

use crate::errors::to_py;
use cairn_client::staging::KvStore;
use pyo3::prelude::*;
use pyo3::types::PyBytes;
use std::path::PathBuf;

/// Native keyed-value client; see `cairn.tasks.StagingStore` for the documented API.
#[pyclass(name = "KvStore", module = "cairn._native", frozen)]
pub(crate) struct PyKvStore {
    inner: KvStore,
}

#[pymethods]
impl PyKvStore {
    #[new]
    #[pyo3(signature = (cluster, timeout_s=cairn_client::config::DEFAULT_TIMEOUT))]
    fn new(cluster: PathBuf, timeout_s: f64) -> PyResult<Self> {
        Ok(PyKvStore { inner: KvStore::open(&cluster, crate::staging::seconds(timeout_s)?).map_err(to_py)? })
    }

    /// Sets each key to its bytes (or, with `member`, adds them to the set at the key).
    #[pyo3(signature = (items, member=false))]
    fn put_many(&self, py: Python<'_>, items: Vec<(String, Bound<'_, PyBytes>)>, member: bool) -> PyResult<()> {
        let pairs: Vec<(&str, &[u8])> = items.iter().map(|(k, v)| (k.as_str(), v.as_bytes())).collect();
        py.detach(|| self.inner.put_many(&pairs, member)).map_err(to_py)
    }

    /// Per key: `[value]` or `[]` when absent; with `members`, every member of the set.
    #[pyo3(signature = (keys, members=false))]
    fn get_many<'py>(&self, py: Python<'py>, keys: Vec<String>, members: bool) -> PyResult<Vec<Vec<Bound<'py, PyBytes>>>> {
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        let got = py.detach(|| self.inner.get_many(&refs, members)).map_err(to_py)?;
        Ok(got.into_iter().map(|vals| vals.into_iter().map(|v| PyBytes::new(py, &v)).collect()).collect())
    }

    /// Compare-and-set through the control plane: (took, version now).
    #[pyo3(signature = (key, expect, value))]
    fn cas(&self, py: Python<'_>, key: String, expect: Option<u64>, value: Option<Vec<u8>>) -> PyResult<(bool, u64)> {
        py.detach(|| self.inner.cas(&key, expect, value.as_deref())).map_err(to_py)
    }

    /// A compare-and-set value: (version, bytes), or None when absent.
    fn cas_get<'py>(&self, py: Python<'py>, key: String) -> PyResult<Option<(u64, Bound<'py, PyBytes>)>> {
        let got = py.detach(|| self.inner.cas_get(&key)).map_err(to_py)?;
        Ok(got.map(|(v, b)| (v, PyBytes::new(py, &b))))
    }

    /// Deletes `keys` (with `prefix`: every key starting with one of them); returns how many.
    #[pyo3(signature = (keys, prefix=false))]
    fn delete(&self, py: Python<'_>, keys: Vec<String>, prefix: bool) -> PyResult<u64> {
        let refs: Vec<&str> = keys.iter().map(String::as_str).collect();
        py.detach(|| self.inner.delete(&refs, prefix)).map_err(to_py)
    }
}
