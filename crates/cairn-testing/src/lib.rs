//! Test scaffolding for Cairn's crates, kept out of their public API (a dev-dependency only):
//!
//! - [`TestCluster`]: servers inside one process, each running [`run`] on its own runtime
//!   thread; any of them can be killed (its runtime and every connection dropped at once, its
//!   memory lost, as with SIGKILL), restarted empty on the same address, or cut off from the
//!   other meta servers.
//! - [`RawConn`]: one authenticated connection speaking the protocol directly, as a client or
//!   a peer server.

use cairn_core::placement::ServerSpec;
use cairn_core::{Error, Result};
use cairn_proto::cluster::{write_private, ClusterFile, ServerEntry};
use cairn_proto::message::{refused, Envelope, Request, Response, Role, ViewChange};
use cairn_proto::sync_io::Stream;
use cairn_proto::ClusterView;
use cairn_server::control::{Control, MetaOptions};
use cairn_server::server::{run, Listeners};
use cairn_server::state::{Limits, State};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// One running server of a [`TestCluster`].
#[derive(Debug)]
struct Running {
    stop: oneshot::Sender<()>,
    thread: JoinHandle<()>,
    ctl: Arc<Control>,
}

/// Servers `0..n` (the last `spares` of them spares) on loopback, with a cluster file in a
/// folder the caller owns.
#[derive(Debug)]
pub struct TestCluster {
    /// The cluster file clients open.
    pub file: PathBuf,
    dir: PathBuf,
    secret: String,
    memory: u64,
    limits: Limits,
    meta: MetaOptions,
    addrs: Vec<SocketAddr>,
    servers: Vec<Option<Running>>,
}

impl TestCluster {
    /// Starts `active + spares` servers with `memory` bytes each; the cluster file goes to
    /// `dir/cluster.json`. The first 3 ring slots run the control plane.
    pub fn start(dir: &Path, active: u32, spares: u32, memory: u64, limits: Limits) -> Result<TestCluster> {
        Self::start_meta(dir, active, spares, memory, limits, 3)
    }

    /// [`TestCluster::start`] with the first `meta` ring slots running the control plane.
    pub fn start_meta(dir: &Path, active: u32, spares: u32, memory: u64, limits: Limits, meta: u32) -> Result<TestCluster> {
        Self::start_with(dir, active, spares, memory, limits, meta, cairn_core::corec::Policy::default())
    }

    /// [`TestCluster::start_meta`] with redundancy settings in the cluster file.
    pub fn start_with(
        dir: &Path,
        active: u32,
        spares: u32,
        memory: u64,
        limits: Limits,
        meta: u32,
        redundancy: cairn_core::corec::Policy,
    ) -> Result<TestCluster> {
        let file = dir.join("cluster.json");
        let secret = cairn_proto::auth::new_secret()?;
        let mut listeners = Vec::new();
        let mut entries = Vec::new();
        for id in 0..active + spares {
            let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| Error::io("binding a test server", e))?;
            let addr = l.local_addr().map_err(|e| Error::io("reading a bound address", e))?;
            entries.push(ServerEntry {
                spec: ServerSpec { id, node: format!("n{id}"), rack: String::new(), spare: id >= active },
                addr: addr.to_string(),
                // Clients on this host use the Unix socket, as with real servers.
                unix: Some(Self::sock(dir, id)),
                host: cairn_proto::cluster::hostname(),
                pid: std::process::id(),
                memory,
                metrics: None,
            });
            listeners.push((addr, l));
        }
        let cluster = ClusterFile { secret: secret.clone(), servers: entries, redundancy, drain: None };
        write_private(&file, &cluster.to_json())?;
        let meta = MetaOptions { servers: meta, ..Default::default() };
        let mut c = TestCluster { file, dir: dir.to_path_buf(), secret, memory, limits, meta, addrs: Vec::new(), servers: Vec::new() };
        for (id, (addr, l)) in listeners.into_iter().enumerate() {
            c.addrs.push(addr);
            c.servers.push(Some(c.launch(id as u32, Some(l))?));
        }
        Ok(c)
    }

    fn sock(dir: &Path, id: u32) -> PathBuf {
        dir.join(format!("server-{id}.sock"))
    }

    /// Runs server `id` on `listener`, or on a new listener at its address (a restart, whose
    /// control-plane replica rejoins under a new node id).
    fn launch(&self, id: u32, listener: Option<std::net::TcpListener>) -> Result<Running> {
        let meta = MetaOptions { rejoin: listener.is_none(), ..self.meta };
        if let Some(l) = &listener {
            l.set_nonblocking(true).map_err(|e| Error::io("configuring a test listener", e))?;
        }
        let addr = self.addrs[id as usize];
        let state = State::new(id, self.secret.clone(), self.file.clone(), self.memory, self.limits.clone());
        let ctl = Control::new(state, meta, None);
        let (stop, stopped) = oneshot::channel::<()>();
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .build()
            .map_err(|e| Error::io("starting a test runtime", e))?;
        let c = ctl.clone();
        let sock = Self::sock(&self.dir, id);
        let _ = std::fs::remove_file(&sock);
        let (tcp, unix) = rt
            .block_on(async move {
                match listener {
                    Some(l) => tokio::net::TcpListener::from_std(l),
                    None => {
                        // Connections of the killed server may linger in TIME_WAIT on this port.
                        let s = tokio::net::TcpSocket::new_v4()?;
                        s.set_reuseaddr(true)?;
                        s.bind(addr)?;
                        s.listen(1024)
                    }
                }
                .and_then(|tcp| Ok((tcp, tokio::net::UnixListener::bind(&sock)?)))
            })
            .map_err(|e| Error::io(format!("listening on {addr}"), e))?;
        let thread = std::thread::spawn(move || {
            rt.block_on(async move {
                c.start();
                run(c, Listeners { tcp, unix: Some(unix) }, async {
                    let _ = stopped.await;
                })
                .await;
            });
            // Dropping the runtime here drops every task still holding a connection.
        });
        Ok(Running { stop, thread, ctl })
    }

    /// The state of a running server (to look at its store or view).
    pub fn state(&self, id: u32) -> Option<&Arc<State>> {
        self.servers.get(id as usize)?.as_ref().map(|r| &r.ctl.state)
    }

    /// The control plane's services of a running server.
    pub fn control(&self, id: u32) -> Option<&Arc<Control>> {
        self.servers.get(id as usize)?.as_ref().map(|r| &r.ctl)
    }

    /// The address of server `id`.
    pub fn addr(&self, id: u32) -> SocketAddr {
        self.addrs[id as usize]
    }

    /// The Unix socket of server `id`.
    pub fn unix_path(&self, id: u32) -> PathBuf {
        TestCluster::sock(&self.dir, id)
    }

    /// The cluster's secret.
    pub fn secret(&self) -> &str {
        &self.secret
    }

    /// Kills server `id`: it stops at once, its connections drop and its memory is gone.
    pub fn kill(&mut self, id: u32) {
        if let Some(r) = self.servers[id as usize].take() {
            let _ = r.stop.send(());
            let _ = r.thread.join();
        }
    }

    /// Waits until the control plane declared server `id` down (every running server's view
    /// lists it): only then is what only it held lost, not merely unavailable.
    pub fn declared_down(&self, id: u32, within: Duration) -> Result<()> {
        self.until(within, &format!("server {id} to be declared down"), |c| {
            (0..c.servers.len() as u32).filter_map(|s| c.state(s)).all(|st| st.view().is_ok_and(|v| v.down.contains(&id)))
        })
    }

    /// The running server that leads the control plane, once one does within `within`.
    pub fn leader(&self, within: Duration) -> Result<u32> {
        let lead = || {
            (0..self.servers.len() as u32).find(|id| self.control(*id).and_then(|c| c.gate.get()).is_some_and(|l| l.role().0 == "leader"))
        };
        self.until(within, "a server to lead the control plane", |_| lead().is_some())?;
        lead().ok_or_else(|| Error::Unavailable("the leader stepped down at once".into()))
    }

    /// Waits until `cond` holds, checking it again whenever a running server's store (objects
    /// held or reserved), view or control-plane replica changes: no polling, and no change
    /// missed (each is subscribed to before `cond` is checked). After `within`, an error naming
    /// `what`.
    pub fn until(&self, within: Duration, what: &str, mut cond: impl FnMut(&Self) -> bool) -> Result<()> {
        let rt =
            tokio::runtime::Builder::new_current_thread().enable_time().build().map_err(|e| Error::io("starting a test runtime", e))?;
        let end = Instant::now() + within;
        rt.block_on(async {
            loop {
                let mut changes = tokio::task::JoinSet::new();
                for ctl in self.servers.iter().flatten().map(|r| &r.ctl) {
                    let mut store = ctl.state.store.changes();
                    let mut view = ctl.state.epochs();
                    let mut started = ctl.gate.started();
                    let mut raft = ctl.gate.get().map(|l| l.raft().metrics());
                    changes.spawn(async move {
                        let raft = async {
                            match raft.as_mut() {
                                Some(m) => m.changed().await,
                                None => std::future::pending().await,
                            }
                        };
                        // A stopped server's channels close: wait on the others.
                        tokio::select! {
                            Ok(()) = store.changed() => {}
                            Ok(()) = view.changed() => {}
                            Ok(()) = started.changed() => {}
                            Ok(()) = raft => {}
                            else => std::future::pending().await,
                        }
                    });
                }
                if cond(self) {
                    return Ok(());
                }
                let left = end.saturating_duration_since(Instant::now());
                if tokio::time::timeout(left, changes.join_next()).await.is_err() {
                    return Err(Error::Unavailable(format!("not within {within:?}: {what}")));
                }
            }
        })
    }

    /// Cuts server `id` off from the other meta servers (`true`) or heals it: its Raft messages
    /// in and out are dropped, as in a network partition; clients still reach it.
    pub fn partition(&self, id: u32, cut: bool) {
        if let Some(c) = self.control(id) {
            c.gate.set_cut(cut);
        }
    }

    /// Proposes `view` (the next epoch) at the leader, as `cairn` admin tools do.
    pub fn set_view(&self, view: &ClusterView) -> Result<()> {
        let mut conn = RawConn::open(&self.addr(self.leader(Duration::from_secs(10))?).to_string(), &self.secret)?;
        conn.call(None, &Request::SetView(ViewChange { view: view.clone() }), &[])?.into_result().map(|_| ())
    }

    /// Waits until every running server holds a view of epoch `epoch` or newer.
    pub fn await_epoch(&self, epoch: u64, within: Duration) -> Result<()> {
        let behind = |c: &Self| -> Vec<u32> {
            (0..c.servers.len() as u32).filter(|id| c.state(*id).is_some_and(|s| s.view().map_or(true, |v| v.epoch < epoch))).collect()
        };
        self.until(within, &format!("every server on view {epoch}"), |c| behind(c).is_empty())
            .map_err(|_| Error::Unavailable(format!("servers {:?} did not reach view {epoch} within {within:?}", behind(self))))
    }

    /// Restarts a killed server, empty, on its old address.
    pub fn restart(&mut self, id: u32) -> Result<()> {
        self.kill(id);
        self.servers[id as usize] = Some(self.launch(id, None)?);
        Ok(())
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        for id in 0..self.servers.len() {
            self.kill(id as u32);
        }
    }
}

/// A raw, authenticated connection to a server, for tests that send frames by hand.
#[derive(Debug)]
pub struct RawConn {
    /// The socket (reads time out after 10 s).
    pub stream: Stream,
}

impl RawConn {
    /// Connects to `addr` over TCP and answers its challenge with `secret`, as a client.
    pub fn open(addr: &str, secret: &str) -> Result<RawConn> {
        RawConn::open_as(addr, secret, Role::Client)
    }

    /// Connects to `addr` over TCP as `role` (a peer may send peer and Raft requests).
    pub fn open_as(addr: &str, secret: &str, role: Role) -> Result<RawConn> {
        let stream = std::net::TcpStream::connect(addr).map_err(|e| Error::io("connecting", e))?;
        stream.set_read_timeout(Some(Duration::from_secs(10))).map_err(|e| Error::io("connecting", e))?;
        RawConn { stream: Stream::Tcp(stream) }.hello(secret, role)
    }

    /// Connects to server `id`'s Unix socket in `cluster` and answers its challenge.
    pub fn open_unix(cluster: &TestCluster, id: u32) -> Result<RawConn> {
        RawConn::open_unix_path(&cluster.unix_path(id), cluster.secret())
    }

    /// Connects to the Unix socket at `path` and answers its challenge with `secret`.
    pub fn open_unix_path(path: &Path, secret: &str) -> Result<RawConn> {
        let stream = std::os::unix::net::UnixStream::connect(path).map_err(|e| Error::io("connecting", e))?;
        stream.set_read_timeout(Some(Duration::from_secs(10))).map_err(|e| Error::io("connecting", e))?;
        RawConn { stream: Stream::Unix(cairn_proto::unix::UnixConn::new(stream)) }.hello(secret, Role::Client)
    }

    fn hello(mut self, secret: &str, role: Role) -> Result<RawConn> {
        let (challenge, _) = self.recv()?;
        let Response::Challenge { nonce, .. } = challenge else { return Err(refused("connect", challenge)) };
        let mac = cairn_proto::auth::answer(secret, &nonce);
        self.call(None, &Request::Hello { client: "test".into(), mac, role }, &[])?.into_result()?;
        Ok(self)
    }

    /// Sends one request (a client's, or on a peer's connection any server's) and reads its
    /// reply and the reply's payload.
    pub fn call<R: serde::Serialize>(&mut self, epoch: Option<u64>, req: &R, payload: &[&[u8]]) -> Result<Response> {
        cairn_proto::sync_io::write_frame(&mut self.stream, &Envelope { epoch, req }, payload)?;
        Ok(self.recv()?.0)
    }

    /// Reads one reply and its payload.
    pub fn recv(&mut self) -> Result<(Response, Vec<u8>)> {
        let (resp, len) = cairn_proto::sync_io::read_head::<Response>(&mut self.stream, u64::MAX)?;
        let mut payload = vec![0u8; len as usize];
        cairn_proto::sync_io::read_payload(&mut self.stream, &mut [&mut payload])?;
        Ok((resp, payload))
    }
}

/// A put of object `id` (a 1-D `u8` variable `x` of `len` elements, step 0, writer 0) claiming
/// crc32c `checksum`: its bytes go as the payload, or (with [`same_node`]) are named in memory.
pub fn put_request(dataset: &str, id: u64, len: u64, checksum: u32) -> Request {
    let region = cairn_core::Region::new(vec![0], vec![len]).expect("a 1-D box");
    Request::Put(cairn_proto::message::ObjectPut {
        dataset: dataset.into(),
        step: 0,
        session: "attacker".into(),
        writer: 0,
        shard: 0,
        from: None,
        stripe: None,
        object: cairn_proto::message::PutItem { var: "x".into(), id, region, elem: 1, checksum, copy: 0 },
    })
}

/// The get of object `id` of [`put_request`].
pub fn get_request(dataset: &str, id: u64, len: u64) -> Request {
    let want = cairn_core::Region::new(vec![0], vec![len]).expect("a 1-D box");
    Request::Get { dataset: dataset.into(), step: 0, id, want, shard: 0, stripe: None, map: None }
}

/// `put` as a same-node put naming `runs` (address, length) of the connected process's memory.
pub fn same_node(put: Request, runs: Vec<(u64, u64)>) -> Request {
    let Request::Put(mut h) = put else { panic!("same_node takes a put") };
    h.from = Some(runs);
    Request::Put(h)
}

/// How a request went, in a word and the server's words: `done` or `refused (why)`.
pub fn outcome(r: &Result<Response>) -> String {
    match r {
        Ok(Response::Error { message, .. }) => format!("refused ({message})"),
        Ok(Response::Ok | Response::Data { .. }) => "done".to_string(),
        Ok(other) => format!("{other:?}"),
        Err(e) => format!("refused ({e})"),
    }
}
