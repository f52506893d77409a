//! Calls to several servers at once: seals and drops of a step's objects on every server that
//! holds some (commits, aborts, releases, drains that let `keep_last` release older steps).

use crate::objects::seal_or_drop;
use crate::peer;
use crate::state::State;
use cairn_core::index::StepIndex;
use cairn_core::{Error, Result};
use cairn_proto::message::{Request, ServerRequest};
use std::collections::BTreeSet;
use std::sync::Arc;

/// Sends `req` (a seal or drop) to server `to`, or applies it here when `to` is this server.
async fn on(state: &Arc<State>, to: u32, req: ServerRequest) -> Result<()> {
    if to == state.id {
        seal_or_drop(state, req)
    } else {
        peer::call(state, to, &req).await.map(|_| ())
    }
}

/// Runs `req(server)` on every server in `servers` at once; returns each server's result.
pub async fn on_each(
    state: &Arc<State>,
    servers: impl IntoIterator<Item = u32>,
    req: impl Fn(u32) -> ServerRequest,
) -> Vec<(u32, Result<()>)> {
    let mut set = tokio::task::JoinSet::new();
    for s in servers {
        let (state, r) = (state.clone(), req(s));
        set.spawn(async move { (s, on(&state, s, r).await) });
    }
    let mut out = Vec::new();
    while let Some(r) = set.join_next().await {
        match r {
            Ok(x) => out.push(x),
            Err(e) => out.push((u32::MAX, Err(Error::Unavailable(format!("a call to a server failed: {e}"))))),
        }
    }
    out
}

/// Runs `req(server)` on every server in `servers` at once; returns the first error.
pub async fn on_all(state: &Arc<State>, servers: impl IntoIterator<Item = u32>, req: impl Fn(u32) -> ServerRequest) -> Result<()> {
    on_each(state, servers, req).await.into_iter().map(|(_, r)| r).find(Result::is_err).unwrap_or(Ok(()))
}

/// Frees the objects of a released step on every server that holds some, before the commit or
/// release that released it is answered (so the writer's next step finds the space), but without
/// failing it: the step is gone from the index already, and a server that is down only keeps its
/// share until it restarts empty.
pub async fn free(state: &Arc<State>, dataset: &str, index: &StepIndex) {
    let servers: BTreeSet<u32> = index.blocks.iter().flat_map(|b| b.objects.iter().flat_map(|o| o.servers())).collect();
    let step = index.step;
    let drop = |_| {
        Request::Drop { dataset: dataset.to_string(), step, session: None, writer: None, ids: Vec::new(), except: None, shard: None }.into()
    };
    if let Err(e) = on_all(state, servers, drop).await {
        if let Some(n) = crate::logging::limited("free", crate::logging::EVERY) {
            tracing::warn!(server = state.id, left_out = n, "freeing released step {step} of '{dataset}': {e}");
        }
    }
}
