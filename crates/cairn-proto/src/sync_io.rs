//! Blocking frame I/O for clients: the payload is written from and read into caller buffers,
//! gathered/scattered in place when the bytes are not contiguous.

use crate::frame::{decode_header, encode_head, Prefix, MAX_HEADER, PREFIX_LEN};
use cairn_core::{Error, Result};
use serde::de::DeserializeOwned;
use serde::Serialize;
use std::io::{IoSlice, IoSliceMut, Read, Write};

// I/O failures stay `Error::Io` (timeouts keep their kind): the connection layer above knows the
// server, its address and the operation, and turns them into one `Unavailable` naming all three.
fn io(what: &str) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |e| Error::io(what, e)
}

/// A blocking byte stream to one server: TCP, or its Unix socket on the same host (where the
/// server knows the client's pid, so same-node requests are served).
#[derive(Debug)]
pub enum Stream {
    /// Over TCP.
    Tcp(std::net::TcpStream),
    /// Over the server's Unix socket (read so that descriptors passed with replies are kept).
    Unix(crate::unix::UnixConn),
}

impl Stream {
    /// A second descriptor of the socket, for another thread to shut it down with (waking a call
    /// blocked on it: a put to a server the control plane declared down is abandoned then).
    pub fn shutdown_handle(&self) -> std::io::Result<std::os::fd::OwnedFd> {
        use std::os::fd::AsFd;
        match self {
            Stream::Tcp(s) => s.as_fd().try_clone_to_owned(),
            Stream::Unix(s) => s.sock.as_fd().try_clone_to_owned(),
        }
    }

    /// Sets both the read and the write deadline to `t`.
    pub fn set_timeouts(&self, t: std::time::Duration) -> std::io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_read_timeout(Some(t)).and_then(|()| s.set_write_timeout(Some(t))),
            Stream::Unix(s) => s.sock.set_read_timeout(Some(t)).and_then(|()| s.sock.set_write_timeout(Some(t))),
        }
    }
}

impl Read for Stream {
    fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(b),
            Stream::Unix(s) => s.read(b),
        }
    }
    fn read_vectored(&mut self, b: &mut [IoSliceMut<'_>]) -> std::io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read_vectored(b),
            Stream::Unix(s) => s.read_vectored(b),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(b),
            Stream::Unix(s) => s.write(b),
        }
    }
    fn write_vectored(&mut self, b: &[IoSlice<'_>]) -> std::io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write_vectored(b),
            Stream::Unix(s) => s.write_vectored(b),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Writes a frame whose payload is the concatenation of `payload`.
pub fn write_frame<T: Serialize>(w: &mut impl Write, msg: &T, payload: &[&[u8]]) -> Result<()> {
    let len: u64 = payload.iter().map(|p| p.len() as u64).sum();
    let head = encode_head(msg, len);
    let mut slices: Vec<IoSlice<'_>> = Vec::with_capacity(payload.len() + 1);
    slices.push(IoSlice::new(&head));
    slices.extend(payload.iter().filter(|p| !p.is_empty()).map(|p| IoSlice::new(p)));
    write_all_vectored(w, &mut slices).map_err(io("sending a request"))
}

/// `write_all` over many slices, at most 1024 (IOV_MAX) per system call.
fn write_all_vectored(w: &mut impl Write, mut slices: &mut [IoSlice<'_>]) -> std::io::Result<()> {
    while !slices.is_empty() {
        let n = slices.len().min(1024);
        match w.write_vectored(&slices[..n]) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(k) => IoSlice::advance_slices(&mut slices, k),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    w.flush()
}

/// Reads a frame's prefix and header; the caller then reads exactly `payload_len` bytes.
pub fn read_head<T: DeserializeOwned>(r: &mut impl Read, max_payload: u64) -> Result<(T, u64)> {
    let mut prefix = [0u8; PREFIX_LEN];
    r.read_exact(&mut prefix).map_err(io("reading a reply"))?;
    let p = Prefix::parse(&prefix, MAX_HEADER, max_payload)?;
    let mut header = vec![0u8; p.header_len as usize];
    r.read_exact(&mut header).map_err(io("reading a reply"))?;
    Ok((decode_header(&header)?, p.payload_len))
}

/// Reads a payload scattered into `parts` (whose lengths sum to the payload length).
pub fn read_payload(r: &mut impl Read, parts: &mut [&mut [u8]]) -> Result<()> {
    read_scattered(r, parts, |_| {})
}

/// [`read_payload`] that also returns the crc32c of what it read, computed on each piece as it
/// arrives, while it is still in cache: checking the whole payload afterwards read it from memory
/// once more.
pub fn read_payload_crc(r: &mut impl Read, parts: &mut [&mut [u8]]) -> Result<u32> {
    let mut crc = 0u32;
    read_scattered(r, parts, |piece| crc = cairn_core::checksum::crc_append(crc, piece))?;
    Ok(crc)
}

/// Reads into `parts` until they are full, handing `seen` each piece of them as it is read.
fn read_scattered(r: &mut impl Read, parts: &mut [&mut [u8]], mut seen: impl FnMut(&[u8])) -> Result<()> {
    let mut slices: Vec<IoSliceMut<'_>> = parts.iter_mut().filter(|p| !p.is_empty()).map(|p| IoSliceMut::new(p)).collect();
    let mut slices = &mut slices[..];
    while !slices.is_empty() {
        let n = slices.len().min(1024);
        match r.read_vectored(&mut slices[..n]) {
            Ok(0) => return Err(Error::io("reading a reply", std::io::ErrorKind::UnexpectedEof.into())),
            Ok(k) => {
                // The `k` bytes just read fill the first slices, in order.
                let mut left = k;
                for s in slices.iter() {
                    if left == 0 {
                        break;
                    }
                    let m = left.min(s.len());
                    seen(&s[..m]);
                    left -= m;
                }
                IoSliceMut::advance_slices(&mut slices, k)
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(io("reading a reply")(e)),
        }
    }
    Ok(())
}

/// Reads and discards `len` payload bytes.
pub fn skip_payload(r: &mut impl Read, len: u64) -> Result<()> {
    std::io::copy(&mut r.take(len), &mut std::io::sink()).map_err(io("reading a reply"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A reader that hands out at most `step` bytes a call, as a socket does.
    struct Trickle<'a>(&'a [u8], usize);

    impl Read for Trickle<'_> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = buf.len().min(self.1).min(self.0.len());
            buf[..n].copy_from_slice(&self.0[..n]);
            self.0 = &self.0[n..];
            Ok(n)
        }
    }

    proptest! {
        #[test]
        fn the_crc_computed_while_reading_is_the_payloads(
            data in proptest::collection::vec(any::<u8>(), 1..20_000),
            cuts in proptest::collection::vec(0usize..20_000, 0..6),
            step in 1usize..5000,
        ) {
            let mut at: Vec<usize> = cuts.into_iter().map(|c| c % data.len()).collect();
            at.push(0);
            at.push(data.len());
            at.sort_unstable();
            let mut out = vec![0u8; data.len()];
            let mut parts: Vec<&mut [u8]> = Vec::new();
            let mut rest = &mut out[..];
            for w in at.windows(2) {
                let (head, tail) = rest.split_at_mut(w[1] - w[0]);
                parts.push(head);
                rest = tail;
            }
            let crc = read_payload_crc(&mut Trickle(&data, step), &mut parts).unwrap();
            prop_assert_eq!(crc, cairn_core::checksum::crc(&data));
            prop_assert_eq!(out, data);
        }
    }
}
