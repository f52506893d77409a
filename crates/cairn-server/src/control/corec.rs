//! The control plane leader's CoREC encoder (§3.2–3.3): after each commit the classifier
//! ([`cairn_core::corec`]) picks replicated objects to encode; each replication group holds one
//! encode token, so a group encodes one object at a time, on its least loaded live member (by the
//! request rate its last encoding reported). Once an object's shards are stored, a log entry
//! makes its index entry name them, and only then are its whole copies dropped: a reader always
//! finds either copies or shards.

use super::gate::Gate;
use super::meta::Meta;
use super::worker::{Next, Worker};
use crate::encode::drop_piece;
use crate::state::State;
use crate::sync::lock;
use cairn_core::corec::{Classifier, Entry, Key, Policy};
use cairn_core::index::{Redundancy, StepIndex};
use cairn_core::{Error, Result};
use cairn_proto::message::{PeerRequest, Response};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

/// Encodings running at once (each on a different replication group and server).
const PARALLEL: usize = 4;

/// The pause before encodings that failed are tried again.
const RETRY_PAUSE: std::time::Duration = std::time::Duration::from_millis(500);

/// The leader's classifier, encoding state and the worker that encodes.
#[derive(Debug)]
pub struct Corec {
    state: Arc<State>,
    gate: Arc<Gate>,
    meta: Arc<Meta>,
    worker: Worker,
    classifier: Mutex<Option<Classifier>>,
    /// Request rate each server reported with its last encoding.
    rates: Mutex<HashMap<u32, f64>>,
}

/// The classifier's entries for a committed step's objects.
fn entries(index: &StepIndex, policy: &Policy, active: usize) -> Vec<Entry> {
    let mut out = Vec::new();
    for b in &index.blocks {
        let Some(def) = index.vars.get(&b.var) else { continue };
        let level = def.redundancy;
        for o in &b.objects {
            out.push(Entry {
                id: o.id,
                var: b.var.clone(),
                region: o.region.clone(),
                bytes: o.region.volume() * def.dtype.size() as u64,
                level,
                k: policy.stripe(level, active).map_or(0, |(k, _)| k),
                encoded: matches!(o.redundancy, Redundancy::Encoded { .. }),
            });
        }
    }
    out
}

impl Corec {
    /// The encoder of the leader on `gate`, reading the index through `meta`.
    pub fn new(state: Arc<State>, gate: Arc<Gate>, meta: Arc<Meta>) -> Corec {
        Corec { state, gate, meta, worker: Worker::default(), classifier: Mutex::default(), rates: Mutex::default() }
    }

    /// Learns a committed step and the steps its commit released, then encodes what the
    /// classifier chooses, in the background.
    pub fn committed(self: &Arc<Self>, dataset: &str, index: &StepIndex, released: &[u64]) {
        let (state, meta) = (&self.state, &self.meta);
        let (Ok(policy), Ok(view), Ok(log)) = (state.policy(), state.view(), &self.gate.leader()) else { return };
        if !policy.scheme.encodes_later() {
            return;
        }
        let active = view.live().len();
        {
            let mut c = lock(&self.classifier);
            let c = c.get_or_insert_with(|| {
                // A new leader learns every committed step, so the bound holds over all of them.
                let mut c = Classifier::new(policy.clone());
                for ds in meta.datasets(log) {
                    for step in meta.steps(log, &ds) {
                        if let Ok(i) = meta.index(log, &ds, step) {
                            c.committed(&ds, step, &entries(&i, &policy, active));
                        }
                    }
                }
                c
            });
            c.committed(dataset, index.step, &entries(index, &policy, active));
            for s in released {
                c.released(dataset, *s);
            }
        }
        let me = self.clone();
        self.worker.run(self.state.shutdown.subscribe(), move || {
            let me = me.clone();
            async move { me.round().await }
        });
    }

    /// Encodes again an object recovery decoded into copies because its stripe no longer fit on
    /// the live servers: with the stripe the live servers allow now (a smaller `k`), or, when
    /// none does (`k` would be under 2), it stays replicated, its level kept by copies.
    pub async fn reencode(&self, dataset: &str, step: u64, id: u64) -> Result<()> {
        let key = Key { dataset: dataset.to_string(), step, id };
        let Some(copies) = self.copies_of(&key) else { return Ok(()) };
        let (policy, view) = (self.state.policy()?, self.state.view()?);
        // (The classifier is left to count it encoded: as a candidate it would be tried again
        // and again on servers too few for any stripe.)
        if policy.stripe(copies.level, view.live().len()).is_none() {
            return Ok(());
        }
        let r = self.encode_one(&key, &copies).await;
        self.classifier_done(&key, r.is_ok());
        r
    }

    /// Forgets the objects of a released step.
    pub fn released(&self, dataset: &str, step: u64) {
        if let Some(c) = lock(&self.classifier).as_mut() {
            c.released(dataset, step);
        }
    }

    /// Storage efficiency the classifier accounts for (1 when it knows nothing).
    pub fn efficiency(&self) -> Option<f64> {
        lock(&self.classifier).as_ref().map(Classifier::efficiency)
    }

    /// Encodes what the classifier plans. A step committed while a round runs wakes the worker
    /// again, so the next round plans it (no wake is lost between an empty plan and sleep).
    async fn round(self: &Arc<Self>) -> Next {
        let plan = lock(&self.classifier).as_mut().map(Classifier::plan).unwrap_or_default();
        if plan.is_empty() {
            return Next::Idle;
        }
        // Failed encodings are planned again: not at once, or a server that died (and is not
        // declared down yet) would be hammered in a loop that starves the clients.
        if self.run_plan(plan).await {
            Next::Again
        } else {
            Next::After(RETRY_PAUSE)
        }
    }
}

/// A committed, still replicated object's copies and its variable's level.
struct Copies {
    holders: Vec<u32>,
    level: u32,
}

impl Corec {
    /// Encodes the planned objects: groups in parallel (up to [`PARALLEL`]), one object at a time
    /// within a group (its encode token). Whether every encoding succeeded.
    async fn run_plan(self: &Arc<Self>, plan: Vec<Key>) -> bool {
        let mut by_group: BTreeMap<Vec<u32>, Vec<(Key, Copies)>> = BTreeMap::new();
        for key in plan {
            match self.copies_of(&key) {
                Some(copies) => {
                    let mut group = copies.holders.clone();
                    group.sort_unstable();
                    by_group.entry(group).or_default().push((key, copies));
                }
                // Released, or no longer replicated: nothing to do.
                None => self.classifier_done(&key, true),
            }
        }
        let mut groups: Vec<Vec<(Key, Copies)>> = by_group.into_values().collect();
        let mut running = tokio::task::JoinSet::new();
        let mut ok = true;
        while !groups.is_empty() || !running.is_empty() {
            while running.len() < PARALLEL {
                let Some(jobs) = groups.pop() else { break };
                let me = self.clone();
                running.spawn(async move {
                    let mut all = true;
                    for (key, copies) in jobs {
                        let ok = me.encode_one(&key, &copies).await;
                        if let Err(e) = &ok {
                            if let Some(n) = crate::logging::limited("encode", crate::logging::EVERY) {
                                let (id, step) = (key.id, key.step);
                                tracing::warn!(
                                    server = me.state.id,
                                    left_out = n,
                                    "encoding object {id:#x} of '{}' step {step}: {e}",
                                    key.dataset
                                );
                            }
                        }
                        all &= ok.is_ok();
                        me.classifier_done(&key, ok.is_ok());
                    }
                    all
                });
            }
            if let Some(r) = running.join_next().await {
                ok &= r.unwrap_or(false);
            }
        }
        ok
    }

    fn classifier_done(&self, key: &Key, ok: bool) {
        if let Some(c) = lock(&self.classifier).as_mut() {
            c.done(key, ok);
        }
    }

    fn copies_of(&self, key: &Key) -> Option<Copies> {
        let log = self.gate.leader().ok()?;
        let index = self.meta.index(&log, &key.dataset, key.step).ok()?;
        let (b, o) = index.blocks.iter().flat_map(|b| b.objects.iter().map(move |o| (b, o))).find(|(_, o)| o.id == key.id)?;
        let level = index.vars.get(&b.var).map_or(0, |d| d.redundancy);
        matches!(o.redundancy, Redundancy::Replicated { .. }).then(|| Copies { holders: o.holders(), level })
    }

    /// Encodes one object: its stripe starts at its first live holder's ring slot; the least
    /// loaded live holder encodes; the log records the shards; then the copies are dropped.
    async fn encode_one(&self, key: &Key, copies: &Copies) -> Result<()> {
        let state = &self.state;
        let policy = state.policy()?;
        let view = state.view()?;
        let log = &self.gate.leader()?;
        let (holders, level) = (&copies.holders, copies.level);
        let (k, m) = policy
            .stripe(level, view.live().len())
            .ok_or_else(|| Error::InvalidArgument(format!("level {level} cannot be encoded on {} live servers", view.live().len())))?;
        let live: Vec<u32> = holders.iter().copied().filter(|h| view.is_live(*h)).collect();
        let start = live.first().and_then(|h| view.slots.iter().position(|s| s == h)).ok_or_else(|| {
            Error::Unavailable(format!("no holder of object {:#x} ({holders:?}) holds a slot in view {}", key.id, view.epoch))
        })?;
        let (shards, _) = view.group(start as u64, (k + m) as usize);
        if shards.len() != (k + m) as usize {
            return Err(Error::Unavailable(format!("a stripe of {} servers needs more than the {} live", k + m, view.live().len())));
        }
        let encoder = {
            let rates = lock(&self.rates);
            *live.iter().min_by(|a, b| rates.get(a).unwrap_or(&0.0).total_cmp(rates.get(b).unwrap_or(&0.0))).expect("live is not empty")
        };
        let stripe = crate::encode::Stripe { k, m, shards: shards.clone(), holders: live.clone() };
        let resp = if encoder == state.id {
            crate::encode::encode(state, &key.dataset, key.step, key.id, stripe).await
        } else {
            let req = PeerRequest::Encode {
                dataset: key.dataset.clone(),
                step: key.step,
                id: key.id,
                k,
                m,
                shards: stripe.shards,
                holders: stripe.holders,
            };
            crate::peer::call(state, encoder, &req).await
        };
        let drop_shards = || async {
            for (i, s) in shards.iter().enumerate() {
                drop_piece(state, *s, &key.dataset, key.step, key.id, i as u32 + 1).await;
            }
        };
        match resp {
            Ok(Response::Encoded { rate }) => {
                lock(&self.rates).insert(encoder, rate);
            }
            Ok(other) => {
                drop_shards().await;
                return Err(cairn_proto::message::unexpected("encode", &other));
            }
            Err(e) => {
                drop_shards().await;
                return Err(e);
            }
        }
        let red = Redundancy::Encoded { k, m, shards: shards.clone() };
        match self.meta.encoded(log, &key.dataset, key.step, vec![(key.id, red)]).await {
            Ok(1) => {
                for h in holders {
                    drop_piece(state, *h, &key.dataset, key.step, key.id, 0).await;
                }
                Ok(())
            }
            Ok(_) => {
                drop_shards().await;
                Err(Error::Conflict("the object was no longer replicated".into()))
            }
            // The entry may have been recorded with the reply lost: keep the shards (and the
            // copies), so that whatever the index names exists.
            Err(e) => Err(e),
        }
    }
}
