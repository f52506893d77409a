//! Same-node puts and gets through shared memory the server owns (cairn-server's
//! `segment.rs`).
//!
//! Puts: the writer opens each leased segment through `/proc/<server pid>/fd/<fd>`, copies its
//! object in while it checksums it and reduces its statistics (one pass: each 64 KiB is
//! checksummed while it is in the cache), and puts the object naming the lease. The server
//! keeps the segment as the object's memory: one copy in all, at memcpy speed once the server's
//! pool recycles segments (cross-memory attach, the fallback, copies at 0.3–0.5× memcpy here).
//! The writer keeps its mappings (bounded, [`Maps`]) for the next lease of the same segment.
//!
//! Gets: a whole copy held in a segment of this process's user is answered with the segment's
//! id, and the first time with a read-only descriptor of it passed over the Unix socket; the
//! reader keeps the mapping ([`ReadMaps`]) and copies the object out of it while it checksums
//! it against the committed crc32c: one copy, where the payload path made two (the server's
//! into the socket, this process's out of it). The server recycles the segment for the next
//! object of its size and user, so a stream's steps are read through the mappings of the first.
//! A segment the server gives up has its pages given back at once (a hole punched), so a
//! mapping kept here never holds memory the server no longer counts.

use cairn_core::{Error, Result};

/// A server's shared segment mapped in this process (writable for a writer's lease, read-only
/// for a reader, [`RoMapped`]), unmapped when dropped.
pub(crate) struct Mapped {
    ptr: std::ptr::NonNull<u8>,
    len: usize,
}

impl Mapped {
    /// Maps the segment of `len` bytes at `path` (`/proc/<server pid>/fd/<fd>`) writable.
    fn open(path: &str, len: usize) -> Result<Mapped> {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .map_err(|e| Error::io(format!("opening the shared segment {path} (same-node puts fall back to copies)"), e))?;
        Mapped::map(&file, len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_POPULATE)
            .map_err(|e| Error::io(format!("mapping the shared segment {path}"), e))
    }

    /// Maps `len` bytes of `file` shared, with `prot` and the further `flags` (on a huge-page
    /// boundary: the server makes segments of huge pages where it can, see `cairn_proto::shm`).
    fn map(file: &std::fs::File, len: usize, prot: libc::c_int, flags: libc::c_int) -> std::io::Result<Mapped> {
        use std::os::fd::AsRawFd;
        // The file's size was checked by the caller; the server sealed it against shrinking.
        let ptr = cairn_proto::shm::map(file.as_raw_fd(), len, prot, flags)?;
        Ok(Mapped { ptr, len })
    }

    /// Its bytes as they are now.
    fn bytes(&self) -> &[u8] {
        // SAFETY: `ptr` maps `len` readable bytes for as long as `self` lives.
        unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) }
    }

    /// Its bytes, to fill (a writable mapping's). (A helper thread filling the page tables of a
    /// fresh mapping while the writer copies, as readers do, measured no better: the first-steps
    /// bench's cold puts went from 0.35–0.64× memcpy to 0.25–0.45× over two runs, the helper
    /// competing with the writers and servers for this VM's 2 cores.)
    pub(crate) fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: `ptr` maps `len` writable bytes for as long as `self` lives.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) }
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: unmaps the mapping made in `map`, which nothing borrows any more.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

// SAFETY: the mapping is owned by the value and only reached through it.
unsafe impl Send for Mapped {}

/// Mappings kept per connection at most, and bytes they map at most: a server's pool hands
/// the same segments out step after step, and mapping one (its page tables filled, then torn
/// down with a TLB flush) costs a tenth of copying into it. Page tables and address space are
/// what a kept mapping costs here, so both are bounded.
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

/// Segments a reader keeps mapped per connection at most, and bytes they map at most; past
/// them the least recently read go (reported to the server with the next get).
const MAX_READ_MAPS: usize = 256;
const MAX_READ_MAPPED: usize = 4 << 30;

/// Segments a reader maps of at least this many bytes are mapped without their page tables,
/// which a helper thread fills ahead of the first copy out of them (see [`RoMapped::read`]);
/// smaller ones are mapped populated.
const HELPED: usize = 4 << 20;

/// A server's segment mapped read-only here.
pub(crate) struct RoMapped {
    map: Mapped,
    /// Mapped but its page tables not filled yet (see [`RoMapped::read`]).
    fresh: bool,
}

impl RoMapped {
    /// Maps `len` bytes of the read-only descriptor `fd` the server passed (its size checked).
    /// A hole the server punches in it reads as zeros (caught by the checksum): reads never fault.
    fn open(fd: std::os::fd::OwnedFd, len: usize) -> Result<RoMapped> {
        let file = std::fs::File::from(fd);
        let size = file.metadata().map_err(|e| Error::io("looking up a shared segment passed for a get", e))?.len();
        if size != len as u64 || len == 0 {
            return Err(Error::Corrupt(format!("a shared segment passed for a get holds {size} bytes, not {len}")));
        }
        let fresh = len >= HELPED;
        let map = Mapped::map(&file, len, libc::PROT_READ, if fresh { 0 } else { libc::MAP_POPULATE })
            .map_err(|e| Error::io("mapping a shared segment for a get", e))?;
        Ok(RoMapped { map, fresh })
    }

    /// Its bytes' length.
    pub(crate) fn len(&self) -> usize {
        self.map.len
    }

    /// Runs `f` on its bytes as they are now (a writer of the same user may still change them:
    /// check them against the committed crc32c as they are copied). The first time for a large
    /// segment, a helper thread fills the page tables (`MADV_POPULATE_READ`, a piece at a time
    /// from the start) while `f` copies behind it: a first 128 MiB get took 28.3 ms mapped
    /// populated, 16.4 ms so (a warm one 12.3 ms). Where the kernel lacks it, the copy faults
    /// pages in.
    pub(crate) fn read<T>(&mut self, f: impl FnOnce(&[u8]) -> T) -> T {
        let bytes = self.map.bytes();
        if !std::mem::take(&mut self.fresh) {
            return f(bytes);
        }
        let (addr, len) = (bytes.as_ptr() as usize, bytes.len());
        std::thread::scope(|s| {
            s.spawn(move || populate(addr, len));
            f(bytes)
        })
    }
}

/// Fills the page tables of `len` mapped bytes at `addr` for reading, a piece at a time from
/// the start; stops quietly where the kernel lacks `MADV_POPULATE_READ`.
fn populate(addr: usize, len: usize) {
    const PIECE: usize = 1 << 20;
    for at in (0..len).step_by(PIECE) {
        // SAFETY: advice over pages of a mapping the caller keeps alive meanwhile; it changes no byte.
        if unsafe { libc::madvise((addr + at) as *mut libc::c_void, PIECE.min(len - at), libc::MADV_POPULATE_READ) } != 0 {
            break;
        }
    }
}

/// The read-only mappings of one server's segments a reader's connection keeps, by segment id,
/// and the ids it unmapped and has not told the server of yet.
#[derive(Default)]
pub(crate) struct ReadMaps {
    kept: std::collections::HashMap<u64, (RoMapped, u64)>,
    tick: u64,
    unmapped: Vec<u64>,
}

impl std::fmt::Debug for ReadMaps {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadMaps").field("kept", &self.kept.len()).field("unmapped", &self.unmapped.len()).finish()
    }
}

impl ReadMaps {
    /// Maps segment `id` from descriptor `fd` (replacing a mapping of the same id).
    pub(crate) fn insert(&mut self, id: u64, fd: std::os::fd::OwnedFd, len: usize) -> Result<()> {
        let map = RoMapped::open(fd, len)?;
        self.tick += 1;
        self.kept.insert(id, (map, self.tick));
        Ok(())
    }

    /// The mapping of segment `id`, if kept.
    pub(crate) fn get(&mut self, id: u64) -> Option<&mut RoMapped> {
        self.tick += 1;
        let tick = self.tick;
        self.kept.get_mut(&id).map(|(m, used)| {
            *used = tick;
            m
        })
    }

    /// Forgets segment `id` (its mapping was wrong or is gone): the server hands it again.
    pub(crate) fn forget(&mut self, id: u64) {
        self.kept.remove(&id);
        self.unmapped.push(id);
    }

    /// Unmaps the least recently read past the bounds. Called before a batch of gets is sent,
    /// never within one: a reply may name any segment the server knew mapped when it was sent.
    pub(crate) fn trim(&mut self) {
        let mapped = |k: &std::collections::HashMap<u64, (RoMapped, u64)>| k.values().map(|(m, _)| m.len()).sum::<usize>();
        while self.kept.len() > MAX_READ_MAPS || (self.kept.len() > 1 && mapped(&self.kept) > MAX_READ_MAPPED) {
            let oldest = *self.kept.iter().min_by_key(|(_, (_, used))| *used).expect("not empty").0;
            self.forget(oldest);
        }
    }

    /// The ids to report unmapped with the next get (at most what one get carries).
    pub(crate) fn take_unmapped(&mut self) -> Vec<u64> {
        let n = self.unmapped.len().min(cairn_proto::message::MAX_UNMAPPED);
        self.unmapped.drain(..n).collect()
    }
}

/// Copies `src` into `parts` (which it fills exactly, in order) a cache-sized piece at a time,
/// returning the crc32c of what it copied, computed on each piece while it is in the cache
/// ([`cairn_core::checksum::crc_copy`]).
pub(crate) fn copy_crc(src: &[u8], parts: &mut [&mut [u8]]) -> u32 {
    const PIECE: usize = 64 << 10;
    let (mut crc, mut at) = (0u32, 0usize);
    for part in parts.iter_mut() {
        for piece in part.chunks_mut(PIECE) {
            crc = cairn_core::checksum::crc_copy(crc, &src[at..at + piece.len()], piece);
            at += piece.len();
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_copy_into_parts_checksums_what_it_copied() {
        let src: Vec<u8> = (0..300_000u32).map(|i| (i * 7) as u8).collect();
        let mut out = vec![0u8; src.len()];
        let (a, rest) = out.split_at_mut(100_001);
        let (b, c) = rest.split_at_mut(3);
        let crc = copy_crc(&src, &mut [a, b, c]);
        assert_eq!(out, src);
        assert_eq!(crc, cairn_core::checksum::crc(&src));
    }

    #[test]
    fn read_mappings_past_the_bounds_go_least_recent_first_and_are_reported() {
        let mut maps = ReadMaps::default();
        for id in 0..(MAX_READ_MAPS as u64 + 2) {
            let f = tempfile::tempfile().unwrap();
            f.set_len(4096).unwrap();
            maps.insert(id, f.into(), 4096).unwrap();
        }
        assert!(maps.get(0).is_some(), "0 read again: 1 and 2 are now the oldest");
        maps.trim();
        assert_eq!(maps.kept.len(), MAX_READ_MAPS);
        assert_eq!(maps.take_unmapped(), vec![1, 2]);
        assert!(maps.get(0).is_some() && maps.get(1).is_none());
        // A descriptor whose size is not the one named is refused.
        let f = tempfile::tempfile().unwrap();
        f.set_len(100).unwrap();
        assert!(maps.insert(99, f.into(), 4096).is_err());
    }
}
