//! CoREC's hybrid redundancy (Duan et al., TOPC 2020, §3.2): objects are written replicated
//! (cheap to write), and those the classifier finds *write-cold* are Reed–Solomon encoded in the
//! background (cheap to store), never letting storage efficiency fall below a bound.
//!
//! In Cairn a committed step never changes, so "writing an object again" is writing a newer
//! step's box over it (DataSpaces' versions of an object). The temperature is the box's: an
//! object is hot while it is the newest version of its box and that box was written within the
//! last `hot_steps` steps, or lies next to the boxes the newest step wrote (the paper's spatial
//! look-ahead: the write region moves to its neighbours). A version superseded by a newer one is
//! cold at once. Whenever efficiency would fall below `min_efficiency`, the least-read (then
//! oldest) replicated objects are encoded too; the `hybrid` scheme, the paper's LRU baseline,
//! only does the latter, by least recent use.

use crate::erasure::MAX_SHARDS;
use crate::region::BoxSet;
use crate::{Error, Region, Result};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, BTreeSet, HashMap};

/// How a cluster keeps objects of variables with a redundancy level above 0.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scheme {
    /// One copy whatever the level (variables asking for more are refused).
    None,
    /// Whole copies only.
    Replicate,
    /// Every object encoded by its writer on the write path.
    Erasure,
    /// Replicated when written, encoded when cold or when efficiency needs it.
    #[default]
    Corec,
    /// Replicated when written, least recently used encoded when efficiency needs it (the
    /// paper's "hybrid erasure coding" baseline).
    Hybrid,
}

impl Scheme {
    /// Parses `none`, `replicate`, `erasure`, `corec` or `hybrid`.
    pub fn parse(s: &str) -> Result<Scheme> {
        serde_json::from_value(serde_json::Value::String(s.to_string())).map_err(|_| {
            Error::Config(format!("redundancy scheme {s:?}: use \"corec\", \"replicate\", \"erasure\", \"hybrid\" or \"none\""))
        })
    }

    /// Whether objects are encoded after they are written (by the control plane's leader).
    pub fn encodes_later(self) -> bool {
        matches!(self, Scheme::Corec | Scheme::Hybrid)
    }
}

/// A cluster's redundancy settings (`[staging]` of `cairn.toml`, `cairn cluster start` flags).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Policy {
    /// Level of variables that do not name one (server failures they survive).
    #[serde(default)]
    pub redundancy: u32,
    /// How objects are kept.
    #[serde(default)]
    pub scheme: Scheme,
    /// Data shards per stripe (`rs_data + level` shards in all).
    #[serde(default = "default_rs_data")]
    pub rs_data: u32,
    /// Storage efficiency (data bytes ÷ stored bytes) the classifier never lets fall below.
    #[serde(default = "default_min_efficiency")]
    pub min_efficiency: f64,
    /// Steps a box stays hot after it was last written.
    #[serde(default = "default_hot_steps")]
    pub hot_steps: u32,
}

fn default_rs_data() -> u32 {
    4
}
fn default_min_efficiency() -> f64 {
    0.6
}
fn default_hot_steps() -> u32 {
    2
}

impl Default for Policy {
    /// Level 0 (what a cluster file without settings means), CoREC, RS(4 + level), bound 0.6.
    fn default() -> Policy {
        Policy { redundancy: 0, scheme: Scheme::Corec, rs_data: 4, min_efficiency: 0.6, hot_steps: 2 }
    }
}

/// Server failures a variable can be asked to survive at most.
pub const MAX_REDUNDANCY: u32 = 16;

impl Policy {
    /// Checks the settings: sizes in range, and a bound that encoding everything can meet.
    pub fn validate(&self) -> Result<()> {
        let bad = |why: String| Err(Error::Config(format!("redundancy settings: {why}")));
        if self.redundancy > MAX_REDUNDANCY {
            return bad(format!("redundancy {} is more than {MAX_REDUNDANCY} server failures", self.redundancy));
        }
        if self.rs_data < 2 || self.rs_data as usize + 16 > MAX_SHARDS {
            return bad(format!("rs_data {}: use 2 to {} data shards per stripe", self.rs_data, MAX_SHARDS - 16));
        }
        if !(self.min_efficiency > 0.0 && self.min_efficiency <= 1.0) {
            return bad(format!("min_efficiency {} must lie in (0, 1]", self.min_efficiency));
        }
        if self.hot_steps == 0 {
            return bad("hot_steps must be at least 1".into());
        }
        if self.scheme == Scheme::None && self.redundancy > 0 {
            return bad(format!(
                "scheme \"none\" keeps one copy, but redundancy is {}; set it to 0 or pick another scheme",
                self.redundancy
            ));
        }
        let best = self.rs_data as f64 / f64::from(self.rs_data + self.redundancy);
        if self.scheme.encodes_later() && self.redundancy > 0 && self.min_efficiency > best + 1e-12 {
            return bad(format!(
                "min_efficiency {} can never be met: with rs_data {} and redundancy {} even encoding everything stores \
                 at efficiency {best:.3}; lower it or raise rs_data",
                self.min_efficiency, self.rs_data, self.redundancy
            ));
        }
        Ok(())
    }

    /// The stripe `(k, m)` an object of level `level` is encoded into on `active` servers, or
    /// `None` when it cannot be (level 0, or too few servers for at least 2 data shards).
    pub fn stripe(&self, level: u32, active: usize) -> Option<(u32, u32)> {
        let k = self.rs_data.min((active as u32).saturating_sub(level));
        (level > 0 && k >= 2).then_some((k, level))
    }
}

/// Bytes stored for an object of `bytes` bytes at `level`: whole copies, or (encoded with `k`
/// data shards) `k + level` shards of `⌈bytes / k⌉` bytes.
pub fn stored_bytes(bytes: u64, level: u32, encoded_k: Option<u32>) -> u64 {
    match encoded_k {
        Some(k) if level > 0 && k > 0 => crate::erasure::shard_len(bytes, k) * u64::from(k + level),
        _ => bytes * u64::from(level + 1),
    }
}

/// One staged object, named by dataset, step and id.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Key {
    /// Dataset.
    pub dataset: String,
    /// Step.
    pub step: u64,
    /// Object id.
    pub id: u64,
}

/// A committed object as the classifier learns it.
#[derive(Debug, Clone)]
pub struct Entry {
    /// Object id.
    pub id: u64,
    /// Variable.
    pub var: String,
    /// Its box.
    pub region: Region,
    /// Its bytes.
    pub bytes: u64,
    /// Its variable's level.
    pub level: u32,
    /// Data shards it would be encoded into (0: it cannot be).
    pub k: u32,
    /// Whether it is encoded already (written so).
    pub encoded: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Form {
    Replicated,
    /// Chosen for encoding, not yet done (counted as encoded).
    Pending,
    Encoded,
}

#[derive(Debug)]
struct Tracked {
    var: String,
    region: Region,
    bytes: u64,
    level: u32,
    k: u32,
    form: Form,
    superseded: bool,
    reads: u64,
    used: u64,
}

impl Tracked {
    fn stored(&self) -> u64 {
        stored_bytes(self.bytes, self.level, (self.form != Form::Replicated).then_some(self.k))
    }

    fn encodable(&self) -> bool {
        self.form == Form::Replicated && self.level > 0 && self.k >= 2
    }
}

/// The classifier: which replicated objects to encode next.
#[derive(Debug)]
pub struct Classifier {
    policy: Policy,
    objs: BTreeMap<Key, Tracked>,
    /// The objects that could be encoded ([`Tracked::encodable`]): what [`Classifier::plan`]
    /// looks at, instead of every object (most are often at level 0, or encoded already).
    candidates: BTreeSet<Key>,
    /// Newest versions per (dataset, variable).
    newest: HashMap<(String, String), Vec<Key>>,
    /// Newest committed step per dataset.
    latest: HashMap<String, u64>,
    data: u64,
    stored: u64,
    tick: u64,
}

impl Classifier {
    /// An empty classifier under `policy`.
    pub fn new(policy: Policy) -> Classifier {
        Classifier {
            policy,
            objs: BTreeMap::new(),
            candidates: BTreeSet::new(),
            newest: HashMap::new(),
            latest: HashMap::new(),
            data: 0,
            stored: 0,
            tick: 0,
        }
    }

    /// Data bytes ÷ stored bytes of the objects it knows (objects chosen for encoding count as
    /// encoded); 1 when it knows none.
    pub fn efficiency(&self) -> f64 {
        if self.stored == 0 {
            1.0
        } else {
            self.data as f64 / self.stored as f64
        }
    }

    /// Objects known.
    pub fn len(&self) -> usize {
        self.objs.len()
    }

    /// Whether it knows no object.
    pub fn is_empty(&self) -> bool {
        self.objs.is_empty()
    }

    /// Whether `dataset` has a step it knows.
    pub fn knows(&self, dataset: &str) -> bool {
        self.latest.contains_key(dataset)
    }

    /// Learns the objects of a committed step; each supersedes older versions of its box.
    pub fn committed(&mut self, dataset: &str, step: u64, entries: &[Entry]) {
        self.tick += 1;
        let latest = self.latest.entry(dataset.to_string()).or_insert(step);
        *latest = (*latest).max(step);
        // Older objects of each variable that a box of this step meets are superseded.
        let mut by_var: BTreeMap<&str, Vec<Region>> = BTreeMap::new();
        for e in entries {
            by_var.entry(&e.var).or_default().push(e.region.clone());
        }
        for (var, regions) in by_var {
            let boxes: BoxSet = regions.into_iter().collect();
            let Some(newest) = self.newest.get_mut(&(dataset.to_string(), var.to_string())) else { continue };
            newest.retain(|old| {
                let Some(o) = self.objs.get_mut(old) else { return false };
                let over = old.step < step && boxes.meeting(&o.region).is_some();
                o.superseded |= over;
                !over
            });
        }
        for e in entries {
            let key = Key { dataset: dataset.to_string(), step, id: e.id };
            let form = if e.encoded { Form::Encoded } else { Form::Replicated };
            let t = Tracked {
                var: e.var.clone(),
                region: e.region.clone(),
                bytes: e.bytes,
                level: e.level,
                k: e.k,
                form,
                superseded: false,
                reads: 0,
                used: self.tick,
            };
            self.newest.entry((dataset.to_string(), e.var.clone())).or_default().push(key.clone());
            self.data += t.bytes;
            self.stored += t.stored();
            if t.encodable() {
                self.candidates.insert(key.clone());
            } else {
                self.candidates.remove(&key);
            }
            if let Some(old) = self.objs.insert(key, t) {
                self.data -= old.bytes;
                self.stored -= old.stored();
            }
        }
    }

    /// Forgets the objects of a released step.
    pub fn released(&mut self, dataset: &str, step: u64) {
        let lo = Key { dataset: dataset.to_string(), step, id: 0 };
        let hi = Key { dataset: dataset.to_string(), step, id: u64::MAX };
        let gone: Vec<Key> = self.objs.range(lo..=hi).map(|(k, _)| k.clone()).collect();
        let mut vars = BTreeSet::new();
        for k in gone {
            self.candidates.remove(&k);
            if let Some(t) = self.objs.remove(&k) {
                self.data -= t.bytes;
                self.stored -= t.stored();
                vars.insert(t.var);
            }
        }
        // Once per variable (not per object: a step of many small objects made this quadratic).
        for var in vars {
            if let Some(n) = self.newest.get_mut(&(dataset.to_string(), var)) {
                n.retain(|x| !(x.dataset == dataset && x.step == step));
            }
        }
    }

    /// Counts a read of an object.
    pub fn read(&mut self, key: &Key) {
        self.tick += 1;
        if let Some(t) = self.objs.get_mut(key) {
            t.reads += 1;
            t.used = self.tick;
        }
    }

    fn is_cold(&self, key: &Key, t: &Tracked) -> bool {
        if t.superseded {
            return true;
        }
        let latest = self.latest.get(&key.dataset).copied().unwrap_or(key.step);
        if latest.saturating_sub(key.step) < u64::from(self.policy.hot_steps) {
            return false;
        }
        // Look-ahead: next to a box the newest step wrote (grown by its own extent).
        let hot = self.newest.get(&(key.dataset.clone(), t.var.clone()));
        !hot.into_iter().flatten().filter(|h| h.step == latest).filter_map(|h| self.objs.get(h)).any(|h| {
            let offset: Vec<u64> = h.region.offset.iter().zip(&h.region.count).map(|(o, c)| o.saturating_sub(*c)).collect();
            let count: Vec<u64> = h.region.count.iter().map(|c| c.saturating_mul(3)).collect();
            Region { offset, count }.intersect(&t.region).is_some()
        })
    }

    /// Chooses objects to encode now (marked pending until [`Classifier::done`]): the cold
    /// ones, then, while efficiency is below the bound, the least read and oldest others.
    pub fn plan(&mut self) -> Vec<Key> {
        let mut out = Vec::new();
        if !self.policy.scheme.encodes_later() {
            return out;
        }
        if self.policy.scheme == Scheme::Corec {
            let cold: Vec<Key> = self.candidates.iter().filter(|k| self.is_cold(k, &self.objs[*k])).cloned().collect();
            for k in cold {
                self.mark(&k);
                out.push(k);
            }
        }
        if self.efficiency() < self.policy.min_efficiency {
            let lru = self.policy.scheme == Scheme::Hybrid;
            let mut order: Vec<(u64, u64, &Key)> = self
                .candidates
                .iter()
                .map(|k| (k, &self.objs[k]))
                .map(|(k, t)| if lru { (t.used, 0, k) } else { (t.reads, k.step, k) })
                .collect();
            order.sort();
            let order: Vec<Key> = order.into_iter().map(|(_, _, k)| k.clone()).collect();
            for k in order {
                if self.efficiency() >= self.policy.min_efficiency {
                    break;
                }
                self.mark(&k);
                out.push(k);
            }
        }
        out
    }

    fn mark(&mut self, key: &Key) {
        let t = self.objs.get_mut(key).expect("a known object");
        self.stored -= t.stored();
        t.form = Form::Pending;
        self.stored += t.stored();
        self.candidates.remove(key);
    }

    /// Records how the encoding of `key` ended: encoded, or (failed) replicated again, to be
    /// chosen again by a later plan.
    pub fn done(&mut self, key: &Key, encoded: bool) {
        if let Some(t) = self.objs.get_mut(key) {
            self.stored -= t.stored();
            t.form = if encoded { Form::Encoded } else { Form::Replicated };
            t.reads = 0;
            self.stored += t.stored();
            if t.encodable() {
                self.candidates.insert(key.clone());
            }
        }
    }

    /// Whether `key` is known and encoded (or chosen for it).
    pub fn is_encoded(&self, key: &Key) -> bool {
        self.objs.get(key).is_some_and(|t| t.form != Form::Replicated)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn policy(scheme: Scheme, min_efficiency: f64) -> Policy {
        Policy { redundancy: 1, scheme, rs_data: 4, min_efficiency, hot_steps: 2 }
    }

    fn entry(id: u64, var: &str, lo: u64, level: u32) -> Entry {
        Entry { id, var: var.into(), region: Region::new(vec![lo], vec![16]).unwrap(), bytes: 128, level, k: 4, encoded: false }
    }

    #[test]
    fn settings_are_checked() {
        assert!(policy(Scheme::Corec, 0.6).validate().is_ok());
        let e = policy(Scheme::Corec, 0.9).validate().unwrap_err().to_string();
        assert!(e.contains("can never be met") && e.contains("0.800"), "{e}");
        assert!(Policy { scheme: Scheme::None, ..policy(Scheme::None, 0.6) }.validate().unwrap_err().to_string().contains("none"));
        assert_eq!(Scheme::parse("erasure").unwrap(), Scheme::Erasure);
        assert!(Scheme::parse("raid").unwrap_err().to_string().contains("corec"));
        assert_eq!(policy(Scheme::Corec, 0.6).stripe(1, 3), Some((2, 1)));
        assert_eq!(policy(Scheme::Corec, 0.6).stripe(2, 3), None, "one data shard would be replication");
        assert_eq!(policy(Scheme::Corec, 0.6).stripe(0, 8), None);
        assert_eq!(stored_bytes(10, 1, Some(4)), 15);
        assert_eq!(stored_bytes(10, 2, None), 30);
    }

    #[test]
    fn superseded_and_far_boxes_turn_cold_newest_stay_hot() {
        let mut c = Classifier::new(policy(Scheme::Corec, 0.3));
        // Steps 0..4 write boxes 0 and 10 (far apart: 160 cells); steps 2.. only box 0.
        c.committed("d", 0, &[entry(1, "v", 0, 1), entry(2, "v", 160, 1)]);
        assert!(c.plan().is_empty(), "everything new is hot");
        c.committed("d", 1, &[entry(1, "v", 0, 1)]);
        let p = c.plan();
        assert_eq!(p, vec![Key { dataset: "d".into(), step: 0, id: 1 }], "the superseded version");
        c.committed("d", 2, &[entry(1, "v", 0, 1)]);
        // Box 160, unwritten for 2 steps and far from box 0, turns cold with the superseded one.
        let key = |step, id| Key { dataset: "d".into(), step, id };
        assert_eq!(c.plan(), vec![key(0, 2), key(1, 1)]);
        assert!(!c.is_encoded(&key(2, 1)));
        c.released("d", 0);
        assert_eq!(c.len(), 2);
    }

    #[test]
    fn look_ahead_keeps_neighbours_of_the_write_region_hot() {
        let mut c = Classifier::new(policy(Scheme::Corec, 0.3));
        c.committed("d", 0, &[entry(1, "v", 16, 1), entry(2, "v", 160, 1)]);
        for s in 1..4 {
            c.committed("d", s, &[entry(9, "v", 0, 1)]);
        }
        c.plan();
        assert!(!c.is_encoded(&Key { dataset: "d".into(), step: 0, id: 1 }), "next to box 0: predicted to be written");
        assert!(c.is_encoded(&Key { dataset: "d".into(), step: 0, id: 2 }));
    }

    #[test]
    fn the_bound_encodes_least_read_first_and_failures_go_back() {
        let mut c = Classifier::new(policy(Scheme::Corec, 0.6));
        c.committed("d", 0, &[entry(1, "v", 0, 1), entry(2, "v", 16, 1), entry(3, "v", 32, 1)]);
        c.read(&Key { dataset: "d".into(), step: 0, id: 1 });
        let p = c.plan();
        assert!(!p.contains(&Key { dataset: "d".into(), step: 0, id: 1 }) || p.len() == 3, "{p:?}");
        assert!(c.efficiency() >= 0.6);
        for k in &p {
            c.done(k, false);
        }
        assert!(c.efficiency() < 0.6, "failed encodings count as replicated again");
        assert_eq!(c.plan().len(), p.len());
    }

    proptest! {
        /// After every step's plan, storage efficiency is at least the bound, whatever the write
        /// pattern, levels and releases; with a bound below pure replication's, the newest
        /// step's objects are never chosen.
        #[test]
        fn efficiency_never_below_the_bound(
            steps in proptest::collection::vec((proptest::collection::vec(0u64..12, 1..8), any::<bool>(), any::<u8>()), 1..40),
            levels in (1u32..3, 0u32..3),
            lru in any::<bool>(),
            low in any::<bool>(),
        ) {
            let min = if low { 0.25 } else { 0.6 };
            let scheme = if lru { Scheme::Hybrid } else { Scheme::Corec };
            let mut c = Classifier::new(Policy { redundancy: 2, scheme, rs_data: 4, min_efficiency: min, hot_steps: 2 });
            let mut pending: Vec<Key> = Vec::new();
            for (step, (boxes, release, fail)) in steps.iter().enumerate() {
                let step = step as u64;
                let entries: Vec<Entry> = boxes.iter().enumerate().map(|(i, b)| {
                    let (var, level) = if i % 2 == 0 { ("a", levels.0) } else { ("b", levels.1) };
                    Entry { bytes: 100 + *b * 7, ..entry(i as u64, var, b * 16, level) }
                }).collect();
                c.committed("d", step, &entries);
                if *release && step >= 3 {
                    c.released("d", step - 3);
                }
                let planned = c.plan();
                prop_assert!(c.efficiency() >= min - 1e-12, "efficiency {} below {min} at step {step}", c.efficiency());
                if low {
                    prop_assert!(planned.iter().all(|k| k.step < step), "a newest object encoded without need: {planned:?}");
                }
                // Encodings end (some failing, then chosen again by the next plan) in any order.
                pending.extend(planned);
                let n = pending.len() / 2;
                for (i, k) in pending.drain(..n).enumerate() {
                    c.done(&k, !(*fail as usize + i).is_multiple_of(5));
                }
                pending.extend(c.plan());
                prop_assert!(c.efficiency() >= min - 1e-12);
                let encodable: BTreeSet<Key> = c.objs.iter().filter(|(_, t)| t.encodable()).map(|(k, _)| k.clone()).collect();
                prop_assert_eq!(&c.candidates, &encodable, "the candidates are exactly the encodable objects");
            }
        }
    }
}
