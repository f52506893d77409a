//! A same-node client's connection: the process at the other end of the Unix socket (bound to
//! it at accept, see [`Peer`]) and the shared-memory segments it leased (see [`crate::segment`]).

use crate::cma::Peer;
use crate::segment::{Memory, Segment};
use crate::state::State;
use cairn_core::{Error, Result};
use std::collections::{HashMap, HashSet};
use std::sync::Arc;

/// Objects under lease per connection at most, and so segments (and descriptors) a writer can
/// hold before it puts.
pub const MAX_LEASES: usize = 1024;

/// Segments whose descriptors a connection holds at most (a reader's mappings, see
/// [`Local::mapping`]); past it, gets of objects in other segments answer with their bytes.
pub const MAX_SHOWN: usize = 1024;

/// A connection's peer on this host (bound to the process that opened it, see [`Peer`]) and
/// the segments it leased. Leases it did not put are given back when the connection ends.
#[derive(Debug)]
pub struct Local {
    /// The client process, or why same-node copies are refused to it.
    peer: std::result::Result<Peer, String>,
    state: Arc<State>,
    next: u64,
    leases: HashMap<u64, Segment>,
    /// The connection's socket (a duplicate), to pass descriptors over; none in unit tests.
    sock: Option<tokio::io::unix::AsyncFd<std::os::fd::OwnedFd>>,
    /// Segments whose read-only descriptor the reader was handed and has not reported unmapped.
    shown: HashSet<u64>,
}

impl Local {
    /// The peer of a Unix-socket connection to `state`'s server ([`Peer::bind`]'s result);
    /// `sock` the connection's socket (duplicated), over which descriptors are passed.
    pub fn new(state: Arc<State>, peer: std::result::Result<Peer, String>, sock: Option<std::os::fd::OwnedFd>) -> Local {
        // Registered for writing only: reads stay with the connection's own stream. Its
        // duplicate is already non-blocking (a file status flag, shared with the original).
        // SAFETY: the descriptor is owned by the AsyncFd and neither replaced nor closed while
        // registered.
        let sock = sock.and_then(|s| unsafe { tokio::io::unix::AsyncFd::register_with_interest(s, tokio::io::Interest::WRITABLE) }.ok());
        Local { peer, state, next: 1, leases: HashMap::new(), sock, shown: HashSet::new() }
    }

    /// How a same-node reader reads an object held in `seg`: `Some(None)` from its mapping of
    /// the segment, `Some(Some(fd))` from a mapping of the read-only descriptor `fd` it is to be
    /// handed now, `None` from a payload: the segment belongs to another user (a lessee of it may
    /// write into it; a reader of another user is never handed one), or the reader holds too
    /// many.
    pub fn mapping(&mut self, seg: &Segment) -> Result<Option<Option<std::os::fd::OwnedFd>>> {
        if self.sock.is_none() || self.peer()?.uid() != seg.owner() {
            return Ok(None);
        }
        if self.shown.contains(&seg.id()) {
            return Ok(Some(None));
        }
        if self.shown.len() >= MAX_SHOWN {
            return Ok(None);
        }
        let fd = seg.read_only()?;
        self.shown.insert(seg.id());
        Ok(Some(Some(fd)))
    }

    /// Forgets the segments the reader reports unmapped: it is handed them again when next read.
    pub fn unmapped(&mut self, ids: &[u64]) {
        for id in ids {
            self.shown.remove(id);
        }
    }

    /// Sends one byte carrying descriptor `fd` to the reader (after a reply's head announcing
    /// it), waiting for room in the socket's buffer at most `timeout`.
    pub async fn send_fd(&self, fd: &std::os::fd::OwnedFd, timeout: std::time::Duration) -> Result<()> {
        let sock = self.sock.as_ref().ok_or_else(crate::cma::not_local)?;
        let send = async {
            loop {
                let mut ready = sock.writable().await?;
                match ready.try_io(|s| cairn_proto::unix::send_fd(s, 0, fd)) {
                    Ok(r) => return r,
                    Err(_would_block) => continue,
                }
            }
        };
        match tokio::time::timeout(timeout, send).await {
            Ok(r) => r.map_err(|e| Error::io("passing a segment's descriptor", e)),
            Err(_) => Err(Error::io("passing a segment's descriptor", std::io::ErrorKind::TimedOut.into())),
        }
    }

    /// The client process same-node copies go to and from.
    pub fn peer(&self) -> Result<&Peer> {
        self.peer.as_ref().map_err(|why| Error::InvalidArgument(why.clone()))
    }

    /// Gives back the leases `release` names, then leases a segment of each of `sizes` bytes
    /// (their space reserved): returns each one's lease id and descriptor.
    pub fn lease(&mut self, sizes: &[u64], release: &[u64]) -> Result<Vec<(u64, i32)>> {
        let (owner, pid) = (self.peer()?.uid(), self.peer()?.pid());
        for id in release {
            if let Some(seg) = self.leases.remove(id) {
                self.give_back(seg);
            }
        }
        if self.leases.len() + sizes.len() > MAX_LEASES {
            return Err(Error::Capacity(format!(
                "{} segments are leased on this connection and {} more were asked for; at most {MAX_LEASES}: put or release some first",
                self.leases.len(),
                sizes.len()
            )));
        }
        let mut out = Vec::with_capacity(sizes.len());
        for &len in sizes {
            let leased = self.state.store.reserve_segment(len as usize, owner).map(|(r, seg)| {
                r.keep();
                seg
            });
            match leased {
                Ok(seg) => {
                    seg.lend(pid, owner);
                    let id = self.next;
                    self.next += 1;
                    out.push((id, seg.fd()));
                    self.leases.insert(id, seg);
                }
                Err(e) => {
                    // None of this request's leases, so the client falls back as a whole.
                    for (id, _) in out {
                        let seg = self.leases.remove(&id).expect("leased above");
                        self.give_back(seg);
                    }
                    return Err(e);
                }
            }
        }
        Ok(out)
    }

    /// Whether it holds leases it has not put yet.
    pub fn holds_leases(&self) -> bool {
        !self.leases.is_empty()
    }

    /// Takes lease `id` for a put of `len` bytes: the segment, whose space stays reserved.
    pub fn take(&mut self, id: u64, len: u64) -> Result<Segment> {
        let seg = self.leases.remove(&id).ok_or_else(|| {
            Error::InvalidArgument(format!("no segment is leased as {id} on this connection (put once per lease); lease again"))
        })?;
        if seg.len() as u64 != len {
            let n = seg.len();
            self.give_back(seg);
            return Err(Error::InvalidArgument(format!("lease {id} holds {n} bytes, the object {len}; lease its size")));
        }
        Ok(seg)
    }

    /// Frees a leased segment's reservation and pools it.
    pub fn give_back(&self, seg: Segment) {
        self.state.store.free(seg.len() as u64);
        self.state.store.recycle_memory(Memory::Shared(seg));
    }
}

impl Drop for Local {
    fn drop(&mut self) {
        for (_, seg) in std::mem::take(&mut self.leases) {
            self.give_back(seg);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn leases_hold_their_space_until_put_or_given_back_and_their_segments_are_reused() {
        use cairn_core::ErrorKind;
        let path = std::path::PathBuf::from("/nonexistent/cluster.json");
        let state = State::new(0, "s".into(), path, 1 << 20, crate::Limits::default());
        let mut local = Local::new(state.clone(), Ok(Peer::this_process()), None);
        let got = local.lease(&[256 << 10, 256 << 10], &[]).unwrap();
        assert_eq!(state.store.used(), 512 << 10);
        // More than the memory left: refused whole, nothing kept.
        assert_eq!(local.lease(&[128 << 10, 600 << 10], &[]).unwrap_err().kind(), ErrorKind::Capacity);
        assert_eq!(state.store.used(), 512 << 10);
        // A put of another size than its lease is refused, and the lease goes back.
        assert_eq!(local.take(got[0].0, 100).unwrap_err().kind(), ErrorKind::InvalidArgument);
        assert_eq!(local.take(got[0].0, 256 << 10).unwrap_err().kind(), ErrorKind::InvalidArgument, "taken once only");
        assert_eq!(state.store.used(), 256 << 10);
        local.lease(&[], &[got[1].0]).unwrap();
        assert_eq!(state.store.used(), 0);
        // Leased again, a pooled segment comes back (already faulted in), its descriptor with it.
        let again = local.lease(&[256 << 10], &[]).unwrap();
        assert!([got[0].1, got[1].1].contains(&again[0].1));
        // A connection that ends gives back what it did not put.
        drop(local);
        assert_eq!(state.store.used(), 0);
    }
}
