//! Calls from this server to another one (seal and free objects at commit and release).

use crate::state::State;
use cairn_core::{Error, Result};
use cairn_proto::async_io::{read_head, write_frame};
use cairn_proto::message::{unexpected, Request, Response};
use tokio::net::TcpStream;

/// Sends `req` to server `to` and returns its (non-error) response.
pub async fn call(state: &State, to: u32, req: &Request) -> Result<Response> {
    let cluster = state.cluster()?;
    let addr = &cluster.server(to)?.addr;
    let gone = |e: std::io::Error| Error::Unavailable(format!("server {to} at {addr} is unreachable: {e}"));
    let mut s = TcpStream::connect(addr).await.map_err(gone)?;
    s.set_nodelay(true).map_err(gone)?;
    let hello = Request::Hello { secret: state.secret.clone(), client: format!("server {}", state.id) };
    match exchange(&mut s, to, &hello).await? {
        Response::Welcome { .. } => exchange(&mut s, to, req).await,
        other => Err(unexpected("hello", &other)),
    }
}

async fn exchange(s: &mut TcpStream, to: u32, msg: &Request) -> Result<Response> {
    write_frame(s, msg, &[]).await?;
    let (resp, _): (Response, _) =
        read_head(s, 0).await?.ok_or_else(|| Error::Unavailable(format!("server {to} closed the connection")))?;
    resp.into_result()
}
