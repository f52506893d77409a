//! Failure detection (CoREC §3.4): the control plane's leader probes every other member (a
//! `view` request, within half the failure timeout) four times per timeout. A member silent for
//! longer than `failure_timeout` (dead, hung, or cut off) is declared down in a new view epoch,
//! and the first answering spare takes its slot in the same view change, so placement moves
//! nothing else. A down server that answers again is sent the current view, which wipes its
//! memory ([`crate::state::State::install`]); once it reports that view, it rejoins as a new member
//! (its slot back if no spare took it, else a spare). A newly elected leader counts silence from
//! its election, so a member is never declared down for a previous leader's missing probes.

use super::gate::Gate;
use super::recovery::Recovery;
use super::views::Views;
use super::worker::{Next, Worker};
use crate::state::State;
use crate::sync::lock;
use cairn_proto::message::{PeerRequest, Request, Response};
use cairn_proto::ClusterView;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The failure detector of a meta server: probes only while it leads.
#[derive(Debug)]
pub struct Detector {
    state: Arc<State>,
    gate: Arc<Gate>,
    views: Arc<Views>,
    recovery: Arc<Recovery>,
    worker: Worker,
    /// When each member last answered, and since when this server leads.
    heard: Mutex<(HashMap<u32, Instant>, Option<Instant>)>,
}

impl Detector {
    /// The detector of the server with `state`.
    pub fn new(state: Arc<State>, gate: Arc<Gate>, views: Arc<Views>, recovery: Arc<Recovery>) -> Detector {
        Detector { state, gate, views, recovery, worker: Worker::default(), heard: Mutex::default() }
    }

    /// Probes four times per failure timeout until shutdown.
    pub fn start(self: &Arc<Self>) {
        let period = (self.state.limits.failure_timeout / 4).max(Duration::from_millis(20));
        let me = self.clone();
        self.worker.start(self.state.shutdown.subscribe(), move || {
            let me = me.clone();
            async move {
                tokio::time::sleep(period).await;
                me.round().await;
                Next::Again
            }
        });
    }

    async fn round(&self) {
        let state = &self.state;
        let timeout = state.limits.failure_timeout;
        let Ok(view) = (if self.gate.leader().is_ok() { state.view() } else { Err(cairn_core::Error::Unavailable(String::new())) }) else {
            *lock(&self.heard) = (HashMap::new(), None);
            return;
        };
        let since = *lock(&self.heard).1.get_or_insert_with(Instant::now);
        let epochs = probe(state, &view, timeout / 2).await;
        let now = Instant::now();
        let heard = {
            let mut h = lock(&self.heard);
            for id in epochs.keys() {
                h.0.insert(*id, now);
            }
            h.0.clone()
        };
        let silent = |id| now.duration_since(heard.get(&id).copied().unwrap_or(since)) > timeout;
        if let Some(next) = next_view(&view, state.id, &epochs, silent, |id| self.recovery.still_named(id)) {
            let what = describe(&view, &next);
            match self.views.set_view(next).await {
                Ok(_) => tracing::info!(server = state.id, "{what}"),
                Err(e) => tracing::warn!(server = state.id, "could not record that {what}: {e}"),
            }
            return;
        }
        // A down server that answers with an older view learns the current one (and empties itself).
        for (id, epoch) in &epochs {
            if view.down.contains(id) && *epoch < view.epoch {
                let _ = crate::peer::call(state, *id, &PeerRequest::ViewChanged { view: (*view).clone() }).await;
            }
        }
    }
}

/// Asks every other member for its view, at once, each within `limit`; the epochs of those that
/// answered.
async fn probe(state: &Arc<State>, view: &ClusterView, limit: Duration) -> HashMap<u32, u64> {
    let mut calls = tokio::task::JoinSet::new();
    for id in view.servers.iter().map(|s| s.spec.id).filter(|id| *id != state.id) {
        let state = state.clone();
        calls.spawn(async move {
            match crate::peer::call_within(&state, id, &Request::View, &[], limit).await {
                Ok(Response::View { view }) => Some((id, view.epoch)),
                _ => None,
            }
        });
    }
    let mut out = HashMap::new();
    while let Some(r) = calls.join_next().await {
        out.extend(r.ok().flatten());
    }
    out
}

/// The one view change the probes call for, if any: the first silent live member or spare is
/// declared down (a spare that answered taking its slot), else the first down server that
/// answered with the current view rejoins, or a retiring server none of whose pieces the index
/// names any more leaves. One change per round keeps each a small step. A
/// server whose slot a spare took rejoins only once the index names it for no piece any more
/// (`named`: recovery has moved them all to the spare): server ids are reused, and an index
/// naming a live server for a piece it lost when it died would never be rebuilt.
fn next_view(
    view: &ClusterView,
    me: u32,
    answered: &HashMap<u32, u64>,
    silent: impl Fn(u32) -> bool,
    named: impl Fn(u32) -> bool,
) -> Option<ClusterView> {
    let members = view.slots.iter().chain(&view.spares).copied().filter(|id| *id != me && !view.down.contains(id));
    if let Some(out) = members.clone().find(|id| silent(*id)) {
        let mut next = view.fail(out).ok()?;
        if view.slots.contains(&out) {
            if let Some(spare) = view.spares.iter().copied().find(|s| answered.contains_key(s)) {
                next = next.replace(out, spare).ok()?;
                next.epoch = view.epoch + 1;
            }
        }
        return Some(next);
    }
    // A retiring server leaves once recovery has moved every piece the index named on it.
    if let Some(gone) = view.retiring.iter().copied().find(|id| !named(*id)) {
        return view.retired(gone).ok();
    }
    let back = view
        .down
        .iter()
        .copied()
        .find(|id| answered.get(id).is_some_and(|e| *e >= view.epoch) && (view.heir(*id) == *id || !named(*id)))?;
    view.rejoin(back).ok()
}

/// What a view change did, for the server's log.
fn describe(before: &ClusterView, after: &ClusterView) -> String {
    let newly_down: Vec<u32> = after.down.iter().copied().filter(|s| !before.down.contains(s)).collect();
    let back: Vec<u32> = before.down.iter().copied().filter(|s| !after.down.contains(s)).collect();
    let took: Vec<(u32, u32)> = before.slots.iter().zip(&after.slots).filter(|(a, b)| a != b).map(|(a, b)| (*a, *b)).collect();
    let left: Vec<u32> = before.retiring.iter().copied().filter(|s| !after.retiring.contains(s)).collect();
    format!("view {}: down {newly_down:?}, rejoined {back:?}, slots taken over (from, to) {took:?}, retired {left:?}", after.epoch)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::control::tests::view;

    #[test]
    fn a_silent_member_is_replaced_by_an_answering_spare_in_one_epoch() {
        let v = view(4, 2);
        let all: HashMap<u32, u64> = (1..6).map(|id| (id, 1)).collect();
        assert!(next_view(&v, 0, &all, |_| false, |_| false).is_none(), "everyone answers: no change");
        let mut answered = all.clone();
        answered.remove(&2);
        answered.remove(&4);
        let next = next_view(&v, 0, &answered, |id| !answered.contains_key(&id), |_| false).unwrap();
        assert_eq!(next.epoch, 2);
        assert_eq!(next.down, vec![2]);
        assert!(next.slots.contains(&5) && !next.slots.contains(&2), "the answering spare 5 took the slot, not the silent 4: {next:?}");
        // With no spare left, a silent member stays in its slot, down, and placement skips it.
        let v = view(3, 0);
        let next = next_view(&v, 0, &HashMap::from([(1, 1)]), |id| id == 2, |_| false).unwrap();
        assert_eq!((next.down.clone(), next.slots.len(), next.live()), (vec![2], 3, vec![0, 1]));
    }

    #[test]
    fn a_down_server_rejoins_only_once_it_holds_the_current_view() {
        let v = view(3, 0).fail(2).unwrap();
        assert!(next_view(&v, 0, &HashMap::from([(1, 2), (2, 1)]), |_| false, |_| false).is_none(), "still on the old view: not wiped yet");
        let next = next_view(&v, 0, &HashMap::from([(1, 2), (2, 2)]), |_| false, |_| true).unwrap();
        assert_eq!((next.epoch, next.down.len(), next.live().len()), (3, 0, 3), "back in its own slot: refilled");
        assert!(next_view(&v, 0, &HashMap::new(), |id| id == 0, |_| false).is_none(), "the leader never declares itself down");
        // A spare took its slot: it waits until no index entry names it (its pieces rebuilt).
        let v = view(3, 1).fail(2).unwrap().replace(2, 3).unwrap();
        let answered = HashMap::from([(1, 3), (2, 3), (3, 3)]);
        assert!(next_view(&v, 0, &answered, |_| false, |id| id == 2).is_none(), "still named: not back yet");
        let next = next_view(&v, 0, &answered, |_| false, |_| false).unwrap();
        assert_eq!((next.down.len(), next.spares.clone()), (0, vec![2]), "back as a spare");
        // A retiring server leaves once nothing names it.
        let v = view(3, 0).retire(1).unwrap();
        let all = HashMap::from([(1, 2), (2, 2)]);
        assert!(next_view(&v, 0, &all, |_| false, |id| id == 1).is_none(), "its pieces still to move");
        let next = next_view(&v, 0, &all, |_| false, |_| false).unwrap();
        assert!(next.retiring.is_empty() && next.server(1).is_err());
    }
}
