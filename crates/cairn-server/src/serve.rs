//! Starting one server of a cluster: read the secret, bind, publish this server's entry next to
//! the cluster file, and (server 0) assemble the cluster file once every server has published.
//! Servers started by `cairn cluster start`, `mpirun` or `srun` all meet this way.

use crate::server::{run, Listeners};
use crate::settings::ServeOptions;
use crate::state::State;
use cairn_core::placement::ServerSpec;
use cairn_core::{Error, Result};
use cairn_proto::cluster::{hostname, write_private, ClusterFile, ServerEntry};
use std::path::Path;
use std::time::{Duration, Instant};

fn wait_for<T>(what: &str, timeout: Duration, mut f: impl FnMut() -> Option<T>) -> Result<T> {
    let start = Instant::now();
    loop {
        if let Some(v) = f() {
            return Ok(v);
        }
        if start.elapsed() > timeout {
            return Err(Error::Unavailable(format!("gave up after {timeout:?} waiting for {what}")));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Runs a server until it is told to shut down (a shutdown request, SIGTERM or SIGINT).
pub fn serve(opts: ServeOptions) -> Result<()> {
    opts.redundancy.validate()?;
    // A cluster file that exists before this server publishes its entry means it is restarting
    // into a running cluster: its control-plane replica rejoins under a new node id.
    // (A stopped cluster's file is no running cluster: this server starts a new one.)
    let rejoin = opts.cluster.exists() && cairn_proto::cluster::StoppedFile::load(&opts.cluster).is_none();
    let dir = ClusterFile::entries_dir(&opts.cluster);
    std::fs::create_dir_all(&dir).map_err(|e| Error::io(format!("creating {}", dir.display()), e))?;
    let log = match &opts.log_file {
        Some(p) if p.as_os_str() == "-" => None,
        Some(p) => Some(p.clone()),
        None => Some(dir.join(format!("server-{}.log", opts.id))),
    };
    crate::logging::init(log.as_deref(), opts.log_level.as_deref(), opts.log_format)
        .map_err(|e| Error::io(format!("opening the log {}", log.as_deref().unwrap_or(Path::new("-")).display()), e))?;
    let secret_path = dir.join("secret");
    let secret = wait_for(&format!("the cluster secret in {}", secret_path.display()), opts.timeout, || {
        std::fs::read_to_string(&secret_path).ok().map(|s| s.trim().to_string()).filter(|s| !s.is_empty())
    })?;
    raise_fd_limit();
    crate::failpoint::arm(&dir);
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().map_err(|e| Error::io("starting the runtime", e))?;
    rt.block_on(async move {
        // A restarting server takes back its port when it is free, so the address every view
        // lists for it stays right (a replacement started by `cairn chaos` rejoins this way).
        let port = if rejoin { previous_port(&opts.cluster, opts.id) } else { 0 };
        let tcp = match tokio::net::TcpListener::bind((opts.bind.as_str(), port)).await {
            Err(_) if port != 0 => tokio::net::TcpListener::bind((opts.bind.as_str(), 0)).await,
            r => r,
        }
        .map_err(|e| Error::io(format!("binding {}", opts.bind), e))?;
        let port = tcp.local_addr().map_err(|e| Error::io("reading the bound address", e))?.port();
        let sock = dir.join(format!("server-{}.sock", opts.id));
        let _ = std::fs::remove_file(&sock);
        // Unix socket paths are limited to ~108 bytes; without one clients use TCP.
        let unix = tokio::net::UnixListener::bind(&sock).ok();
        if unix.is_some() {
            share_socket(&opts, &dir, &sock)?;
        }
        let host = hostname();
        let advertised = if opts.bind == "0.0.0.0" || opts.bind == "::" { host.clone() } else { opts.bind.clone() };
        let metrics = bind_metrics(&opts).await?;
        let metrics_addr = match &metrics {
            Some(l) => {
                let a = l.local_addr().map_err(|e| Error::io("reading the metrics address", e))?;
                let ip = a.ip().to_string();
                Some(format!("{}:{}", if a.ip().is_unspecified() { host.as_str() } else { ip.as_str() }, a.port()))
            }
            None => None,
        };
        let entry = ServerEntry {
            spec: ServerSpec {
                id: opts.id,
                node: if opts.node.is_empty() { host.clone() } else { opts.node.clone() },
                rack: opts.rack.clone(),
                spare: opts.id >= opts.servers,
            },
            addr: format!("{advertised}:{port}"),
            unix: unix.as_ref().map(|_| sock.clone()),
            host,
            pid: std::process::id(),
            memory: opts.memory,
            metrics: metrics_addr,
        };
        write_private(&dir.join(format!("server-{}.json", opts.id)), &serde_json::to_vec_pretty(&entry).expect("serializes"))?;
        tracing::info!(
            server = opts.id,
            event = "started",
            version = env!("CARGO_PKG_VERSION"),
            cluster = %cairn_proto::auth::cluster_id(&secret),
            addr = %entry.addr,
            unix = ?entry.unix,
            memory = opts.memory,
            drain = ?opts.drain,
            metrics = ?entry.metrics,
            "listening on {} (memory {} bytes)",
            entry.addr,
            opts.memory
        );
        let meta = crate::control::MetaOptions { servers: opts.meta, rejoin, ..Default::default() };
        let state = State::new(opts.id, secret.clone(), opts.cluster.clone(), opts.memory, opts.limits.clone());
        crate::prefault::spawn(std::sync::Arc::downgrade(&state), opts.prefault_bytes());
        let ctl = crate::control::Control::new(state, meta, opts.drain_spec());
        ctl.start();
        if let Some(l) = metrics {
            tokio::spawn(crate::metrics::serve(l, ctl.clone()));
        }
        if opts.id == 0 {
            let (dir, cluster, n, timeout) = (dir.clone(), opts.cluster.clone(), opts.servers + opts.spares, opts.timeout);
            let mut policy = opts.redundancy.clone();
            policy.redundancy = policy.redundancy.min(opts.servers.saturating_sub(1));
            let drain = opts.drain_spec();
            // With a socket group the cluster file (it carries the secret) is the group's to read.
            let group = opts.socket_group.as_deref().filter(|_| opts.limits.same_node_other_users).map(gid_of).transpose()?;
            tokio::task::spawn_blocking(move || {
                if let Err(e) = assemble(&dir, &cluster, &secret, (n, timeout), Written { redundancy: policy, drain, group }) {
                    tracing::error!(server = 0, "{e}");
                }
            });
        }
        let signalled = async {
            use tokio::signal::unix::{signal, SignalKind};
            match (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) {
                (Ok(mut term), Ok(mut int)) => tokio::select! { _ = term.recv() => {}, _ = int.recv() => {} },
                _ => std::future::pending().await,
            }
        };
        run(ctl, Listeners { tcp, unix }, signalled).await;
        tracing::info!(server = opts.id, event = "stopped", "stopped (a shutdown request or a signal)");
        let _ = std::fs::remove_file(&sock);
        Ok(())
    })
}

/// Who may connect to the Unix socket (issue 52): its owner only (socket 0600, folder 0700), or
/// with `--same-node-other-users true` anyone (0666, folder 0711: traversable, not listable) or,
/// with `--socket-group G`, members of G (0660 of group G, folder 0750 and the cluster file 0640
/// of group G, so they can read the secret it carries). The secret file and logs stay 0600.
fn share_socket(opts: &ServeOptions, dir: &Path, sock: &Path) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let set = |p: &Path, mode: u32| {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
            .map_err(|e| Error::io(format!("setting the mode of {}", p.display()), e))
    };
    let group = match (&opts.socket_group, opts.limits.same_node_other_users) {
        (Some(g), true) => Some(gid_of(g)?),
        (Some(g), false) => {
            return Err(Error::Config(format!("--socket-group {g} needs --same-node-other-users true (the group's users are other users)")))
        }
        (None, _) => None,
    };
    match (opts.limits.same_node_other_users, group) {
        (false, _) => {
            set(dir, 0o700)?;
            set(sock, 0o600)
        }
        (true, None) => {
            set(dir, 0o711)?;
            set(sock, 0o666)
        }
        (true, Some(gid)) => {
            for p in [dir, sock] {
                std::os::unix::fs::chown(p, None, Some(gid)).map_err(|e| Error::io(format!("giving {} to group {gid}", p.display()), e))?;
            }
            set(dir, 0o750)?;
            set(sock, 0o660)
        }
    }
}

/// The id of group `name` (or a number).
fn gid_of(name: &str) -> Result<u32> {
    if let Ok(n) = name.parse::<u32>() {
        return Ok(n);
    }
    let c = std::ffi::CString::new(name).map_err(|_| Error::Config(format!("group {name:?} has a NUL byte")))?;
    // SAFETY: getgrnam takes a NUL-terminated name and returns a static record or null; its gid
    // is read at once, before any other call could overwrite it.
    let gr = unsafe { libc::getgrnam(c.as_ptr()) };
    if gr.is_null() {
        return Err(Error::Config(format!("--socket-group {name}: no such group")));
    }
    // SAFETY: non-null, as checked.
    Ok(unsafe { (*gr).gr_gid })
}

/// The port server `id` listened on, by the cluster file (0 when unknown).
fn previous_port(cluster: &Path, id: u32) -> u16 {
    let Ok(file) = ClusterFile::load(cluster) else { return 0 };
    file.servers.iter().find(|s| s.spec.id == id).and_then(|s| s.addr.rsplit(':').next()?.parse().ok()).unwrap_or(0)
}

/// What server 0 writes into the cluster file beside the entries, and who may read it.
struct Written {
    redundancy: cairn_core::corec::Policy,
    drain: Option<cairn_proto::cluster::DrainSpec>,
    /// The socket group, which may read the file (it carries the secret).
    group: Option<u32>,
}

/// Waits for `n` entries in `dir` (up to `timeout`), then writes the cluster file.
fn assemble(dir: &Path, cluster: &Path, secret: &str, (n, timeout): (u32, Duration), w: Written) -> Result<()> {
    let Written { redundancy, drain, group } = w;
    let servers = wait_for(&format!("{n} servers to publish their entries in {}", dir.display()), timeout, || {
        (0..n)
            .map(|id| {
                let text = std::fs::read(dir.join(format!("server-{id}.json"))).ok()?;
                serde_json::from_slice::<ServerEntry>(&text).ok()
            })
            .collect::<Option<Vec<_>>>()
    })?;
    let file = ClusterFile { secret: secret.to_string(), servers, redundancy, drain };
    write_private(cluster, &file.to_json())?;
    if let Some(gid) = group {
        use std::os::unix::fs::PermissionsExt;
        std::os::unix::fs::chown(cluster, None, Some(gid))
            .map_err(|e| Error::io(format!("giving {} to group {gid}", cluster.display()), e))?;
        std::fs::set_permissions(cluster, std::fs::Permissions::from_mode(0o640))
            .map_err(|e| Error::io(format!("setting the mode of {}", cluster.display()), e))?;
    }
    Ok(())
}

/// Raises this process's open-file limit to its hard limit: every connection is a descriptor, and
/// the common soft limit of 1024 would be reached before the server's own connection bounds.
fn raise_fd_limit() {
    // SAFETY: getrlimit/setrlimit only read and write the struct passed to them.
    unsafe {
        let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            let _ = libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

/// The listener of this server's Prometheus metrics (see [`ServeOptions::metrics`]).
async fn bind_metrics(opts: &ServeOptions) -> Result<Option<tokio::net::TcpListener>> {
    let (host, port) = match opts.metrics.as_deref() {
        Some("off") => return Ok(None),
        Some(a) => {
            let (h, p) = a.rsplit_once(':').unwrap_or((a, "0"));
            let p: u16 = p.parse().unwrap_or(0);
            // Server i takes PORT + i (a port of 0 stays the system's choice).
            let p = if p == 0 { 0 } else { p.checked_add(u16::try_from(opts.id).unwrap_or(u16::MAX)).unwrap_or(0) };
            (h.trim_matches(['[', ']']).to_string(), p)
        }
        None => (opts.bind.clone(), 0),
    };
    let l = tokio::net::TcpListener::bind((host.as_str(), port))
        .await
        .map_err(|e| Error::io(format!("binding the metrics address {host}:{port} (--metrics)"), e))?;
    Ok(Some(l))
}
