//! Running a staging server in this process (`cairn serve`) and talking to a cluster's servers
//! (`cairn cluster status/stop`).

use crate::errors::to_py;
use pyo3::prelude::*;
use std::path::PathBuf;
use std::time::Duration;

/// A positive number of seconds as a duration.
pub(crate) fn seconds(s: f64) -> PyResult<Duration> {
    Duration::try_from_secs_f64(s)
        .ok()
        .filter(|d| !d.is_zero())
        .ok_or_else(|| to_py(cairn_core::Error::InvalidArgument(format!("timeout {s}: use a positive number of seconds"))))
}

/// Runs one staging server until it is shut down; blocks (without the GIL). `args` are the
/// flags of `cairn serve` (as for `cairn-server`) and `settings` the server keys of the
/// `[staging]` table, which flags override: both go through `cairn_server::ServeOptions`.
#[pyfunction]
#[pyo3(signature = (args, settings=None))]
pub(crate) fn serve(py: Python<'_>, args: Vec<String>, settings: Option<std::collections::BTreeMap<String, String>>) -> PyResult<()> {
    let settings = settings.unwrap_or_default();
    let opts = cairn_server::ServeOptions::parse(settings.iter().map(|(k, v)| (k.as_str(), v.as_str())), &args).map_err(to_py)?;
    let Some(opts) = opts else {
        println!("{}", cairn_server::settings::USAGE);
        return Ok(());
    };
    py.detach(|| cairn_server::serve(opts)).map_err(to_py)
}

/// Sends one request (JSON) to server `server` of the cluster in `cluster` within `timeout_s`;
/// returns the reply as JSON.
#[pyfunction]
#[pyo3(signature = (cluster, server, request, timeout_s=cairn_client::config::DEFAULT_TIMEOUT))]
pub(crate) fn cluster_request(py: Python<'_>, cluster: PathBuf, server: u32, request: String, timeout_s: f64) -> PyResult<String> {
    let timeout = seconds(timeout_s)?;
    py.detach(|| cairn_client::staging::admin_request(&cluster, server, &request, timeout)).map_err(to_py)
}

/// Gives server `down`'s slot to a spare through the control plane; returns the new view (JSON).
#[pyfunction]
#[pyo3(signature = (cluster, down, spare=None, timeout_s=cairn_client::config::DEFAULT_TIMEOUT))]
pub(crate) fn cluster_replace(py: Python<'_>, cluster: PathBuf, down: u32, spare: Option<u32>, timeout_s: f64) -> PyResult<String> {
    let timeout = seconds(timeout_s)?;
    let view = py.detach(|| cairn_client::staging::replace_server(&cluster, down, spare, timeout)).map_err(to_py)?;
    Ok(serde_json::to_string(&view).expect("views serialize"))
}

/// Adds running servers `ids` to the cluster as new slots; returns the new view (JSON).
#[pyfunction]
#[pyo3(signature = (cluster, ids, timeout_s=cairn_client::config::DEFAULT_TIMEOUT))]
pub(crate) fn cluster_add(py: Python<'_>, cluster: PathBuf, ids: Vec<u32>, timeout_s: f64) -> PyResult<String> {
    let timeout = seconds(timeout_s)?;
    let view = py.detach(|| cairn_client::staging::add_servers(&cluster, &ids, timeout)).map_err(to_py)?;
    Ok(serde_json::to_string(&view).expect("views serialize"))
}

/// Retires live server `id` (its pieces move, then it leaves the view); returns the new view (JSON).
#[pyfunction]
#[pyo3(signature = (cluster, id, timeout_s=cairn_client::config::DEFAULT_TIMEOUT))]
pub(crate) fn cluster_retire(py: Python<'_>, cluster: PathBuf, id: u32, timeout_s: f64) -> PyResult<String> {
    let timeout = seconds(timeout_s)?;
    let view = py.detach(|| cairn_client::staging::retire_server(&cluster, id, timeout)).map_err(to_py)?;
    Ok(serde_json::to_string(&view).expect("views serialize"))
}

/// Rewrites the server list of cluster file `cluster` (JSON entries; see
/// `cairn_proto::cluster::rewrite_servers`): mode, owner and group kept, a stopped file refused.
#[pyfunction]
pub(crate) fn cluster_rewrite_servers(cluster: PathBuf, servers_json: &str) -> PyResult<()> {
    let servers: Vec<cairn_proto::cluster::ServerEntry> = serde_json::from_str(servers_json)
        .map_err(|e| to_py(cairn_core::Error::InvalidArgument(format!("server entries do not parse: {e}"))))?;
    cairn_proto::cluster::rewrite_servers(&cluster, |s| *s = servers).map_err(to_py)
}

/// Bytes in a size such as "4GiB".
#[pyfunction]
pub(crate) fn parse_size(text: &str) -> PyResult<u64> {
    cairn_proto::cluster::parse_size(text).map_err(to_py)
}

/// Seconds in a duration such as "5s" or "250ms".
#[pyfunction]
pub(crate) fn parse_duration(text: &str) -> PyResult<f64> {
    cairn_proto::cluster::parse_duration(text).map(|d| d.as_secs_f64()).map_err(to_py)
}

/// (node, rack) of servers 0..n from a topology file (or defaults without one).
#[pyfunction]
#[pyo3(signature = (path, n))]
pub(crate) fn load_topology(path: Option<PathBuf>, n: u32) -> PyResult<Vec<(String, String)>> {
    cairn_proto::cluster::load_topology(path.as_deref(), n).map_err(to_py)
}

/// A new cluster secret (64 hex digits from the OS's random source).
#[pyfunction]
pub(crate) fn new_secret() -> PyResult<String> {
    cairn_proto::auth::new_secret().map_err(to_py)
}

/// Starts a local cluster whose servers run `command` (plus their flags and `extra`); returns
/// the server pids by id once every server answers.
#[pyfunction]
#[pyo3(signature = (file, servers, spares, topology, memory, host, timeout_s, command, extra))]
#[allow(clippy::too_many_arguments)]
pub(crate) fn cluster_start(
    py: Python<'_>,
    file: PathBuf,
    servers: u32,
    spares: u32,
    topology: Option<PathBuf>,
    memory: u64,
    host: String,
    timeout_s: f64,
    command: Vec<String>,
    extra: Vec<String>,
) -> PyResult<Vec<u32>> {
    use cairn_client::staging::local::{LaunchOptions, LocalCluster};
    let opts = LaunchOptions { file, servers, spares, topology, memory, host, timeout: seconds(timeout_s)?, command, extra };
    py.detach(|| LocalCluster::start(&opts)).map(|c| c.pids).map_err(to_py)
}

/// Stops the local cluster in `file` (see `cairn_client::staging::local::LocalCluster::stop`);
/// how many servers were running.
#[pyfunction]
pub(crate) fn cluster_stop(py: Python<'_>, file: PathBuf, timeout_s: f64) -> PyResult<u32> {
    let timeout = seconds(timeout_s)?;
    py.detach(|| cairn_client::staging::local::LocalCluster::stop(&file, timeout)).map_err(to_py)
}
