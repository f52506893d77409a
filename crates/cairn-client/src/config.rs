//! `cairn.toml`: which engine, and its settings. Found from an explicit path, else `$CAIRN_CONFIG`,
//! else `./cairn.toml`, else defaults; keyword overrides from the caller win over all of them.

use cairn_core::{Error, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// The engine a dataset is written and read with.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum EngineKind {
    /// Each writer appends to its own data file; a global index per step (no servers).
    #[default]
    File,
    /// Staging servers holding data in memory.
    Staging,
}

/// Settings of the `file` engine (`[file]` in `cairn.toml`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FileConfig {
    /// Directory holding datasets; a dataset `name` lives in `path/name`.
    pub path: PathBuf,
    /// Flush data and index to stable storage at every step end (survives power loss, not only
    /// process crashes; costs a disk flush per step).
    pub fsync: bool,
    /// Checksum chunk size in bytes.
    #[serde(deserialize_with = "units::size")]
    pub chunk_size: u32,
    /// Compression of stored blocks: `none`, `aware` (pco for numbers, zstd otherwise, chosen by
    /// each variable's element type), `zstd[:LEVEL]` or `gzip[:LEVEL]`. Reads decompress
    /// transparently; a box read decodes the blocks it touches whole.
    pub compression: String,
    /// With an MPI communicator, how a step's blocks reach the data files: `offsets` (each put
    /// reserves room in its group's file by a one-sided fetch-and-add and writes there; 1.3–2.7×
    /// `send`'s write rate at 4–128 ranks in bench file-scale), `send` (members send them to
    /// their group's aggregator at the step's end, which writes them) or `none` (every rank its
    /// own file, as without a communicator). Metadata is gathered over MPI unless `none`.
    pub aggregation: String,
    /// Number of aggregator groups; 0 = one per node (ranks sharing memory).
    pub aggregators: u32,
}

impl Default for FileConfig {
    fn default() -> Self {
        FileConfig {
            path: PathBuf::from("."),
            fsync: false,
            chunk_size: cairn_core::checksum::DEFAULT_CHUNK,
            compression: "none".into(),
            aggregation: "offsets".into(),
            aggregators: 0,
        }
    }
}

impl FileConfig {
    /// The compression policy, or `None` for `none`.
    pub fn compression(&self) -> Result<Option<cairn_core::codec::Policy>> {
        match self.compression.as_str() {
            "none" | "" => Ok(None),
            other => cairn_core::codec::Policy::parse(other)
                .map(Some)
                .map_err(|_| Error::Config(format!("[file] compression = {other:?}: use none, aware, zstd[:1-19] or gzip[:1-9]"))),
        }
    }
}

/// Settings of the `staging` engine (`[staging]` in `cairn.toml`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StagingConfig {
    /// Cluster file written by `cairn cluster start`; none starts an embedded local cluster.
    pub cluster: Option<PathBuf>,
    /// Target object size in bytes: larger blocks are halved until their pieces fit.
    #[serde(deserialize_with = "units::size")]
    pub object_size: u64,
    /// Keep only this many newest committed steps; older ones are released at each commit.
    pub keep_last: Option<u64>,
    /// The queue limit writers set on the datasets they open (committed steps not yet
    /// released; see `define_queue`), and its policy: "block" (default) or "discard_oldest".
    pub queue_limit: Option<u64>,
    /// See `queue_limit`.
    pub queue_policy: Option<String>,
    /// Embedded cluster: keep it running after the program ends (for readers in other processes).
    pub keep: bool,
    /// Embedded cluster: number of servers.
    pub servers: u32,
    /// Embedded cluster: memory limit per server, e.g. "4GiB".
    #[serde(deserialize_with = "units::size_text")]
    pub memory: String,
    /// How this process reaches servers: "auto" (servers on this host: same-node copies, where the
    /// server copies object bytes straight from and to this process's memory, over a Unix socket;
    /// the socket alone where the kernel forbids them; TCP to other hosts), "socket" (no
    /// same-node copies) or "tcp" (TCP even on this host).
    pub transport: String,
    /// Same-node puts ("auto"): objects of at least this many bytes are written into shared-memory
    /// segments the server leases and keeps as their memory (one copy, at memcpy speed); smaller
    /// ones are copied by the server from this process's memory.
    #[serde(deserialize_with = "units::size")]
    pub shared_min: u64,
    /// Seconds every read and write to a server may take to make progress; a server that misses
    /// it (hung, overloaded, gone) is reported by `UnavailableError`. Waits such as `wait_step`
    /// add their own timeout to it.
    #[serde(deserialize_with = "units::seconds")]
    pub timeout: f64,
    /// Redundancy level of variables that do not name one (default: the cluster's, set by
    /// `cairn cluster start --redundancy`); also the level a cluster started from here gets.
    pub redundancy: Option<u32>,
    /// Clusters started from here: how objects are kept ("corec", "replicate", "erasure",
    /// "hybrid", "none").
    pub scheme: Option<String>,
    /// Clusters started from here: data shards per stripe.
    pub rs_data: Option<u32>,
    /// Clusters started from here: storage efficiency CoREC never goes below.
    pub min_efficiency: Option<f64>,
    /// Clusters started from here: steps a box stays hot after it was written.
    pub hot_steps: Option<u32>,
    /// Clusters started from here: how long a silent server may go unheard before it is
    /// declared down ("5s", "250ms" or seconds; servers default to 3 s).
    pub failure_timeout: Option<Duration>,
    /// Clusters started from here: "lazy" (default) or "aggressive" recovery onto spares.
    pub recovery: Option<String>,
    /// Clusters started from here: lazy recovery rebuilds a lost server's objects within this
    /// (servers default to a quarter of `mtbf`, else 60 s).
    pub recovery_deadline: Option<Duration>,
    /// Clusters started from here: bytes per second recovery may send ("256MiB", the servers'
    /// default; 0: no limit).
    #[serde(deserialize_with = "units::some_rate_text")]
    pub recovery_rate: Option<String>,
    /// Clusters started from here: the mean time between server failures expected.
    pub mtbf: Option<Duration>,
    /// Clusters started from here: drain every committed step to this folder in the background
    /// (`PATH/<dataset>/`, a `file`-engine dataset); readers fall back to it.
    pub drain: Option<PathBuf>,
    /// Clusters started from here: drain the steps whose number is a multiple of this (default
    /// 1), or `"auto"` (Young/Daly from the measured drain cost and `drain_mtbf`).
    pub drain_every: Option<DrainEvery>,
    /// Clusters started from here: mean time between losses of the memory level.
    pub drain_mtbf: Option<Duration>,
    /// Clusters started from here: bytes of shared memory each server makes ready for same-node
    /// writers from start-up ("1GiB"; servers default to `min(memory, 1GiB)`; 0: none).
    #[serde(deserialize_with = "units::some_size_text")]
    pub prefault: Option<String>,
    /// Clusters started from here: server 0's Prometheus metrics address `HOST:PORT` (server
    /// i takes PORT + i), or `off`; servers default to their own address and a free port.
    pub metrics: Option<String>,
    /// Clusters started from here: label per-dataset byte counters with dataset names (off by
    /// default: names can say what a run is about, and the metrics port is unauthenticated).
    pub metrics_datasets: Option<bool>,
    /// Clusters started from here: same-node copies for other users' clients too (the Unix
    /// socket then connectable by them; docs/protocol.md, threat model).
    pub same_node_other_users: Option<bool>,
    /// Clusters started from here, with `same_node_other_users`: only this group's users may
    /// connect (socket 0660 of the group; the cluster file readable by it).
    pub socket_group: Option<String>,
}

/// Size and seconds keys as users write them: every size key takes a size with a unit
/// (`cairn_proto::cluster::parse_size`: `"4G"`, `"512MiB"`) or an integer of bytes, every
/// seconds key a number of seconds or a duration (`"250ms"`, `"2m"`).
mod units {
    use serde::{Deserialize, Deserializer};

    /// A size or a seconds value as written in TOML.
    #[derive(Deserialize)]
    #[serde(untagged)]
    enum Written {
        Int(u64),
        Float(f64),
        Text(String),
    }

    /// `text` as a size in bytes, `None` if it does not fit `T`; an error if it is no size.
    pub(super) fn parse<T: TryFrom<u64>>(text: &str) -> cairn_core::Result<Option<T>> {
        Ok(T::try_from(cairn_proto::cluster::parse_size(text)?).ok())
    }

    /// The bytes of a written size (with `rate`, a trailing `/s` allowed) and its text.
    fn written<'de, D: Deserializer<'de>>(d: D, rate: bool) -> Result<(u64, String), D::Error> {
        match Written::deserialize(d)? {
            Written::Int(n) => Ok((n, n.to_string())),
            Written::Float(_) => Err(serde::de::Error::custom("a size is an integer of bytes or text with a unit, e.g. \"4GiB\"")),
            Written::Text(t) => {
                let n =
                    cairn_proto::cluster::parse_size(if rate { t.trim_end_matches("/s") } else { &t }).map_err(serde::de::Error::custom)?;
                Ok((n, t))
            }
        }
    }

    pub(super) fn size<'de, D: Deserializer<'de>, T: TryFrom<u64>>(d: D) -> Result<T, D::Error> {
        let (n, _) = written(d, false)?;
        T::try_from(n).map_err(|_| serde::de::Error::custom(format!("{n} bytes is too large here")))
    }

    /// A size kept as written (servers parse it again), checked; an integer becomes its text.
    pub(super) fn size_text<'de, D: Deserializer<'de>>(d: D) -> Result<String, D::Error> {
        written(d, false).map(|(_, t)| t)
    }

    pub(super) fn some_size_text<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
        size_text(d).map(Some)
    }

    /// A rate in bytes per second (`"256MiB/s"`, or as a size), kept as written.
    pub(super) fn some_rate_text<'de, D: Deserializer<'de>>(d: D) -> Result<Option<String>, D::Error> {
        written(d, true).map(|(_, t)| Some(t))
    }

    /// Seconds: a number, or a duration with a unit.
    pub(super) fn seconds<'de, D: Deserializer<'de>>(d: D) -> Result<f64, D::Error> {
        match Written::deserialize(d)? {
            Written::Int(n) => Ok(n as f64),
            Written::Float(f) => Ok(f),
            Written::Text(t) => cairn_proto::cluster::parse_duration(&t).map(|d| d.as_secs_f64()).map_err(serde::de::Error::custom),
        }
    }
}

/// `drain_every`: a step count, or `"auto"`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum DrainEvery {
    /// Every this many steps.
    Steps(u64),
    /// `"auto"` (or a count written as text).
    Text(String),
}

impl DrainEvery {
    /// The cadence, checked: `None` for `auto`.
    pub fn get(&self) -> Result<Option<u64>> {
        let bad = || Error::Config(format!("[staging] drain_every = {self:?}: give a step count >= 1, or \"auto\""));
        match self {
            DrainEvery::Steps(0) => Err(bad()),
            DrainEvery::Steps(n) => Ok(Some(*n)),
            DrainEvery::Text(t) if t == "auto" => Ok(None),
            DrainEvery::Text(t) => t.parse::<u64>().ok().filter(|n| *n > 0).map(Some).ok_or_else(bad),
        }
    }
}

/// A duration setting: seconds, or a string with a unit (`"5s"`, `"250ms"`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Duration {
    /// Seconds.
    Seconds(f64),
    /// With a unit.
    Text(String),
}

impl Duration {
    /// The duration, checked.
    pub fn get(&self) -> Result<std::time::Duration> {
        match self {
            Duration::Seconds(s) => cairn_proto::cluster::parse_duration(&s.to_string()),
            Duration::Text(t) => cairn_proto::cluster::parse_duration(t),
        }
    }
}

impl StagingConfig {
    /// The redundancy settings of a cluster started from here: `base` with this table's keys.
    pub fn policy(&self, base: cairn_core::corec::Policy) -> Result<cairn_core::corec::Policy> {
        let mut p = base;
        if let Some(r) = self.redundancy {
            p.redundancy = r;
        }
        if let Some(s) = &self.scheme {
            p.scheme = cairn_core::corec::Scheme::parse(s)?;
        }
        if let Some(k) = self.rs_data {
            p.rs_data = k;
        }
        if let Some(e) = self.min_efficiency {
            p.min_efficiency = e;
        }
        if let Some(h) = self.hot_steps {
            p.hot_steps = h;
        }
        p.validate()?;
        Ok(p)
    }
}

/// Default deadline of every call to a staging server, in seconds: well above a loaded server's
/// answer time and above its own deadline for calls to peers (5 s), so that a writer ending a
/// step hears which peer failed rather than timing out first.
pub const DEFAULT_TIMEOUT: f64 = 10.0;

impl StagingConfig {
    /// The deadline as a duration, checked.
    pub fn deadline(&self) -> Result<std::time::Duration> {
        std::time::Duration::try_from_secs_f64(self.timeout)
            .ok()
            .filter(|d| !d.is_zero())
            .ok_or_else(|| Error::Config(format!("[staging] timeout = {}: use a positive number of seconds", self.timeout)))
    }
}

/// Default target object size: large enough that per-object overhead vanishes next to the bytes,
/// small enough that objects spread over servers and rebuild quickly.
pub const DEFAULT_OBJECT_SIZE: u64 = 16 << 20;

/// Default [`StagingConfig::shared_min`]: each shared segment costs a descriptor held by the
/// server and a mapping made and unmade by the writer, which a copy of 1 MiB amortizes.
pub const DEFAULT_SHARED_MIN: u64 = 1 << 20;

impl Default for StagingConfig {
    fn default() -> Self {
        StagingConfig {
            cluster: None,
            object_size: DEFAULT_OBJECT_SIZE,
            keep_last: None,
            queue_limit: None,
            queue_policy: None,
            keep: false,
            servers: 3,
            memory: "4GiB".into(),
            transport: "auto".into(),
            shared_min: DEFAULT_SHARED_MIN,
            timeout: DEFAULT_TIMEOUT,
            redundancy: None,
            scheme: None,
            rs_data: None,
            min_efficiency: None,
            hot_steps: None,
            failure_timeout: None,
            recovery: None,
            recovery_deadline: None,
            recovery_rate: None,
            mtbf: None,
            drain: None,
            drain_every: None,
            drain_mtbf: None,
            prefault: None,
            metrics: None,
            metrics_datasets: None,
            same_node_other_users: None,
            socket_group: None,
        }
    }
}

/// A parsed `cairn.toml`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// Engine to use.
    pub engine: EngineKind,
    /// Trace records (`trace`) are buffered and written every this many steps as one write.
    /// Steps ended while records wait are held, puts included, and commit in order at that flush
    /// (at the latest when the writer closes).
    pub trace_flush: u32,
    /// `file` engine settings.
    pub file: FileConfig,
    /// `staging` engine settings.
    pub staging: StagingConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config { engine: EngineKind::default(), trace_flush: 1, file: FileConfig::default(), staging: StagingConfig::default() }
    }
}

/// Keys accepted as overrides, in the order the error message lists them.
const OVERRIDES: &str =
    "engine, trace_flush, path, fsync, chunk_size, compression, aggregation, aggregators, cluster, object_size, keep_last, queue_limit, queue_policy, keep, servers, memory, transport, shared_min, timeout, redundancy, scheme, rs_data, min_efficiency, hot_steps, failure_timeout, recovery, recovery_deadline, recovery_rate, mtbf, drain, drain_every, drain_mtbf, prefault, metrics, metrics_datasets, same_node_other_users, socket_group";

impl Config {
    /// Parses TOML text; `origin` names it in errors.
    pub fn parse(text: &str, origin: &str) -> Result<Config> {
        toml::from_str::<Config>(text)
            .map_err(|e| Error::Config(format!("{origin}: {}; see docs/guide.md for the keys cairn.toml accepts", e.to_string().trim())))?
            .validate()
    }

    /// Loads the configuration (explicit path, `$CAIRN_CONFIG`, `./cairn.toml`, defaults) and
    /// applies `overrides` (keys as in `cairn.toml`, without the table name).
    pub fn load(path: Option<&Path>, overrides: &[(String, String)]) -> Result<Config> {
        let env = std::env::var_os("CAIRN_CONFIG").map(PathBuf::from);
        let chosen = path.map(Path::to_path_buf).or(env).or_else(|| {
            let local = PathBuf::from("cairn.toml");
            local.exists().then_some(local)
        });
        let mut cfg = match chosen {
            Some(p) => {
                let text = std::fs::read_to_string(&p).map_err(|e| {
                    Error::Config(format!("cannot read config file {}: {e}; check the path (or $CAIRN_CONFIG)", p.display()))
                })?;
                Config::parse(&text, &p.display().to_string())?
            }
            None => Config::default(),
        };
        for (k, v) in overrides {
            cfg.set(k, v)?;
        }
        Ok(cfg)
    }

    /// Checks settings serde cannot.
    fn validate(self) -> Result<Config> {
        Transport::parse(&self.staging.transport)?;
        if let Some(d) = &self.staging.failure_timeout {
            d.get().map_err(|e| Error::Config(format!("[staging] failure_timeout: {e}")))?;
        }
        if let Some(e) = &self.staging.drain_every {
            e.get()?;
        }
        for (key, d) in
            [("recovery_deadline", &self.staging.recovery_deadline), ("mtbf", &self.staging.mtbf), ("drain_mtbf", &self.staging.drain_mtbf)]
        {
            if let Some(d) = d {
                d.get().map_err(|e| Error::Config(format!("[staging] {key}: {e}")))?;
            }
        }
        if let Some(p) = &self.staging.queue_policy {
            queue_policy(p)?;
        }
        if let Some(r) = &self.staging.recovery {
            if r != "lazy" && r != "aggressive" {
                return Err(Error::Config(format!("[staging] recovery = {r:?}: use \"lazy\" or \"aggressive\"")));
            }
        }
        if self.trace_flush == 0 {
            return Err(Error::Config("trace_flush = 0: use 1 (write traces every step) or more".into()));
        }
        if self.file.chunk_size == 0 {
            return Err(Error::Config(format!(
                "[file] chunk_size = 0: use a positive byte count (the default is {}), or leave the key out",
                cairn_core::checksum::DEFAULT_CHUNK
            )));
        }
        if !["send", "offsets", "none"].contains(&self.file.aggregation.as_str()) {
            return Err(Error::Config(format!("[file] aggregation = {:?}: use send, offsets or none", self.file.aggregation)));
        }
        self.staging.policy(cairn_core::corec::Policy { redundancy: 0, ..Default::default() })?;
        if self.staging.object_size == 0 {
            return Err(Error::Config(format!(
                "[staging] object_size = 0: use a positive byte count (the default is {DEFAULT_OBJECT_SIZE}), or leave the key out"
            )));
        }
        Ok(self)
    }

    /// Applies one override.
    pub fn set(&mut self, key: &str, value: &str) -> Result<()> {
        let bad = |what: &str| Error::Config(format!("override {key}={value:?}: {what}"));
        match key {
            "engine" => {
                self.engine = match value {
                    "file" => EngineKind::File,
                    "staging" => EngineKind::Staging,
                    _ => return Err(bad("unknown engine; use \"file\" or \"staging\"")),
                }
            }
            "trace_flush" => {
                self.trace_flush = value.parse().ok().filter(|c| *c > 0).ok_or_else(|| bad("expected a positive step count"))?
            }
            "path" => self.file.path = PathBuf::from(value),
            "fsync" => self.file.fsync = value.parse().map_err(|_| bad("expected true or false"))?,
            "chunk_size" => {
                self.file.chunk_size = units::parse(value)?.filter(|c| *c > 0).ok_or_else(|| bad("expected a positive size"))?
            }
            "compression" => {
                self.file.compression = value.to_string();
                self.file.compression()?;
            }
            "aggregation" => {
                if !["send", "offsets", "none"].contains(&value) {
                    return Err(bad("use send, offsets or none"));
                }
                self.file.aggregation = value.to_string();
            }
            "aggregators" => self.file.aggregators = value.parse().map_err(|_| bad("expected a group count (0: one per node)"))?,
            _ => self.staging.set(key, value)?,
        }
        Ok(())
    }
}

impl StagingConfig {
    /// Applies one override of a `[staging]` key (see [`Config::set`]).
    fn set(&mut self, key: &str, value: &str) -> Result<()> {
        let bad = |what: &str| Error::Config(format!("override {key}={value:?}: {what}"));
        match key {
            "cluster" => self.cluster = Some(PathBuf::from(value)),
            "object_size" => self.object_size = units::parse(value)?.filter(|c| *c > 0).ok_or_else(|| bad("expected a positive size"))?,
            "keep_last" => {
                self.keep_last = Some(value.parse().ok().filter(|c| *c > 0).ok_or_else(|| bad("expected a positive step count"))?)
            }
            "keep" => self.keep = value.parse().map_err(|_| bad("expected true or false"))?,
            "servers" => self.servers = value.parse().ok().filter(|c| *c > 0).ok_or_else(|| bad("expected a positive server count"))?,
            "memory" => {
                cairn_proto::cluster::parse_size(value)?;
                self.memory = value.to_string();
            }
            "transport" => {
                Transport::parse(value)?;
                self.transport = value.to_string();
            }
            "shared_min" => self.shared_min = units::parse(value)?.ok_or_else(|| bad("expected a size"))?,
            "timeout" => {
                self.timeout = cairn_proto::cluster::parse_duration(value)?.as_secs_f64();
                self.deadline()?;
            }
            "redundancy" => self.redundancy = Some(value.parse().map_err(|_| bad("expected a number of server failures"))?),
            "scheme" => {
                cairn_core::corec::Scheme::parse(value)?;
                self.scheme = Some(value.to_string());
            }
            "rs_data" => self.rs_data = Some(value.parse().map_err(|_| bad("expected a number of data shards"))?),
            "min_efficiency" => self.min_efficiency = Some(value.parse().map_err(|_| bad("expected a fraction, e.g. 0.6"))?),
            "hot_steps" => self.hot_steps = Some(value.parse().map_err(|_| bad("expected a step count"))?),
            "failure_timeout" => {
                cairn_proto::cluster::parse_duration(value)?;
                self.failure_timeout = Some(Duration::Text(value.to_string()));
            }
            "recovery_deadline" => {
                cairn_proto::cluster::parse_duration(value)?;
                self.recovery_deadline = Some(Duration::Text(value.to_string()));
            }
            "mtbf" => {
                cairn_proto::cluster::parse_duration(value)?;
                self.mtbf = Some(Duration::Text(value.to_string()));
            }
            "recovery_rate" => {
                cairn_proto::cluster::parse_size(value.trim_end_matches("/s"))?;
                self.recovery_rate = Some(value.to_string());
            }
            "queue_limit" => self.queue_limit = Some(value.parse().map_err(|_| bad("expected a step count (0: no limit)"))?),
            "queue_policy" => {
                queue_policy(value)?;
                self.queue_policy = Some(value.to_string());
            }
            "prefault" => {
                cairn_proto::cluster::parse_size(value)?;
                self.prefault = Some(value.to_string());
            }
            "metrics" => self.metrics = Some(value.to_string()),
            "metrics_datasets" => self.metrics_datasets = Some(value.parse().map_err(|_| bad("expected true or false"))?),
            "same_node_other_users" => self.same_node_other_users = Some(value.parse().map_err(|_| bad("expected true or false"))?),
            "socket_group" => self.socket_group = Some(value.to_string()),
            "drain" => self.drain = Some(PathBuf::from(value)),
            "drain_every" => {
                let e = DrainEvery::Text(value.to_string());
                e.get()?;
                self.drain_every = Some(e);
            }
            "drain_mtbf" => {
                cairn_proto::cluster::parse_duration(value)?;
                self.drain_mtbf = Some(Duration::Text(value.to_string()));
            }
            "recovery" => {
                if value != "lazy" && value != "aggressive" {
                    return Err(bad("use lazy or aggressive"));
                }
                self.recovery = Some(value.to_string());
            }
            _ => return Err(Error::Config(format!("unknown config key '{key}'; accepted: {OVERRIDES}"))),
        }
        Ok(())
    }
}

/// The `[staging] queue_policy` named `p` ("block" or "discard_oldest").
pub fn queue_policy(p: &str) -> Result<cairn_core::queue::Policy> {
    cairn_core::queue::Policy::parse(p).map_err(|e| Error::Config(format!("[staging] queue_policy: {e}")))
}

/// Which transport clients use (`[staging] transport`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    /// For servers on this host, same-node copies (the server copies object bytes straight
    /// between this process's memory and its own) over a Unix socket, or the Unix socket alone
    /// where the kernel forbids them; TCP for the others.
    Auto,
    /// Like `Auto`, but the server copies every object (cross-memory attach), none goes into a
    /// leased shared segment: the same-node path before those, kept for comparison.
    Attach,
    /// Unix socket for servers on this host, with object bytes in the frames; else TCP.
    Socket,
    /// TCP always.
    Tcp,
}

impl Transport {
    /// The transport a `[staging] transport` value names.
    pub fn parse(text: &str) -> Result<Transport> {
        match text {
            "auto" => Ok(Transport::Auto),
            "attach" => Ok(Transport::Attach),
            "socket" => Ok(Transport::Socket),
            "tcp" => Ok(Transport::Tcp),
            other => Err(Error::Config(format!(
                "[staging] transport = \"{other}\": use \"auto\" (same-node copies where possible), \"attach\", \"socket\" or \"tcp\""
            ))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_file_engine_settings() {
        let c = Config::parse("engine = \"file\"\n[file]\npath = \"out\"\nfsync = true\n", "t").unwrap();
        assert_eq!(c.engine, EngineKind::File);
        assert_eq!(c.file.path, PathBuf::from("out"));
        assert!(c.file.fsync);
    }

    #[test]
    fn typos_are_named() {
        let e = Config::parse("engine = \"stagign\"\n", "cairn.toml").unwrap_err().to_string();
        assert!(e.contains("cairn.toml") && e.contains("stagign"), "{e}");
        let e = Config::parse("[file]\npaht = \"x\"\n", "cairn.toml").unwrap_err().to_string();
        assert!(e.contains("paht"), "{e}");
        let mut c = Config::default();
        assert!(c.set("engin", "file").unwrap_err().to_string().contains("accepted"));
        assert!(c.set("engine", "nope").is_err());
        c.set("path", "/tmp/x").unwrap();
        assert_eq!(c.file.path, PathBuf::from("/tmp/x"));
    }

    #[test]
    fn zero_sizes_are_refused_with_the_key() {
        for (text, key) in [("[file]\nchunk_size = 0\n", "chunk_size"), ("[staging]\nobject_size = 0\n", "object_size")] {
            let e = Config::parse(text, "cairn.toml").unwrap_err();
            assert_eq!(e.kind(), cairn_core::ErrorKind::Config);
            assert!(e.to_string().contains(&format!("{key} = 0: use a positive byte count")), "{e}");
            let e = Config::default().set(key, "0").unwrap_err();
            assert!(e.to_string().contains(key) && e.to_string().contains("positive"), "{e}");
        }
        assert_eq!(Config::parse("[file]\nchunk_size = 1\n[staging]\nobject_size = 1\n", "t").unwrap().file.chunk_size, 1);
    }

    #[test]
    fn sizes_take_units_or_bytes_and_seconds_take_durations() {
        let text = "[file]\nchunk_size = \"64K\"\n[staging]\nprefault = 0\nmemory = 4294967296\nobject_size = \"8M\"\n\
                    shared_min = 65536\ntimeout = \"250ms\"\nrecovery_rate = \"256MiB/s\"\n";
        let c = Config::parse(text, "t").unwrap();
        assert_eq!((c.file.chunk_size, c.staging.object_size, c.staging.shared_min), (64 << 10, 8 << 20, 65536));
        assert_eq!((c.staging.prefault.as_deref(), c.staging.memory.as_str()), (Some("0"), "4294967296"));
        assert_eq!(c.staging.deadline().unwrap(), std::time::Duration::from_millis(250));
        assert_eq!(Config::parse("[staging]\ntimeout = 2\n", "t").unwrap().staging.timeout, 2.0);
        for bad in [
            "[staging]\nprefault = 1.5\n",
            "[staging]\nmemory = \"lots\"\n",
            "[staging]\nmemory = \"4GiB/s\"\n",
            "[staging]\ntimeout = \"soon\"\n",
        ] {
            assert_eq!(Config::parse(bad, "t").unwrap_err().kind(), cairn_core::ErrorKind::Config, "{bad}");
        }
        let mut c = Config::default();
        for (k, v) in [("object_size", "4M"), ("chunk_size", "1MiB"), ("shared_min", "0"), ("timeout", "1m"), ("memory", "2G")] {
            c.set(k, v).unwrap();
        }
        assert_eq!((c.staging.object_size, c.file.chunk_size, c.staging.shared_min, c.staging.timeout), (4 << 20, 1 << 20, 0, 60.0));
        assert!(c.set("memory", "2 parsecs").is_err() && c.set("chunk_size", "8T").is_err());
    }

    #[test]
    fn missing_file_is_a_config_error() {
        let e = Config::load(Some(Path::new("/nonexistent/cairn.toml")), &[]).unwrap_err();
        assert_eq!(e.kind(), cairn_core::ErrorKind::Config);
    }
}
