//! The cluster file: how clients and servers find each other. `cairn cluster start` (or servers
//! started by `mpirun`/`srun`) write one entry per server into `FILE.d/`; server 0 assembles them
//! into `FILE` once all are up. The secret lives in `FILE.d/secret` and is copied into `FILE`.

use cairn_core::placement::ServerSpec;
use cairn_core::{Error, Result};
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};

/// One server's entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ServerEntry {
    /// Id, node, rack and whether it is a spare.
    #[serde(flatten)]
    pub spec: ServerSpec,
    /// TCP address, `host:port`.
    pub addr: String,
    /// Unix socket path for clients on the same node.
    #[serde(default)]
    pub unix: Option<PathBuf>,
    /// Host name the server runs on (clients on the same host may use `unix`).
    #[serde(default)]
    pub host: String,
    /// Process id (for `cairn cluster stop` of a local cluster).
    #[serde(default)]
    pub pid: u32,
    /// Memory limit in bytes.
    #[serde(default)]
    pub memory: u64,
    /// `HOST:PORT` of its Prometheus metrics (`GET /metrics`); none when turned off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub metrics: Option<String>,
}

/// A complete cluster file.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ClusterFile {
    /// Token every client and server presents in its hello.
    pub secret: String,
    /// All servers, sorted by id.
    pub servers: Vec<ServerEntry>,
    /// Redundancy settings: the default level of variables and how objects are kept.
    #[serde(default)]
    pub redundancy: cairn_core::corec::Policy,
    /// Where committed steps are drained to disk, if anywhere: readers find the steps there
    /// when no server answers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain: Option<DrainSpec>,
}

/// The drain of a cluster's committed steps to disk (multi-level checkpoints).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DrainSpec {
    /// Folder of the drained datasets: `PATH/<dataset>/`, each a `file`-engine dataset.
    pub path: PathBuf,
    /// Steps whose number is a multiple of this are drained; `None`: the cadence is chosen
    /// from Young/Daly with the measured cost of a step's drain and `mtbf_s`.
    #[serde(default)]
    pub every: Option<u64>,
    /// Mean time between losses of the memory level, in seconds (for the automatic cadence).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtbf_s: Option<f64>,
}

/// What `cairn cluster stop` leaves in the cluster file: `{"state": "stopped", "drain": {...}}`
/// (no secret, no servers), so readers still find the steps drained to disk.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoppedFile {
    /// `"stopped"`.
    pub state: String,
    /// The stopped cluster's drain, if it had one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drain: Option<DrainSpec>,
    /// The stopped cluster's id: its drained steps, and the datasets whose owner record names
    /// it, are its own.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
}

impl StoppedFile {
    /// The stopped file at `path`, if the file there is one.
    pub fn load(path: &Path) -> Option<StoppedFile> {
        Self::parse(&std::fs::read(path).ok()?)
    }

    /// The stopped file in `bytes` (a cluster file's), if they are one.
    fn parse(bytes: &[u8]) -> Option<StoppedFile> {
        let f: StoppedFile = serde_json::from_slice(bytes).ok()?;
        (f.state == "stopped").then_some(f)
    }

    /// Writes the stopped file of cluster `id` that drained to `drain` at `path`.
    pub fn write(path: &Path, drain: Option<DrainSpec>, id: Option<String>) -> Result<()> {
        let f = StoppedFile { state: "stopped".into(), drain, id };
        write_private(path, &serde_json::to_vec_pretty(&f).expect("serializes"))
    }
}

impl ClusterFile {
    /// Reads a cluster file.
    pub fn load(path: &Path) -> Result<ClusterFile> {
        let text = std::fs::read(path).map_err(|e| {
            Error::Unavailable(format!(
                "cannot read cluster file {}: {e}; start a cluster with `cairn cluster start --file {}`",
                path.display(),
                path.display()
            ))
        })?;
        // The bytes already read: a second read could see another file (a start over a stop).
        if StoppedFile::parse(&text).is_some() {
            return Err(Error::Unavailable(format!(
                "the cluster of {} is stopped (`cairn cluster stop`): readers find the steps it drained to disk; start a \
                 cluster with `cairn cluster start --file {}`",
                path.display(),
                path.display()
            )));
        }
        let c: ClusterFile =
            serde_json::from_slice(&text).map_err(|e| Error::Corrupt(format!("cluster file {} does not parse: {e}", path.display())))?;
        if c.servers.iter().all(|s| s.spec.spare) {
            return Err(Error::Config(format!("cluster file {} lists no active server", path.display())));
        }
        Ok(c)
    }

    /// The directory holding the per-server entries and the secret.
    pub fn entries_dir(path: &Path) -> PathBuf {
        let mut p = path.as_os_str().to_owned();
        p.push(".d");
        PathBuf::from(p)
    }

    /// The cluster's id (see [`crate::auth::cluster_id`]; also written into the file as `"id"`).
    pub fn id(&self) -> String {
        crate::auth::cluster_id(&self.secret)
    }

    /// The file's JSON, with the cluster's id for people and tools that read it.
    pub fn to_json(&self) -> Vec<u8> {
        let mut doc = serde_json::to_value(self).expect("cluster files serialize");
        doc["id"] = self.id().into();
        serde_json::to_vec_pretty(&doc).expect("serializes")
    }

    /// The entry of server `id`.
    pub fn server(&self, id: u32) -> Result<&ServerEntry> {
        self.servers.iter().find(|s| s.spec.id == id).ok_or_else(|| Error::NotFound(format!("server {id} is not in the cluster file")))
    }
}

/// Writes `bytes` to `path` atomically (temporary file, then rename), readable by the owner only.
pub fn write_private(path: &Path, bytes: &[u8]) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let tmp = path.with_extension(format!("tmp{}", std::process::id()));
    let what = || format!("writing {}", path.display());
    let mut f =
        std::fs::OpenOptions::new().write(true).create(true).truncate(true).mode(0o600).open(&tmp).map_err(|e| Error::io(what(), e))?;
    f.write_all(bytes).map_err(|e| Error::io(what(), e))?;
    std::fs::rename(&tmp, path).map_err(|e| Error::io(what(), e))
}

/// Rewrites the server list of the cluster file at `path` with `change` (the one writer of a live
/// cluster file after its start: `cluster add`, `replace`, `retire`). The rest of the document
/// is kept as it is, and so are the file's owner, group and mode (a socket group's read access
/// survives); it is written to a temporary file of a unique name, then renamed over the file. A
/// stopped cluster's file is never replaced (`Conflict`).
pub fn rewrite_servers(path: &Path, change: impl FnOnce(&mut Vec<ServerEntry>)) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
    let what = || format!("rewriting the cluster file {}", path.display());
    let bytes = std::fs::read(path).map_err(|e| Error::io(what(), e))?;
    if StoppedFile::parse(&bytes).is_some() {
        return Err(Error::Conflict(format!(
            "the cluster of {} is stopped: its file is kept for readers of its drained steps and not rewritten; start a cluster \
             with `cairn cluster start --file {}`",
            path.display(),
            path.display()
        )));
    }
    let mut doc: serde_json::Value =
        serde_json::from_slice(&bytes).map_err(|e| Error::Corrupt(format!("cluster file {} does not parse: {e}", path.display())))?;
    let mut servers: Vec<ServerEntry> = serde_json::from_value(doc["servers"].take())
        .map_err(|e| Error::Corrupt(format!("the servers of cluster file {} do not parse: {e}", path.display())))?;
    change(&mut servers);
    doc["servers"] = serde_json::to_value(&servers).expect("entries serialize");
    let meta = std::fs::metadata(path).map_err(|e| Error::io(what(), e))?;
    let nonce = crate::auth::new_nonce()?;
    let tmp = path.with_file_name(format!(
        ".{}.tmp-{}-{nonce}",
        path.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned()),
        std::process::id()
    ));
    let written = (|| -> std::io::Result<()> {
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(0o600).open(&tmp)?;
        f.write_all(&serde_json::to_vec_pretty(&doc).expect("serializes"))?;
        // Owner and group as they were (a group is kept only where this user may give it).
        if meta.uid() != f.metadata()?.uid() || meta.gid() != f.metadata()?.gid() {
            std::os::unix::fs::fchown(&f, Some(meta.uid()), Some(meta.gid()))?;
        }
        f.set_permissions(std::fs::Permissions::from_mode(meta.mode() & 0o7777))?;
        f.sync_all()?;
        std::fs::rename(&tmp, path)
    })();
    if let Err(e) = written {
        let _ = std::fs::remove_file(&tmp);
        return Err(Error::io(what(), e));
    }
    Ok(())
}

/// This machine's host name (clients on the server's host use its Unix socket).
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "localhost".into())
}

/// Bytes in a size as HPC users write them, one parser for the CLI, `cairn.toml`, `cairn serve`
/// and the job script: case-insensitive; a bare `K`/`M`/`G`/`T` is binary (as in Slurm: `4G` =
/// 4 GiB), `KB`/`MB`/`GB`/`TB` decimal, `KiB`/`MiB`/`GiB`/`TiB` binary, `B` or no unit bytes;
/// the number may have a fraction or exponent (`1.5GiB`, `1e9`). A bare-letter size prints its
/// meaning once ([`size_note`]): until this release `4G` meant 4×10⁹ bytes.
pub fn parse_size(text: &str) -> Result<u64> {
    let bytes = size(text)?;
    if let Some(note) = size_note(text) {
        static SHOWN: std::sync::Mutex<Vec<String>> = std::sync::Mutex::new(Vec::new());
        let mut shown = SHOWN.lock().unwrap_or_else(|p| p.into_inner());
        if !shown.iter().any(|t| t == text) && shown.len() < 64 {
            shown.push(text.to_string());
            eprintln!("{note}");
        }
    }
    Ok(bytes)
}

/// The number and unit (lower-cased) of a size or a duration.
fn split_unit(text: &str) -> (&str, String) {
    let t = text.trim();
    let split = t.find(|c: char| c.is_ascii_alphabetic() && c != 'e' && c != 'E').unwrap_or(t.len());
    (t[..split].trim(), t[split..].trim().to_ascii_lowercase())
}

fn size(text: &str) -> Result<u64> {
    let (num, unit) = split_unit(text);
    let mult: Option<u64> = match unit.as_str() {
        "" | "b" => Some(1),
        "k" | "kib" => Some(1 << 10),
        "m" | "mib" => Some(1 << 20),
        "g" | "gib" => Some(1 << 30),
        "t" | "tib" => Some(1 << 40),
        "kb" => Some(1_000),
        "mb" => Some(1_000_000),
        "gb" => Some(1_000_000_000),
        "tb" => Some(1_000_000_000_000),
        _ => None,
    };
    let value = num.parse::<f64>().ok().filter(|v| v.is_finite() && *v >= 0.0);
    match (value, mult) {
        (Some(v), Some(m)) if v * (m as f64) < u64::MAX as f64 => Ok((v * m as f64) as u64),
        _ => {
            Err(Error::Config(format!("size {text:?} not understood; write e.g. 4GiB or 4G (binary), 4GB (decimal), or a number of bytes")))
        }
    }
}

/// The one-line note of what a size with a bare `K`/`M`/`G`/`T` means (printed once per text for
/// one release, since such sizes were decimal before); `None` for other sizes.
pub fn size_note(text: &str) -> Option<String> {
    let (_, unit) = split_unit(text);
    let decimal = match unit.as_str() {
        "k" => "KB",
        "m" => "MB",
        "g" => "GB",
        "t" => "TB",
        _ => return None,
    };
    let bytes = size(text).ok()?;
    let t = text.trim();
    Some(format!(
        "cairn: note: size {t:?} is {bytes} bytes: a bare {} is binary, as in Slurm (write {}{decimal} for powers of 10)",
        unit.to_ascii_uppercase(),
        &t[..t.len() - 1].trim_end()
    ))
}

/// A duration such as `"5s"`, `"250ms"`, `"2m"`, `"1.5"` (seconds) or `"1h"`: positive and finite.
pub fn parse_duration(text: &str) -> Result<std::time::Duration> {
    let (num, unit) = split_unit(text);
    let mult = match unit.as_str() {
        "" | "s" => Some(1.0),
        "ms" => Some(1e-3),
        "us" => Some(1e-6),
        "m" | "min" => Some(60.0),
        "h" => Some(3600.0),
        _ => None,
    };
    match (num.parse::<f64>().ok(), mult) {
        (Some(v), Some(m)) if v.is_finite() && v > 0.0 && v * m < 1e9 => Ok(std::time::Duration::from_secs_f64(v * m)),
        _ => Err(Error::Config(format!("duration {text:?} not understood; write e.g. \"5s\", \"250ms\", \"2m\" or a number of seconds"))),
    }
}

/// One `[[server]]` entry of a topology file.
#[derive(Debug, Deserialize)]
struct TopologyEntry {
    id: u32,
    node: Option<String>,
    rack: Option<String>,
}

#[derive(Debug, Deserialize)]
struct Topology {
    #[serde(default)]
    server: Vec<TopologyEntry>,
}

/// `(node, rack)` of servers `0..n` from a topology file (TOML, or JSON when it ends in `.json`):
/// `[[server]] id = 0, node = "n0", rack = "r0"`. Without a file each server is its own node in
/// one rack.
pub fn load_topology(path: Option<&Path>, n: u32) -> Result<Vec<(String, String)>> {
    let Some(path) = path else { return Ok((0..n).map(|i| (format!("node{i}"), "rack0".to_string())).collect()) };
    let text = std::fs::read_to_string(path)
        .map_err(|e| Error::Config(format!("cannot read topology file {}: {e}; check the path", path.display())))?;
    let parsed: std::result::Result<Topology, String> = if path.extension().is_some_and(|e| e == "json") {
        serde_json::from_str(&text).map_err(|e| e.to_string())
    } else {
        toml::from_str(&text).map_err(|e| e.to_string())
    };
    let topo = parsed.map_err(|e| {
        Error::Config(format!("topology file {} does not parse: {}; write [[server]] id, node, rack entries", path.display(), e.trim()))
    })?;
    let mut out: Vec<Option<(String, String)>> = vec![None; n as usize];
    for s in topo.server {
        if let Some(slot) = out.get_mut(s.id as usize) {
            *slot = Some((s.node.unwrap_or_else(|| format!("node{}", s.id)), s.rack.unwrap_or_else(|| "rack0".into())));
        }
    }
    let missing: Vec<u32> = (0..n).filter(|i| out[*i as usize].is_none()).collect();
    if !missing.is_empty() {
        return Err(Error::Config(format!(
            "topology file {} lacks servers {missing:?}; list every id from 0 to {} under [[server]]",
            path.display(),
            n.saturating_sub(1)
        )));
    }
    Ok(out.into_iter().map(|e| e.expect("checked above")).collect())
}

/// Keeps a server's log `path` as `path.1` (replacing an older one) if it holds anything: a
/// server started again, or a cluster started again in the same place, keeps the last run's log.
pub fn rotate_log(path: &Path) {
    if std::fs::metadata(path).is_ok_and(|m| m.len() > 0) {
        let mut old = path.as_os_str().to_owned();
        old.push(".1");
        let _ = std::fs::rename(path, PathBuf::from(old));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rewrite_keeps_the_rest_of_the_file_and_its_mode_and_never_replaces_a_stopped_file() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cluster.json");
        let entry = |id| ServerEntry {
            spec: cairn_core::placement::ServerSpec { id, node: format!("n{id}"), rack: String::new(), spare: false },
            addr: format!("127.0.0.1:{}", 7000 + id),
            unix: None,
            host: "h".into(),
            pid: 0,
            memory: 1,
            metrics: None,
        };
        let file = ClusterFile { secret: "s".into(), servers: vec![entry(0)], redundancy: Default::default(), drain: None };
        std::fs::write(&path, file.to_json()).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o640)).unwrap();
        rewrite_servers(&path, |s| s.push(entry(1))).unwrap();
        let back = ClusterFile::load(&path).unwrap();
        assert_eq!((back.secret.as_str(), back.servers.len()), ("s", 2));
        assert_eq!(std::fs::metadata(&path).unwrap().permissions().mode() & 0o777, 0o640, "the group's read access is kept");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1, "no temporary file left");
        StoppedFile::write(&path, None, None).unwrap();
        let e = rewrite_servers(&path, |s| s.clear()).unwrap_err();
        assert_eq!(e.kind(), cairn_core::ErrorKind::Conflict);
        assert!(StoppedFile::load(&path).is_some(), "a stopped cluster's file is never replaced");
    }

    #[test]
    fn an_old_log_is_kept_once() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("server-0.log");
        std::fs::write(&log, "first run\n").unwrap();
        rotate_log(&log);
        assert!(!log.exists());
        assert_eq!(std::fs::read_to_string(dir.path().join("server-0.log.1")).unwrap(), "first run\n");
        std::fs::write(&log, "").unwrap();
        rotate_log(&log);
        assert!(log.exists(), "an empty log is not worth keeping");
    }

    #[test]
    fn durations_take_units_or_seconds() {
        let ms = |t: &str| parse_duration(t).map(|d| d.as_millis());
        assert_eq!((ms("5s").unwrap(), ms("250ms").unwrap(), ms("1.5").unwrap(), ms("2m").unwrap()), (5000, 250, 1500, 120_000));
        for bad in ["", "0s", "-1s", "5 parsecs", "inf", "1e30h"] {
            assert!(parse_duration(bad).unwrap_err().to_string().contains("250ms"), "{bad}");
        }
    }

    #[test]
    fn sizes_parse_with_units_and_refuse_nonsense() {
        assert_eq!(parse_size("4GiB").unwrap(), 4 << 30);
        assert_eq!(parse_size(" 512 MB ").unwrap(), 512_000_000);
        assert_eq!(parse_size("1e9").unwrap(), 1_000_000_000);
        assert_eq!(parse_size("1.5KiB").unwrap(), 1536);
        assert_eq!(parse_size("123").unwrap(), 123);
        // As Slurm users write them: a bare letter is binary, any case.
        assert_eq!(parse_size("4G").unwrap(), 4 << 30);
        assert_eq!(parse_size("4g").unwrap(), 4 << 30);
        assert_eq!(parse_size("512m").unwrap(), 512 << 20);
        assert_eq!(parse_size("2K").unwrap(), 2048);
        assert_eq!(parse_size("1T").unwrap(), 1 << 40);
        assert_eq!(parse_size("4gb").unwrap(), 4_000_000_000);
        assert_eq!(parse_size("4GIB").unwrap(), 4 << 30);
        assert_eq!(parse_size("3kB").unwrap(), 3000);
        assert_eq!(parse_size("0").unwrap(), 0);
        assert_eq!(
            size_note("4G").unwrap(),
            "cairn: note: size \"4G\" is 4294967296 bytes: a bare G is binary, as in Slurm (write 4GB for powers of 10)"
        );
        assert!(size_note("4GiB").is_none() && size_note("4GB").is_none() && size_note("4096").is_none());
        for bad in ["", "4 parsecs", "-1GiB", "GiB", "1e400", "nan", "4Gi", "4 GiBs"] {
            assert_eq!(parse_size(bad).unwrap_err().kind(), cairn_core::ErrorKind::Config, "{bad}");
        }
    }

    #[test]
    fn topology_from_toml_and_json() {
        let dir = tempfile::tempdir().unwrap();
        let toml = dir.path().join("t.toml");
        std::fs::write(&toml, "[[server]]\nid = 1\nnode = \"a\"\nrack = \"r1\"\n[[server]]\nid = 0\nnode = \"b\"\n").unwrap();
        assert_eq!(load_topology(Some(&toml), 2).unwrap(), vec![("b".into(), "rack0".into()), ("a".into(), "r1".into())]);
        let e = load_topology(Some(&toml), 3).unwrap_err().to_string();
        assert!(e.contains("lacks servers [2]"), "{e}");
        let json = dir.path().join("t.json");
        std::fs::write(&json, r#"{"server": [{"id": 0, "node": "x", "rack": "y"}]}"#).unwrap();
        assert_eq!(load_topology(Some(&json), 1).unwrap(), vec![("x".into(), "y".into())]);
        std::fs::write(&json, "{").unwrap();
        assert!(load_topology(Some(&json), 1).unwrap_err().to_string().contains("does not parse"));
        assert_eq!(load_topology(None, 2).unwrap()[1], ("node1".into(), "rack0".into()));
    }
}
