//! The cluster view through the control plane's log: a view change is a `SetView` entry proposed
//! at the leader (its epoch the current one's plus one), committed by a majority, and installed
//! by every meta replica as it applies it. Other servers learn it three ways, so none stays
//! behind for long: the leader pushes each committed view to every server (`view_changed`), a
//! server that restarts asks the others for theirs, and a server that gets a request placed by a
//! newer epoch than its own asks the others too. Every view a server holds was committed (or is
//! the cluster file's first), so taking the newest epoch any server reports is safe.

use super::gate::Gate;
use super::recovery::Recovery;
use super::worker::{Next, Worker};
use crate::state::State;
use crate::sync::lock;
use cairn_core::{Error, Result};
use cairn_meta::log::query;
use cairn_meta::raft::RaftLog;
use cairn_meta::{Cmd, MetaLog, Outcome};
use cairn_proto::cluster::ClusterFile;
use cairn_proto::message::{PeerRequest, Request, Response, ViewChange};
use cairn_proto::ClusterView;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// How this server learns and spreads views.
#[derive(Debug)]
pub struct Views {
    state: Arc<State>,
    gate: Arc<Gate>,
    recovery: Arc<Recovery>,
    /// A refresh of the view from the other servers is under way.
    refreshing: AtomicBool,
    /// The newest committed view not pushed yet, and the worker pushing views.
    to_push: Mutex<Option<ClusterView>>,
    pusher: Worker,
}

impl Views {
    /// The views of the server with `state`, its control plane on `gate`.
    pub fn new(state: Arc<State>, gate: Arc<Gate>, recovery: Arc<Recovery>) -> Views {
        Views { state, gate, recovery, refreshing: AtomicBool::new(false), to_push: Mutex::default(), pusher: Worker::default() }
    }

    /// Whether a refresh from the other servers is under way.
    pub fn refreshing(&self) -> bool {
        self.refreshing.load(Ordering::Acquire)
    }

    /// Installs a committed view if it is newer than this server's (see [`State::install`]);
    /// returns whether it was. The keyed values it holds follow the change.
    pub fn adopt(&self, next: ClusterView) -> Result<bool> {
        let Some(before) = self.state.install(next)? else { return Ok(false) };
        crate::control::rehome::view_changed(&self.state, before, self.state.view()?);
        Ok(true)
    }

    /// Proposes the next view (leader only). Once committed it is installed here and pushed to the
    /// other servers; the reply does not wait for them.
    pub async fn set_view(self: &Arc<Self>, view: ClusterView) -> Result<Response> {
        let state = &self.state;
        let log = &self.gate.leader()?;
        log_first_view(state, log).await?;
        let before = state.view()?;
        match log.propose(Cmd::SetView(ViewChange { view: view.clone() })).await? {
            Outcome::ViewSet => {}
            other => return Err(Error::Corrupt(format!("the control plane answered a view change with {other:?}; please report this"))),
        }
        // Recovery is queued before the view is installed: whoever sees the new view also sees the
        // work it calls for (`cairn chaos` waits on both).
        self.recovery.view_changed(&before, &view);
        self.adopt(view.clone())?;
        self.push(view);
        Ok(Response::Ok)
    }
}

/// Puts the cluster file's first view into the log if no view is there yet, so that every view
/// change is made against a replicated epoch.
pub async fn log_first_view(state: &State, log: &RaftLog) -> Result<()> {
    if query(log, |s| s.view().is_some()) {
        return Ok(());
    }
    let first = ClusterView::initial(&ClusterFile::load(&state.cluster_path)?);
    match log.propose(Cmd::SetView(ViewChange { view: first })).await {
        // Another leader's first view got there first: as good.
        Ok(_) => Ok(()),
        Err(e) if e.kind() == cairn_core::ErrorKind::Conflict => Ok(()),
        Err(e) => Err(e),
    }
}

impl Views {
    /// Installs each view this meta replica applies, as it applies it.
    pub async fn follow(self: Arc<Self>, log: RaftLog) {
        let mut metrics = log.raft().metrics();
        let mut shutdown = self.state.shutdown.subscribe();
        loop {
            let here = self.state.view().map_or(0, |v| v.epoch);
            if let Some(v) = query(&log, |s| s.view().filter(|v| v.epoch > here).cloned()) {
                let _ = self.adopt(v);
            }
            tokio::select! {
                changed = metrics.changed() => if changed.is_err() { return },
                _ = shutdown.recv() => return,
            }
        }
    }

    /// Sends a committed view to every other server, in the background (best effort: one that
    /// misses it asks when a request shows it is behind). Views committed while a push is under way
    /// coalesce: the pusher sends the newest next.
    pub fn push(self: &Arc<Self>, view: ClusterView) {
        {
            let mut next = lock(&self.to_push);
            if next.as_ref().is_none_or(|v| v.epoch < view.epoch) {
                *next = Some(view);
            }
        }
        let me = self.clone();
        self.pusher.run(self.state.shutdown.subscribe(), move || {
            let me = me.clone();
            async move {
                let Some(view) = lock(&me.to_push).take() else { return Next::Idle };
                let state = &me.state;
                let others = view.servers.iter().map(|s| s.spec.id).filter(|id| *id != state.id);
                let req = PeerRequest::ViewChanged { view: view.clone() };
                futures_join(others.map(|id| {
                    let (state, req) = (state.clone(), req.clone());
                    async move {
                        let _ = crate::peer::call(&state, id, &req).await;
                    }
                }))
                .await;
                Next::Again
            }
        });
    }

    /// Asks every other server for its view and installs the newest, in the background; one
    /// refresh at a time.
    pub fn refresh(self: &Arc<Self>) {
        if self.refreshing.swap(true, Ordering::AcqRel) {
            return;
        }
        let me = self.clone();
        tokio::spawn(async move {
            let state = &me.state;
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
                    let _ = me.adopt(newest);
                }
            }
            me.refreshing.store(false, Ordering::Release);
        });
    }
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
