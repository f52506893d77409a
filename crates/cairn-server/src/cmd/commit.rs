//! Step commits on the dataset's coordinator: collect fragments, have every server holding objects
//! of the step verify and seal them, then make the step visible at once; release and wait.

use crate::meta::Ready;
use crate::peer;
use crate::state::State;
use crate::store::Which;
use cairn_core::index::{Fragment, Redundancy, StepIndex};
use cairn_core::{Error, ErrorKind, Result};
use cairn_proto::message::{Request, Response, Share};
use cairn_proto::ClusterView;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

/// Applies a seal or drop to this server's store, whether it came from a peer or from itself.
pub fn seal_or_drop(state: &State, req: Request) -> Result<()> {
    match req {
        Request::Seal { dataset, step, session, keys, bytes } => state.store.seal(&dataset, step, &session, &keys, bytes),
        Request::Drop { dataset, step, session, writer, ids, except, shard } => {
            let which = Which { session: session.as_deref(), writer, ids: &ids, except: except.as_deref(), shard };
            state.store.drop_objects(&dataset, step, &which);
            Ok(())
        }
        other => Err(Error::InvalidArgument(format!("expected a seal or drop request, got {other:?}"))),
    }
}

/// Sends `req` (a seal or drop) to server `to`, or applies it here when `to` is this server.
async fn on(state: &Arc<State>, to: u32, req: Request) -> Result<()> {
    if to == state.id {
        seal_or_drop(state, req)
    } else {
        peer::call(state, to, &req).await.map(|_| ())
    }
}

/// Runs `req(server)` on every server in `servers` at once; returns each server's result.
async fn on_each(state: &Arc<State>, servers: impl IntoIterator<Item = u32>, req: impl Fn(u32) -> Request) -> Vec<(u32, Result<()>)> {
    let mut set = tokio::task::JoinSet::new();
    for s in servers {
        let (state, r) = (state.clone(), req(s));
        set.spawn(async move { (s, on(&state, s, r).await) });
    }
    let mut out = Vec::new();
    while let Some(r) = set.join_next().await {
        match r {
            Ok(x) => out.push(x),
            Err(e) => out.push((u32::MAX, Err(Error::Unavailable(format!("commit task failed: {e}"))))),
        }
    }
    out
}

/// Runs `req(server)` on every server in `servers` at once; returns the first error.
async fn on_all(state: &Arc<State>, servers: impl IntoIterator<Item = u32>, req: impl Fn(u32) -> Request) -> Result<()> {
    on_each(state, servers, req).await.into_iter().map(|(_, r)| r).find(Result::is_err).unwrap_or(Ok(()))
}

/// With servers `failed` gone at commit time, whether every object of the step still has its
/// level's worth elsewhere: readable, and surviving `level - 1` more failures (copies: at least
/// `max(1, level)` left; shards: at least `k + level - 1`). Else an error naming what is missing.
fn enough_left(index: &StepIndex, failed: &BTreeSet<u32>) -> Result<()> {
    let mut short = Vec::new();
    for b in &index.blocks {
        let level = index.vars.get(&b.var).map_or(0, |d| d.redundancy);
        for o in &b.objects {
            let left = o.servers().iter().filter(|s| !failed.contains(s)).count() as u32;
            let need = match &o.redundancy {
                Redundancy::Encoded { k, .. } => k + level.saturating_sub(1),
                _ => level.max(1),
            };
            if left < need {
                short.push(format!("object {:#x} of '{}' (writer {}) on servers {:?}", o.id, b.var, b.writer, o.servers()));
            }
        }
    }
    if short.is_empty() {
        return Ok(());
    }
    let more = if short.len() > 5 { format!(" and {} more", short.len() - 5) } else { String::new() };
    short.truncate(5);
    let failed: Vec<String> = failed.iter().map(|s| format!("server {s}")).collect();
    Err(Error::Unavailable(format!(
        "step {} cannot commit: {} failed while it was being sealed, and these objects kept less than their level's \
         worth elsewhere: {}{more}; write the step again (placement avoids failed servers once they are replaced), \
         or raise the variables' redundancy",
        index.step,
        failed.join(", "),
        short.join("; ")
    )))
}

/// The (object id, shard) keys the index places on each server: what its seal expects.
fn keys_by_server(index: &StepIndex) -> BTreeMap<u32, Vec<(u64, u32)>> {
    let mut out: BTreeMap<u32, Vec<(u64, u32)>> = BTreeMap::new();
    for o in index.blocks.iter().flat_map(|b| &b.objects) {
        match &o.redundancy {
            Redundancy::Encoded { shards, .. } => {
                for (i, s) in shards.iter().enumerate() {
                    out.entry(*s).or_default().push((o.id, i as u32 + 1));
                }
            }
            _ => o.holders().into_iter().for_each(|s| out.entry(s).or_default().push((o.id, 0))),
        }
    }
    out
}

/// Records a writer's fragment; the last one commits the step. Only the control plane's leader
/// takes fragments (others answer `not_leader`).
pub async fn end_step(state: &Arc<State>, dataset: &str, frag: Fragment, shares: Vec<Share>, keep_last: Option<u64>) -> Result<Response> {
    let log = crate::control::leader(state)?;
    // Marked from before its fragment is proposed: the leader's sweep of prepared steps must not
    // take up a step this end of step is about to finish itself.
    let (step, session) = (frag.step, frag.session.clone());
    state.meta.start_finishing(dataset, step, &session);
    let r = async {
        let Some(ready) = state.meta.add_fragment(log, dataset, frag, shares).await? else {
            return Ok(Response::Committed { committed: false });
        };
        finish_once(state, dataset, &ready, keep_last).await?;
        Ok(Response::Committed { committed: true })
    }
    .await;
    state.meta.done_finishing(dataset, step, &session);
    r
}

/// The finalize of a prepared step: every server holding its objects verifies and seals them,
/// then the `Commit` entry makes it visible; if a seal fails the step is aborted and its objects
/// dropped. A new leader runs this for every step its predecessor left prepared (seals are
/// idempotent), so the step ends committed everywhere or invisible everywhere.
pub async fn finish(state: &Arc<State>, dataset: &str, ready: &Ready, keep_last: Option<u64>) -> Result<()> {
    let (step, session) = (ready.index.step, ready.session.clone());
    state.meta.start_finishing(dataset, step, &session);
    let r = finish_once(state, dataset, ready, keep_last).await;
    state.meta.done_finishing(dataset, step, &session);
    r
}

async fn finish_once(state: &Arc<State>, dataset: &str, ready: &Ready, keep_last: Option<u64>) -> Result<()> {
    let log = crate::control::leader(state)?;
    let view = state.view()?;
    let (step, session) = (ready.index.step, ready.session.clone());
    let started = std::time::Instant::now();
    let keys = keys_by_server(&ready.index);
    let results = on_each(state, ready.shares.keys().copied(), |s| {
        let keys = keys.get(&s).cloned().unwrap_or_default();
        Request::Seal { dataset: dataset.into(), step, session: session.clone(), keys, bytes: ready.shares[&s].1 }
    })
    .await;
    // Servers that could not be reached (dead or hung) are tolerated when every object still
    // has its level's worth of copies or shards elsewhere; any other refusal aborts the step.
    let failed: BTreeSet<u32> =
        results.iter().filter(|(_, r)| matches!(r, Err(e) if e.kind() == ErrorKind::Unavailable)).map(|(s, _)| *s).collect();
    let refused = results.into_iter().map(|(_, r)| r).find(|r| matches!(r, Err(e) if e.kind() != ErrorKind::Unavailable));
    let sealed = match refused {
        Some(e) => e,
        None if failed.is_empty() => Ok(()),
        None => enough_left(&ready.index, &failed),
    };
    if let Err(e) = sealed {
        // The seal failure is what the writer must hear (and every rank that ended the step).
        abort_and_drop(state, log, dataset, step, &session, &e.to_string()).await;
        return Err(e);
    }
    let seal = started.elapsed();
    let done = match state.meta.commit(log, dataset, step, &session, keep_last).await {
        // Refused (what it consumes is gone): it will never commit, so it is aborted like a step
        // whose seal failed.
        Err(e) if matches!(e.kind(), ErrorKind::Conflict | ErrorKind::InvalidArgument) => {
            abort_and_drop(state, log, dataset, step, &session, &e.to_string()).await;
            return Err(e);
        }
        r => r?,
    };
    state.meta.timed(seal, started.elapsed() - seal);
    sweep(state, dataset, step, &session, &view, ready.shares.keys().copied().collect());
    state.recovery.committed(state, dataset, &ready.index);
    state.corec.committed(state, dataset, &ready.index, &done.released.iter().map(|i| i.step).collect::<Vec<_>>());
    for old in done.released {
        free(state, dataset, &old).await;
    }
    for (src, index) in done.consumed {
        state.corec.released(&src, index.step);
        free(state, &src, &index).await;
    }
    Ok(())
}

/// Aborts a prepared step and drops its objects; the objects stay if the abort did not take
/// (another finisher committed the step, or this leader lost its place).
async fn abort_and_drop(state: &Arc<State>, log: &dyn cairn_meta::MetaLog, dataset: &str, step: u64, session: &str, reason: &str) {
    if let Ok(servers) = state.meta.abort(log, dataset, step, session, reason).await {
        let _ = on_all(state, servers, |_| Request::Drop {
            dataset: dataset.into(),
            step,
            session: Some(session.to_string()),
            writer: None,
            ids: Vec::new(),
            except: None,
            shard: None,
        })
        .await;
    }
}

/// On becoming leader: finishes every step the previous leader left prepared.
pub async fn finish_in_flight(state: &Arc<State>) {
    let Ok(log) = crate::control::leader(state) else { return };
    let prepared = cairn_meta::log::query(log, |s| s.in_flight());
    for p in prepared.into_iter().filter(|p| !state.meta.is_finishing(&p.dataset, p.index.step, &p.session)) {
        let ready = Ready { index: p.index, session: p.session, shares: p.shares };
        if let Err(e) = finish(state, &p.dataset, &ready, None).await {
            eprintln!("cairn server {}: finishing step {} of '{}' left prepared: {e}", state.id, ready.index.step, p.dataset);
        }
    }
}

/// After a commit, servers that took no part in it drop what other sessions left of the step
/// (a crashed run's objects placed where the restart put none) and the committing session's
/// unsealed leftovers (a put that timed out there and was placed again around it); participants
/// did so when sealing. In the background: the commit does not wait, and a server that is down
/// is skipped.
fn sweep(state: &Arc<State>, dataset: &str, step: u64, session: &str, view: &ClusterView, sealed: BTreeSet<u32>) {
    let others: Vec<u32> = view.live().into_iter().filter(|s| !sealed.contains(s)).collect();
    if others.is_empty() {
        return;
    }
    let (state, dataset, session) = (state.clone(), dataset.to_string(), session.to_string());
    tokio::spawn(async move {
        let _ = on_all(&state, others, |_| Request::Drop {
            dataset: dataset.clone(),
            step,
            session: None,
            writer: None,
            ids: Vec::new(),
            except: Some(session.clone()),
            shard: None,
        })
        .await;
    });
}

/// Frees the objects of a released step on every server that holds some, before the commit or
/// release that released it is answered (so the writer's next step finds the space), but without
/// failing it: the step is gone from the index already, and a server that is down only keeps its
/// share until it restarts empty.
async fn free(state: &Arc<State>, dataset: &str, index: &StepIndex) {
    let servers: BTreeSet<u32> = index.blocks.iter().flat_map(|b| b.objects.iter().flat_map(|o| o.servers())).collect();
    let step = index.step;
    let drop =
        |_| Request::Drop { dataset: dataset.to_string(), step, session: None, writer: None, ids: Vec::new(), except: None, shard: None };
    if let Err(e) = on_all(state, servers, drop).await {
        eprintln!("cairn server {}: freeing released step {step} of '{dataset}': {e}", state.id);
    }
}

/// A writer rank's abort of its session's step: the step aborts for every rank (those that
/// ended it learn `reason` from [`outcome`]), and the objects of its fragments are dropped.
/// A step no rank ended yet has nothing to abort here (the rank dropped its own objects).
pub async fn abort_step(state: &Arc<State>, dataset: &str, step: u64, session: &str, reason: &str) -> Result<Response> {
    let log = crate::control::leader(state)?;
    if !state.meta.is_finishing(dataset, step, session) {
        abort_and_drop(state, log, dataset, step, session, reason).await;
    }
    Ok(Response::Ok)
}

/// What became of a step a writer session ended.
pub fn outcome(state: &State, dataset: &str, step: u64, session: &str) -> Result<Response> {
    let (outcome, reason) = state.meta.outcome(crate::control::leader(state)?, dataset, step, session);
    Ok(Response::Outcome { outcome: outcome.into(), reason })
}

/// Releases a committed step.
pub async fn release(state: &Arc<State>, dataset: &str, step: u64) -> Result<Response> {
    let index = state.meta.release(crate::control::leader(state)?, dataset, step).await?;
    state.corec.released(dataset, step);
    free(state, dataset, &index).await;
    Ok(Response::Ok)
}

/// Longest wait one `wait_step` may ask for (a day); clients wait longer by asking again.
const MAX_WAIT: Duration = Duration::from_secs(86_400);

/// Waits until `step` commits or the timeout passes.
pub async fn wait_step(state: &State, dataset: &str, step: u64, timeout_ms: u64) -> Result<Response> {
    let mut rx = state.meta.watch(dataset);
    let deadline = tokio::time::Instant::now() + Duration::from_millis(timeout_ms).min(MAX_WAIT);
    loop {
        // A leader that loses its place mid-wait sends the reader to the new one.
        let log = crate::control::leader(state)?;
        if state.meta.is_committed(log, dataset, step) {
            return Ok(Response::Committed { committed: true });
        }
        if let Some(gone) = state.meta.released(log, dataset, step) {
            return Err(gone);
        }
        // Re-checked at least every second: commits finished by a new leader do not ring here.
        let tick = deadline.min(tokio::time::Instant::now() + Duration::from_secs(1));
        match tokio::time::timeout_at(tick, rx.changed()).await {
            Ok(Ok(())) => continue,
            _ if tokio::time::Instant::now() < deadline => continue,
            _ => return Ok(Response::Committed { committed: false }),
        }
    }
}
