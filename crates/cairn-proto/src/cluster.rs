//! The cluster file: how clients and servers find each other. `cairn cluster start` (or servers
//! started by `mpirun`/`srun`) write one entry per server into `FILE.d/`; server 0 assembles them
//! into `FILE` once all are up. The secret lives in `FILE.d/secret` and is copied into `FILE`.

use cairn_core::placement::{place_key, Ring, ServerSpec};
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
}

/// A complete cluster file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterFile {
    /// Token every client and server presents in its hello.
    pub secret: String,
    /// All servers, sorted by id.
    pub servers: Vec<ServerEntry>,
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

    /// The ring of active servers.
    pub fn ring(&self) -> Ring {
        Ring::new(&self.servers.iter().map(|s| s.spec.clone()).collect::<Vec<_>>())
    }

    /// The entry of server `id`.
    pub fn server(&self, id: u32) -> Result<&ServerEntry> {
        self.servers.iter().find(|s| s.spec.id == id).ok_or_else(|| Error::NotFound(format!("server {id} is not in the cluster file")))
    }

    /// The server that coordinates commits of `dataset` and keeps its step index.
    pub fn coordinator(&self, dataset: &str) -> u32 {
        self.ring().place(place_key(dataset, "", &[]))
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

/// Compares secrets in time independent of where they differ.
pub fn secret_matches(given: &str, expected: &str) -> bool {
    let (a, b) = (given.as_bytes(), expected.as_bytes());
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
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
