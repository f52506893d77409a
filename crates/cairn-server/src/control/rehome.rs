//! Keyed values follow view changes. A key's copies live on the replica group its hash picks
//! from the view's slots; when a view change gives a group a server that did not hold the key (a
//! spare in a lost server's slot, the next server when placement passes over a down one, a
//! server back in its own slot, empty), the first surviving holder pushes the key to it. So
//! after recovery the task store again survives the cluster's level of further failures.

use crate::state::State;
use cairn_proto::batch::{kv_batches, KV_BATCH_BYTES};
use cairn_proto::message::Request;
use cairn_proto::ClusterView;
use std::collections::BTreeMap;
use std::sync::Arc;

/// What to push where: per server, (key, member?, value) in order.
type Pushes = BTreeMap<u32, Vec<(String, bool, Vec<u8>)>>;

/// The pushes this server owes after `before` became `after`: each key it holds whose group
/// gained servers, when it is the first live member of the old group still in the new one.
fn plan(state: &State, before: &ClusterView, after: &ClusterView, level: u32) -> Pushes {
    let me = state.id;
    let mut out: Pushes = BTreeMap::new();
    let owed = |key: &str| -> Vec<u32> {
        let (old, new) = (before.key_group(key, level), after.key_group(key, level));
        let first_holder = old.iter().copied().find(|s| new.contains(s) && after.is_live(*s));
        if first_holder != Some(me) {
            return Vec::new();
        }
        new.into_iter().filter(|s| !old.contains(s)).collect()
    };
    for (key, member, values) in state.kv.select(|k| !owed(k).is_empty()) {
        for to in owed(&key) {
            out.entry(to).or_default().extend(values.iter().map(|v| (key.clone(), member, v.clone())));
        }
    }
    out
}

/// After this server installed `after` (replacing `before`): pushes the keys it owes, in
/// batches; a push that fails is reported and left (the key keeps its other copies).
pub fn view_changed(state: &Arc<State>, before: Arc<ClusterView>, after: Arc<ClusterView>) {
    if !after.is_live(state.id) || state.kv.is_empty() {
        return;
    }
    let Ok(policy) = state.policy() else { return };
    let Ok(rt) = tokio::runtime::Handle::try_current() else { return };
    let state = state.clone();
    rt.spawn(async move {
        let pushes = plan(&state, &before, &after, policy.redundancy);
        for (to, items) in pushes {
            let (mut sent, mut failed) = (0usize, None);
            for batch in kv_batches(&items, KV_BATCH_BYTES, |(_, _, v)| v.len() as u64, |a, b| a.1 != b.1) {
                let keys = batch.iter().map(|(k, _, _)| k.clone()).collect();
                let sizes = batch.iter().map(|(_, _, v)| v.len() as u64).collect();
                let payload: Vec<u8> = batch.iter().flat_map(|(_, _, v)| v.iter().copied()).collect();
                let req = Request::KvPut { keys, sizes, member: batch[0].1 };
                match crate::peer::call_with(&state, to, &req, &payload).await {
                    Ok(_) => sent += batch.len(),
                    Err(e) => failed = Some(e),
                }
            }
            if let Some(e) = failed {
                tracing::warn!(server = state.id, "copying keyed values to server {to} after view {}: {e}", after.epoch);
            } else if sent > 0 {
                tracing::info!(server = state.id, "copied {sent} keyed values to server {to} (view {})", after.epoch);
            }
        }
    });
}
