//! The cluster view through the control plane's log: a view change is a `SetView` entry proposed
//! at the leader (its epoch the current one's plus one), committed by a majority, and installed
//! by every meta replica as it applies it. Other servers learn it three ways, so none stays
//! behind for long: the leader pushes each committed view to every server (`view_changed`), a
//! server that restarts asks the others for theirs, and a server that gets a request placed by a
//! newer epoch than its own asks the others too. Every view a server holds was committed (or is
//! the cluster file's first), so taking the newest epoch any server reports is safe.

use crate::state::State;
use cairn_core::{Error, Result};
use cairn_meta::log::query;
use cairn_meta::raft::RaftLog;
use cairn_meta::{Cmd, MetaLog, Outcome};
use cairn_proto::cluster::ClusterFile;
use cairn_proto::message::{Request, Response};
use cairn_proto::ClusterView;
use std::sync::atomic::Ordering;
use std::sync::Arc;

/// Proposes the next view (leader only). Once committed it is installed here and pushed to the
/// other servers; the reply does not wait for them.
pub async fn set_view(state: &Arc<State>, view: ClusterView) -> Result<Response> {
    let log = crate::control::leader(state)?;
    log_first_view(state, log).await?;
    let before = state.view()?;
    match log.propose(Cmd::SetView { view: view.clone() }).await? {
        Outcome::ViewSet => {}
        other => return Err(Error::Corrupt(format!("the control plane answered a view change with {other:?}; please report this"))),
    }
    // Recovery is queued before the view is installed: whoever sees the new view also sees the
    // work it calls for (`cairn chaos` waits on both).
    state.recovery.view_changed(state, &before, &view);
    state.adopt(view.clone())?;
    push(state, view);
    Ok(Response::Ok)
}

/// Puts the cluster file's first view into the log if no view is there yet, so that every view
/// change is made against a replicated epoch.
pub async fn log_first_view(state: &State, log: &RaftLog) -> Result<()> {
    if query(log, |s| s.view().is_some()) {
        return Ok(());
    }
    let first = ClusterView::initial(&ClusterFile::load(&state.cluster_path)?);
    match log.propose(Cmd::SetView { view: first }).await {
        // Another leader's first view got there first: as good.
        Ok(_) => Ok(()),
        Err(e) if e.kind() == cairn_core::ErrorKind::Conflict => Ok(()),
        Err(e) => Err(e),
    }
}

/// Installs each view this meta replica applies, as it applies it.
pub async fn follow(state: Arc<State>, log: RaftLog) {
    let mut metrics = log.raft().metrics();
    let mut shutdown = state.shutdown.subscribe();
    loop {
        let here = state.view().map_or(0, |v| v.epoch);
        if let Some(v) = query(&log, |s| s.view().filter(|v| v.epoch > here).cloned()) {
            let _ = state.adopt(v);
        }
        tokio::select! {
            changed = metrics.changed() => if changed.is_err() { return },
            _ = shutdown.recv() => return,
        }
    }
}

/// Sends a committed view to every other server, in the background (best effort: one that
/// misses it asks when a request shows it is behind).
pub fn push(state: &Arc<State>, view: ClusterView) {
    let state = state.clone();
    tokio::spawn(async move {
        let others = view.servers.iter().map(|s| s.spec.id).filter(|id| *id != state.id);
        let req = Request::ViewChanged { view: view.clone() };
        futures_join(others.map(|id| {
            let (state, req) = (state.clone(), req.clone());
            async move {
                let _ = crate::peer::call(&state, id, &req).await;
            }
        }))
        .await;
    });
}

/// Asks every other server for its view and installs the newest, in the background; one
/// refresh at a time.
pub fn refresh(state: &Arc<State>) {
    if state.view_refreshing.swap(true, Ordering::AcqRel) {
        return;
    }
    let state = state.clone();
    tokio::spawn(async move {
        if let Ok(view) = state.view() {
            let others = view.servers.iter().map(|s| s.spec.id).filter(|id| *id != state.id);
            let found = futures_join(others.map(|id| {
                let state = state.clone();
                async move {
                    match crate::peer::call(&state, id, &Request::View).await {
                        Ok(Response::View { view }) => Some(view),
                        _ => None,
                    }
                }
            }))
            .await;
            if let Some(newest) = found.into_iter().flatten().max_by_key(|v| v.epoch) {
                let _ = state.adopt(newest);
            }
        }
        state.view_refreshing.store(false, Ordering::Release);
    });
}

/// Runs the futures concurrently (each peer call has its own deadline) and collects them.
async fn futures_join<T: Send + 'static>(futs: impl Iterator<Item = impl std::future::Future<Output = T> + Send + 'static>) -> Vec<T> {
    let mut set = tokio::task::JoinSet::new();
    futs.for_each(|f| {
        set.spawn(f);
    });
    let mut out = Vec::new();
    while let Some(r) = set.join_next().await {
        out.extend(r.ok());
    }
    out
}
