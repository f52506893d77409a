//! The index schema: variable definitions, block records, each writer's per-step fragment and the
//! committed step index merged from them. Serialized as JSON (see `docs/format.md`).

use crate::attrs::{check_attrs, check_dims, merge_attrs, Attrs};
use crate::dtype::DType;
use crate::error::{Error, Result};
use crate::region::{find_overlap, Region};
use crate::stats::Stats;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Version of the index format this build writes; readers refuse newer ones.
pub const FORMAT_VERSION: u32 = 1;

/// A variable: name, element type, and a global shape, or none for a *local* (per-writer,
/// variable-size) variable.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct VarDef {
    /// Variable name.
    pub name: String,
    /// Element type.
    pub dtype: DType,
    /// Global shape; `None` for a local variable.
    pub shape: Option<Vec<u64>>,
    /// Server failures its objects survive in a staging cluster (0: one copy).
    #[serde(default, skip_serializing_if = "is_zero_u32")]
    pub redundancy: u32,
    /// Names of the dimensions, one per dimension of `shape` (or of a local variable's blocks).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dims: Option<Vec<String>>,
    /// The variable's attributes (units, long name, …).
    #[serde(default, skip_serializing_if = "Attrs::is_empty")]
    pub attrs: Attrs,
    /// Step-invariant (a coordinate, a mesh): written in one step only, the first in which any
    /// rank puts it, and read without a step.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub constant: bool,
}

fn is_zero_u32(n: &u32) -> bool {
    *n == 0
}

impl VarDef {
    /// Builds a definition, checking the name and the number of dimensions.
    pub fn new(name: &str, dtype: DType, shape: Option<Vec<u64>>) -> Result<VarDef> {
        if name.is_empty() || name.len() > 256 || name.chars().any(|c| c.is_control()) {
            return Err(Error::InvalidArgument(format!("invalid variable name {name:?}: use 1 to 256 printable characters")));
        }
        if let Some(s) = &shape {
            Region::new(vec![0; s.len()], s.clone())?;
            let elements = s.iter().try_fold(1u64, |n, d| n.checked_mul(*d));
            if elements.and_then(|n| n.checked_mul(dtype.size() as u64)).is_none() {
                return Err(Error::InvalidArgument(format!(
                    "'{name}': shape {s:?} of {dtype} holds more than 2^64 bytes (its element count or byte size overflows 64 \
                     bits); give a smaller shape"
                )));
            }
        }
        Ok(VarDef { name: name.to_string(), dtype, shape, redundancy: 0, dims: None, attrs: Attrs::new(), constant: false })
    }

    /// The definition with dimension names and attributes, checked (see [`VarDef::check_meta`]).
    pub fn with_meta(mut self, dims: Option<Vec<String>>, attrs: Attrs) -> Result<VarDef> {
        self.dims = dims;
        self.attrs = attrs;
        self.check_meta()?;
        Ok(self)
    }

    /// Checks the dimension names (one per dimension; a local variable's are checked against its
    /// blocks) and the attributes (bounded in size).
    pub fn check_meta(&self) -> Result<()> {
        if let (Some(dims), Some(shape)) = (&self.dims, &self.shape) {
            check_dims(dims, shape.len(), &self.name)?;
        } else if let Some(dims) = &self.dims {
            check_dims(dims, dims.len(), &self.name)?;
        }
        check_attrs(&self.attrs, &format!("variable '{}'", self.name))
    }

    /// The definition of a step-invariant variable (see [`VarDef::constant`]): a global array.
    pub fn with_constant(mut self, constant: bool) -> Result<VarDef> {
        if constant && self.shape.is_none() {
            return Err(Error::InvalidArgument(format!(
                "'{}': a constant is a global array (a coordinate, a mesh); give it a shape, or drop constant=True",
                self.name
            )));
        }
        self.constant = constant;
        Ok(self)
    }

    /// The definition with redundancy level `r` (server failures its objects survive).
    pub fn with_redundancy(mut self, r: u32) -> VarDef {
        self.redundancy = r;
        self
    }

    /// Whether the variable is local (ragged, per writer).
    pub fn is_local(&self) -> bool {
        self.shape.is_none()
    }

    /// Human description, e.g. `f8 (256, 256)` or `f8 local`.
    pub fn describe(&self) -> String {
        let kind = match &self.shape {
            Some(s) => format!("{} {s:?}", self.dtype),
            None => format!("{} local", self.dtype),
        };
        let mut text = match self.redundancy {
            0 => kind,
            r => format!("{kind} surviving {r} server failures"),
        };
        if let Some(dims) = &self.dims {
            text += &format!(" dims ({})", dims.join(", "));
        }
        if self.constant {
            text += " constant";
        }
        if !self.attrs.is_empty() {
            let json = serde_json::to_string(&self.attrs).unwrap_or_default();
            let cut = json.char_indices().nth(120).map_or(json.len(), |(i, _)| i);
            text += &format!(" attrs {}{}", &json[..cut], if cut < json.len() { "…" } else { "" });
        }
        text
    }
}

/// Where one block's bytes are stored and what they hold.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BlockRecord {
    /// Variable name.
    pub var: String,
    /// Rank of the writer that put it.
    pub writer: u32,
    /// Box in the global index space (local variables: offset zero, count = the block's shape).
    pub region: Region,
    /// Data file, relative to the dataset directory.
    pub file: String,
    /// Byte offset of the block in the file.
    pub pos: u64,
    /// Length in bytes (`volume × element size`).
    pub len: u64,
    /// Checksum chunk size in bytes.
    pub chunk: u32,
    /// crc32c of each chunk.
    pub crcs: Vec<u32>,
    /// crc32c of the whole block; for a staged block, the XOR of its objects' checksums (each
    /// object carries its own crc32c, which readers verify).
    pub checksum: u32,
    /// Min/max/mean of the values.
    #[serde(flatten)]
    pub stats: Stats,
    /// Staging engine: the objects the block was split into, in place of `file`/`pos`/`crcs`.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub objects: Vec<ObjectRef>,
    /// The codec pipeline of the stored bytes (a [`crate::codec::Pipeline`] spec such as
    /// `pco:f8le:4`); absent when stored raw. `crcs` and `checksum` are of the raw bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub codec: Option<String>,
    /// Bytes stored in `file` from `pos` when compressed (`len` stays the raw length).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub stored: u64,
}

fn is_zero(v: &u64) -> bool {
    *v == 0
}

/// One staged object: a piece of a block held by a server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ObjectRef {
    /// Object id, unique within a dataset step: the writer rank in the high 32 bits.
    pub id: u64,
    /// Its box (inside the block's).
    pub region: Region,
    /// Server holding it (the first copy).
    pub server: u32,
    /// crc32c of its bytes (C order of `region`).
    pub checksum: u32,
    /// The copies it has beyond one.
    #[serde(default, skip_serializing_if = "Redundancy::is_single")]
    pub redundancy: Redundancy,
}

/// How an object survives server failures.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Redundancy {
    /// One copy, on `server`.
    #[default]
    Single,
    /// Whole copies on each of `servers` (the first is `server`), in different failure domains.
    Replicated {
        /// Servers holding a copy, in the order readers try them.
        servers: Vec<u32>,
    },
    /// Reed–Solomon coded: `k` data shards (the object's bytes cut in `k`, the last padded) and
    /// `m` parity shards, shard `i` on `shards[i]` (stored under shard number `i + 1`); any `k`
    /// give the object back (see [`crate::erasure`]).
    Encoded {
        /// Data shards.
        k: u32,
        /// Parity shards (the level: server failures survived).
        m: u32,
        /// Server of each shard, data shards first.
        shards: Vec<u32>,
    },
}

impl Redundancy {
    fn is_single(&self) -> bool {
        matches!(self, Redundancy::Single)
    }
}

impl ObjectRef {
    /// The servers holding a whole copy, in the order to try them (none when encoded).
    pub fn holders(&self) -> Vec<u32> {
        match &self.redundancy {
            Redundancy::Single => vec![self.server],
            Redundancy::Replicated { servers } => servers.clone(),
            Redundancy::Encoded { .. } => Vec::new(),
        }
    }

    /// Every server holding a copy or a shard of it.
    pub fn servers(&self) -> Vec<u32> {
        match &self.redundancy {
            Redundancy::Encoded { shards, .. } => shards.clone(),
            _ => self.holders(),
        }
    }
}

impl BlockRecord {
    /// Checks the record's internal consistency against its variable, so that a damaged index is
    /// reported as corrupt instead of steering a read out of bounds.
    pub fn validate(&self, def: &VarDef) -> Result<()> {
        let bad = |why: String| Err(Error::Corrupt(format!("index entry for a block of '{}' by writer {}: {why}", self.var, self.writer)));
        if self.region.offset.len() != self.region.count.len() {
            return bad("offset and count differ in length".into());
        }
        if let Some(shape) = &def.shape {
            if self.region.check_within(shape, "block").is_err() {
                return bad(format!("box {:?}+{:?} lies outside shape {shape:?}", self.region.offset, self.region.count));
            }
        }
        let want = self.region.volume().checked_mul(def.dtype.size() as u64);
        if want != Some(self.len) {
            return bad(format!("length {} does not match its box ({:?} bytes)", self.len, want));
        }
        if !self.objects.is_empty() {
            let mut volume = 0u64;
            for o in &self.objects {
                // Regions are checked when decoded, but index entries are also built in code:
                // compare dimension by dimension without indexing past either box.
                let inside = o.region.ndim() == self.region.ndim()
                    && o.region.offset.len() == o.region.ndim()
                    && o.region
                        .offset
                        .iter()
                        .zip(&o.region.count)
                        .zip(self.region.offset.iter().zip(&self.region.count))
                        .all(|((&oo, &oc), (&bo, &bc))| oo >= bo && oo.checked_add(oc).is_some_and(|e| Some(e) <= bo.checked_add(bc)));
                if !inside {
                    return bad(format!("object {:?}+{:?} lies outside its block", o.region.offset, o.region.count));
                }
                let servers = o.servers();
                let distinct = servers.iter().collect::<std::collections::BTreeSet<_>>().len();
                if servers.first() != Some(&o.server) || distinct != servers.len() || servers.len() > crate::erasure::MAX_SHARDS {
                    return bad(format!("object {:#x} lists its copies on {servers:?}, not distinct servers led by {}", o.id, o.server));
                }
                if let Redundancy::Encoded { k, m, shards } = &o.redundancy {
                    if *k == 0 || *m == 0 || (*k as usize).saturating_add(*m as usize) != shards.len() {
                        return bad(format!("object {:#x} is coded {k}+{m} but lists {} shards", o.id, shards.len()));
                    }
                }
                volume = volume.saturating_add(o.region.volume());
            }
            if volume != self.region.volume() {
                return bad("its objects do not cover the block".into());
            }
        } else if self.chunk == 0 || self.crcs.len() as u64 != self.len.div_ceil(self.chunk as u64) {
            return bad("checksum list does not cover the block".into());
        }
        if self.pos.checked_add(self.len.max(self.stored)).is_none() {
            return bad("position overflows".into());
        }
        if let Some(spec) = &self.codec {
            if crate::codec::Pipeline::parse(spec).is_err() || self.stored == 0 {
                return bad(format!("codec {spec:?} is unknown or has no stored length"));
            }
        }
        Ok(())
    }
}

/// What one writer commits for one step: its definitions and blocks.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Fragment {
    /// Index format version.
    pub format: u32,
    /// Step number.
    pub step: u64,
    /// Writer rank.
    pub writer: u32,
    /// Number of writers the step waits for.
    pub nranks: u32,
    /// The writer session (one launch of the application); only fragments of one session merge,
    /// so fragments a crashed run left behind never mix with those of its restart.
    #[serde(default)]
    pub session: String,
    /// Variables this writer defined.
    pub vars: Vec<VarDef>,
    /// Blocks this writer put in the step.
    pub blocks: Vec<BlockRecord>,
    /// Datasets (same cluster) whose same step this step's commit releases, in one transaction
    /// with it (D²T consume-and-produce).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub consume: Vec<String>,
    /// Attributes of the dataset this writer set.
    #[serde(default, skip_serializing_if = "Attrs::is_empty")]
    pub attrs: Attrs,
}

/// Writer ranks of one step at most (4 Mi, beyond the largest MPI jobs): a step stays pending
/// until every rank ends it, so an absurd count would hold it pending for ever.
pub const MAX_RANKS: u32 = 1 << 22;

impl Fragment {
    /// A fragment in the current format version.
    pub fn new(step: u64, writer: u32, nranks: u32, session: String, vars: Vec<VarDef>, blocks: Vec<BlockRecord>) -> Fragment {
        Fragment { format: FORMAT_VERSION, step, writer, nranks, session, vars, blocks, consume: Vec::new(), attrs: Attrs::new() }
    }

    /// Checks what one fragment can show alone (before it is merged with the others): a valid
    /// rank, every block this writer's and valid against this writer's definition of its variable.
    pub fn validate(&self) -> Result<()> {
        if self.nranks == 0 || self.writer >= self.nranks {
            return Err(Error::InvalidArgument(format!("writer {} of {} writers is not a valid rank", self.writer, self.nranks)));
        }
        if self.nranks > MAX_RANKS {
            return Err(Error::InvalidArgument(format!(
                "{} writers of one step: at most {MAX_RANKS} (a step waits for every one of them to end it)",
                self.nranks
            )));
        }
        check_attrs(&self.attrs, "the dataset")?;
        for v in &self.vars {
            v.check_meta()?;
        }
        for b in &self.blocks {
            if b.writer != self.writer {
                return Err(Error::InvalidArgument(format!("fragment of writer {} holds a block of writer {}", self.writer, b.writer)));
            }
            let def = self.vars.iter().find(|v| v.name == b.var).ok_or_else(|| {
                Error::InvalidArgument(format!("step {}: writer {} put '{}' without defining it", self.step, self.writer, b.var))
            })?;
            b.validate(def)?;
        }
        Ok(())
    }

    /// Whether `other` carries the same blocks and definitions (a writer retrying its end of
    /// step), ignoring statistics (NaN never equals itself).
    pub fn same_content(&self, other: &Fragment) -> bool {
        let key = |b: &BlockRecord| (b.var.clone(), b.region.clone(), b.len, b.checksum, b.objects.clone());
        (self.step, self.writer, self.nranks, &self.session, &self.vars, &self.consume, &self.attrs)
            == (other.step, other.writer, other.nranks, &other.session, &other.vars, &other.consume, &other.attrs)
            && self.blocks.iter().map(key).eq(other.blocks.iter().map(key))
    }
}

/// The committed index of one step: every writer's blocks, validated together.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StepIndex {
    /// Index format version.
    pub format: u32,
    /// Step number.
    pub step: u64,
    /// Number of writers that committed it.
    pub nranks: u32,
    /// Variables defined in the step, by name.
    pub vars: BTreeMap<String, VarDef>,
    /// All blocks of the step.
    pub blocks: Vec<BlockRecord>,
    /// Attributes of the dataset, as of this step (every writer's, merged).
    #[serde(default, skip_serializing_if = "Attrs::is_empty")]
    pub attrs: Attrs,
    /// The consume-and-produce transaction whose commit this is (file engine), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub consumed: Option<Consumed>,
    /// A step a staging cluster drained: which cluster, and the objects each block was staged as
    /// (how a drain knows a step on disk for its own, docs/format.md *Drained steps*).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub staged: Option<Staged>,
}

/// The identity of a drained step: the cluster that drained it and, per block (in the index's
/// order), the staged objects' ids, boxes and crc32c. A drain takes a step it finds on disk for
/// the one it owes only when all of these match; statistics or sizes never decide it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Staged {
    /// The cluster's id (`ClusterFile::id`, made at `cluster start`).
    pub cluster: String,
    /// Per block, its objects.
    pub blocks: Vec<Vec<StagedObject>>,
}

/// One staged object of a drained block.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StagedObject {
    /// Object id within the step.
    pub id: u64,
    /// Its box.
    pub region: Region,
    /// crc32c of its bytes.
    pub checksum: u32,
}

impl Staged {
    /// The identity of committed staging step `index` as cluster `cluster` drains it.
    pub fn of(cluster: &str, index: &StepIndex) -> Staged {
        let blocks = index
            .blocks
            .iter()
            .map(|b| b.objects.iter().map(|o| StagedObject { id: o.id, region: o.region.clone(), checksum: o.checksum }).collect())
            .collect();
        Staged { cluster: cluster.to_string(), blocks }
    }
}

/// A step committed by a consume-and-produce transaction of the file engine: the source
/// datasets' `taken/` entries carry its id, and readers of a source hide the step it took once
/// this index is committed (docs/format.md, *Consume*).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Consumed {
    /// The transaction's id.
    pub txn: String,
    /// Datasets beside this one whose same step the commit released.
    pub datasets: Vec<String>,
}

impl StepIndex {
    /// Merges the fragments of all writers, checking that every rank `0..nranks` is present once,
    /// that definitions agree, and that no two blocks of a global variable overlap.
    pub fn merge(step: u64, mut frags: Vec<Fragment>) -> Result<StepIndex> {
        frags.sort_by_key(|f| f.writer);
        let nranks = frags.first().map(|f| f.nranks).unwrap_or(0);
        let ranks: Vec<u32> = frags.iter().map(|f| f.writer).collect();
        if frags.iter().any(|f| f.nranks != nranks) || ranks != (0..nranks).collect::<Vec<_>>() {
            return Err(Error::Conflict(format!(
                "step {step}: writers disagree on the number of ranks or a rank is repeated \
                 (fragments from ranks {ranks:?}, nranks {:?}); open every writer with the same nranks",
                frags.iter().map(|f| f.nranks).collect::<Vec<_>>()
            )));
        }
        let mut vars: BTreeMap<String, (VarDef, u32)> = BTreeMap::new();
        let mut attrs = Attrs::new();
        for f in &frags {
            merge_attrs(&mut attrs, &f.attrs, &format!("step {step} by an earlier rank"), &format!("rank {}", f.writer))?;
            for v in &f.vars {
                match vars.get(&v.name) {
                    Some((prev, r)) if prev != v => {
                        return Err(Error::Conflict(format!(
                            "step {step}: rank {r} defined '{}' as {} but rank {} as {}; every rank must \
                             define a variable the same way",
                            v.name,
                            prev.describe(),
                            f.writer,
                            v.describe()
                        )))
                    }
                    Some(_) => {}
                    None => {
                        vars.insert(v.name.clone(), (v.clone(), f.writer));
                    }
                }
            }
        }
        let index = StepIndex {
            format: FORMAT_VERSION,
            step,
            nranks,
            vars: vars.into_iter().map(|(k, (v, _))| (k, v)).collect(),
            blocks: frags.into_iter().flat_map(|f| f.blocks).collect(),
            attrs,
            consumed: None,
            staged: None,
        };
        index.validate()?;
        Ok(index)
    }

    /// Checks blocks against definitions and each other.
    pub fn validate(&self) -> Result<()> {
        let mut by_var: BTreeMap<&str, Vec<&BlockRecord>> = BTreeMap::new();
        for b in &self.blocks {
            let def = self
                .vars
                .get(&b.var)
                .ok_or_else(|| Error::Corrupt(format!("step {}: block of undefined variable '{}'", self.step, b.var)))?;
            b.validate(def)?;
            by_var.entry(&b.var).or_default().push(b);
        }
        for (name, blocks) in by_var {
            if self.vars[name].is_local() {
                let mut writers: Vec<u32> = blocks.iter().map(|b| b.writer).collect();
                writers.sort_unstable();
                if let Some(w) = writers.windows(2).find(|w| w[0] == w[1]) {
                    return Err(Error::Conflict(format!(
                        "step {}: writer {} put local variable '{name}' twice; put one block per writer per step",
                        self.step, w[0]
                    )));
                }
                continue;
            }
            let regions: Vec<&Region> = blocks.iter().map(|b| &b.region).collect();
            if let Some((i, j)) = find_overlap(&regions) {
                let (a, b) = (blocks[i], blocks[j]);
                return Err(Error::Conflict(format!(
                    "step {}: blocks of '{name}' overlap: writer {} put offset {:?} count {:?} and writer {} \
                     put offset {:?} count {:?}; each element may be written once per step",
                    self.step, a.writer, a.region.offset, a.region.count, b.writer, b.region.offset, b.region.count
                )));
            }
        }
        Ok(())
    }

    /// Blocks of one variable.
    pub fn blocks_of<'a>(&'a self, var: &'a str) -> impl Iterator<Item = &'a BlockRecord> + 'a {
        self.blocks.iter().filter(move |b| b.var == var)
    }
}

/// Serializes an index document.
pub fn to_json<T: Serialize>(doc: &T) -> Vec<u8> {
    serde_json::to_vec(doc).expect("index documents always serialize")
}

/// Parses an index document, reporting damage as [`Error::Corrupt`] naming `what`.
pub fn from_json<T: for<'de> Deserialize<'de> + HasFormat>(bytes: &[u8], what: &str) -> Result<T> {
    let doc: T = serde_json::from_slice(bytes)
        .map_err(|e| Error::Corrupt(format!("{what} does not parse ({e}); the file is damaged or truncated")))?;
    if doc.format() > FORMAT_VERSION {
        return Err(Error::Corrupt(format!(
            "{what} has format version {} but this Cairn reads up to {FORMAT_VERSION}; upgrade Cairn",
            doc.format()
        )));
    }
    Ok(doc)
}

/// Documents that carry a format version.
pub trait HasFormat {
    /// The document's format version.
    fn format(&self) -> u32;
}
impl HasFormat for Fragment {
    fn format(&self) -> u32 {
        self.format
    }
}
impl HasFormat for StepIndex {
    fn format(&self) -> u32 {
        self.format
    }
}

/// Serde for `Option<f64>` that keeps non-finite values (JSON has no NaN or infinity).
pub mod opt_f64 {
    use serde::de::{self, Visitor};
    use serde::{Deserializer, Serializer};

    /// Writes finite values as numbers and others as `"inf"`, `"-inf"`, `"nan"`.
    pub fn serialize<S: Serializer>(v: &Option<f64>, s: S) -> Result<S::Ok, S::Error> {
        match v {
            None => s.serialize_none(),
            Some(x) if x.is_finite() => s.serialize_some(x),
            Some(x) => s.serialize_some(&x.to_string().to_lowercase()),
        }
    }

    /// A visitor, not an untagged enum, which buffers each value first (three per block record):
    /// decoding an end of step of 1,024 blocks took 11.5 ms with it, 8.4 ms with this.
    struct Num;

    impl<'de> Visitor<'de> for Num {
        type Value = Option<f64>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a number, \"inf\", \"-inf\", \"nan\" or null")
        }
        fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
            Ok(Some(v))
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
            Ok(Some(v as f64))
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
            Ok(Some(v as f64))
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
            v.parse().map(Some).map_err(E::custom)
        }
        fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
            Ok(None)
        }
        fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
            d.deserialize_any(Num)
        }
    }

    /// Reads what [`serialize`] wrote.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<f64>, D::Error> {
        d.deserialize_option(Num)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn block(var: &str, writer: u32, o: &[u64], c: &[u64]) -> BlockRecord {
        let region = Region::new(o.to_vec(), c.to_vec()).unwrap();
        let len = region.volume() * 8;
        BlockRecord {
            var: var.into(),
            writer,
            region,
            file: format!("data/rank-{writer}.bin"),
            pos: 0,
            len,
            chunk: 1 << 20,
            crcs: vec![0; len.div_ceil(1 << 20) as usize],
            checksum: 0,
            stats: Stats { min: Some(f64::NEG_INFINITY), max: Some(f64::NAN), mean: None },
            objects: Vec::new(),
            codec: None,
            stored: 0,
        }
    }

    fn frag(writer: u32, nranks: u32, blocks: Vec<BlockRecord>) -> Fragment {
        let vars = vec![VarDef::new("p", DType::F64, Some(vec![10, 4])).unwrap(), VarDef::new("w", DType::F64, None).unwrap()];
        Fragment::new(3, writer, nranks, String::new(), vars, blocks)
    }

    #[test]
    fn malformed_object_regions_are_errors_not_panics() {
        let mut b = block("p", 0, &[0, 0], &[10, 4]);
        // Built in code, bypassing the checks decoding applies: validation must still not index past it.
        b.objects = vec![ObjectRef {
            id: 1,
            region: Region { offset: vec![], count: vec![10, 4] },
            server: 0,
            checksum: 0,
            redundancy: Redundancy::Single,
        }];
        let def = VarDef::new("p", DType::F64, Some(vec![10, 4])).unwrap();
        assert!(b.validate(&def).unwrap_err().to_string().contains("outside its block"));
        b.objects[0].region = Region { offset: vec![0, u64::MAX], count: vec![10, 4] };
        assert!(b.validate(&def).is_err());
    }

    #[test]
    fn merge_round_trips_through_json_with_non_finite_stats() {
        let idx = StepIndex::merge(
            3,
            vec![
                frag(1, 2, vec![block("p", 1, &[5, 0], &[5, 4]), block("w", 1, &[0], &[7])]),
                frag(0, 2, vec![block("p", 0, &[0, 0], &[5, 4])]),
            ],
        )
        .unwrap();
        let back: StepIndex = from_json(&to_json(&idx), "step 3").unwrap();
        assert_eq!(back.blocks.len(), 3);
        assert!(back.blocks[0].stats.max.unwrap().is_nan());
        assert_eq!(back.blocks[0].stats.min, Some(f64::NEG_INFINITY));
    }

    #[test]
    fn merge_refuses_overlaps_missing_ranks_and_conflicting_definitions() {
        let e =
            StepIndex::merge(3, vec![frag(0, 2, vec![block("p", 0, &[0, 0], &[6, 4])]), frag(1, 2, vec![block("p", 1, &[5, 0], &[5, 4])])])
                .unwrap_err();
        assert!(e.to_string().contains("overlap") && e.to_string().contains("writer 1"), "{e}");
        assert!(StepIndex::merge(3, vec![frag(0, 3, vec![]), frag(1, 3, vec![])]).is_err());
        let mut other = frag(1, 2, vec![]);
        other.vars[0].dtype = DType::F32;
        let e = StepIndex::merge(3, vec![frag(0, 2, vec![]), other]).unwrap_err().to_string();
        assert!(e.contains("'p'") && e.contains("f4"), "{e}");
    }

    #[test]
    fn dims_and_attrs_round_trip_and_leave_old_indexes_unchanged() {
        let old = to_json(&StepIndex::merge(3, vec![frag(0, 1, vec![])]).unwrap());
        assert!(!String::from_utf8_lossy(&old).contains("dims") && !String::from_utf8_lossy(&old).contains("attrs"));
        let mut f = frag(0, 1, vec![]);
        let units = serde_json::json!({"units": "K", "scale": [1, 2.5]}).as_object().unwrap().clone();
        f.vars[0] = f.vars[0].clone().with_meta(Some(vec!["y".into(), "x".into()]), units.clone()).unwrap();
        f.attrs = serde_json::json!({"title": "run"}).as_object().unwrap().clone();
        let back: StepIndex = from_json(&to_json(&StepIndex::merge(3, vec![f]).unwrap()), "step 3").unwrap();
        assert_eq!(back.vars["p"].dims.as_deref(), Some(&["y".to_string(), "x".to_string()][..]));
        assert_eq!(back.vars["p"].attrs, units);
        assert_eq!(back.attrs["title"], "run");
        let e = VarDef::new("p", DType::F64, Some(vec![10, 4])).unwrap().with_meta(Some(vec!["x".into()]), Attrs::new()).unwrap_err();
        assert!(e.to_string().contains("2 dimensions but 1"), "{e}");
    }

    #[test]
    fn ranks_setting_one_dataset_attribute_differently_conflict() {
        let mut a = frag(0, 2, vec![]);
        let mut b = frag(1, 2, vec![]);
        a.attrs = serde_json::json!({"title": "a"}).as_object().unwrap().clone();
        b.attrs = serde_json::json!({"title": "b"}).as_object().unwrap().clone();
        let e = StepIndex::merge(3, vec![a.clone(), b]).unwrap_err();
        assert!(e.to_string().contains("\"title\" is \"a\"") && e.to_string().contains("rank 1"), "{e}");
        let idx = StepIndex::merge(3, vec![a, frag(1, 2, vec![])]).unwrap();
        assert_eq!(idx.attrs["title"], "a");
    }

    #[test]
    fn damaged_documents_are_corrupt_not_panics() {
        let mut idx = StepIndex::merge(3, vec![frag(0, 1, vec![block("p", 0, &[0, 0], &[10, 4])])]).unwrap();
        idx.blocks[0].len += 8;
        let e = from_json::<StepIndex>(&to_json(&idx), "step 3").and_then(|i| i.validate()).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Corrupt);
        let e = from_json::<StepIndex>(b"{\"format\":1,\"st", "step 3").unwrap_err();
        assert!(e.to_string().contains("truncated"));
    }
}
