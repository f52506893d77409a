//! Connections to the servers of a cluster: one per server, opened when first needed (a Unix
//! socket when the server runs on this host, else TCP), authenticated by answering the server's
//! challenge, with every read and write under the configured deadline. Requests are placed by
//! the client's cluster view; a server with a newer one answers `stale_epoch` with it, and the
//! client takes it and asks again.

use crate::config::Transport;
use cairn_core::{Error, ErrorKind, Reason, Result};
use cairn_proto::cluster::{hostname, ClusterFile, ServerEntry};
use cairn_proto::message::{refused, Envelope, ObjectPut, Request, Response, MAX_RUNS};
use cairn_proto::sync_io::{read_head, read_payload, read_payload_crc, skip_payload, write_frame, Stream};
use cairn_proto::ClusterView;
use std::collections::HashMap;
use std::net::{TcpStream, ToSocketAddrs};
use std::ops::ControlFlow;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

/// Attempts of one request while the cluster redirects it (newer view, busy server).
pub(crate) const REDIRECTS: usize = 4;
/// Time allowed beyond the deadline to find the control plane's leader: Raft elects a new one
/// within about 1 s of the last heartbeat (a 0.5 s lease, then 0.25–0.5 s elections).
const ELECTION: Duration = Duration::from_secs(3);

/// An authenticated connection to one server. Every failure to send or receive comes out as one
/// `Unavailable` error naming the server, its address and the operation.
#[derive(Debug)]
pub(crate) struct Conn {
    stream: Stream,
    server: u32,
    addr: String,
    timeout: Duration,
    /// The view epoch requests are stamped with.
    epoch: Option<u64>,
    /// The server copies object bytes straight from and to this process's memory.
    same_node: bool,
    /// Large objects go into shared segments the server leases (`shm`).
    pub(crate) leasing: bool,
    /// The server's segments mapped here.
    pub(crate) maps: super::shm::Maps,
    /// Whole copies in the server's segments are read out of read-only mappings (`shm`).
    pub(crate) mapping: bool,
    /// The server's segments mapped here for reading.
    pub(crate) rmaps: super::shm::ReadMaps,
    /// Reading a reply failed part-way (over the caller's bound, bad magic, another version, a
    /// header that does not parse, a short payload): where the next reply starts is unknown, so
    /// [`Cluster::with`] closes the connection whatever the error's kind.
    broken: bool,
}

impl Conn {
    fn open(entry: &ServerEntry, secret: &str, transport: Transport, timeout: Duration) -> Result<Conn> {
        let (server, addr) = (entry.spec.id, entry.addr.clone());
        let unix = entry.unix.as_deref().filter(|p| transport != Transport::Tcp && entry.host == hostname() && p.exists());
        let stream = match unix {
            Some(p) => UnixStream::connect(p).map(|s| Stream::Unix(cairn_proto::unix::UnixConn::new(s))),
            None => tcp(&addr, timeout).map(Stream::Tcp),
        }
        .and_then(|s| s.set_timeouts(timeout).map(|()| s));
        let stream = stream.map_err(|e| fail(server, &addr, "connect", timeout, &Error::io("connecting", e)))?;
        let local = matches!(stream, Stream::Unix(_));
        let mut c = Conn {
            stream,
            server,
            addr,
            timeout,
            epoch: None,
            same_node: false,
            leasing: false,
            maps: Default::default(),
            mapping: false,
            rmaps: Default::default(),
            broken: false,
        };
        let nonce = match c.recv(0, "hello")?.0 {
            Response::Challenge { nonce, .. } => nonce,
            other => return Err(refused("connect", other)),
        };
        let hello = Request::Hello {
            client: format!("client pid {}", std::process::id()),
            mac: cairn_proto::auth::answer(secret, &nonce),
            role: cairn_proto::Role::Client,
        };
        // The server says whether it bound this connection to this process's memory image
        // (same node, allowed user, the kernel's ptrace check passed): no probe of memory.
        let bound = match c.call(&hello)? {
            Response::Welcome { same_node, .. } => same_node,
            other => return Err(refused("hello", other)),
        };
        if local && matches!(transport, Transport::Auto | Transport::Attach) {
            c.same_node = bound;
            c.leasing = c.same_node && transport == Transport::Auto;
            c.mapping = c.leasing;
        }
        Ok(c)
    }

    /// The runs (address, length) of `parts` in this process's memory, when the server copies
    /// object bytes itself on this connection; else `None` (send them as a payload). The parts
    /// must stay alive and untouched until the request's reply is read.
    pub(crate) fn runs_of(&self, parts: &[&[u8]]) -> Option<Vec<(u64, u64)>> {
        let runs: Vec<(u64, u64)> = parts.iter().filter(|p| !p.is_empty()).map(|p| (p.as_ptr() as u64, p.len() as u64)).collect();
        (self.same_node && !runs.is_empty() && runs.len() <= MAX_RUNS).then_some(runs)
    }

    fn fail(&self, op: &str, e: Error) -> Error {
        fail(self.server, &self.addr, op, self.timeout, &e)
    }

    /// Sends a request whose payload is the concatenation of `payload`. Requests placed by the
    /// view carry its epoch, and so do gets (a server with a newer view answers `stale_epoch`:
    /// the reader's index may name pieces recovery moved); those addressed to a server by id
    /// otherwise (drops of objects the index locates, administration) do not.
    pub(crate) fn send(&mut self, req: &Request, payload: &[&[u8]]) -> Result<()> {
        let placed = matches!(
            req,
            Request::Put(ObjectPut { .. })
                | Request::Get { .. }
                | Request::PutMany { .. }
                | Request::EndStep { .. }
                | Request::Steps { .. }
                | Request::Index { .. }
                | Request::WaitStep { .. }
                | Request::Release(_)
                | Request::RemoveDataset { .. }
                | Request::KvPut { .. }
                | Request::KvGet { .. }
                | Request::KvDelete { .. }
        );
        let env = Envelope { epoch: self.epoch.filter(|_| placed), req: req.clone() };
        let r = write_frame(&mut self.stream, &env, payload);
        self.framed(r, &req.op_name())
    }

    /// Reads one reply as sent (an error reply is a `Response::Error`), with a payload of at most
    /// `max_payload` bytes left to read.
    pub(crate) fn recv(&mut self, max_payload: u64, op: &str) -> Result<(Response, u64)> {
        let r = read_head::<Response>(&mut self.stream, max_payload);
        self.framed(r, op)
    }

    /// Reads a reply's payload into `parts`.
    pub(crate) fn read_payload(&mut self, parts: &mut [&mut [u8]], op: &str) -> Result<()> {
        let r = read_payload(&mut self.stream, parts);
        self.framed(r, op)
    }

    /// [`Conn::read_payload`] that returns the payload's crc32c, computed as it arrives.
    pub(crate) fn read_payload_crc(&mut self, parts: &mut [&mut [u8]], op: &str) -> Result<u32> {
        let r = read_payload_crc(&mut self.stream, parts);
        self.framed(r, op)
    }

    /// A request write's or reply read's result: on any error the connection's framing is in
    /// doubt (see [`Conn::broken`]).
    fn framed<T>(&mut self, r: Result<T>, op: &str) -> Result<T> {
        r.map_err(|e| {
            self.broken = true;
            self.fail(op, e)
        })
    }

    /// The oldest descriptor the server passed on this connection and no reply claimed yet.
    pub(crate) fn take_fd(&mut self) -> Option<std::os::fd::OwnedFd> {
        match &mut self.stream {
            Stream::Unix(u) => u.take_fd(),
            Stream::Tcp(_) => None,
        }
    }

    /// Reads and drops a reply's payload.
    pub(crate) fn skip(&mut self, len: u64, op: &str) -> Result<()> {
        let r = skip_payload(&mut self.stream, len);
        self.framed(r, op)
    }

    /// Sends a request without payload and reads its reply as sent (which carries none).
    pub(crate) fn call(&mut self, req: &Request) -> Result<Response> {
        self.send(req, &[])?;
        Ok(self.recv(0, &req.op_name())?.0)
    }

    /// Runs `f` with reads allowed to take `wait` longer than the deadline (a long poll).
    fn waiting<T>(&mut self, wait: Duration, f: impl FnOnce(&mut Conn) -> Result<T>) -> Result<T> {
        if wait.is_zero() {
            return f(self);
        }
        let before = self.timeout;
        let set = |c: &Conn, t: Duration| {
            match &c.stream {
                Stream::Tcp(s) => s.set_read_timeout(Some(t)),
                Stream::Unix(s) => s.sock.set_read_timeout(Some(t)),
            }
            .map_err(|e| c.fail("wait", Error::io("setting a timeout", e)))
        };
        self.timeout = before.saturating_add(wait);
        set(self, self.timeout)?;
        let r = f(self);
        self.timeout = before;
        set(self, before)?;
        r
    }
}

fn tcp(addr: &str, timeout: Duration) -> std::io::Result<TcpStream> {
    let mut last = std::io::Error::new(std::io::ErrorKind::NotFound, "the address resolves to nothing");
    for a in addr.to_socket_addrs()? {
        match TcpStream::connect_timeout(&a, timeout) {
            Ok(s) => {
                s.set_nodelay(true)?;
                return Ok(s);
            }
            Err(e) => last = e,
        }
    }
    Err(last)
}

/// The one error for a server that failed or missed its deadline.
fn fail(server: u32, addr: &str, op: &str, timeout: Duration, e: &Error) -> Error {
    let timed_out =
        matches!(e, Error::Io { source, .. } if matches!(source.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut));
    match e {
        _ if timed_out => Error::Unavailable(format!(
            "staging server {server} at {addr} did not answer {op} within {:.1} s; it may be hung or overloaded \
             (`cairn cluster status`), or raise [staging] timeout",
            timeout.as_secs_f64()
        )),
        Error::Io { source, .. } => {
            let message = format!("staging server {server} at {addr}: {op} failed: {e}; is it up? (`cairn cluster status`)");
            // Refused, reset or closed: nobody is there (a hung server misses its deadline instead).
            use std::io::ErrorKind as K;
            match source.kind() {
                K::ConnectionRefused | K::NotFound | K::ConnectionReset | K::ConnectionAborted | K::BrokenPipe | K::UnexpectedEof => {
                    Error::ServerGone(message)
                }
                _ => Error::Unavailable(message),
            }
        }
        other => other.duplicate(),
    }
}

/// A cluster as a client sees it: the cluster file (secret, memory), the current view, and a
/// connection slot per server.
#[derive(Debug)]
pub(crate) struct Cluster {
    file: ClusterFile,
    /// Where the cluster file is (read again to find servers added since: [`Cluster::discover`]).
    path: std::path::PathBuf,
    view: RwLock<Arc<ClusterView>>,
    slots: Mutex<HashMap<u32, Arc<Mutex<Option<Conn>>>>>,
    /// The control plane's leader, as last found.
    leader: Mutex<Option<u32>>,
    transport: Transport,
    /// Deadline of every read and write.
    pub(crate) timeout: Duration,
    /// A second descriptor of each open connection's socket, to shut it down from another
    /// thread ([`Cluster::abandon`]).
    sockets: Mutex<HashMap<u32, std::os::fd::OwnedFd>>,
    /// Servers that missed a deadline lately (hung or overloaded), with the error they gave:
    /// not asked again for [`Cluster::timeout`], so one hung server costs a caller one deadline,
    /// not one per request (a read of several steps paid it for every step's index).
    hung: Mutex<HashMap<u32, (Instant, String)>>,
}

impl Cluster {
    pub(crate) fn open(path: &Path, timeout: Duration, transport: Transport) -> Result<Arc<Cluster>> {
        let file = ClusterFile::load(path)?;
        let view = RwLock::new(Arc::new(ClusterView::initial(&file)));
        let hung = Mutex::new(HashMap::new());
        Ok(Arc::new(Cluster {
            file,
            path: path.to_path_buf(),
            view,
            slots: Mutex::new(HashMap::new()),
            leader: Mutex::new(None),
            transport,
            timeout,
            hung,
            sockets: Mutex::default(),
        }))
    }

    /// The cluster's redundancy settings.
    pub(crate) fn policy(&self) -> &cairn_core::corec::Policy {
        &self.file.redundancy
    }

    /// Where the cluster drains committed steps to disk, if it does.
    pub(crate) fn drain(&self) -> Option<&cairn_proto::cluster::DrainSpec> {
        self.file.drain.as_ref()
    }

    /// The cluster's id (drained steps carry it).
    pub(crate) fn id(&self) -> String {
        self.file.id()
    }

    /// The current view.
    pub(crate) fn view(&self) -> Arc<ClusterView> {
        self.view.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Shuts down the connection to `server`, waking a call blocked on it (which fails as the
    /// server gone): for a server the control plane declared down while a put to it waited.
    pub(crate) fn abandon(&self, server: u32) {
        use std::os::fd::AsRawFd;
        if let Some(fd) = self.sockets.lock().unwrap_or_else(|p| p.into_inner()).get(&server) {
            // SAFETY: a descriptor this cluster owns; shutdown(2) has no memory effects.
            unsafe { libc::shutdown(fd.as_raw_fd(), libc::SHUT_RDWR) };
        }
    }

    /// Takes a newer view (from a `stale_epoch` reply); connections to servers whose address
    /// changed are dropped.
    fn install(&self, next: ClusterView) {
        if next.validate().is_err() {
            return;
        }
        let mut v = self.view.write().unwrap_or_else(|p| p.into_inner());
        if next.epoch <= v.epoch {
            return;
        }
        let moved: Vec<u32> =
            next.servers.iter().filter(|s| v.server(s.spec.id).map_or(true, |o| o.addr != s.addr)).map(|s| s.spec.id).collect();
        *v = Arc::new(next);
        drop(v);
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        moved.iter().for_each(|id| {
            slots.remove(id);
        });
    }

    /// Asks the cluster for its current view (the leader's when known) and takes it if newer;
    /// returns whether the view changed. For a server that failed: a spare may hold its slot now.
    pub(crate) fn refresh_view(&self) -> bool {
        let before = self.view().epoch;
        if let Ok((Response::View { view }, _)) = self.leader_call(&Request::View, &[], 0) {
            self.install(view);
        }
        self.view().epoch != before
    }

    /// Waits, within the client's deadline, for a view newer than `epoch` (the control plane
    /// declaring a failed server down takes up to its failure timeout); returns whether one came.
    pub(crate) fn await_view_after(&self, epoch: u64) -> bool {
        let until = std::time::Instant::now() + self.timeout;
        loop {
            if self.refresh_view() || self.view().epoch > epoch {
                return true;
            }
            if std::time::Instant::now() >= until {
                return false;
            }
            std::thread::sleep(std::time::Duration::from_millis(100));
        }
    }

    /// A server's memory limit as the cluster file gives it.
    pub(crate) fn memory(&self, server: u32) -> Result<u64> {
        Ok(self.view().server(server)?.memory)
    }

    /// Runs `f` on the connection to `server`, connecting first if needed; requests carry the
    /// current view's epoch. A connection that failed is dropped, so the next call reconnects.
    pub(crate) fn with<T>(&self, server: u32, f: impl FnOnce(&mut Conn) -> Result<T>) -> Result<T> {
        let view = self.view();
        // A server that left the view (retired) is gone for this client: the index read again
        // names where its pieces went (readers re-read it on NotFound; writers place again by
        // the view that no longer has it).
        let entry = view
            .server(server)
            .map_err(|_| Error::NotFound(format!("server {server} has left the cluster (view {}); read the index again", view.epoch)))?;
        if let Some((since, why)) = self.hung.lock().unwrap_or_else(|p| p.into_inner()).get(&server) {
            let left = self.timeout.saturating_sub(since.elapsed());
            if !left.is_zero() {
                return Err(Error::Unavailable(format!("{why} (not asked again for {:.1} s)", left.as_secs_f64())));
            }
        }
        let slot = self.slots.lock().unwrap_or_else(|p| p.into_inner()).entry(server).or_default().clone();
        let mut guard = slot.lock().unwrap_or_else(|p| p.into_inner());
        let started = Instant::now();
        let r = match guard.as_mut() {
            Some(conn) => {
                conn.epoch = Some(view.epoch);
                f(conn)
            }
            None => Conn::open(entry, &self.file.secret, self.transport, self.timeout).and_then(|conn| {
                let mut sockets = self.sockets.lock().unwrap_or_else(|p| p.into_inner());
                match conn.stream.shutdown_handle() {
                    Ok(fd) => sockets.insert(server, fd),
                    Err(_) => sockets.remove(&server),
                };
                drop(sockets);
                let conn = guard.insert(conn);
                conn.epoch = Some(view.epoch);
                f(conn)
            }),
        };
        if guard.as_ref().is_some_and(|c| c.broken) {
            *guard = None;
        }
        let mut hung = self.hung.lock().unwrap_or_else(|p| p.into_inner());
        match &r {
            Err(e) if matches!(e.kind(), ErrorKind::Unavailable | ErrorKind::Corrupt) => {
                *guard = None;
                // A call that failed after (nearly) its whole deadline met a server that does
                // not answer, not one that is gone (those fail at once).
                if e.kind() == ErrorKind::Unavailable && started.elapsed() >= self.timeout.mul_f64(0.9) {
                    hung.insert(server, (Instant::now(), e.to_string()));
                }
            }
            _ => {
                hung.remove(&server);
            }
        }
        drop(hung);
        // A connection dropped above takes its second descriptor with it.
        if guard.is_none() {
            self.sockets.lock().unwrap_or_else(|p| p.into_inner()).remove(&server);
        }
        r
    }

    /// Turns a reply into a result, taking a newer view from a `stale_epoch` one. Callers that
    /// placed requests by the old view see the epoch change and place again.
    pub(crate) fn settle(&self, resp: Response) -> Result<Response> {
        if let Response::Error { kind: ErrorKind::StaleEpoch, view: Some(v), .. } = &resp {
            self.install((**v).clone());
        }
        resp.into_result()
    }

    /// A request for the control plane's leader, with a payload of at most `max_reply` bytes
    /// back. It goes to the leader last found, else the ring's servers in order; a `not_leader`
    /// reply's hint is followed, and a server that is down or knows no leader (an election) is
    /// passed over, for the deadline plus [`ELECTION`] (one hung leader costs its deadline, and
    /// the others need about a second to elect the next).
    pub(crate) fn leader_call(&self, req: &Request, payload: &[&[u8]], max_reply: u64) -> Result<(Response, Vec<u8>)> {
        self.leader_call_waiting(req, payload, max_reply, Duration::ZERO)
    }

    /// [`Cluster::leader_call`] whose reply may take `wait` beyond the deadline (a long poll).
    pub(crate) fn leader_call_waiting(
        &self,
        req: &Request,
        payload: &[&[u8]],
        max_reply: u64,
        wait: Duration,
    ) -> Result<(Response, Vec<u8>)> {
        self.leader_or_follower(req, payload, max_reply, wait, false)
    }

    /// A read of committed state (steps, an index) from the leader, or, while none answers (an
    /// election), from a follower that heard from one lately: readers never wait for an election.
    /// Callers check a reply's `follower` mark where a stale answer matters.
    pub(crate) fn read_committed(&self, req: &Request) -> Result<Response> {
        self.leader_or_follower(req, &[], 0, Duration::ZERO, true).map(|(r, _)| r)
    }

    fn leader_or_follower(
        &self,
        req: &Request,
        payload: &[&[u8]],
        max_reply: u64,
        wait: Duration,
        followers: bool,
    ) -> Result<(Response, Vec<u8>)> {
        let op = req.op_name();
        // With `followers`, once no leader answers, the read is asked of followers too.
        let mut req = std::borrow::Cow::Borrowed(req);
        let mut hunt = Hunt::new(*self.leader.lock().unwrap_or_else(|p| p.into_inner()));
        loop {
            let view = self.view();
            let slots = view.slots.clone();
            // A leader found earlier may have left the cluster since (retired): ask the ring.
            let target = hunt.next.filter(|t| view.server(*t).is_ok()).unwrap_or(slots[hunt.tried % slots.len()]);
            let reply = self.with(target, |c| {
                c.waiting(wait, |c| {
                    c.send(&req, payload)?;
                    let (resp, len) = c.recv(max_reply, &op)?;
                    let mut body = vec![0u8; len as usize];
                    c.read_payload(&mut [&mut body], &op)?;
                    Ok((resp, body))
                })
            });
            hunt.alive |= reply.is_ok();
            let mut switched = false;
            if followers && !hunt.following && hunt.leaderless(&reply, target) {
                if let Some(r) = follower_read(&req) {
                    req = std::borrow::Cow::Owned(r);
                    (hunt.following, switched) = (true, true);
                }
            }
            let why = match self.follow(&mut hunt, target, reply, switched)? {
                ControlFlow::Break(answer) => return Ok(answer),
                ControlFlow::Continue(why) => why,
            };
            hunt.tried += 1;
            if let Some(e) = hunt.give_up(&op, &why, &slots, self.timeout + ELECTION) {
                // Every slot this client knows is unreachable: the cluster may have moved on
                // (spares took every original member's slot). Any other server the cluster
                // file lists tells the current view; the hunt starts over by it.
                if !hunt.discovered && hunt.none_reachable(&slots) && self.discover(&hunt.unreachable) {
                    // The same deadline: a discovery is part of this hunt, not a second one.
                    hunt = Hunt { discovered: true, started: hunt.started, ..Hunt::new(None) };
                    continue;
                }
                return Err(e);
            }
            if hunt.next.is_none() && hunt.tried.is_multiple_of(slots.len()) {
                std::thread::sleep(Duration::from_millis(50)); // an election is under way
            }
        }
    }

    /// What `target`'s `reply` means for the hunt for a leader: the answer (`Break`), or why to
    /// ask again (`Continue`), with whom to ask next in `hunt.next`.
    fn follow(
        &self,
        hunt: &mut Hunt,
        target: u32,
        reply: Result<(Response, Vec<u8>)>,
        switched: bool,
    ) -> Result<ControlFlow<(Response, Vec<u8>), String>> {
        let why = match reply {
            Ok((Response::Error { kind: ErrorKind::Unavailable, message, .. }, _)) if switched => {
                hunt.next = Some(target); // it may answer as a follower now
                message
            }
            Ok((Response::Error { kind: ErrorKind::NotLeader, leader, message, reason, .. }, _)) => {
                hunt.next = leader.filter(|l| *l != target);
                if reason == Some(Reason::LostQuorum) {
                    hunt.quorum_lost = Some(message.clone());
                    hunt.quorum_lost_at.get_or_insert_with(Instant::now);
                }
                message
            }
            Ok((Response::Error { kind: ErrorKind::StaleEpoch, view: Some(v), message, .. }, _)) => {
                self.install(*v);
                hunt.next = Some(target);
                message
            }
            // A follower's "not committed" may only lag: it learns of a commit with the leader's
            // next append, and a leader killed just after a commit took that with it. The
            // leader elected next says for sure; the follower's word ends the hunt if none does.
            Ok((Response::Error { kind: ErrorKind::NotFound, message, .. }, _)) if hunt.following => {
                hunt.lagging = Some(message.clone());
                hunt.next = None;
                message
            }
            Ok((Response::Error { kind: ErrorKind::Busy, retry_after_ms, message, .. }, _)) => {
                std::thread::sleep(Duration::from_millis(retry_after_ms.unwrap_or(100).min(1000)));
                hunt.next = Some(target);
                message
            }
            Ok((resp, body)) => {
                if !hunt.following {
                    *self.leader.lock().unwrap_or_else(|p| p.into_inner()) = Some(target);
                }
                return resp.into_result().map(|r| ControlFlow::Break((r, body)));
            }
            Err(e) if e.kind() == ErrorKind::Unavailable => {
                hunt.unreachable.insert(target);
                hunt.next = None;
                e.to_string()
            }
            Err(e) => return Err(e),
        };
        Ok(ControlFlow::Continue(why))
    }

    /// Asks the servers the cluster file lists (read again: `cluster add` lists new ones) and
    /// this client's view knows, but for those in `tried`, for the cluster's view, and takes the
    /// first newer one that comes; returns whether one came. Each is asked on a connection of
    /// its own, closed after.
    fn discover(&self, tried: &std::collections::BTreeSet<u32>) -> bool {
        let file = ClusterFile::load(&self.path).unwrap_or_else(|_| self.file.clone());
        let view = self.view();
        let mut entries: Vec<&ServerEntry> = file.servers.iter().collect();
        entries.extend(view.servers.iter().filter(|s| file.servers.iter().all(|f| f.spec.id != s.spec.id)));
        for entry in entries.into_iter().filter(|e| !tried.contains(&e.spec.id)) {
            let asked = Conn::open(entry, &file.secret, self.transport, self.timeout).and_then(|mut c| c.call(&Request::View));
            if let Ok(Response::View { view: next }) = asked {
                let before = self.view().epoch;
                self.install(next);
                if self.view().epoch > before {
                    return true;
                }
            }
        }
        false
    }

    /// One request without payloads to `server`, asked again while the cluster redirects it
    /// (newer view, busy server).
    pub(crate) fn call(&self, server: u32, req: &Request) -> Result<Response> {
        for attempt in 1..=REDIRECTS {
            let resp = self.with(server, |c| c.call(req))?;
            match &resp {
                Response::Error { kind: ErrorKind::StaleEpoch, view: Some(v), .. } if attempt < REDIRECTS => self.install((**v).clone()),
                Response::Error { kind: ErrorKind::Busy, retry_after_ms, .. } if attempt < REDIRECTS => {
                    std::thread::sleep(Duration::from_millis(retry_after_ms.unwrap_or(100).min(1000)))
                }
                _ => return self.settle(resp),
            }
        }
        unreachable!("the last attempt returns")
    }

    /// One request to the control plane's leader, which coordinates every step commit.
    pub(crate) fn coord(&self, req: &Request) -> Result<Response> {
        self.leader_call(req, &[], 0).map(|(r, _)| r)
    }

    /// A request to the leader whose reply may take `wait` beyond the deadline.
    pub(crate) fn coord_waiting(&self, req: &Request, wait: Duration) -> Result<Response> {
        self.leader_call_waiting(req, &[], 0, wait).map(|(r, _)| r)
    }
}

/// The follower-read form of a read of committed state (steps, an index), if it has one.
fn follower_read(req: &Request) -> Option<Request> {
    match req {
        Request::Steps { dataset, .. } => Some(Request::Steps { dataset: dataset.clone(), follower: true }),
        Request::Index { dataset, step, .. } => Some(Request::Index { dataset: dataset.clone(), step: *step, follower: true }),
        _ => None,
    }
}

/// The search for the control plane's leader (see [`Cluster::coord`]).
struct Hunt {
    /// Whom to ask next (a leader named by a follower, or one asked again), else the ring.
    next: Option<u32>,
    tried: usize,
    /// Whether any server answered: with none alive there is nobody to elect a leader.
    alive: bool,
    unreachable: std::collections::BTreeSet<u32>,
    /// A leader's word that it lost its quorum: the best explanation if no leader answers.
    quorum_lost: Option<String>,
    /// When that word first came: a leader says it only after failing to reach its majority for
    /// the failure timeout, so one election later with no other leader, the verdict stands.
    quorum_lost_at: Option<Instant>,
    /// Whether the read is asked of followers too (no leader answered).
    following: bool,
    /// A follower's not-found answer, which may lag the leader's commits: the answer if no
    /// leader answers.
    lagging: Option<String>,
    started: Instant,
    /// Whether the servers beyond the view's slots were asked for a newer view already.
    discovered: bool,
}

impl Hunt {
    fn new(leader: Option<u32>) -> Hunt {
        Hunt {
            next: leader,
            tried: 0,
            alive: false,
            unreachable: Default::default(),
            quorum_lost: None,
            quorum_lost_at: None,
            following: false,
            lagging: None,
            started: Instant::now(),
            discovered: false,
        }
    }

    /// Whether no server answered and every slot of the view was found unreachable.
    fn none_reachable(&self, slots: &[u32]) -> bool {
        !self.alive && slots.iter().all(|s| self.unreachable.contains(s))
    }

    /// Whether `target`'s reply says there is no leader to ask: it is down or hung, or a leader
    /// that cannot confirm it still leads, or it knows no leader that can be reached.
    fn leaderless(&self, reply: &Result<(Response, Vec<u8>)>, target: u32) -> bool {
        match reply {
            Err(e) => e.kind() == ErrorKind::Unavailable,
            Ok((Response::Error { kind: ErrorKind::Unavailable, .. }, _)) => true,
            Ok((Response::Error { kind: ErrorKind::NotLeader, leader, .. }, _)) => {
                leader.is_none_or(|l| l == target || self.unreachable.contains(&l))
            }
            _ => false,
        }
    }

    /// The error to end the hunt with: no server of `slots` reachable, or `budget` spent.
    fn give_up(&self, op: &str, why: &str, slots: &[u32], budget: Duration) -> Option<Error> {
        if self.none_reachable(slots) {
            return Some(Error::Unavailable(format!(
                "no staging server of the control plane could be reached for {op} (last: {why}); is the cluster up? \
                 (`cairn cluster status`)"
            )));
        }
        // A lost quorum is told within the failure timeout and one election, not the whole budget.
        let quorum_lost = self.quorum_lost_at.is_some_and(|at| at.elapsed() > ELECTION);
        if self.started.elapsed() <= budget && !quorum_lost {
            return None;
        }
        let secs = self.started.elapsed().min(budget).as_secs_f64();
        if let Some(l) = &self.lagging {
            return Some(Error::NotFound(format!("{l} (a follower's answer: no leader answered {op} within {secs:.1} s to confirm it)")));
        }
        Some(match &self.quorum_lost {
            Some(q) => Error::LostQuorum(format!("no leader of the control plane answered {op} within {secs:.1} s: {q}")),
            None => Error::Unavailable(format!(
                "no leader of the control plane answered {op} within {secs:.1} s: without a majority of its meta servers up \
                 (its quorum) nothing can commit; see `cairn cluster status` (last: {why})"
            )),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_core::placement::ServerSpec;
    use cairn_proto::message::Envelope;

    /// A cluster file naming one server at `addr`.
    fn one_server_file(dir: &Path, addr: &str) -> std::path::PathBuf {
        let entry = ServerEntry {
            spec: ServerSpec { id: 0, node: "n0".into(), rack: String::new(), spare: false },
            addr: addr.to_string(),
            unix: None,
            host: "elsewhere".into(),
            pid: 0,
            memory: 1 << 20,
            metrics: None,
        };
        let file = ClusterFile { secret: "s".into(), servers: vec![entry], redundancy: Default::default(), drain: None };
        let path = dir.join("cluster.json");
        std::fs::write(&path, file.to_json()).unwrap();
        path
    }

    #[test]
    fn a_connection_whose_reply_broke_its_framing_is_closed_and_the_next_request_succeeds() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = listener.local_addr().unwrap().to_string();
        // A fake server: on its first connection it answers a get with a payload one byte over
        // the client's bound, then a valid reply; on the next, with the bytes asked for.
        let server = std::thread::spawn(move || {
            for (n, stream) in listener.incoming().take(2).enumerate() {
                let mut s = stream.unwrap();
                write_frame(&mut s, &Response::Challenge { server: 0, nonce: "n".into() }, &[]).unwrap();
                read_head::<Envelope<Request>>(&mut s, 0).unwrap();
                write_frame(&mut s, &Response::Welcome { server: 0, epoch: 1, same_node: false }, &[]).unwrap();
                read_head::<Envelope<Request>>(&mut s, 0).unwrap();
                let payload = vec![7u8; 8 + usize::from(n == 0)];
                let data = Response::Data { checksum: cairn_core::checksum::crc(&payload) };
                if n == 0 {
                    // The client closes as soon as it reads the head over its bound: these writes
                    // may meet the reset (that closing is what the test checks).
                    let _ = write_frame(&mut s, &data, &[&payload]).and_then(|()| write_frame(&mut s, &Response::Ok, &[]));
                } else {
                    write_frame(&mut s, &data, &[&payload]).unwrap();
                }
            }
        });
        let dir = tempfile::tempdir().unwrap();
        let cluster = Cluster::open(&one_server_file(dir.path(), &addr), Duration::from_secs(5), Transport::Tcp).unwrap();
        let want = cairn_core::Region::new(vec![0], vec![8]).unwrap();
        let get = Request::Get { dataset: "d".into(), step: 0, id: 1, want, shard: 0, stripe: None, map: None };
        let fetch = |c: &mut Conn| -> Result<Vec<u8>> {
            c.send(&get, &[])?;
            let (resp, len) = c.recv(8, "get")?;
            assert!(matches!(resp, Response::Data { .. }), "{resp:?}");
            let mut out = vec![0u8; len as usize];
            c.read_payload(&mut [&mut out], "get")?;
            Ok(out)
        };
        let e = cluster.with(0, fetch).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
        // Not the refused payload (or the reply after it) read as the next reply: a new connection.
        assert_eq!(cluster.with(0, fetch).unwrap(), vec![7u8; 8]);
        server.join().unwrap();
    }

    #[test]
    fn a_followers_not_found_ends_the_hunt_only_when_no_leader_answers() {
        let mut hunt = Hunt::new(None);
        hunt.alive = true;
        hunt.lagging = Some("step 4 is not committed".into());
        assert!(hunt.give_up("index", "", &[0, 1], Duration::from_secs(60)).is_none(), "within the budget: ask on");
        hunt.started -= Duration::from_secs(2);
        let e = hunt.give_up("index", "", &[0, 1], Duration::from_secs(1)).unwrap();
        assert_eq!(e.kind(), ErrorKind::NotFound);
        assert!(e.to_string().contains("step 4 is not committed") && e.to_string().contains("a follower's answer"), "{e}");
    }

    #[test]
    fn a_lost_quorum_is_told_one_election_after_a_leader_said_so_not_at_the_budget() {
        let mut hunt = Hunt::new(None);
        hunt.alive = true;
        hunt.quorum_lost = Some("leader 0 cannot reach a majority".into());
        hunt.quorum_lost_at = Some(Instant::now());
        let budget = Duration::from_secs(60);
        assert!(hunt.give_up("commit", "", &[0, 1, 2], budget).is_none(), "another leader may be elected meanwhile");
        hunt.quorum_lost_at = Some(Instant::now() - ELECTION - Duration::from_millis(10));
        let e = hunt.give_up("commit", "", &[0, 1, 2], budget).unwrap();
        assert!(e.reason() == Some(Reason::LostQuorum) && e.to_string().contains("cannot reach a majority"), "{e}");
    }
}
