//! One connection: a hello with the cluster secret, then requests answered in order. A malformed
//! frame or a wrong secret ends the connection with an error reply; the server goes on.

use crate::cmd::{self, Reply};
use crate::state::State;
use cairn_core::{Error, Result};
use cairn_proto::async_io::{read_head, write_frame};
use cairn_proto::cluster::secret_matches;
use cairn_proto::message::{Request, Response};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Serves one connection until the peer leaves, sends something malformed, or the server stops.
pub async fn handle<S: AsyncRead + AsyncWrite + Unpin>(state: Arc<State>, mut stream: S) {
    let mut shutdown = state.shutdown.subscribe();
    if let Err(e) = hello(&state, &mut stream).await {
        return refuse(&mut stream, &e).await;
    }
    loop {
        let head = tokio::select! {
            h = read_head::<Request>(&mut stream, state.store.limit()) => h,
            _ = shutdown.recv() => return,
        };
        let (req, prefix) = match head {
            Ok(Some(h)) => h,
            Ok(None) => return,
            // The stream is out of step with the frames now: answer, then hang up.
            Err(e) => return refuse(&mut stream, &e).await,
        };
        state.requests.fetch_add(1, Ordering::Relaxed);
        let reply = cmd::dispatch(&state, req, prefix, &mut stream).await;
        let fatal = matches!(&reply, Err(Error::Io { .. }));
        let sent = match reply {
            Ok(Reply::Plain(r)) => write_frame(&mut stream, &r, &[]).await,
            Ok(Reply::WithPayload(r, p)) => write_frame(&mut stream, &r, p.bytes()).await,
            Err(e) => write_frame(&mut stream, &Response::error(&e), &[]).await,
        };
        if fatal || sent.is_err() {
            return;
        }
    }
}

/// Sends the error, then closes gracefully: closing with unread input would reset the connection
/// and could destroy the reply before the peer reads it, so unread bytes are drained briefly first.
async fn refuse<S: AsyncRead + AsyncWrite + Unpin>(stream: &mut S, e: &Error) {
    let _ = write_frame(stream, &Response::error(e), &[]).await;
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

async fn hello<S: AsyncRead + AsyncWrite + Unpin>(state: &State, stream: &mut S) -> Result<()> {
    let head = read_head::<Request>(stream, 0).await?;
    match head {
        Some((Request::Hello { secret, .. }, _)) if secret_matches(&secret, &state.secret) => {
            write_frame(stream, &Response::Welcome { server: state.id }, &[]).await
        }
        Some((Request::Hello { .. }, _)) => Err(Error::Unavailable(format!(
            "server {} refused the connection: wrong cluster secret; use the cluster file this cluster wrote",
            state.id
        ))),
        Some(_) => Err(Error::InvalidArgument("the first request on a connection must be a hello with the cluster secret".into())),
        None => Err(Error::Unavailable("connection closed before hello".into())),
    }
}
