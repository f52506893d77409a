//! Same-node puts into shared memory the server leases (cairn-server's `segment.rs`): the
//! writer opens each leased segment through `/proc/<server pid>/fd/<fd>`, copies its object in
//! while it checksums it and reduces its statistics (one pass: each 64 KiB is checksummed while
//! it is in the cache), and puts the object naming the lease. The server keeps the segment as
//! the object's memory: one copy in all, at memcpy speed once the server's pool recycles
//! segments (cross-memory attach, the fallback, copies at 0.3–0.5× memcpy here). The writer
//! keeps its mappings (bounded, [`Maps`]) for the next lease of the same segment.
//!
//! Gets stay with cross-memory attach. Measured (`python -m cairn.bench staging`, 256 MiB
//! steps of 16 MiB objects, one reader): a reader mapping each object's segment read-only and
//! copying out of it got 5.4–5.7 GB/s, the server's copy into the reader's array 6.5 GB/s. Each
//! step is read once, so every get paid for a fresh mapping (page tables filled, then torn
//! down), which a put avoids by reusing the mapping of a recycled segment.

use cairn_core::{Error, Result};

/// A server's shared segment mapped writable in this process, unmapped when dropped.
pub(crate) struct Mapped {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

impl Mapped {
    /// Maps the segment of `len` bytes at `path` (`/proc/<server pid>/fd/<fd>`).
    fn open(path: &str, len: usize) -> Result<Mapped> {
        use std::os::fd::AsRawFd;
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| Error::io(format!("opening the shared segment {path} (same-node puts fall back to copies)"), e))?;
        let prot = libc::PROT_READ | libc::PROT_WRITE;
        // SAFETY: maps `len` bytes of the file just opened (its size checked by the caller; the
        // server sealed it against shrinking); the mapping outlives the descriptor.
        let ptr = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, libc::MAP_SHARED | libc::MAP_POPULATE, file.as_raw_fd(), 0) };
        if ptr == libc::MAP_FAILED {
            return Err(Error::io(format!("mapping the shared segment {path}"), std::io::Error::last_os_error()));
        }
        Ok(Mapped { ptr: std::ptr::NonNull::new(ptr.cast()).expect("mmap succeeded"), len })
    }

    /// Its bytes, to fill.
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` maps `len` writable bytes for as long as `self` lives.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: unmaps the mapping made in `open`, which nothing borrows any more.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

// SAFETY: the mapping is owned by the value and only reached through it.
unsafe impl Send for Mapped {}

/// Mappings kept per connection at most, and bytes they map at most: a server's pool hands
/// the same segments out step after step, and mapping one (its page tables filled, then torn
/// down with a TLB flush) costs a tenth of copying into it. A kept mapping keeps its segment's
/// memory alive after the server frees it, so both are bounded.
const MAX_MAPS: usize = 64;
const MAX_MAPPED: usize = 1 << 30;

/// The mappings of one server's segments this connection keeps, newest last.
#[derive(Default)]
pub(crate) struct Maps {
    kept: Vec<Kept>,
}

struct Kept {
    fd: i32,
    ino: u64,
    map: Mapped,
}

impl std::fmt::Debug for Maps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Maps").field("kept", &self.kept.len()).finish()
    }
}

impl Maps {
    /// Segment `fd` of the server `pid`, of `len` bytes, mapped here: the mapping kept from
    /// before if it maps the same segment (its inode, which stays unique while the mapping
    /// holds it), else a new one.
    pub(crate) fn get(&mut self, pid: u32, fd: i32, len: usize) -> Result<&mut Mapped> {
        use std::os::unix::fs::MetadataExt;
        let path = format!("/proc/{pid}/fd/{fd}");
        let meta = std::fs::metadata(&path)
            .map_err(|e| Error::io(format!("looking up the shared segment {path} (same-node puts fall back to copies)"), e))?;
        if meta.len() != len as u64 {
            return Err(Error::Corrupt(format!("the shared segment {path} holds {} bytes, not {len}", meta.len())));
        }
        let at = match self.kept.iter().position(|k| k.fd == fd && k.ino == meta.ino()) {
            Some(i) => {
                let k = self.kept.remove(i);
                self.kept.push(k);
                self.kept.len() - 1
            }
            None => {
                self.kept.retain(|k| k.fd != fd);
                let map = Mapped::open(&path, len)?;
                self.kept.push(Kept { fd, ino: meta.ino(), map });
                while self.kept.len() > MAX_MAPS || (self.kept.len() > 1 && self.kept.iter().map(|k| k.map.len).sum::<usize>() > MAX_MAPPED)
                {
                    self.kept.remove(0);
                }
                self.kept.len() - 1
            }
        };
        Ok(&mut self.kept[at].map)
    }
}
