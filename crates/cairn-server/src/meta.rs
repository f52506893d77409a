//! The coordinator's side of commits (D²T): the writers' fragments of open steps, and the committed
//! step indexes of the datasets this server coordinates. A step commits when all `nranks`
//! fragments of one session are in and every server holding its objects has sealed them; until
//! then readers cannot see it.

use crate::state::lock;
use cairn_core::index::{Fragment, StepIndex};
use cairn_core::{Error, Result};
use cairn_proto::message::Share;
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use tokio::sync::watch;

/// A step whose fragments are complete and must now be sealed.
#[derive(Debug)]
pub struct Ready {
    /// The merged index.
    pub index: StepIndex,
    /// The session that wrote it.
    pub session: String,
    /// Objects and bytes expected per server.
    pub shares: BTreeMap<u32, (u64, u64)>,
}

#[derive(Debug, Default)]
struct Pending {
    frags: BTreeMap<u32, Fragment>,
    shares: BTreeMap<u32, BTreeMap<u32, (u64, u64)>>,
}

#[derive(Debug)]
struct Dataset {
    committed: BTreeMap<u64, Arc<StepIndex>>,
    pending: HashMap<(u64, String), Pending>,
    /// Bumped at every commit and release; waiters watch it.
    version: watch::Sender<u64>,
}

impl Default for Dataset {
    fn default() -> Self {
        Dataset { committed: BTreeMap::new(), pending: HashMap::new(), version: watch::channel(0).0 }
    }
}

/// Metadata of the datasets this server coordinates.
#[derive(Debug, Default)]
pub struct Meta {
    datasets: Mutex<HashMap<String, Dataset>>,
}

impl Meta {
    /// Records a writer's fragment. Returns the step ready to seal when this was the last one.
    /// The fragment is checked before any lock is taken, and merged after it is released, so a
    /// malformed fragment costs its sender an error and nobody else anything. A second, different
    /// fragment for the same rank of a session (two processes started as one rank) is refused.
    pub fn add_fragment(&self, dataset: &str, frag: Fragment, shares: Vec<Share>) -> Result<Option<Ready>> {
        frag.validate()?;
        let step = frag.step;
        let key = (step, frag.session.clone());
        let p = {
            let mut all = lock(&self.datasets);
            let ds = all.entry(dataset.to_string()).or_default();
            if ds.committed.contains_key(&step) {
                return Err(Error::AlreadyExists(format!("step {step} of '{dataset}' is already committed; write a new step number")));
            }
            let p = ds.pending.entry(key.clone()).or_default();
            if let Some(other) = p.frags.values().next().filter(|o| o.nranks != frag.nranks) {
                return Err(Error::Conflict(format!(
                    "writer {} ends step {step} of '{dataset}' for {} writers, but writer {} did for {}; all ranks must agree",
                    frag.writer, frag.nranks, other.writer, other.nranks
                )));
            }
            if let Some(prev) = p.frags.get(&frag.writer).filter(|prev| !prev.same_content(&frag)) {
                return Err(Error::Conflict(format!(
                    "rank {} of session '{}' already ended step {step} of '{dataset}' with other blocks ({} vs {}); two \
                     processes were started as the same rank: give each its own rank (or its own session)",
                    frag.writer,
                    frag.session,
                    prev.blocks.len(),
                    frag.blocks.len()
                )));
            }
            let nranks = frag.nranks as usize;
            p.shares.insert(frag.writer, shares.iter().map(|s| (s.server, (s.objects, s.bytes))).collect());
            p.frags.insert(frag.writer, frag);
            if p.frags.len() < nranks {
                return Ok(None);
            }
            ds.pending.remove(&key).expect("present")
        };
        let mut total: BTreeMap<u32, (u64, u64)> = BTreeMap::new();
        for per_writer in p.shares.values() {
            for (server, (n, b)) in per_writer {
                let t = total.entry(*server).or_default();
                t.0 = t.0.saturating_add(*n);
                t.1 = t.1.saturating_add(*b);
            }
        }
        let index = StepIndex::merge(step, p.frags.into_values().collect())?;
        Ok(Some(Ready { index, session: key.1, shares: total }))
    }

    /// Makes a sealed step visible. Returns the steps that `keep_last` now releases.
    pub fn commit(&self, dataset: &str, index: StepIndex, keep_last: Option<u64>) -> Vec<Arc<StepIndex>> {
        let mut all = lock(&self.datasets);
        let ds = all.entry(dataset.to_string()).or_default();
        let step = index.step;
        ds.committed.insert(step, Arc::new(index));
        // A crashed run's fragments of this step can never complete now.
        ds.pending.retain(|(s, _), _| *s != step);
        let mut released = Vec::new();
        if let Some(k) = keep_last {
            while ds.committed.len() as u64 > k.max(1) {
                released.push(ds.committed.pop_first().expect("non-empty").1);
            }
        }
        ds.version.send_modify(|v| *v += 1);
        released
    }

    /// Removes a committed step; returns its index so its objects can be freed.
    pub fn release(&self, dataset: &str, step: u64) -> Result<Arc<StepIndex>> {
        let mut all = lock(&self.datasets);
        let ds = all.get_mut(dataset).ok_or_else(|| no_dataset(dataset))?;
        let idx = ds.committed.remove(&step).ok_or_else(|| not_committed(dataset, step, &ds.committed))?;
        ds.version.send_modify(|v| *v += 1);
        Ok(idx)
    }

    /// Committed steps of a dataset (empty if unknown: a reader may come before the writers).
    pub fn steps(&self, dataset: &str) -> Vec<u64> {
        let all = lock(&self.datasets);
        all.get(dataset).map(|d| d.committed.keys().copied().collect()).unwrap_or_default()
    }

    /// The committed index of a step.
    pub fn index(&self, dataset: &str, step: u64) -> Result<Arc<StepIndex>> {
        let all = lock(&self.datasets);
        let ds = all.get(dataset).ok_or_else(|| no_dataset(dataset))?;
        ds.committed.get(&step).cloned().ok_or_else(|| not_committed(dataset, step, &ds.committed))
    }

    /// A receiver that changes whenever a step of `dataset` commits or is released.
    pub fn watch(&self, dataset: &str) -> watch::Receiver<u64> {
        lock(&self.datasets).entry(dataset.to_string()).or_default().version.subscribe()
    }

    /// Whether `step` of `dataset` is committed.
    pub fn is_committed(&self, dataset: &str, step: u64) -> bool {
        lock(&self.datasets).get(dataset).is_some_and(|d| d.committed.contains_key(&step))
    }

    /// Names of the datasets with committed steps.
    pub fn datasets(&self) -> Vec<String> {
        let all = lock(&self.datasets);
        let mut names: Vec<String> = all.iter().filter(|(_, d)| !d.committed.is_empty()).map(|(n, _)| n.clone()).collect();
        names.sort();
        names
    }
}

fn no_dataset(dataset: &str) -> Error {
    Error::NotFound(format!("dataset '{dataset}' has no committed step in this cluster"))
}

fn not_committed(dataset: &str, step: u64, committed: &BTreeMap<u64, Arc<StepIndex>>) -> Error {
    let have = match (committed.keys().next(), committed.keys().next_back()) {
        (Some(a), Some(b)) => format!("committed: {} steps, {a}..={b}", committed.len()),
        _ => "no step is committed".into(),
    };
    Error::NotFound(format!("step {step} of '{dataset}' is not committed ({have}); wait for the writers or pick a kept step"))
}
