//! Calls from this server to another one (seal and free objects at commit and release), over
//! pooled, authenticated connections, each call within the peer deadline.

use crate::state::State;
use cairn_core::{Error, Result};
use cairn_proto::async_io::{read_head, write_frame};
use cairn_proto::message::{refused, Envelope, Request, Response, Role, ServerRequest};
use cairn_proto::MAX_HEADER;
use tokio::net::TcpStream;

/// Sends `req` to server `to` and returns its (non-error) response. A pooled connection that
/// turns out closed (the peer restarted) is replaced once; a peer that does not answer within
/// the deadline is reported by id, address and operation.
pub async fn call<R: Into<ServerRequest> + Clone>(state: &State, to: u32, req: &R) -> Result<Response> {
    call_with(state, to, req, &[]).await
}

/// [`call`] with a payload.
pub async fn call_with<R: Into<ServerRequest> + Clone>(state: &State, to: u32, req: &R, payload: &[u8]) -> Result<Response> {
    call_within(state, to, req, payload, state.limits.peer_timeout).await
}

/// [`call_with`] within `limit` instead of the peer deadline (failure probes).
pub async fn call_within<R: Into<ServerRequest> + Clone>(
    state: &State,
    to: u32,
    req: &R,
    payload: &[u8],
    limit: std::time::Duration,
) -> Result<Response> {
    call_full(state, to, req.clone().into(), payload, limit, 0).await.map(|(r, _)| r)
}

/// Sends `req` to server `to` and returns its response with the reply's payload (at most
/// `max_reply` bytes) within `limit`: reads of another server's objects (recovery).
pub async fn fetch<R: Into<ServerRequest> + Clone>(
    state: &State,
    to: u32,
    req: &R,
    max_reply: u64,
    limit: std::time::Duration,
) -> Result<(Response, Vec<u8>)> {
    call_full(state, to, req.clone().into(), &[], limit, max_reply).await
}

async fn call_full(
    state: &State,
    to: u32,
    req: ServerRequest,
    payload: &[u8],
    limit: std::time::Duration,
    max_reply: u64,
) -> Result<(Response, Vec<u8>)> {
    let view = state.view()?;
    // A server that left the view (retired) is as unreachable as a dead one.
    let addr =
        view.server(to).map_err(|_| Error::Unavailable(format!("server {to} has left the cluster (view {})", view.epoch)))?.addr.clone();
    let op = req.op_name();
    let attempt = |pooled: Option<TcpStream>| {
        let (addr, req) = (addr.as_str(), &req);
        async move {
            let mut s = match pooled {
                Some(s) => s,
                None => connect(state, addr).await?,
            };
            let env = Envelope { epoch: None, req };
            write_frame(&mut s, &env, payload).await?;
            let (resp, p): (Response, _) = read_head(&mut s, MAX_HEADER, max_reply)
                .await?
                .ok_or_else(|| Error::ServerGone(format!("server {to} closed the connection")))?;
            let mut body = vec![0u8; p.payload_len as usize];
            tokio::io::AsyncReadExt::read_exact(&mut s, &mut body).await.map_err(|e| Error::io("reading a reply's payload", e))?;
            Ok::<_, Error>((s, (resp, body)))
        }
    };
    let run = async {
        let pooled = state.peers.take(to);
        let reused = pooled.is_some();
        match attempt(pooled).await {
            Err(Error::Io { .. } | Error::Unavailable(_)) if reused => attempt(None).await,
            r => r,
        }
    };
    match tokio::time::timeout(limit, run).await {
        Ok(Ok((s, (resp, body)))) => {
            state.peers.give_back(to, s);
            resp.into_result().map(|r| (r, body))
        }
        Ok(Err(e)) => Err(Error::Unavailable(format!("server {to} at {addr}: {op} failed: {e}"))),
        Err(_) => Err(Error::Unavailable(format!(
            "server {to} at {addr} did not answer {op} within {:.1} s; it may be hung or overloaded",
            limit.as_secs_f64()
        ))),
    }
}

/// A new authenticated connection to the server at `addr`.
pub async fn connect(state: &State, addr: &str) -> Result<TcpStream> {
    let mut s = TcpStream::connect(addr).await.map_err(|e| Error::io("connecting", e))?;
    s.set_nodelay(true).map_err(|e| Error::io("connecting", e))?;
    let nonce = match read_head::<Response>(&mut s, MAX_HEADER, 0).await? {
        Some((Response::Challenge { nonce, .. }, _)) => nonce,
        Some((other, _)) => return Err(refused("connect", other)),
        None => return Err(Error::Unavailable("closed the connection before its challenge".into())),
    };
    let mac = cairn_proto::auth::answer(&state.secret, &nonce);
    let hello = Request::Hello { client: format!("server {}", state.id), mac, role: Role::Peer };
    write_frame(&mut s, &Envelope { epoch: None, req: hello }, &[]).await?;
    match read_head::<Response>(&mut s, MAX_HEADER, 0).await? {
        Some((Response::Welcome { .. }, _)) => Ok(s),
        Some((other, _)) => Err(refused("hello", other)),
        None => Err(Error::Unavailable("closed the connection after hello".into())),
    }
}
