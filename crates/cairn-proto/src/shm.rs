//! Mappings of shared segments, made alike by the server that owns a segment and by the
//! same-node writers and readers it hands it to. The server makes a segment's memory of 2 MiB
//! huge pages where the kernel lets it (see [`make_huge`]), and every mapping of a segment
//! starts on a 2 MiB boundary, so each huge page is mapped by one page-table entry: a first
//! mapping of 128 MiB costs 64 faults instead of 32768. Measured here (a VM, where every fault
//! is dear; `shmem_enabled` is `never`, so without [`make_huge`] shared memory is 4 KiB pages):
//! a writer's first copy into a fresh mapping of 128 MiB 65.8 → 17.2 ms (a warm one 14.9), a
//! reader's first copy out 32.2 → 14.7 ms, and making the segment's pages 116 → 25 ms.

use std::io;
use std::ptr::NonNull;

/// The huge page size mappings are aligned to (x86-64's and 4 KiB-page arm64's PMD size).
pub const HUGE: usize = 2 << 20;

/// Maps `len` (> 0) bytes of the shared segment `fd` from its start, with `prot` and the further
/// mmap `flags` (e.g. `MAP_POPULATE`). Segments of at least [`HUGE`] bytes are mapped at a
/// [`HUGE`] boundary (an address range is reserved, then the segment mapped over its aligned part).
pub fn map(fd: std::os::fd::RawFd, len: usize, prot: libc::c_int, flags: libc::c_int) -> io::Result<NonNull<u8>> {
    let shared = libc::MAP_SHARED | flags;
    if len < HUGE {
        // SAFETY: a new shared mapping of the caller's descriptor; the result is checked.
        let p = unsafe { libc::mmap(std::ptr::null_mut(), len, prot, shared, fd, 0) };
        return mapped(p);
    }
    let span = len + HUGE;
    // SAFETY: reserves address space only (no access, no memory); unmapped below but for the
    // aligned part the segment replaces.
    let base = unsafe {
        libc::mmap(std::ptr::null_mut(), span, libc::PROT_NONE, libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE, -1, 0)
    };
    let base = mapped(base)?.as_ptr() as usize;
    let at = base.next_multiple_of(HUGE);
    // SAFETY: maps the segment over part of the reservation made above, which this call owns.
    let p = unsafe { libc::mmap(at as *mut libc::c_void, len, prot, shared | libc::MAP_FIXED, fd, 0) };
    let end = at + len.next_multiple_of(page_size());
    // SAFETY: gives back the reservation's parts outside the segment's mapping (all of it if
    // the mapping failed); nothing else uses them.
    unsafe {
        if p == libc::MAP_FAILED {
            let e = io::Error::last_os_error();
            libc::munmap(base as *mut libc::c_void, span);
            return Err(e);
        }
        if at > base {
            libc::munmap(base as *mut libc::c_void, at - base);
        }
        if base + span > end {
            libc::munmap(end as *mut libc::c_void, base + span - end);
        }
    }
    mapped(p)
}

fn mapped(p: *mut libc::c_void) -> io::Result<NonNull<u8>> {
    if p == libc::MAP_FAILED {
        return Err(io::Error::last_os_error());
    }
    Ok(NonNull::new(p.cast()).expect("mmap does not return null"))
}

/// Makes the whole [`HUGE`] pieces of the `len` bytes at `ptr` (a writable mapping of a new,
/// empty segment, from [`map`]) huge pages: one byte of each is touched (a 4 KiB page), then
/// `MADV_COLLAPSE` replaces those pages by zeroed huge ones (Linux ≥ 6.1; allowed unless
/// `shmem_enabled` is `deny`, unprivileged). Returns whether it did; where it did not (an older
/// kernel, no huge page free), the segment keeps small pages and works the same, slower.
pub fn make_huge(ptr: NonNull<u8>, len: usize) -> bool {
    let whole = len / HUGE * HUGE;
    if whole == 0 || !(ptr.as_ptr() as usize).is_multiple_of(HUGE) {
        return false;
    }
    for at in (0..whole).step_by(HUGE) {
        // SAFETY: within the caller's writable mapping; the segment is new, so nothing reads it.
        unsafe { ptr.as_ptr().add(at).write_volatile(0) };
    }
    // SAFETY: advice over the caller's mapping; collapsing keeps every byte's value.
    unsafe { libc::madvise(ptr.as_ptr().cast(), whole, libc::MADV_COLLAPSE) == 0 }
}

/// Bytes of this process's shared mapping that starts at `addr` mapped by huge pages
/// (`ShmemPmdMapped` in `/proc/self/smaps`); `None` if no mapping starts there.
pub fn huge_mapped(addr: usize) -> Option<usize> {
    let smaps = std::fs::read_to_string("/proc/self/smaps").ok()?;
    let head = format!("{addr:x}-");
    let mut lines = smaps.lines().skip_while(|l| !l.starts_with(&head));
    lines.next()?;
    // The mapping's fields, up to the next mapping's header (which has no ':' after its first word).
    let line =
        lines.take_while(|l| l.split_whitespace().next().is_some_and(|w| w.ends_with(':'))).find(|l| l.starts_with("ShmemPmdMapped:"))?;
    line.split_whitespace().nth(1)?.parse::<usize>().ok().map(|kib| kib << 10)
}

/// The system's page size.
pub fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

    fn memfd(len: usize) -> OwnedFd {
        // SAFETY: a new descriptor, owned by the result; sized below.
        let fd = unsafe { OwnedFd::from_raw_fd(libc::memfd_create(c"test".as_ptr(), libc::MFD_CLOEXEC)) };
        // SAFETY: sizes the descriptor just created.
        assert_eq!(unsafe { libc::ftruncate(fd.as_raw_fd(), len as libc::off_t) }, 0);
        fd
    }

    fn unmap(p: NonNull<u8>, len: usize) {
        // SAFETY: unmaps a mapping the test made and no longer uses.
        unsafe { libc::munmap(p.as_ptr().cast(), len) };
    }

    #[test]
    fn big_segments_map_at_huge_boundaries_and_their_huge_pages_keep_what_was_written() {
        let len = 3 * HUGE + 12345;
        let fd = memfd(len);
        let rw = libc::PROT_READ | libc::PROT_WRITE;
        let p = map(fd.as_raw_fd(), len, rw, 0).unwrap();
        assert!((p.as_ptr() as usize).is_multiple_of(HUGE));
        // Whether the kernel collapses depends on it; either way the bytes are the segment's.
        let huge = make_huge(p, len);
        // SAFETY: the mapping is `len` writable bytes.
        let w = unsafe { std::slice::from_raw_parts_mut(p.as_ptr(), len) };
        assert!(w.iter().all(|b| *b == 0), "a new segment reads as zeros (huge: {huge})");
        w[HUGE + 7] = 42;
        w[len - 1] = 9;
        let q = map(fd.as_raw_fd(), len, libc::PROT_READ, libc::MAP_POPULATE).unwrap();
        assert!((q.as_ptr() as usize).is_multiple_of(HUGE));
        // SAFETY: the second mapping is `len` readable bytes.
        let r = unsafe { std::slice::from_raw_parts(q.as_ptr(), len) };
        assert_eq!((r[HUGE + 7], r[len - 1], r[0]), (42, 9, 0), "both map the same memory");
        if huge {
            assert_eq!(huge_mapped(q.as_ptr() as usize).unwrap(), 3 * HUGE, "the second mapping maps the huge pieces whole");
        }
        unmap(p, len);
        unmap(q, len);
        let small = map(fd.as_raw_fd(), 4096, libc::PROT_READ, 0).unwrap();
        assert!(!make_huge(small, 4096), "nothing to collapse in less than a huge page");
        unmap(small, 4096);
    }
}
