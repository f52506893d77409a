//! Attributes cross the boundary as JSON text: the Python side turns numpy values into JSON.

use crate::errors::to_py;
use cairn_core::attrs::Attrs;
use pyo3::PyResult;

/// Parses the attributes of `owner` from a JSON object (none: empty).
pub(crate) fn parse(text: Option<&str>, owner: &str) -> PyResult<Attrs> {
    text.map_or(Ok(Attrs::new()), |t| cairn_core::attrs::parse(t, owner)).map_err(to_py)
}

/// The attributes as a JSON object.
pub(crate) fn to_json(attrs: &Attrs) -> String {
    serde_json::to_string(attrs).expect("attributes serialize")
}
