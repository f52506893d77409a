//! What a request produces: a response, with payload bytes or without, and how a refused
//! request's payload is read past so the connection stays in step.

use cairn_core::{Error, Result};
use cairn_proto::message::Response;
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncReadExt};

/// What a request produced: a response, or a response with payload bytes.
#[derive(Debug)]
pub enum Reply {
    /// A response without payload.
    Plain(Response),
    /// A response followed by raw bytes.
    WithPayload(Response, Payload),
    /// A response followed by one byte carrying a descriptor for a same-node reader
    /// ([`Response::Mapped`] with `fd`).
    WithFd(Response, std::os::fd::OwnedFd),
}

/// Payload bytes of a reply: a stored object shared without copying, or bytes cut out of one.
#[derive(Debug)]
pub enum Payload {
    /// A whole stored object.
    Shared(Arc<crate::segment::Memory>),
    /// A sub-box copied out of an object.
    Owned(Vec<u8>),
}

impl Payload {
    /// The bytes.
    pub fn bytes(&self) -> &[u8] {
        match self {
            Payload::Shared(b) => b,
            Payload::Owned(b) => b,
        }
    }
}

/// Reads and drops a refused request's payload so the connection stays in step.
pub async fn discard<S: AsyncRead + Unpin>(stream: &mut S, len: u64) -> Result<()> {
    tokio::io::copy(&mut (&mut *stream).take(len), &mut tokio::io::sink())
        .await
        .map_err(|e| Error::io("discarding a refused payload", e))?;
    Ok(())
}
