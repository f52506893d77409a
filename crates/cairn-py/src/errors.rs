//! Python exceptions: one root (`cairn.CairnError`) and a class per error kind, each also a
//! subclass of the built-in that fits, so `except KeyError` works for unknown variables.

use cairn_core::{Error, ErrorKind};
use pyo3::exceptions::PyException;
use pyo3::prelude::*;
use pyo3::sync::PyOnceLock;
use pyo3::types::{PyDict, PyTuple, PyType};

/// (class name, built-in base, docstring), in the order of [`class_index`].
const CLASSES: [(&str, &str, &str); 9] = [
    ("NotFoundError", "KeyError", "A variable, step, writer or dataset does not exist."),
    ("AlreadyExistsError", "FileExistsError", "The thing to create exists already (a committed step, a dataset)."),
    ("ConflictError", "ValueError", "The request contradicts earlier writes (overlap, redefinition, step order)."),
    ("UnavailableError", "ConnectionError", "A resource is gone or full (server, disk, memory)."),
    ("CorruptError", "OSError", "Stored data failed a checksum or does not parse."),
    ("InvalidArgumentError", "ValueError", "The request is malformed (shape, dtype, box out of bounds)."),
    ("ConfigError", "ValueError", "The configuration is wrong (unknown engine or key, unreadable file)."),
    ("CapacityError", "MemoryError", "A staging server's memory limit would be exceeded; release old steps and retry."),
    (
        "DataLossError",
        "OSError",
        "Committed data is gone: every server holding a copy failed (more failures than the variable's redundancy).",
    ),
];

fn class_index(kind: ErrorKind) -> usize {
    match kind {
        ErrorKind::NotFound => 0,
        ErrorKind::AlreadyExists => 1,
        ErrorKind::Conflict => 2,
        ErrorKind::Unavailable | ErrorKind::StaleEpoch | ErrorKind::NotLeader | ErrorKind::Busy => 3,
        ErrorKind::Corrupt => 4,
        ErrorKind::InvalidArgument => 5,
        ErrorKind::Config => 6,
        ErrorKind::Capacity => 7,
        ErrorKind::DataLoss => 8,
    }
}

/// Name of the exception class of errors of `kind`.
pub(crate) fn class_name(kind: ErrorKind) -> &'static str {
    CLASSES[class_index(kind)].0
}

pyo3::create_exception!(cairn, CairnError, PyException, "Root of every error Cairn raises.");

static TYPES: PyOnceLock<Vec<Py<PyType>>> = PyOnceLock::new();

fn types(py: Python<'_>) -> PyResult<&Vec<Py<PyType>>> {
    TYPES.get_or_try_init(py, || {
        let builtins = py.import("builtins")?;
        let type_ = builtins.getattr("type")?;
        let root = py.get_type::<CairnError>();
        CLASSES
            .iter()
            .map(|(name, base, doc)| {
                let dict = PyDict::new(py);
                dict.set_item("__doc__", *doc)?;
                dict.set_item("__module__", "cairn")?;
                // The typed reason's snake_case name (`foreign_drain`, `released`, …), or None.
                dict.set_item("code", py.None())?;
                // Keep the plain message: KeyError would otherwise quote it.
                dict.set_item("__str__", py.get_type::<PyException>().getattr("__str__")?)?;
                let bases = PyTuple::new(py, [root.as_any(), &builtins.getattr(*base)?])?;
                Ok(type_.call1((*name, bases, dict))?.cast_into::<PyType>()?.unbind())
            })
            .collect()
    })
}

/// Adds the exception classes to the module.
pub(crate) fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    let py = m.py();
    m.add("CairnError", py.get_type::<CairnError>())?;
    for ((name, _, _), t) in CLASSES.iter().zip(types(py)?) {
        m.add(*name, t.bind(py))?;
    }
    Ok(())
}

/// Converts a Cairn error into the exception of its kind, its typed reason as `code`.
pub(crate) fn to_py(e: Error) -> PyErr {
    Python::attach(|py| match types(py) {
        Ok(t) => {
            let err = PyErr::from_type(t[class_index(e.kind())].bind(py).clone(), e.to_string());
            if let Some(reason) = e.reason() {
                if let Err(set) = err.value(py).setattr("code", reason.code()) {
                    return set;
                }
            }
            err
        }
        Err(err) => err,
    })
}
