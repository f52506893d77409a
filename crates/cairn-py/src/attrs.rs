//! Attributes cross the boundary as JSON text: the Python side turns numpy values into JSON.

use crate::errors::to_py;
use cairn_core::attrs::Attrs;
use cairn_core::Error;
use pyo3::PyResult;

/// Parses the attributes of `owner` from a JSON object (none: empty).
pub(crate) fn parse(text: Option<&str>, owner: &str) -> PyResult<Attrs> {
    let Some(text) = text else { return Ok(Attrs::new()) };
    match serde_json::from_str::<serde_json::Value>(text) {
        Ok(serde_json::Value::Object(map)) => Ok(map),
        Ok(other) => Err(to_py(Error::InvalidArgument(format!("attributes of {owner} must be a mapping of names to values, not {other}")))),
        Err(e) => Err(to_py(Error::InvalidArgument(format!("attributes of {owner} are not JSON ({e})")))),
    }
}

/// The attributes as a JSON object.
pub(crate) fn to_json(attrs: &Attrs) -> String {
    serde_json::to_string(attrs).expect("attributes serialize")
}
