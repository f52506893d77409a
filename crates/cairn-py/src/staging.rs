//! Running a staging server in this process (`cairn serve`) and talking to a cluster's servers
//! (`cairn cluster status/stop`).

use crate::errors::to_py;
use pyo3::prelude::*;
use std::path::PathBuf;
use std::time::Duration;

/// Runs one staging server until it is shut down; blocks (without the GIL).
#[pyfunction]
#[pyo3(signature = (cluster, id, servers, spares, memory, bind, node, rack, timeout_s))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn serve(
    py: Python<'_>,
    cluster: PathBuf,
    id: u32,
    servers: u32,
    spares: u32,
    memory: u64,
    bind: String,
    node: String,
    rack: String,
    timeout_s: f64,
) -> PyResult<()> {
    let opts =
        cairn_server::ServeOptions { cluster, id, servers, spares, memory, bind, node, rack, timeout: Duration::from_secs_f64(timeout_s) };
    py.detach(|| cairn_server::serve(opts)).map_err(to_py)
}

/// Sends one request (JSON) to server `server` of the cluster in `cluster`; returns the reply as JSON.
#[pyfunction]
pub(crate) fn cluster_request(py: Python<'_>, cluster: PathBuf, server: u32, request: String) -> PyResult<String> {
    py.detach(|| cairn_client::staging::admin_request(&cluster, server, &request)).map_err(to_py)
}
