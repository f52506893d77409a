//! Local clusters: start S server processes in the background, wait until each serves, stop
//! them. Every front end starts clusters here: `cairn cluster start` and Python's embedded
//! cluster (servers run as `python -m cairn serve`), and the C API (servers run as the
//! `cairn-server` binary). Servers started by `mpirun`/`srun` on many nodes meet through the same
//! cluster file without this.

use super::conn::Cluster;
use crate::config::Transport;
use cairn_core::{Error, Result};
use cairn_proto::cluster::{load_topology, write_private, ClusterFile};
use cairn_proto::message::{Request, Response};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// How to start a local cluster.
#[derive(Debug, Clone)]
pub struct LaunchOptions {
    /// The cluster file to write (its folder `FILE.d/` holds the secret, sockets and logs).
    pub file: PathBuf,
    /// Active servers.
    pub servers: u32,
    /// Spare servers.
    pub spares: u32,
    /// Topology file (`[[server]] id, node, rack`); none: one node per server, one rack.
    pub topology: Option<PathBuf>,
    /// Memory limit per server, in bytes.
    pub memory: u64,
    /// Address the servers listen on.
    pub host: String,
    /// How long to wait for the cluster to come up.
    pub timeout: Duration,
    /// The command that runs one server, before its flags (see [`server_command`]).
    pub command: Vec<String>,
    /// Further server flags (deadlines: `--io-timeout S` and the like).
    pub extra: Vec<String>,
}

impl LaunchOptions {
    /// `servers` servers of `memory` bytes on loopback, run by [`server_command`].
    pub fn new(file: &Path, servers: u32, memory: u64) -> LaunchOptions {
        LaunchOptions {
            file: file.to_path_buf(),
            servers,
            spares: 0,
            topology: None,
            memory,
            host: "127.0.0.1".into(),
            timeout: Duration::from_secs(60),
            command: server_command(),
            extra: Vec::new(),
        }
    }
}

/// A cluster this process started.
#[derive(Debug)]
pub struct LocalCluster {
    /// Its cluster file.
    pub file: PathBuf,
    /// Process ids of its servers, by server id.
    pub pids: Vec<u32>,
}

/// The command that runs the `cairn-server` binary: `$CAIRN_SERVER`, else the one beside this
/// executable, else the one on `PATH`.
pub fn server_command() -> Vec<String> {
    if let Some(s) = std::env::var_os("CAIRN_SERVER") {
        return vec![s.to_string_lossy().into_owned()];
    }
    let beside = std::env::current_exe().ok().and_then(|e| Some(e.parent()?.join("cairn-server"))).filter(|p| p.exists());
    vec![beside.map_or_else(|| "cairn-server".to_string(), |p| p.to_string_lossy().into_owned())]
}

/// Whether any server of the cluster in `file` answers within `timeout`.
pub fn is_running(file: &Path, timeout: Duration) -> bool {
    let Ok(c) = Cluster::open(file, timeout, Transport::Auto) else { return false };
    let ids: Vec<u32> = c.view().servers.iter().map(|s| s.spec.id).collect();
    ids.into_iter().any(|id| c.call(id, &Request::Status).is_ok())
}

/// Servers (with spares) one local cluster starts at most.
pub const MAX_SERVERS: u32 = 4096;

/// Memory per server at least.
pub const MIN_MEMORY: u64 = 1 << 20;

impl LocalCluster {
    /// Starts the servers and returns once the cluster file is written and every server answers.
    pub fn start(opts: &LaunchOptions) -> Result<LocalCluster> {
        let file = std::path::absolute(&opts.file).map_err(|e| Error::io(format!("resolving {}", opts.file.display()), e))?;
        if file.exists() {
            if is_running(&file, Duration::from_secs(2)) {
                return Err(Error::Config(format!(
                    "a cluster is already running with {}; stop it (`cairn cluster stop --file {0}`) or pick another file",
                    file.display()
                )));
            }
            std::fs::remove_file(&file).map_err(|e| Error::io(format!("removing the stale {}", file.display()), e))?;
        }
        if opts.command.is_empty() {
            return Err(Error::InvalidArgument("no command to run a server with".into()));
        }
        if opts.servers == 0 || opts.servers.checked_add(opts.spares).is_none_or(|n| n > MAX_SERVERS) {
            return Err(Error::InvalidArgument(format!(
                "{} servers and {} spares: give 1 or more servers, {MAX_SERVERS} in all at most",
                opts.servers, opts.spares
            )));
        }
        if opts.memory < MIN_MEMORY {
            return Err(Error::InvalidArgument(format!(
                "memory of {} bytes per server: give at least 1 MiB (e.g. \"64MiB\")",
                opts.memory
            )));
        }
        let dir = ClusterFile::entries_dir(&file);
        // A cluster started again in the same place: the last run's logs stay (as `.log.1`),
        // its entries, secret and sockets go.
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            if !e.file_name().to_string_lossy().contains(".log") {
                let _ = std::fs::remove_dir_all(e.path()).or_else(|_| std::fs::remove_file(e.path()));
            }
        }
        std::fs::create_dir_all(&dir).map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
        write_private(&dir.join("secret"), cairn_proto::auth::new_secret()?.as_bytes())?;
        let n = opts.servers + opts.spares;
        let topo = load_topology(opts.topology.as_deref(), n)?;
        let mut children = Vec::with_capacity(n as usize);
        for (id, (node, rack)) in topo.iter().enumerate() {
            let log_path = dir.join(format!("server-{id}.log"));
            cairn_proto::cluster::rotate_log(&log_path);
            // The owner's only, as the secret: logs name datasets and paths. The server logs
            // into it too (its stderr is this file, so it keeps it).
            let log = {
                use std::os::unix::fs::OpenOptionsExt;
                std::fs::OpenOptions::new().create(true).append(true).mode(0o600).open(&log_path)
            }
            .map_err(|e| Error::io(format!("creating {}", log_path.display()), e))?;
            let err = log.try_clone().map_err(|e| Error::io("duplicating a log handle", e))?;
            let mut cmd = Command::new(&opts.command[0]);
            cmd.args(&opts.command[1..])
                .args(["--cluster", &file.to_string_lossy(), "--id", &id.to_string()])
                .args(["--servers", &opts.servers.to_string(), "--spares", &opts.spares.to_string()])
                .args(["--memory", &opts.memory.to_string(), "--host", &opts.host, "--node", node, "--rack", rack])
                .args(&opts.extra)
                .stdin(Stdio::null())
                .stdout(log)
                .stderr(err)
                // Its own process group: a Ctrl-C meant for the application does not stop the servers.
                .process_group(0);
            match cmd.spawn() {
                Ok(c) => children.push(c),
                Err(e) => {
                    children.iter_mut().for_each(|c| drop(c.kill()));
                    return Err(Error::Unavailable(format!(
                        "cannot run the staging server command {:?}: {e}; build it (cargo build --release) or set $CAIRN_SERVER",
                        opts.command[0]
                    )));
                }
            }
        }
        let started = Instant::now();
        let failed = |children: &mut Vec<std::process::Child>, why: String| {
            children.iter_mut().for_each(|c| drop(c.kill()));
            children.iter_mut().for_each(|c| drop(c.wait()));
            Error::Unavailable(format!("cluster did not start: {why}"))
        };
        while !file.exists() {
            let exited: Vec<String> = children
                .iter_mut()
                .enumerate()
                .filter_map(|(i, c)| matches!(c.try_wait(), Ok(Some(_))).then_some(i))
                .map(|i| {
                    let log = std::fs::read_to_string(dir.join(format!("server-{i}.log"))).unwrap_or_default();
                    let tail: String = log.trim().chars().rev().take(400).collect::<Vec<_>>().into_iter().rev().collect();
                    format!("server {i} exited ({tail})")
                })
                .collect();
            if !exited.is_empty() {
                return Err(failed(&mut children, exited.join("; ")));
            }
            if started.elapsed() > opts.timeout {
                return Err(failed(&mut children, format!("not up after {:.0} s", opts.timeout.as_secs_f64())));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let c = Cluster::open(&file, Duration::from_secs(5), Transport::Auto)?;
        for id in 0..n {
            if let Err(e) = c.call(id, &Request::Status) {
                return Err(failed(&mut children, format!("server {id} does not answer: {e}; see its log in {}", dir.display())));
            }
        }
        Ok(LocalCluster { file, pids: children.iter().map(|c| c.id()).collect() })
    }

    /// Stops the cluster in `file`: a shutdown request to each server (a server that does not
    /// answer within 2 s is killed at once), a kill for any still running after `timeout`, then
    /// the cluster file becomes a stopped one (`{"state": "stopped", "drain": ...}`: readers
    /// still find the drained steps) and its folder keeps only the servers' logs. Works for any
    /// local cluster, whoever started it; a stopped one is left as it is. Returns how many
    /// servers were running (answered or were killed).
    pub fn stop(file: &Path, timeout: Duration) -> Result<u32> {
        if cairn_proto::cluster::StoppedFile::load(file).is_some() {
            return Ok(0);
        }
        let c = Cluster::open(file, Duration::from_secs(2), Transport::Auto)?;
        let entries = c.view().servers.clone();
        let mut waiting = Vec::new();
        let mut running = 0;
        // A pid names a process of the host that recorded it: another node's server (a job's)
        // is only asked to shut down, never killed by a number that means something else here.
        let here = cairn_proto::cluster::hostname();
        for s in &entries {
            let pid = if s.host == here { s.pid } else { 0 };
            match c.call(s.spec.id, &Request::Shutdown) {
                Ok(Response::Ok) => waiting.push(pid),
                _ => {
                    running += u32::from(pid > 0 && alive(pid));
                    kill(pid);
                }
            }
        }
        running += waiting.len() as u32;
        let deadline = Instant::now() + timeout;
        for pid in waiting.into_iter().filter(|p| *p > 0) {
            while alive(pid) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            if alive(pid) {
                kill(pid);
            }
        }
        cairn_proto::cluster::StoppedFile::write(file, c.drain().cloned(), Some(c.id()))?;
        // The logs stay for whoever looks into what happened; the secret, entries and sockets go.
        let dir = ClusterFile::entries_dir(file);
        for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            if !e.file_name().to_string_lossy().contains(".log") {
                let _ = std::fs::remove_file(e.path());
            }
        }
        Ok(running)
    }
}

fn kill(pid: u32) {
    if pid > 0 {
        // SAFETY: kill(2) with a pid from the cluster file (a server this user started).
        unsafe { libc::kill(pid as libc::pid_t, libc::SIGKILL) };
    }
}

/// Whether process `pid` runs (a zombie, exited but not yet reaped, does not).
fn alive(pid: u32) -> bool {
    // Reap it if it is our child; a child that exited is a zombie until then.
    // SAFETY: waitpid with WNOHANG on one pid only reads its status.
    unsafe { libc::waitpid(pid as libc::pid_t, std::ptr::null_mut(), libc::WNOHANG) };
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(stat) => stat.rsplit_once(')').and_then(|(_, rest)| rest.split_whitespace().next()).is_some_and(|state| state != "Z"),
        Err(_) => false,
    }
}
