//! Frame I/O over tokio streams, for servers.

use crate::frame::{decode_header, encode_head, Prefix, PREFIX_LEN};
use cairn_core::{Error, Result};
use serde::de::DeserializeOwned;
use serde::Serialize;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// Reads a frame's prefix and header, bounding the header by `max_header` and the payload by
/// `max_payload`. `Ok(None)` when the peer closed the connection cleanly between frames.
pub async fn read_head<T: DeserializeOwned>(
    r: &mut (impl AsyncRead + Unpin),
    max_header: u32,
    max_payload: u64,
) -> Result<Option<(T, Prefix)>> {
    let mut prefix = [0u8; PREFIX_LEN];
    match r.read_exact(&mut prefix).await {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => return Ok(None),
        Err(e) => return Err(Error::io("reading a frame", e)),
    }
    let p = Prefix::parse(&prefix, max_header, max_payload)?;
    let mut header = vec![0u8; p.header_len as usize];
    r.read_exact(&mut header).await.map_err(|e| Error::io("reading a frame header", e))?;
    Ok(Some((decode_header(&header)?, p)))
}

/// Writes a frame with the given payload.
pub async fn write_frame<T: Serialize>(w: &mut (impl AsyncWrite + Unpin), msg: &T, payload: &[u8]) -> Result<()> {
    let head = encode_head(msg, payload.len() as u64);
    let res = async {
        if payload.is_empty() || payload.len() > 64 << 10 {
            w.write_all(&head).await?;
            w.write_all(payload).await?;
        } else {
            // One write for small replies: avoids a second segment (and Nagle delays).
            let mut both = head;
            both.extend_from_slice(payload);
            w.write_all(&both).await?;
        }
        w.flush().await
    };
    res.await.map_err(|e| Error::io("writing a frame", e))
}
