//! A server's settings, parsed in one place: [`ServeOptions::set`] takes every setting by its
//! `[staging]` key (or its flag's name); the `cairn-server` binary, `cairn serve` (the pyo3
//! entry) and `cairn cluster start` (which starts `cairn serve` with flags) all go through it.

use crate::state::Limits;
use cairn_core::corec::{Policy, Scheme};
use cairn_core::{Error, Result};
use cairn_proto::cluster::{parse_duration, parse_size};
use std::path::PathBuf;
use std::time::Duration;

/// How to start a server.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Cluster file to join (entries go to `FILE.d/`).
    pub cluster: PathBuf,
    /// This server's id.
    pub id: u32,
    /// Active servers in the cluster (ids `0..servers`), then `spares` spares.
    pub servers: u32,
    /// Spare servers (ids `servers..servers+spares`).
    pub spares: u32,
    /// Memory limit in bytes.
    pub memory: u64,
    /// Address to bind (`127.0.0.1` for a local cluster, `0.0.0.0` across nodes).
    pub bind: String,
    /// Node name (failure domain); the host name when empty.
    pub node: String,
    /// Rack name (wider failure domain).
    pub rack: String,
    /// How long to wait for the secret and, on server 0, for the other servers.
    pub timeout: Duration,
    /// Deadlines and bounds of the running server.
    pub limits: Limits,
    /// Meta servers in the cluster (the first this many ring slots run the control plane).
    pub meta: u32,
    /// Redundancy settings server 0 writes into the cluster file (the level is lowered to what
    /// the active servers can give: a level `r` needs `r + 1` of them).
    pub redundancy: Policy,
    /// Folder committed steps are drained to (none: no drain).
    pub drain: Option<PathBuf>,
    /// Steps whose number is a multiple of this are drained; `None`: Young/Daly (`auto`).
    pub drain_every: Option<u64>,
    /// Mean time between losses of the memory level (for `drain_every = "auto"`).
    pub drain_mtbf: Option<Duration>,
    /// Bytes of shared segments to make ahead of leases (`None`: `min(memory, 1GiB)`).
    pub prefault: Option<u64>,
    /// Prometheus metrics: `HOST:PORT` of server 0 (server i takes PORT + i), `off`; `None`: the
    /// server's own address with a port of the system's choosing.
    pub metrics: Option<String>,
    /// Where the log goes: `None`, `FILE.d/server-<id>.log`; `-`: stderr.
    pub log_file: Option<PathBuf>,
    /// The log filter (`info`, `debug`, `cairn_server=debug`); `None`: `RUST_LOG`, else `info`.
    pub log_level: Option<String>,
    /// Text lines or JSON lines.
    pub log_format: crate::logging::LogFormat,
    /// With `same_node_other_users`: the group whose members may connect (socket 0660 of that
    /// group, the cluster file and its folder readable by it); none: anyone (socket 0666).
    pub socket_group: Option<String>,
}

impl Default for ServeOptions {
    /// The defaults; the id is the MPI or Slurm rank when there is one.
    fn default() -> Self {
        let rank = ["OMPI_COMM_WORLD_RANK", "PMI_RANK", "SLURM_PROCID"].iter().find_map(|k| std::env::var(k).ok()?.parse().ok());
        ServeOptions {
            cluster: PathBuf::from("cluster.json"),
            id: rank.unwrap_or(0),
            servers: 1,
            spares: 0,
            memory: 4 << 30,
            bind: "127.0.0.1".into(),
            node: String::new(),
            rack: String::new(),
            timeout: Duration::from_secs(120),
            limits: Limits::default(),
            meta: 3,
            redundancy: Policy { redundancy: 1, ..Default::default() },
            drain: None,
            drain_every: Some(1),
            drain_mtbf: None,
            prefault: None,
            socket_group: None,
            log_file: None,
            metrics: None,
            log_level: None,
            log_format: crate::logging::LogFormat::Text,
        }
    }
}

/// The flags, for `--help`.
pub const USAGE: &str = "usage: cairn-server --cluster FILE [--id N] [--servers N] [--spares N] [--memory SIZE] [--host ADDR]
                    [--node NAME] [--rack NAME] [--timeout DURATION] [--io-timeout DURATION]
                    [--hello-timeout DURATION] [--peer-timeout DURATION] [--meta M] [--redundancy R]
                    [--scheme corec|replicate|erasure|hybrid|none] [--rs-data K] [--min-efficiency S]
                    [--hot-steps W] [--failure-timeout DURATION] [--recovery lazy|aggressive]
                    [--recovery-deadline DURATION] [--recovery-rate SIZE] [--mtbf DURATION]
                    [--same-node-other-users true|false] [--drain PATH] [--drain-every N|auto]
                    [--drain-mtbf DURATION] [--prefault SIZE] [--socket-group GROUP]
                    [--log-level FILTER] [--log-format text|json] [--log-file PATH|-] [--metrics HOST:PORT|off]
                    [--metrics-datasets true|false]
The id defaults to the MPI/Slurm rank; --host defaults to 127.0.0.1 (0.0.0.0 listens on every interface);
--meta (1 to 5, default 3) servers run the control plane's Raft replicas. Variables survive --redundancy
server failures unless they say otherwise (default 1, lowered to servers - 1); cold objects are coded RS(K + R).
A server the control plane's leader has not heard from for --failure-timeout (default 3s) is declared down
and a spare takes its slot; its objects are rebuilt there within --recovery-deadline (default a quarter of
--mtbf when given, else 60s; lazy) or at once (aggressive), sending at most --recovery-rate bytes per second
(default 256MiB; 0: no limit). Durations are \"5s\", \"250ms\", \"2m\" or seconds; sizes \"4GiB\", \"512MiB\" or bytes.
With --drain, the leader writes every committed step whose number is a multiple of --drain-every (default 1;
auto: Young/Daly from the measured drain cost and --drain-mtbf) to PATH/<dataset>/, a file-engine dataset.
The server makes --prefault bytes of shared memory ready for same-node writers (default min(--memory, 1GiB);
0: none), so a fresh cluster's first steps run at the warm speed: twice its largest lease at once, the rest
only while it moves no data, at idle priority.
The Unix socket is the owner's (0600, in a 0700 folder) unless --same-node-other-users true: then anyone's
(0666, the folder traversable), or with --socket-group GROUP that group's (0660; the cluster file and folder
readable by it); the secret and logs stay the owner's.
Prometheus metrics are served at http://ADDR/metrics (ADDR: the server entry's metrics field): --metrics HOST:PORT
is server 0's, server i takes PORT+i; the default is the server's own address with a free port; off: none.
No series names a dataset unless --metrics-datasets true (bytes put and got by dataset, 256 names at most).
The log (RFC 3339 times, levels, the server id; --log-level or RUST_LOG, default info) goes to
FILE.d/server-<id>.log, an older one kept as server-<id>.log.1; --log-file - writes it to stderr.
Each setting is also a key of the [staging] table (failure_timeout = \"5s\"), which flags override.";

impl ServeOptions {
    /// Sets one setting by its `[staging]` key (`failure_timeout`) or its flag's name
    /// (`failure-timeout`), from its text as a flag or a config file gives it. Keys of other
    /// settings are refused, naming the key.
    pub fn set(&mut self, key: &str, value: &str) -> Result<()> {
        let key = key.trim_start_matches("--").replace('-', "_");
        let bad = |what: &str| Error::Config(format!("{key} = {value:?}: {what}"));
        let count = |what: &str| value.trim().parse::<u32>().map_err(|_| bad(&format!("give {what}")));
        let switch = || match value {
            "true" => Ok(true),
            "false" => Ok(false),
            _ => Err(bad("use true or false")),
        };
        let l = &mut self.limits;
        match key.as_str() {
            "cluster" => self.cluster = PathBuf::from(value),
            "id" => self.id = count("a server id")?,
            "servers" => self.servers = count("a server count")?,
            "spares" => self.spares = count("a spare count")?,
            "memory" => self.memory = parse_size(value)?,
            "host" | "bind" => self.bind = value.to_string(),
            "node" => self.node = value.to_string(),
            "rack" => self.rack = value.to_string(),
            "timeout" => self.timeout = parse_duration(value)?,
            "io_timeout" => l.io_timeout = parse_duration(value)?,
            "hello_timeout" => l.hello_timeout = parse_duration(value)?,
            "peer_timeout" => l.peer_timeout = parse_duration(value)?,
            "failure_timeout" => l.failure_timeout = parse_duration(value)?,
            "recovery" => {
                l.recovery_lazy = match value {
                    "lazy" => true,
                    "aggressive" => false,
                    _ => return Err(bad("use \"lazy\" or \"aggressive\"")),
                }
            }
            "recovery_deadline" => l.recovery_deadline = Some(parse_duration(value)?),
            // A size per second: "256MiB" (the "/s" may be written).
            "recovery_rate" => l.recovery_rate = parse_size(value.trim().trim_end_matches("/s"))?,
            "mtbf" => l.mtbf = Some(parse_duration(value)?),
            "same_node_other_users" => l.same_node_other_users = switch()?,
            "metrics_datasets" => l.metrics_datasets = switch()?,
            "meta" => self.meta = count("a meta server count, 1 to 5")?.clamp(1, 5),
            "redundancy" => self.redundancy.redundancy = count("a number of server failures")?,
            "scheme" => self.redundancy.scheme = Scheme::parse(value)?,
            "rs_data" => self.redundancy.rs_data = count("a number of data shards")?,
            "min_efficiency" => self.redundancy.min_efficiency = value.trim().parse().map_err(|_| bad("give a fraction, e.g. 0.6"))?,
            "hot_steps" => self.redundancy.hot_steps = count("a step count")?,
            "drain" => {
                let p = PathBuf::from(value);
                self.drain = Some(std::path::absolute(&p).map_err(|e| bad(&format!("not a usable path: {e}")))?);
            }
            "drain_every" => {
                self.drain_every = match value.trim() {
                    "auto" => None,
                    n => Some(n.parse::<u64>().ok().filter(|n| *n > 0).ok_or_else(|| bad("give a step count >= 1, or \"auto\""))?),
                }
            }
            "drain_mtbf" => self.drain_mtbf = Some(parse_duration(value)?),
            "prefault" => self.prefault = Some(parse_size(value)?),
            "socket_group" => self.socket_group = Some(value.to_string()).filter(|g| !g.is_empty()),
            "log_file" => self.log_file = Some(PathBuf::from(value)),
            "metrics" => {
                if value != "off" {
                    let (_, port) = value.rsplit_once(':').ok_or_else(|| bad("give HOST:PORT, or off"))?;
                    port.parse::<u16>().map_err(|_| bad("give HOST:PORT with a port from 0 to 65535, or off"))?;
                }
                self.metrics = Some(value.to_string());
            }
            "log_level" => {
                tracing_subscriber::EnvFilter::try_new(value).map_err(|e| bad(&format!("not a log filter ({e}); e.g. info or debug")))?;
                self.log_level = Some(value.to_string());
            }
            "log_format" => {
                self.log_format = match value {
                    "text" => crate::logging::LogFormat::Text,
                    "json" => crate::logging::LogFormat::Json,
                    _ => return Err(bad("use text or json")),
                }
            }
            _ => return Err(Error::Config(format!("unknown server setting {key:?}\n{USAGE}"))),
        }
        Ok(())
    }

    /// Bytes of shared segments to make ahead: `prefault`, else `min(memory, 1GiB)`.
    pub fn prefault_bytes(&self) -> u64 {
        self.prefault.unwrap_or(self.memory.min(1 << 30)).min(self.memory)
    }

    /// The drain the options ask for, as the cluster file records it.
    pub fn drain_spec(&self) -> Option<cairn_proto::cluster::DrainSpec> {
        Some(cairn_proto::cluster::DrainSpec {
            path: self.drain.clone()?,
            every: self.drain_every,
            mtbf_s: self.drain_mtbf.map(|d| d.as_secs_f64()),
        })
    }

    /// The options `settings` (key and value, e.g. the server keys of a `[staging]` table) and
    /// then the flags `args` (`--key value` or `--key=value`) give; `None` when `args` ask for
    /// `--help`. The cluster file's path is made absolute.
    pub fn parse<'a>(settings: impl IntoIterator<Item = (&'a str, &'a str)>, args: &[String]) -> Result<Option<ServeOptions>> {
        let mut opts = ServeOptions::default();
        for (key, value) in settings {
            opts.set(key, value)?;
        }
        let mut args = args.iter();
        while let Some(flag) = args.next() {
            if flag == "-h" || flag == "--help" {
                return Ok(None);
            }
            if !flag.starts_with("--") {
                return Err(Error::Config(format!("unexpected argument {flag:?}\n{USAGE}")));
            }
            let (key, value) = match flag.split_once('=') {
                Some((k, v)) => (k, v),
                None => (flag.as_str(), args.next().ok_or_else(|| Error::Config(format!("{flag} needs a value\n{USAGE}")))?.as_str()),
            };
            opts.set(key, value).map_err(|e| Error::Config(format!("{flag}: {e}")))?;
        }
        opts.cluster = std::path::absolute(&opts.cluster).map_err(|e| Error::io(format!("cluster file {}", opts.cluster.display()), e))?;
        Ok(Some(opts))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(a: &str) -> Vec<String> {
        a.split_whitespace().map(String::from).collect()
    }

    #[test]
    fn flags_override_the_staging_table_and_name_what_is_wrong() {
        let staging = [("failure_timeout", "5s"), ("recovery_rate", "100MiB/s"), ("scheme", "replicate")];
        let o = ServeOptions::parse(staging, &args("--failure-timeout 250ms --memory 1GiB --io-timeout=2 --meta 9")).unwrap().unwrap();
        assert_eq!(o.limits.failure_timeout, Duration::from_millis(250), "the flag wins");
        assert_eq!((o.limits.recovery_rate, o.memory), (100 << 20, 1 << 30));
        assert_eq!((o.limits.io_timeout, o.meta, o.redundancy.scheme), (Duration::from_secs(2), 5, Scheme::Replicate));
        assert!(o.cluster.is_absolute());
        assert!(ServeOptions::parse([], &args("--help")).unwrap().is_none());
        for (bad, says) in [
            ("--recovery eager", "\"lazy\" or \"aggressive\""),
            ("--mtbf soon", "duration \"soon\""),
            ("--servers many", "a server count"),
            ("--colour blue", "unknown server setting \"colour\""),
            ("--memory", "needs a value"),
            ("stray", "unexpected argument"),
        ] {
            let e = ServeOptions::parse([], &args(bad)).unwrap_err().to_string();
            assert!(e.contains(says), "{bad}: {e}");
        }
    }

    #[test]
    fn recovery_settings_as_the_server_uses_them() {
        let mut o = ServeOptions::default();
        o.set("recovery_rate", "0").unwrap();
        assert_eq!(o.limits.recovery_rate, 0, "no limit");
        o.set("mtbf", "20s").unwrap();
        assert_eq!(o.limits.recovery_deadline(), Duration::from_secs(5), "a quarter of the MTBF");
        o.set("recovery-deadline", "2s").unwrap();
        assert_eq!(o.limits.recovery_deadline(), Duration::from_secs(2), "an explicit deadline wins");
    }
}
