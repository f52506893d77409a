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

use cairn_core::{Error, Result};

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

    /// Its bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether it has no bytes (never: segments have at least one).
    pub fn is_empty(&self) -> bool {
        self.len == 0
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

#[cfg(test)]
mod tests {
    use super::*;

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
