//! One connection: the server's challenge, the client's hello (small, and within the hello
//! deadline), then requests answered in order, each frame within the I/O deadline. A malformed
//! frame or a failed hello ends the connection with an error reply; the server goes on.

use crate::admission::Place;
use crate::cmd;
use crate::control::Control;
use crate::deadline::Deadline;
use crate::local::Local;
use crate::reply::{discard, Reply};
use crate::state::State;
use cairn_core::{Error, Result};
use cairn_proto::async_io::{read_head, write_frame};
use cairn_proto::message::{Envelope, RaftRequest, RaftRpc, Request, Response, Role, ServerRequest, MAX_RAFT_PAYLOAD};
use cairn_proto::{MAX_HEADER, MAX_HELLO};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::sync::Semaphore;

/// Serves one connection until the peer leaves, sends something malformed, stalls mid-frame,
/// or the server stops. `local` is the client on this host at the other end of a Unix socket
/// (same-node copies go straight to and from its memory), or why copies are refused to it.
pub async fn handle<S: AsyncRead + AsyncWrite + Unpin>(
    ctl: Arc<Control>,
    stream: S,
    mut place: Place,
    auth: Arc<Semaphore>,
    local: Option<(std::result::Result<crate::cma::Peer, String>, Option<std::os::fd::OwnedFd>)>,
) {
    let state = ctl.state.clone();
    state.stats.connections.inc();
    // Counted down however the connection ends.
    struct Open<'a>(&'a prometheus_client::metrics::gauge::Gauge);
    impl Drop for Open<'_> {
        fn drop(&mut self) {
            self.0.dec();
        }
    }
    let _open = Open(&state.stats.connections);
    let mut stream = Deadline::new(stream, state.limits.io_timeout);
    let hello = tokio::select! {
        h = tokio::time::timeout(state.limits.hello_timeout, hello(&state, &mut stream)) => h.unwrap_or_else(|_| {
            Err(Error::Unavailable(format!(
                "no hello within {:.1} s; the first frame must be a hello answering the challenge",
                state.limits.hello_timeout.as_secs_f64()
            )))
        }),
        // A newer connection took this one's place: drop it without a word.
        _ = &mut place.evicted => return,
    };
    drop(place);
    let role = match hello {
        Ok(role) => role,
        Err(e) => return refuse(&mut stream, &Response::error(&e)).await,
    };
    let Ok(_permit) = auth.try_acquire_owned() else {
        let busy = Response::busy(
            format!("server {} serves {} connections already; retry, or close idle ones", state.id, state.limits.max_connections),
            500,
        );
        return refuse(&mut stream, &busy).await;
    };
    let same_node = matches!(local, Some((Ok(_), _)));
    let mut local = local.map(|(p, sock)| Local::new(state.clone(), p, sock));
    let epoch = state.view().map_or(0, |v| v.epoch);
    stream.arm();
    if write_frame(&mut stream, &Response::Welcome { server: state.id, epoch, same_node }, &[]).await.is_err() {
        return;
    }
    let mut shutdown = state.shutdown.subscribe();
    let mut appends = Appends { ctl: ctl.clone(), carried: false };
    loop {
        // A client holding leases must put (or give them back) within the deadline: a hung
        // writer cannot keep their space reserved, since its connection and leases go.
        if !local.as_ref().is_some_and(Local::holds_leases) {
            stream.expect_frame();
        }
        // A client's connection decodes clients' requests only: it cannot name a peer's.
        let max_payload = state.store.limit().max(MAX_RAFT_PAYLOAD);
        let head = tokio::select! {
            h = read_request(&mut stream, role, max_payload) => h,
            _ = shutdown.recv() => return,
        };
        let (env, prefix) = match head {
            Ok(Some(h)) => h,
            Ok(None) => return,
            // The stream is out of step with the frames now: answer, then hang up.
            Err(e) => return refuse(&mut stream, &Response::error(&e)).await,
        };
        if prefix.payload_len > state.store.limit() && !matches!(env.req, ServerRequest::Raft(RaftRequest::Raft { .. })) {
            let e = Error::InvalidArgument(format!(
                "frame payload of {} bytes exceeds the {} bytes accepted here",
                prefix.payload_len,
                state.store.limit()
            ));
            return refuse(&mut stream, &Response::error(&e)).await;
        }
        state.requests.fetch_add(1, Ordering::Relaxed);
        if role == Role::Client {
            state.client_requests.fetch_add(1, Ordering::Relaxed);
        }
        appends.carried |= matches!(env.req, ServerRequest::Raft(RaftRequest::Raft { kind: RaftRpc::Append, .. }));
        let stop_after = matches!(env.req, ServerRequest::Client(Request::Shutdown));
        let began = std::time::Instant::now();
        let op = state.stats.op(op_key(&env.req), || match &env.req {
            ServerRequest::Raft(_) => "raft".into(),
            req => req.op_name(),
        });
        // A get's dataset, named only when bytes are counted by dataset (`metrics_datasets`).
        let got = match &env.req {
            ServerRequest::Client(Request::Get { dataset, .. }) => Some(state.stats.datasets.as_ref().map(|_| dataset.clone())),
            _ => None,
        };
        // A get placed by a view newer than this server's is served as it is: a shard's
        // geometry, not the epoch, says whether the piece is the one the reader wants, and a
        // reader's get never waits for a view change to reach a holder.
        let epoch = match &env.req {
            ServerRequest::Client(Request::Get { .. }) => env.epoch.filter(|e| state.view().is_ok_and(|v| *e <= v.epoch)),
            _ => env.epoch,
        };
        await_view(&ctl, epoch).await;
        let reply = match check_epoch(&ctl, epoch) {
            Some(refusal) => discard(&mut stream, prefix.payload_len).await.map(|()| Reply::Plain(refusal)),
            None => cmd::dispatch(&ctl, env.req, prefix, &mut stream, &mut local).await,
        };
        let fatal = matches!(&reply, Err(Error::Io { .. }));
        stream.arm();
        // A mapped get's bytes count as got, though the reader copies them itself.
        if let (Some(dataset), Ok(Reply::Plain(Response::Mapped { len, .. }) | Reply::WithFd(Response::Mapped { len, .. }, _))) =
            (&got, &reply)
        {
            state.stats.got(dataset.as_deref(), *len);
        }
        let sent = match reply {
            Ok(Reply::Plain(r)) => write_frame(&mut stream, &r, &[]).await,
            Ok(Reply::WithPayload(r, p)) => {
                if let Some(dataset) = &got {
                    state.stats.got(dataset.as_deref(), p.bytes().len() as u64);
                }
                write_frame(&mut stream, &r, p.bytes()).await
            }
            Ok(Reply::WithFd(r, fd)) => match local.as_ref() {
                Some(l) => send_with_fd(&mut stream, l, &r, &fd, state.limits.io_timeout).await,
                None => write_frame(&mut stream, &Response::error(&crate::cma::not_local()), &[]).await,
            },
            Err(e) => write_frame(&mut stream, &Response::error(&e), &[]).await,
        };
        op.done(began.elapsed());
        if stop_after {
            let _ = state.shutdown.send(());
        }
        if fatal || sent.is_err() {
            return;
        }
    }
}

/// Writes reply `r`'s head announcing a one-byte payload, then that byte with descriptor `fd`.
async fn send_with_fd<S: AsyncWrite + Unpin>(
    stream: &mut S,
    local: &Local,
    r: &Response,
    fd: &std::os::fd::OwnedFd,
    timeout: std::time::Duration,
) -> Result<()> {
    let head = cairn_proto::frame::encode_head(r, 1);
    stream.write_all(&head).await.map_err(|e| Error::io("writing a frame", e))?;
    stream.flush().await.map_err(|e| Error::io("writing a frame", e))?;
    local.send_fd(fd, timeout).await
}

/// The kind of `req` for its op's counters (named by serializing one request of the kind: a
/// put_many carries hundreds of headers); Raft's messages carry log entries and are all `raft`.
fn op_key(req: &ServerRequest) -> crate::stats::OpKey {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    let family = match req {
        ServerRequest::Raft(_) => return (2, 0),
        ServerRequest::Client(r) => {
            std::mem::discriminant(r).hash(&mut h);
            0
        }
        ServerRequest::Peer(r) => {
            std::mem::discriminant(r).hash(&mut h);
            1
        }
    };
    (family, h.finish())
}

/// The next request of a connection whose hello said `role` (`None`: it ended cleanly).
async fn read_request<S: AsyncRead + Unpin>(
    stream: &mut S,
    role: Role,
    max_payload: u64,
) -> Result<Option<(Envelope<ServerRequest>, cairn_proto::frame::Prefix)>> {
    Ok(match role {
        Role::Client => read_head::<Envelope<Request>>(stream, MAX_HEADER, max_payload)
            .await?
            .map(|(env, p)| (Envelope { epoch: env.epoch, req: ServerRequest::Client(env.req) }, p)),
        Role::Peer => read_head::<Envelope<ServerRequest>>(stream, MAX_HEADER, max_payload).await?,
    })
}

/// Tells this server's control-plane replica when a connection that carried a leader's appends
/// ends, however it ends: a killed leader's connections close at once, and its followers can
/// stand for election as soon as its lease runs out (`RaftLog::leader_hung_up`).
struct Appends {
    ctl: Arc<Control>,
    carried: bool,
}

impl Drop for Appends {
    fn drop(&mut self) {
        if let (true, Some(log)) = (self.carried, self.ctl.gate.get()) {
            log.leader_hung_up();
        }
    }
}

/// How long a request placed by a newer view than this server's waits for that view (just
/// committed, on its way here) before it is refused as busy.
const VIEW_WAIT: std::time::Duration = std::time::Duration::from_millis(500);

/// Waits (at most [`VIEW_WAIT`]) for the view a request was placed by, asking the other servers
/// for it: a client that learnt a view change first is then served instead of refused.
async fn await_view(ctl: &Arc<Control>, epoch: Option<u64>) {
    let Some(given) = epoch else { return };
    if ctl.state.view().is_ok_and(|v| given > v.epoch) {
        ctl.views.refresh();
        ctl.state.view_at(given, VIEW_WAIT).await;
    }
}

/// The refusal of a request placed by another view than this server's, if it was.
fn check_epoch(ctl: &Arc<Control>, epoch: Option<u64>) -> Option<Response> {
    let (state, given) = (&ctl.state, epoch?);
    let view = match state.view() {
        Ok(v) => v,
        Err(e) => return Some(Response::error(&e)),
    };
    if given < view.epoch {
        return Some(Response::stale_epoch(given, &view));
    }
    (given > view.epoch).then(|| {
        ctl.views.refresh();
        Response::busy(
            format!(
                "server {} is at cluster view {}, the request at {given}: the view change has not reached it yet; retry",
                state.id, view.epoch
            ),
            100,
        )
    })
}

/// Sends the reply, then closes gracefully: closing with unread input would reset the connection
/// and could destroy the reply before the peer reads it, so unread bytes are drained briefly first.
async fn refuse<S: AsyncRead + AsyncWrite + Unpin>(stream: &mut Deadline<S>, reply: &Response) {
    stream.arm();
    let _ = write_frame(stream, reply, &[]).await;
    let _ = stream.shutdown().await;
    let drain = async {
        let mut sink = [0u8; 8192];
        let mut left = 1usize << 20;
        while left > 0 {
            match stream.read(&mut sink).await {
                Ok(0) | Err(_) => break,
                Ok(n) => left = left.saturating_sub(n),
            }
        }
    };
    let _ = tokio::time::timeout(std::time::Duration::from_millis(200), drain).await;
}

/// The challenge, then a hello of at most [`MAX_HELLO`] bytes answering it: who is calling.
async fn hello<S: AsyncRead + AsyncWrite + Unpin>(state: &State, stream: &mut Deadline<S>) -> Result<Role> {
    let nonce = cairn_proto::auth::new_nonce()?;
    stream.arm();
    write_frame(stream, &Response::Challenge { server: state.id, nonce: nonce.clone() }, &[]).await?;
    match read_head::<Envelope<Request>>(stream, MAX_HELLO, 0).await? {
        Some((Envelope { req: Request::Hello { mac, role, .. }, .. }, _)) if cairn_proto::auth::verify(&state.secret, &nonce, &mac) => {
            Ok(role)
        }
        Some((Envelope { req: Request::Hello { .. }, .. }, _)) => Err(Error::Unavailable(format!(
            "server {} refused the connection: wrong cluster secret; use the cluster file this cluster wrote",
            state.id
        ))),
        Some(_) => Err(Error::InvalidArgument("the first request on a connection must be a hello answering the challenge".into())),
        None => Err(Error::Unavailable("connection closed before hello".into())),
    }
}
