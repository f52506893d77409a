//! One frame: a fixed 16-byte prefix, a JSON header and raw payload bytes.

use cairn_core::{Error, Result};
use serde::de::DeserializeOwned;
use serde::Serialize;

/// Bytes that open every frame: `CRN` and the protocol version (2: requests by audience,
/// typed error reasons; 3: no same-node probe or get into client memory, the welcome says
/// whether same-node puts work).
pub const MAGIC: [u8; 4] = *b"CRN3";
/// Length of the prefix.
pub const PREFIX_LEN: usize = 16;
/// Largest header accepted on an authenticated connection (a step index with many thousands of
/// blocks fits easily).
pub const MAX_HEADER: u32 = 64 << 20;
/// Largest header accepted before authentication: a `hello` is a few dozen bytes, so nobody
/// unauthenticated makes a server allocate more than this.
pub const MAX_HELLO: u32 = 4 << 10;

/// The decoded prefix of a frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Prefix {
    /// Header length in bytes.
    pub header_len: u32,
    /// Payload length in bytes.
    pub payload_len: u64,
}

impl Prefix {
    /// Parses and bounds a prefix: the header may be at most `max_header` bytes ([`MAX_HEADER`],
    /// or [`MAX_HELLO`] before authentication) and the payload at most `max_payload` (what the
    /// receiver is prepared to hold).
    pub fn parse(b: &[u8; PREFIX_LEN], max_header: u32, max_payload: u64) -> Result<Prefix> {
        if b[..3] == MAGIC[..3] && b[3] != MAGIC[3] {
            return Err(Error::Config(format!(
                "the peer speaks Cairn protocol version {}, this end version {}: run the same Cairn release on every \
                 client and server (restart the cluster with this one's `cairn cluster start`)",
                char::from(b[3]),
                char::from(MAGIC[3])
            )));
        }
        if b[..4] != MAGIC {
            return Err(Error::Corrupt(format!(
                "bad frame: expected magic {MAGIC:?}, got {:?}; the peer is not a Cairn {} endpoint",
                &b[..4],
                String::from_utf8_lossy(&MAGIC)
            )));
        }
        let header_len = u32::from_le_bytes(b[4..8].try_into().expect("4 bytes"));
        let payload_len = u64::from_le_bytes(b[8..16].try_into().expect("8 bytes"));
        if header_len == 0 || header_len > max_header {
            return Err(Error::Corrupt(format!("bad frame: header length {header_len} is outside 1 to {max_header}")));
        }
        if payload_len > max_payload {
            return Err(Error::InvalidArgument(format!(
                "frame payload of {payload_len} bytes exceeds the {max_payload} bytes accepted here"
            )));
        }
        Ok(Prefix { header_len, payload_len })
    }
}

/// Encodes prefix and header of a frame whose payload (written separately) has `payload_len` bytes.
pub fn encode_head<T: Serialize>(msg: &T, payload_len: u64) -> Vec<u8> {
    let mut out = vec![0u8; PREFIX_LEN];
    serde_json::to_writer(&mut out, msg).expect("messages always serialize");
    let header_len = (out.len() - PREFIX_LEN) as u32;
    out[..4].copy_from_slice(&MAGIC);
    out[4..8].copy_from_slice(&header_len.to_le_bytes());
    out[8..16].copy_from_slice(&payload_len.to_le_bytes());
    out
}

/// Decodes a header.
pub fn decode_header<T: DeserializeOwned>(bytes: &[u8]) -> Result<T> {
    serde_json::from_slice(bytes).map_err(|e| Error::Corrupt(format!("bad frame: header does not parse: {e}")))
}

/// Decodes a whole frame held in memory: the message, its payload, and the bytes consumed.
/// Incomplete input is an error naming what is missing.
pub fn decode<T: DeserializeOwned>(buf: &[u8], max_header: u32, max_payload: u64) -> Result<(T, &[u8], usize)> {
    let prefix: &[u8; PREFIX_LEN] = buf
        .get(..PREFIX_LEN)
        .and_then(|p| p.try_into().ok())
        .ok_or_else(|| Error::Corrupt(format!("bad frame: {} bytes, shorter than the {PREFIX_LEN}-byte prefix", buf.len())))?;
    let p = Prefix::parse(prefix, max_header, max_payload)?;
    let h_end = PREFIX_LEN + p.header_len as usize;
    let end =
        (h_end as u64).checked_add(p.payload_len).filter(|e| *e <= buf.len() as u64).ok_or_else(|| {
            Error::Corrupt(format!("bad frame: truncated ({} bytes, frame needs {} + {})", buf.len(), h_end, p.payload_len))
        })? as usize;
    let msg = decode_header(&buf[PREFIX_LEN..h_end])?;
    Ok((msg, &buf[h_end..end], end))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::message::Request;

    #[test]
    fn another_protocol_version_is_named_with_this_one() {
        let mut old = [0u8; PREFIX_LEN];
        old[..4].copy_from_slice(b"CRN2");
        let e = Prefix::parse(&old, MAX_HEADER, 0).unwrap_err();
        assert!(e.kind() == cairn_core::ErrorKind::Config && e.to_string().contains("protocol version 2, this end version 3"), "{e}");
    }

    #[test]
    fn round_trip_and_bounds() {
        let msg = Request::Steps { dataset: "d".into(), follower: false };
        let mut buf = encode_head(&msg, 3);
        buf.extend_from_slice(b"abc");
        let (back, payload, n): (Request, _, _) = decode(&buf, MAX_HEADER, 10).unwrap();
        assert!(decode::<Request>(&buf, (n - PREFIX_LEN - 4) as u32, 10).unwrap_err().to_string().contains("header length"));
        assert_eq!((back, payload, n), (msg, &b"abc"[..], buf.len()));
        assert!(decode::<Request>(&buf, MAX_HEADER, 2).unwrap_err().to_string().contains("exceeds"));
        assert!(decode::<Request>(&buf[..buf.len() - 1], MAX_HEADER, 10).unwrap_err().to_string().contains("truncated"));
        let mut bad = buf.clone();
        bad[0] = b'X';
        assert!(decode::<Request>(&bad, MAX_HEADER, 10).unwrap_err().to_string().contains("magic"));
        let mut huge = buf.clone();
        huge[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(decode::<Request>(&huge, MAX_HEADER, 10).is_err());
        let mut junk = buf;
        junk[PREFIX_LEN] = b'#';
        assert!(decode::<Request>(&junk, MAX_HEADER, 10).unwrap_err().to_string().contains("parse"));
    }
}

#[cfg(test)]
mod properties {
    use super::*;
    use crate::message::{Request, Response};
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]
        /// The stable-toolchain twin of the cargo-fuzz target: arbitrary bytes, and valid frames
        /// with arbitrary corruption, decode to a frame or an error and never panic.
        #[test]
        fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..256)) {
            let _ = decode::<crate::message::Envelope>(&bytes, MAX_HEADER, 1 << 20);
            let _ = decode::<Response>(&bytes, MAX_HEADER, 1 << 20);
        }

        #[test]
        fn corrupted_frames_never_panic(pos in 0usize..200, flip in any::<u8>(), cut in 0usize..200) {
            let msg = Request::Get { dataset: "d".into(), step: 3, id: 9, want: cairn_core::Region::new(vec![1, 2], vec![3, 4]).unwrap(), shard: 0, stripe: None, map: None };
            let mut buf = encode_head(&msg, 0);
            let n = buf.len();
            buf[pos % n] ^= flip;
            buf.truncate(cut.min(n));
            let _ = decode::<Request>(&buf, MAX_HEADER, 1 << 20);
        }
    }
}
