//! Shared-memory object memory for writers on this host (issue 19's same-node path). A writer
//! leases segments (`lease`): anonymous shared memory (`memfd`) this server creates, or reuses
//! from freed objects, and maps. The writer opens each through `/proc/<server pid>/fd/<fd>`
//! (allowed to the same user, as cross-memory attach is), copies its object into it while it
//! checksums it, and puts the object naming the lease: the server keeps the segment as the
//! object's memory, with no copy of its own. Recycled segments are already faulted in, so
//! steady-state steps copy at memcpy speed; cross-memory attach reached 0.3–0.5× memcpy
//! (`cma.rs`, measured by the `same_node_copy` example).
//!
//! Same-node readers of the segment's user read a whole copy out of a read-only mapping of the
//! segment (issue 55): its descriptor, reopened read-only, is passed over the Unix socket once
//! per connection ([`crate::local::Local::mapping`]), and the reader keeps the mapping while the
//! pool hands the segment to the next object of its size.
//!
//! What it costs: the writer keeps a writable mapping (it reuses it when the same segment is
//! leased to it again), so it could change an object after its put. So no byte of a segment
//! leaves the server unchecked against the object's crc32c (`objects::intact`: payload gets,
//! recovery pieces, encoding; the drain checks all it gathers), and a mapped reader checks what
//! it copies: such a change is detected, never served. The check costs a crc32c pass (~50 GB/s
//! here) where bytes leave, instead of one after every put on the writer's critical path.
//! A dropped segment's pages are given back at once ([`Drop`]): mappings others keep of it do
//! not hold memory the server no longer counts.
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
    id: u64,
}

/// Ids of segments: unique in this process's lifetime, so a reader's mapping named by one is
/// never taken for another segment's.
static NEXT_ID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);

// SAFETY: the mapping is plain shared memory owned by this value; access goes through `&[u8]`.
unsafe impl Send for Segment {}
// SAFETY: as above; this process only reads it through shared references.
unsafe impl Sync for Segment {}

impl Segment {
    /// A new segment of `len` (> 0) bytes for writers of user `owner`, its pages allocated up front.
    pub fn new(len: usize, owner: u32) -> Result<Segment> {
        Segment::fresh(len)?.claim(len, owner)
    }

    /// A segment of `len` (> 0) bytes, its pages allocated and zeroed now (what costs a fault per
    /// page, done ahead by the prefaulter), not yet anyone's: [`Segment::claim`] cuts it to the
    /// size a lease needs and seals it.
    pub fn fresh(len: usize) -> Result<Segment> {
        use std::os::fd::FromRawFd;
        let fail = |what: &str| Error::Capacity(format!("cannot {what} a {len}-byte shared segment: {}", std::io::Error::last_os_error()));
        // SAFETY: memfd_create with a static NUL-terminated name.
        let raw = unsafe { libc::memfd_create(c"cairn-object".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
        if raw < 0 {
            return Err(fail("create"));
        }
        // SAFETY: `raw` is a new descriptor this value now owns.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(raw) };
        // SAFETY: ftruncate, fallocate and mmap of the descriptor just created; results checked.
        let ptr = unsafe {
            if libc::ftruncate(raw, len as libc::off_t) != 0 {
                return Err(fail("size"));
            }
            // The file's pages are allocated (and zeroed) first, under the file's own lock, so
            // the populating mmap below (which holds this process's mmap lock, as every other
            // thread's mmap and munmap wait for it) only maps them. The server reads the object
            // after the writer's put (its checksum): unmapped pages then cost it a fault each
            // (measured: a cold 128 MiB step in 65 ms instead of 29). Shared memory that cannot
            // be allocated fails here, not later with SIGBUS.
            // Any failure but "not supported" (then the populating mmap allocates) is one: ENOMEM
            // under a memory cgroup must not become a SIGBUS or an OOM kill later.
            loop {
                if libc::fallocate(raw, 0, 0, len as libc::off_t) == 0 {
                    break;
                }
                match std::io::Error::last_os_error().raw_os_error() {
                    Some(libc::EINTR) => continue,
                    Some(libc::EOPNOTSUPP | libc::ENOSYS) => break,
                    _ => return Err(fail("allocate")),
                }
            }
            libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED | libc::MAP_POPULATE, raw, 0)
        };
        if ptr == libc::MAP_FAILED {
            return Err(fail("map"));
        }
        let id = NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(Segment { fd, ptr: std::ptr::NonNull::new(ptr.cast()).expect("mmap succeeded"), len, owner: u32::MAX, id })
    }

    /// This fresh segment cut to `len` (at most its size; the pages past it go back to the
    /// system) and sealed at that size for writers of user `owner`: a writer holding it can change
    /// its bytes, never cut it short under this server's mapping (which would fault here).
    pub fn claim(mut self, len: usize, owner: u32) -> Result<Segment> {
        use std::os::fd::AsRawFd;
        debug_assert!(len > 0 && len <= self.len);
        let raw = self.fd.as_raw_fd();
        let fail = |what: &str| Error::Capacity(format!("cannot {what} a {len}-byte shared segment: {}", std::io::Error::last_os_error()));
        if len < self.len {
            let page = page_size();
            let keep = len.div_ceil(page) * page;
            // SAFETY: shrinks the file this value owns, after unmapping the pages past the new
            // end here (touching them would fault); the mapping's start stays.
            unsafe {
                if keep < self.len {
                    libc::munmap(self.ptr.as_ptr().add(keep).cast(), self.len - keep);
                }
                self.len = len;
                if libc::ftruncate(raw, len as libc::off_t) != 0 {
                    return Err(fail("cut"));
                }
            }
        }
        // SAFETY: fcntl on the descriptor this value owns.
        if unsafe { libc::fcntl(raw, libc::F_ADD_SEALS, libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL) } != 0 {
            return Err(fail("seal"));
        }
        self.owner = owner;
        Ok(self)
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

    /// Its id (unique in this process's lifetime).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// A new descriptor of it that can only read (a reopen through `/proc/self/fd` with
    /// `O_RDONLY`): a mapping made from it cannot write, for a same-node reader to be handed.
    pub fn read_only(&self) -> Result<std::os::fd::OwnedFd> {
        let path = format!("/proc/self/fd/{}", self.fd());
        std::fs::OpenOptions::new()
            .read(true)
            .open(&path)
            .map(std::os::fd::OwnedFd::from)
            .map_err(|e| Error::io(format!("reopening shared segment {} read-only", self.id), e))
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

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096).max(1)
}

impl Drop for Segment {
    fn drop(&mut self) {
        // SAFETY: unmaps the mapping made in `new`, which nothing borrows any more.
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
        if self.owner != u32::MAX {
            // Its pages go back to the system now, though a writer or reader that was handed
            // it may still map it: memory the server no longer counts is never kept alive by
            // a mapping (one that reads on sees zeros; nothing points it there any more).
            // SAFETY: fallocate on the descriptor this value owns (sealed against shrinking and
            // growing only, so punching a hole is allowed); failure leaves the pages to the mappings.
            unsafe {
                libc::fallocate(self.fd(), libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE, 0, self.len as libc::off_t);
            }
        }
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

    #[test]
    fn a_read_only_descriptor_maps_for_reading_only_and_a_dropped_segment_frees_its_pages() {
        use std::os::fd::AsRawFd;
        let seg = Segment::new(1 << 20, 0).unwrap();
        let ro = seg.read_only().unwrap();
        // SAFETY: maps the segment through the read-only descriptor; checked, then unmapped.
        unsafe {
            let w = libc::mmap(std::ptr::null_mut(), 1 << 20, libc::PROT_READ | libc::PROT_WRITE, libc::MAP_SHARED, ro.as_raw_fd(), 0);
            assert_eq!(w, libc::MAP_FAILED, "no writable shared mapping from a read-only descriptor");
            let r = libc::mmap(std::ptr::null_mut(), 1 << 20, libc::PROT_READ, libc::MAP_SHARED, ro.as_raw_fd(), 0);
            assert_ne!(r, libc::MAP_FAILED);
            let bytes = seg.bytes().as_ptr().cast_mut();
            std::ptr::write_bytes(bytes, 9, 1 << 20);
            assert_eq!(*r.cast::<u8>().add(12345), 9, "the reader sees the segment");
            drop(seg);
            // Its pages were given back although the reader still maps it: it reads zeros.
            assert_eq!(*r.cast::<u8>().add(12345), 0);
            libc::munmap(r, 1 << 20);
        }
    }

    #[test]
    fn a_fresh_segment_claimed_smaller_is_cut_and_sealed_at_that_size() {
        let seg = Segment::fresh(1 << 20).unwrap().claim(100_000, 1000).unwrap();
        assert_eq!((seg.len(), seg.owner(), seg.bytes().len()), (100_000, 1000, 100_000));
        let path = format!("/proc/{}/fd/{}", std::process::id(), seg.fd());
        let f = std::fs::OpenOptions::new().read(true).write(true).open(path).unwrap();
        assert_eq!(f.metadata().unwrap().len(), 100_000);
        assert!(f.set_len(50_000).is_err(), "sealed against shrinking");
        assert!(seg.bytes().iter().all(|b| *b == 0));
    }
}
