//! Operators' requests to a running cluster: replacing, adding and retiring servers by view
//! changes, and one administrative request as JSON (the `cairn cluster` commands).

use super::conn::Cluster;
use crate::config::Transport;
use cairn_core::{Error, Result};
use cairn_proto::message::{Request, ViewChange};
use cairn_proto::ClusterView;

/// Gives server `down`'s ring slot to `spare` (or the first spare) by a view change through the
/// control plane ([`ClusterView::replace`] of the newest view); returns the new view.
pub fn replace_server(cluster: &std::path::Path, down: u32, spare: Option<u32>, timeout: std::time::Duration) -> Result<ClusterView> {
    let c = Cluster::open(cluster, timeout, Transport::Auto)?;
    c.refresh_view();
    let view = c.view();
    let spare = match spare.or_else(|| view.spares.first().copied()) {
        Some(s) => s,
        None => return Err(Error::InvalidArgument(format!("view {} has no spare; start the cluster with --spares N", view.epoch))),
    };
    // A live server (one that answers) hands its slot over and retires, its pieces copied from
    // it first; a dead or hung one is replaced, and recovery rebuilds from the surviving pieces.
    let answers = view.is_live(down) && c.call(down, &Request::Status).is_ok();
    let next = if answers { view.hand_over(down, spare)? } else { view.replace(down, spare)? };
    c.coord(&Request::SetView(ViewChange { view: next.clone() }))?;
    Ok(next)
}

/// Adds the running servers `ids` (started with `--cluster` naming this cluster, their entries
/// published in `FILE.d/`) to the cluster as new ring slots, by a view change.
pub fn add_servers(cluster: &std::path::Path, ids: &[u32], timeout: std::time::Duration) -> Result<ClusterView> {
    let dir = cairn_proto::cluster::ClusterFile::entries_dir(cluster);
    let mut entries = Vec::with_capacity(ids.len());
    for id in ids {
        let path = dir.join(format!("server-{id}.json"));
        let text =
            std::fs::read(&path).map_err(|e| Error::io(format!("reading server {id}'s entry {}; is it running?", path.display()), e))?;
        let mut entry: cairn_proto::cluster::ServerEntry =
            serde_json::from_slice(&text).map_err(|e| Error::Corrupt(format!("server entry {}: {e}", path.display())))?;
        entry.spec.spare = false;
        entries.push(entry);
    }
    let c = Cluster::open(cluster, timeout, Transport::Auto)?;
    c.refresh_view();
    let next = c.view().add(entries)?;
    c.coord(&Request::SetView(ViewChange { view: next.clone() }))?;
    Ok(next)
}

/// Retires live server `id` by a view change: it loses its slot at once, recovery moves its
/// pieces to live servers, and the control plane removes it from the view when none is left.
pub fn retire_server(cluster: &std::path::Path, id: u32, timeout: std::time::Duration) -> Result<ClusterView> {
    let c = Cluster::open(cluster, timeout, Transport::Auto)?;
    c.refresh_view();
    let next = c.view().retire(id)?;
    c.coord(&Request::SetView(ViewChange { view: next.clone() }))?;
    Ok(next)
}

/// Sends one administrative request, given as JSON (`{"op": "status"}`, `objects`, `datasets`,
/// `view`, `set_view`, `shutdown`, `wait_drained`), to server `server` of the cluster in `cluster`
/// (`set_view`, `datasets` and `wait_drained` to the control plane's leader), within `timeout`;
/// returns the reply as JSON.
pub fn admin_request(cluster: &std::path::Path, server: u32, request: &str, timeout: std::time::Duration) -> Result<String> {
    let req: Request =
        serde_json::from_str(request).map_err(|e| Error::InvalidArgument(format!("request {request:?} does not parse: {e}")))?;
    let leader = matches!(req, Request::SetView(_) | Request::Datasets | Request::WaitDrained { .. });
    if !leader && !matches!(req, Request::Status | Request::Objects | Request::View | Request::Shutdown) {
        return Err(Error::InvalidArgument(format!(
            "{request:?} is not an administrative request (status, objects, datasets, view, set_view, shutdown, wait_drained)"
        )));
    }
    let c = Cluster::open(cluster, timeout, Transport::Auto)?;
    // A view change is a log entry, and the dataset list the log's state: both go to the control
    // plane's leader, whichever server is named (asked again through an election).
    let resp = match &req {
        Request::WaitDrained { timeout_ms, .. } => c.coord_waiting(&req, std::time::Duration::from_millis(*timeout_ms))?,
        _ if leader => c.coord(&req)?,
        _ => c.call(server, &req)?,
    };
    Ok(serde_json::to_string(&resp).expect("responses serialize"))
}
