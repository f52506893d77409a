//! Shared-memory object memory for writers on this host (issue 19's same-node path). A writer
//! leases segments (`lease`): anonymous shared memory (`memfd`) this server creates, or reuses
//! from freed objects, and maps. The writer opens each through `/proc/<server pid>/fd/<fd>`
//! (allowed to the same user, as cross-memory attach is), copies its object into it while it
//! checksums it, and puts the object naming the lease: the server keeps the segment as the
//! object's memory, with no copy of its own. Recycled segments are already faulted in, so
//! steady-state steps copy at memcpy speed; cross-memory attach reached 0.3–0.5× memcpy
//! (`cma.rs`, measured by the `same_node_copy` example).
//!
//! What it costs: the writer keeps a writable mapping (it reuses it when the same segment is
//! leased to it again), so it could change an object after its put. Checksums stay end to end
//! (the writer computes them, every reader verifies), so such a change is detected, not served.
//! A writer that dies while it copies never puts: its connection's leases go back to the pool,
//! and nothing half-written is stored. One that hangs loses its connection, and so its leases,
//! after the connection's deadline: a connection holding leases is never idle.

use crate::cma::Peer;
use crate::state::State;
use cairn_core::{Error, Result};
use std::collections::HashMap;
use std::sync::Arc;

/// One shared-memory segment of exactly `len` bytes, mapped read-write here.
#[derive(Debug)]
pub struct Segment {
    fd: std::os::fd::OwnedFd,
    ptr: std::ptr::NonNull<u8>,
    len: usize,
    owner: u32,
}

// SAFETY: the mapping is plain shared memory owned by this value; access goes through `&[u8]`.
unsafe impl Send for Segment {}
// SAFETY: as above; this process only reads it through shared references.
unsafe impl Sync for Segment {}

impl Segment {
    /// A new segment of `len` (> 0) bytes for writers of user `owner`, its pages allocated up front.
    pub fn new(len: usize, owner: u32) -> Result<Segment> {
        use std::os::fd::FromRawFd;
        let fail = |what: &str| Error::Capacity(format!("cannot {what} a {len}-byte shared segment: {}", std::io::Error::last_os_error()));
        // SAFETY: memfd_create with a static NUL-terminated name.
        let raw = unsafe { libc::memfd_create(c"cairn-object".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
        if raw < 0 {
            return Err(fail("create"));
        }
        // SAFETY: `raw` is a new descriptor this value now owns.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(raw) };
        // SAFETY: ftruncate and mmap of the descriptor just created; the result is checked.
        let ptr = unsafe {
            // Sealed at its size: a writer holding it can change its bytes, never cut it short
            // under this server's mapping (which would fault here).
            if libc::ftruncate(raw, len as libc::off_t) != 0
                || libc::fcntl(raw, libc::F_ADD_SEALS, libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL) != 0
            {
                return Err(fail("size"));
            }
            libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED | libc::MAP_POPULATE, raw, 0)
        };
        if ptr == libc::MAP_FAILED {
            return Err(fail("map"));
        }
        Ok(Segment { fd, ptr: std::ptr::NonNull::new(ptr.cast()).expect("mmap succeeded"), len, owner })
    }

    /// The user whose writers lease it (a lessee may keep a mapping, so it never goes to another).
    pub fn owner(&self) -> u32 {
        self.owner
    }

    /// Its descriptor in this process (for the lease's holder to open).
    pub fn fd(&self) -> i32 {
        use std::os::fd::AsRawFd;
        self.fd.as_raw_fd()
    }

    /// Its bytes.
    pub fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr` maps `len` bytes for as long as `self` lives.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: unmaps the mapping made in `new`, which nothing borrows any more.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

/// An object's memory: a buffer of this server's, or a segment a writer on this host filled.
#[derive(Debug)]
pub enum Memory {
    /// Received over a socket, copied by cross-memory attach, or computed here.
    Heap(Vec<u8>),
    /// A leased segment.
    Shared(Segment),
}

impl std::ops::Deref for Memory {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match self {
            Memory::Heap(v) => v,
            Memory::Shared(s) => s.bytes(),
        }
    }
}

impl From<Vec<u8>> for Memory {
    fn from(v: Vec<u8>) -> Memory {
        Memory::Heap(v)
    }
}

impl From<Segment> for Memory {
    fn from(s: Segment) -> Memory {
        Memory::Shared(s)
    }
}

/// Objects under lease per connection at most, and so segments (and descriptors) a writer can
/// hold before it puts.
pub const MAX_LEASES: usize = 1024;

/// A connection's peer on this host (bound to the process that opened it, see [`Peer`]) and
/// the segments it leased. Leases it did not put are given back when the connection ends.
#[derive(Debug)]
pub struct Local {
    /// The client process, or why same-node copies are refused to it.
    peer: std::result::Result<Peer, String>,
    state: Arc<State>,
    next: u64,
    leases: HashMap<u64, Segment>,
}

impl Local {
    /// The peer of a Unix-socket connection to `state`'s server ([`Peer::bind`]'s result).
    pub fn new(state: Arc<State>, peer: std::result::Result<Peer, String>) -> Local {
        Local { peer, state, next: 1, leases: HashMap::new() }
    }

    /// The client process same-node copies go to and from.
    pub fn peer(&self) -> Result<&Peer> {
        self.peer.as_ref().map_err(|why| Error::InvalidArgument(why.clone()))
    }

    /// Gives back the leases `release` names, then leases a segment of each of `sizes` bytes
    /// (their space reserved): returns each one's lease id and descriptor.
    pub fn lease(&mut self, sizes: &[u64], release: &[u64]) -> Result<Vec<(u64, i32)>> {
        let owner = self.peer()?.uid();
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
        if seg.len as u64 != len {
            let n = seg.len;
            self.give_back(seg);
            return Err(Error::InvalidArgument(format!("lease {id} holds {n} bytes, the object {len}; lease its size")));
        }
        Ok(seg)
    }

    /// Frees a leased segment's reservation and pools it.
    pub fn give_back(&self, seg: Segment) {
        self.state.store.free(seg.len as u64);
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
        let state = State::new(0, "s".into(), path, 1 << 20, crate::Limits::default(), crate::control::MetaOptions::default());
        let mut local = Local::new(state.clone(), Ok(Peer::this_process()));
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

    #[test]
    fn a_segment_is_shared_memory_another_opening_sees() {
        let seg = Segment::new(8192, 0).unwrap();
        assert!(seg.bytes().iter().all(|b| *b == 0));
        // What a same-node writer does: open it through /proc, map it, write.
        let path = format!("/proc/{}/fd/{}", std::process::id(), seg.fd());
        let f = std::fs::OpenOptions::new().read(true).write(true).open(path).unwrap();
        use std::os::fd::AsRawFd;
        // SAFETY: maps the 8192 bytes of the file just opened, then unmaps them.
        unsafe {
            let p = libc::mmap(std::ptr::null_mut(), 8192, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, f.as_raw_fd(), 0);
            assert_ne!(p, libc::MAP_FAILED);
            std::ptr::write_bytes(p.cast::<u8>(), 7, 8192);
            libc::munmap(p, 8192);
        }
        assert!(seg.bytes().iter().all(|b| *b == 7));
    }
}
