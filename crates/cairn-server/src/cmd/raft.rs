//! Raft between meta servers (append, vote, snapshot: the payload in, the result out), and the
//! join of a restarted or new meta server, answered by the leader.

use crate::control::Control;
use crate::reply::{Payload, Reply};
use cairn_core::{Error, Result};
use cairn_meta::raft::MetaNode;
use cairn_proto::frame::Prefix;
use cairn_proto::message::{RaftRequest, Response, MAX_RAFT_PAYLOAD};
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncReadExt};

/// Checks a Raft request whose frame announced `payload_len` payload bytes.
pub fn check(req: &RaftRequest, payload_len: u64) -> Result<()> {
    match req {
        RaftRequest::Raft { .. } if payload_len > MAX_RAFT_PAYLOAD => {
            Err(Error::InvalidArgument(format!("a raft message of {payload_len} bytes exceeds {MAX_RAFT_PAYLOAD}")))
        }
        RaftRequest::Raft { .. } => Ok(()),
        RaftRequest::MetaJoin { .. } => super::check::no_payload("meta_join", payload_len),
    }
}

/// Runs a checked Raft request.
pub async fn apply<S: AsyncRead + Unpin>(ctl: &Arc<Control>, req: RaftRequest, p: Prefix, stream: &mut S) -> Result<Reply> {
    match req {
        RaftRequest::Raft { kind, target, head } => {
            let mut payload = vec![0u8; p.payload_len as usize];
            stream.read_exact(&mut payload).await.map_err(|e| Error::io("reading a raft message", e))?;
            let out = crate::control::raft::serve_rpc(&ctl.gate, kind, target, head, payload).await?;
            Ok(Reply::WithPayload(Response::Raft, Payload::Owned(out)))
        }
        RaftRequest::MetaJoin { node, server, addr } => {
            crate::control::raft::admit(&ctl.state, &ctl.gate, node, MetaNode { server, addr }).await?;
            Ok(Reply::Plain(Response::Ok))
        }
    }
}
