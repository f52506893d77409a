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
    /// Made of huge pages ([`Segment::ahead`] where the kernel let it).
    huge: bool,
    /// The process (pid, uid) it was last leased to, which mapped it writable: what may have
    /// changed its bytes after a put (readers' mappings cannot write).
    lent: std::sync::Mutex<Option<(i32, u32)>>,
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
    /// page), not yet anyone's: [`Segment::claim`] cuts it to the size a lease needs and seals it.
    pub fn fresh(len: usize) -> Result<Segment> {
        Segment::make(len, false)
    }

    /// As [`Segment::fresh`], made of huge pages where the kernel lets it
    /// ([`cairn_proto::shm::make_huge`]), for the prefaulter: the mappings writers and readers
    /// make of it then cost a fault per 2 MiB, not per 4 KiB (a fresh cluster's first 128 MiB
    /// puts at 0.78–1.04× memcpy, 0.37–0.57× with small pages). Not for leases made on demand:
    /// a huge page is a 2 MiB block of free memory, and in a VM whose host takes back the guest's
    /// free blocks (free page reporting, as here) a block's first touch costs the host's faults:
    /// 4 MiB made huge took 0.2–0.5 ms from recently freed memory and 9–10 ms from reclaimed
    /// memory, against ~3.6 ms in small pages (116 ms per 128 MiB), which come from the smaller
    /// free pieces the host leaves alone.
    pub fn ahead(len: usize) -> Result<Segment> {
        Segment::make(len, true)
    }

    fn make(len: usize, huge: bool) -> Result<Segment> {
        use std::os::fd::FromRawFd;
        let fail = |what: &str| Error::Capacity(format!("cannot {what} a {len}-byte shared segment: {}", std::io::Error::last_os_error()));
        // SAFETY: memfd_create with a static NUL-terminated name.
        let raw = unsafe { libc::memfd_create(c"cairn-object".as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING) };
        if raw < 0 {
            return Err(fail("create"));
        }
        // SAFETY: `raw` is a new descriptor this value now owns.
        let fd = unsafe { std::os::fd::OwnedFd::from_raw_fd(raw) };
        // SAFETY: ftruncate of the descriptor just created.
        if unsafe { libc::ftruncate(raw, len as libc::off_t) } != 0 {
            return Err(fail("size"));
        }
        let ptr = cairn_proto::shm::map(raw, len, libc::PROT_READ | libc::PROT_WRITE, 0)
            .map_err(|e| Error::Capacity(format!("cannot map a {len}-byte shared segment: {e}")))?;
        // Huge pages first if asked, then the (rest of the) file's pages allocated under the
        // file's own lock, and this mapping's page tables filled: shared memory that cannot be
        // allocated fails here, not later with SIGBUS, and ENOMEM under a memory cgroup is not
        // an OOM kill later. Any fallocate failure but "not supported" (then populating
        // allocates) is one.
        let made_huge = huge && cairn_proto::shm::make_huge(ptr, len);
        // SAFETY: fallocate and madvise of the descriptor and mapping just made; results checked.
        let made = unsafe {
            loop {
                if libc::fallocate(raw, 0, 0, len as libc::off_t) == 0 {
                    break true;
                }
                match std::io::Error::last_os_error().raw_os_error() {
                    Some(libc::EINTR) => continue,
                    Some(libc::EOPNOTSUPP | libc::ENOSYS) => break true,
                    _ => break false,
                }
            }
        } && populate(ptr, len);
        if !made {
            let e = fail("allocate");
            // SAFETY: unmaps the mapping made above, which nothing else uses.
            unsafe { libc::munmap(ptr.as_ptr().cast(), len) };
            return Err(e);
        }
        if huge && !made_huge && len >= cairn_proto::shm::HUGE {
            tracing::debug!(len, "a shared segment is made of small pages (MADV_COLLAPSE refused)");
        }
        let id = NEXT_ID.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(Segment { fd, ptr, len, owner: u32::MAX, id, huge: made_huge, lent: std::sync::Mutex::new(None) })
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
            let page = cairn_proto::shm::page_size();
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

    /// Whether it is made of huge pages (a first mapping costs a fault per 2 MiB, not per 4 KiB).
    pub fn huge(&self) -> bool {
        self.huge
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

    /// Notes that process `pid` of user `uid` maps it writable now (a lease).
    pub fn lend(&self, pid: i32, uid: u32) {
        *self.lent.lock().unwrap_or_else(|p| p.into_inner()) = Some((pid, uid));
    }

    /// Who may have written it last, as far as this server knows: "process PID (uid UID)", or
    /// "unknown".
    pub fn writer(&self) -> String {
        match *self.lent.lock().unwrap_or_else(|p| p.into_inner()) {
            Some((pid, uid)) => format!("process {pid} (uid {uid}), the last it was mapped writable for"),
            None => "unknown".into(),
        }
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

/// Fills the page tables of the `len` writable bytes at `ptr` (allocating what is not yet);
/// false if memory ran out. A kernel without `MADV_POPULATE_WRITE` (< 5.14) faults them in.
fn populate(ptr: std::ptr::NonNull<u8>, len: usize) -> bool {
    // SAFETY: advice over a mapping the caller owns; it changes no byte.
    let done = unsafe { libc::madvise(ptr.as_ptr().cast(), len, libc::MADV_POPULATE_WRITE) == 0 };
    done || std::io::Error::last_os_error().raw_os_error() == Some(libc::EINVAL)
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

    /// Whether this kernel makes shared memory huge on `MADV_COLLAPSE` (Linux ≥ 6.1, shmem not denied).
    fn collapses() -> bool {
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
        let mut v = release.split(['.', '-']).map(|p| p.parse::<u32>().unwrap_or(0));
        let (major, minor) = (v.next().unwrap_or(0), v.next().unwrap_or(0));
        let shmem = std::fs::read_to_string("/sys/kernel/mm/transparent_hugepage/shmem_enabled").unwrap_or_default();
        (major, minor) >= (6, 1) && !shmem.is_empty() && !shmem.contains("[deny]")
    }

    #[test]
    fn segments_made_ahead_are_huge_pages_that_a_writers_mapping_maps_whole() {
        let huge = cairn_proto::shm::HUGE;
        let ahead = Segment::ahead(2 * huge + 4096).unwrap().claim(2 * huge + 100, 7).unwrap();
        let leased = Segment::new(2 * huge, 7).unwrap();
        let path = |s: &Segment| format!("/proc/{}/fd/{}", std::process::id(), s.fd());
        let map = |s: &Segment| {
            let f = std::fs::OpenOptions::new().read(true).write(true).open(path(s)).unwrap();
            use std::os::fd::AsRawFd;
            cairn_proto::shm::map(f.as_raw_fd(), s.len(), libc::PROT_READ | libc::PROT_WRITE, libc::MAP_POPULATE).unwrap()
        };
        let (a, l) = (map(&ahead), map(&leased));
        // SAFETY: `a` maps `ahead.len()` writable bytes until unmapped below.
        unsafe { a.as_ptr().add(huge + 1).write(5) };
        assert_eq!(ahead.bytes()[huge + 1], 5, "the writer's mapping is the server's segment");
        if collapses() {
            assert_eq!(cairn_proto::shm::huge_mapped(a.as_ptr() as usize).unwrap(), 2 * huge, "made ahead: mapped by huge pages");
        }
        assert_eq!(cairn_proto::shm::huge_mapped(l.as_ptr() as usize).unwrap(), 0, "made on demand: small pages");
        // SAFETY: unmaps the two mappings made above.
        unsafe {
            libc::munmap(a.as_ptr().cast(), ahead.len());
            libc::munmap(l.as_ptr().cast(), leased.len());
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
