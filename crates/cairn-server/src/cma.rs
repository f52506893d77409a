//! Same-node copies (cross-memory attach): a client on this host names runs of its own memory
//! instead of sending the bytes, and the server copies them once, straight between that memory
//! and its object buffers (`process_vm_readv` / `process_vm_writev`), where a socket costs a
//! copy into the kernel and one out of it. Only the process at the other end of the connection's
//! Unix socket is ever read or written (its pid comes from `SO_PEERCRED`, which the kernel
//! vouches for, not from the request), and the kernel's ptrace check applies on top: where it
//! refuses, the client's probe ([`probe`]) fails and it sends payloads as before.
//!
//! Why cross-memory attach and not a shared-memory segment (`memfd` + `mmap`) that the writer
//! copies into and the server adopts as the object's storage: measured by
//! `cargo run --release -p cairn-server --example same_node_copy` (this 2-core VM, best of 7,
//! GB/s, the client a forked process; `bench/results/same_node_copy.json`):
//!
//! | object | memcpy | CMA put | CMA put + crc32c | memfd, a fresh segment | memfd, a pooled segment | CMA get | memfd get |
//! |---|---|---|---|---|---|---|---|
//! | 1 MiB | 32.7 | 8.7 | 7.0 | 1.17 | 41.4 | 9.2 | 33.6 |
//! | 16 MiB | 14.6 | 4.9 | 4.7 | 1.10 | 12.5 | 5.5 | 12.2 |
//! | 256 MiB | 10.6 | 5.2 | 4.2 | 1.25 | 12.4 | 5.5 | 15.8 |
//!
//! A segment per object is 4–8× slower than this copy: its pages are faulted in and zeroed on
//! first touch (in this VM each fault also exits to the host). Only segments kept and reused
//! (a pool per client, already faulted in) copy at memcpy speed, 2.5–4× this path; that needs the
//! server's object memory to be such segments shared with the writer, who could then still
//! change an object after the server checked it (readers would catch it by its checksum, not
//! prevent it). Cross-memory attach needs no shared state and gives the server the only copy;
//! the pooled ring is the way past 0.5× memcpy (issue 19).

use cairn_core::{Error, Result};

/// iovecs per system call (the kernel's `UIO_MAXIOV`).
const IOV_MAX: usize = 1024;

/// Bytes per system call at most: each piece is still in the cache when [`read`]'s caller looks
/// at it (the put's checksum), which then costs almost nothing next to the copy.
pub(crate) const CHUNK: usize = 256 << 10;

/// Copies above this size leave the async worker thread to the others while they run.
const BLOCKING: usize = 1 << 20;

/// Which way the bytes go.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Dir {
    /// From the client's memory into ours.
    In,
    /// From ours into the client's memory.
    Out,
}

/// Copies the runs `remote` (address, length) of process `pid` into `local` (their lengths must
/// add up to its length), handing each piece copied to `seen` while it is in the cache.
pub fn read(pid: i32, remote: &[(u64, u64)], local: &mut [u8], seen: &mut dyn FnMut(&[u8])) -> Result<()> {
    let len = local.len();
    let base = local.as_mut_ptr();
    blocking(len, || {
        copy(pid, remote, base, len, Dir::In, &mut |from, to| {
            // SAFETY: `from..to` lies in `local` and the kernel has finished writing it.
            seen(unsafe { std::slice::from_raw_parts(base.add(from), to - from) })
        })
    })
}

/// Copies `local` into the runs `remote` of process `pid`.
pub fn write(pid: i32, remote: &[(u64, u64)], local: &[u8]) -> Result<()> {
    // The kernel only reads the local side of a `process_vm_writev`.
    blocking(local.len(), || copy(pid, remote, local.as_ptr().cast_mut(), local.len(), Dir::Out, &mut |_, _| {}))
}

/// The answer to a client's probe: `len` bytes at `addr` in `pid` read and checked against their
/// crc32c, so a client only names its memory once the kernel lets this server copy it.
pub fn probe(pid: Option<i32>, addr: u64, len: u64, checksum: u32) -> Result<()> {
    let pid = pid.ok_or_else(not_local)?;
    let mut buf = vec![0u8; len as usize];
    read(pid, &[(addr, len)], &mut buf, &mut |_| {})?;
    if cairn_core::checksum::crc(&buf) != checksum {
        return Err(Error::InvalidArgument(format!(
            "same-node probe: the {len} bytes read from process {pid} do not match their crc32c; the client sends payloads instead"
        )));
    }
    Ok(())
}

/// The error for a same-node request over a connection that is not a local Unix socket.
pub fn not_local() -> Error {
    Error::InvalidArgument(
        "a same-node copy (a request naming client memory) needs a Unix-socket connection from a process on this host".into(),
    )
}

/// Runs a copy of `len` bytes, off the async worker when it is long and the runtime has others.
fn blocking<T>(len: usize, f: impl FnOnce() -> T) -> T {
    let multi = tokio::runtime::Handle::try_current().is_ok_and(|h| h.runtime_flavor() == tokio::runtime::RuntimeFlavor::MultiThread);
    if len >= BLOCKING && multi {
        tokio::task::block_in_place(f)
    } else {
        f()
    }
}

/// The copy, in system calls of at most [`IOV_MAX`] runs and [`CHUNK`] bytes; `done_with(from, to)`
/// follows each with the range of `base` it moved.
fn copy(pid: i32, remote: &[(u64, u64)], base: *mut u8, len: usize, dir: Dir, done_with: &mut dyn FnMut(usize, usize)) -> Result<()> {
    let total = remote.iter().try_fold(0u64, |a, (_, n)| a.checked_add(*n));
    if total != Some(len as u64) {
        return Err(Error::InvalidArgument(format!(
            "same-node copy: the named runs of client memory add up to {total:?} bytes, the object has {len}"
        )));
    }
    // Position in `remote`: run index and bytes of it done.
    let (mut run, mut into) = (0usize, 0u64);
    let mut done = 0usize;
    while done < len {
        let mut iov = Vec::with_capacity(IOV_MAX.min(remote.len() - run));
        let mut batch = 0usize;
        for (i, &(addr, n)) in remote.iter().enumerate().skip(run) {
            if iov.len() == IOV_MAX || batch == CHUNK {
                break;
            }
            let skip = if i == run { into } else { 0 };
            let take = (n - skip).min((CHUNK - batch) as u64);
            if take > 0 {
                let at = addr.checked_add(skip).ok_or_else(|| bad_address(addr))?;
                iov.push(libc::iovec { iov_base: at as usize as *mut libc::c_void, iov_len: take as usize });
                batch += take as usize;
            }
        }
        // SAFETY: the local iovec is `base[done..done + batch]`, inside the caller's buffer of
        // `len` bytes (`batch` ≤ `len - done` since the runs add up to `len`); the remote iovecs
        // are only addresses in another process, which the kernel checks.
        let local = libc::iovec { iov_base: unsafe { base.add(done) }.cast(), iov_len: batch };
        let n = unsafe {
            match dir {
                Dir::In => libc::process_vm_readv(pid, &local, 1, iov.as_ptr(), iov.len() as libc::c_ulong, 0),
                Dir::Out => libc::process_vm_writev(pid, &local, 1, iov.as_ptr(), iov.len() as libc::c_ulong, 0),
            }
        };
        if n <= 0 {
            let e = std::io::Error::last_os_error();
            let what = if dir == Dir::In { "reading" } else { "writing" };
            return Err(match e.raw_os_error() {
                Some(libc::ESRCH) => Error::Unavailable(format!("same-node copy: client process {pid} is gone")),
                Some(libc::EPERM | libc::EACCES | libc::ENOSYS) => Error::InvalidArgument(format!(
                    "same-node copy: the kernel does not let this server access process {pid}'s memory ({e}); the client must \
                     send payloads (`[staging] transport = \"socket\"`)"
                )),
                _ if n == 0 => Error::InvalidArgument(format!("same-node copy: no byte moved {what} process {pid}'s memory")),
                _ => Error::InvalidArgument(format!("same-node copy: {what} process {pid}'s memory failed: {e}")),
            });
        }
        let mut moved = n as u64;
        done_with(done, done + n as usize);
        done += n as usize;
        while moved > 0 {
            let rest = remote[run].1 - into;
            if moved >= rest {
                moved -= rest;
                (run, into) = (run + 1, 0);
            } else {
                into += moved;
                moved = 0;
            }
        }
    }
    Ok(())
}

fn bad_address(addr: u64) -> Error {
    Error::InvalidArgument(format!("same-node copy: run at {addr:#x} overflows the address space"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn runs(buf: &[u8], cuts: &[usize]) -> Vec<(u64, u64)> {
        let mut at = 0;
        cuts.iter()
            .chain(std::iter::once(&buf.len()))
            .map(|&end| {
                let r = (buf.as_ptr() as u64 + at as u64, (end - at) as u64);
                at = end;
                r
            })
            .collect()
    }

    #[test]
    fn copies_runs_of_this_process_both_ways() {
        let me = std::process::id() as i32;
        let src: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
        let mut got = vec![0u8; src.len()];
        let mut crc = 0u32;
        if let Err(e) = read(me, &runs(&src, &[1, 2, 4000, 4000, 9999]), &mut got, &mut |b| crc = cairn_core::checksum::crc_append(crc, b))
        {
            return eprintln!("cross-memory attach unavailable here, skipped: {e}");
        }
        assert_eq!(got, src);
        assert_eq!(crc, cairn_core::checksum::crc(&src), "every piece is seen once, in order");
        let mut back = vec![0u8; src.len()];
        let r = runs(&back, &[5000]);
        write(me, &r, &src).unwrap();
        assert_eq!(back.as_mut_slice(), src.as_slice());
    }

    #[test]
    fn more_runs_or_bytes_than_one_call_takes_are_copied_in_batches() {
        let me = std::process::id() as i32;
        let src: Vec<u8> = (0..3 * IOV_MAX as u32 + 17).map(|i| i as u8).collect();
        let cuts: Vec<usize> = (1..src.len()).collect();
        let mut got = vec![0u8; src.len()];
        if read(me, &runs(&src, &cuts), &mut got, &mut |_| {}).is_err() {
            return;
        }
        assert_eq!(got, src);
        let big: Vec<u8> = (0..3 * CHUNK + 5).map(|i| (i % 251) as u8).collect();
        let mut got = vec![0u8; big.len()];
        let mut pieces = Vec::new();
        read(me, &runs(&big, &[CHUNK / 2]), &mut got, &mut |b| pieces.push(b.len())).unwrap();
        assert_eq!(got, big);
        assert!(pieces.iter().all(|n| *n <= CHUNK) && pieces.iter().sum::<usize>() == big.len(), "{pieces:?}");
    }

    #[test]
    fn runs_that_do_not_add_up_or_point_nowhere_are_errors_not_crashes() {
        let me = std::process::id() as i32;
        let mut got = vec![0u8; 8];
        let e = read(me, &[(0x1000, 4)], &mut got, &mut |_| {}).unwrap_err();
        assert!(e.to_string().contains("add up to"), "{e}");
        let e = read(me, &[(8, 8)], &mut got, &mut |_| {}).unwrap_err();
        assert!(e.to_string().contains("same-node copy"), "{e}");
        let e = read(me, &[(u64::MAX - 2, 8)], &mut got, &mut |_| {}).unwrap_err();
        assert!(e.to_string().contains("same-node copy"), "{e}");
        assert!(probe(None, 0, 0, 0).unwrap_err().to_string().contains("Unix-socket"));
    }
}
