//! Same-node copies: a client on this host names runs of its own memory instead of sending the
//! bytes of a put, and the server copies them once, straight from that memory into its object
//! buffers, where a socket costs a copy into the kernel and one out of it. The server only ever
//! reads the memory image that connected (issue 52): at accept it opens `/proc/PID/mem` of the
//! process at the other end of the Unix socket (by the pidfd the kernel took at `connect`), and
//! every copy goes through that descriptor, which holds the connect-time address space: after
//! an `execve` (a setuid program) it reads nothing. Opening it is the kernel's ptrace check,
//! with the server's rights; where it refuses, the connection has no same-node copies (the
//! welcome says so) and the client sends payloads. The server never writes into a client's
//! memory and answers nothing about memory the client did not put: gets come as payloads.
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
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::fs::FileExt;

/// Bytes per system call at most: each piece is still in the cache when [`Peer::read`]'s caller
/// looks at it (the put's checksum), which then costs almost nothing next to the copy.
pub(crate) const CHUNK: usize = 256 << 10;

/// Copies above this size leave the async worker thread to the others while they run.
const BLOCKING: usize = 1 << 20;

/// `SO_PEERPIDFD` (Linux 6.5): a pidfd of the process that opened the connection, which the
/// kernel took at `connect` (not a pid, which another process may hold by the time it is used).
const SO_PEERPIDFD: libc::c_int = 77;

/// The client at the other end of a Unix-socket connection, bound for good to the process that
/// opened it (issue 40). A pid alone is not enough: the process may exit and another take its pid
/// (a forked child keeping the socket), and a copy by pid would then touch that process.
///
/// - Reads (the put path) go through `/proc/PID/mem` opened at bind and confirmed against the
///   pidfd after opening (the process still held its pid, so the file is its memory): the
///   descriptor holds that process's address space as it was, and reads fail once the process
///   is gone or has exec'd another image, whoever takes the pid or the process.
/// - A socket passed on (`SCM_RIGHTS`, a fork) still copies only from the image that opened
///   it, or fails once that one is gone.
#[derive(Debug)]
pub struct Peer {
    pid: i32,
    uid: u32,
    pidfd: OwnedFd,
    /// `/proc/PID/mem`, read-only, opened at bind: the connect-time memory image.
    mem: std::fs::File,
}

impl Peer {
    /// The client of Unix socket `sock`, or why same-node copies are refused to it: a client of
    /// another user unless `other_users` (the server's `--same-node-other-users`), a kernel
    /// without `SO_PEERPIDFD`, a client already gone.
    pub fn bind(sock: BorrowedFd<'_>, other_users: bool) -> std::result::Result<Peer, String> {
        let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
        getsockopt(sock, libc::SO_PEERCRED, &mut cred).map_err(|e| format!("same-node copies: no peer credentials ({e})"))?;
        // SAFETY: geteuid cannot fail.
        let me = unsafe { libc::geteuid() };
        if cred.uid != me && !other_users {
            return Err(format!(
                "same-node copies are refused to a client of user {} (this server runs as {me}); send payloads, or start the \
                 servers with --same-node-other-users true to allow them",
                cred.uid
            ));
        }
        let mut raw: libc::c_int = -1;
        getsockopt(sock, SO_PEERPIDFD, &mut raw).map_err(|e| {
            format!("same-node copies need SO_PEERPIDFD (Linux 6.5 or later) to bind a client to its process ({e}); send payloads")
        })?;
        // SAFETY: the kernel just created this descriptor for us.
        let pidfd = unsafe { OwnedFd::from_raw_fd(raw) };
        Peer::confirm(pidfd, cred.uid)
    }

    /// Process `pid` (a child this process started, or itself), bound as [`Peer::bind`] binds.
    pub fn open(pid: i32) -> std::result::Result<Peer, String> {
        // SAFETY: pidfd_open takes a pid and flags; the result is checked.
        let raw = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
        if raw < 0 {
            return Err(format!("pidfd_open({pid}): {}", std::io::Error::last_os_error()));
        }
        // SAFETY: a new descriptor this value now owns.
        let pidfd = unsafe { OwnedFd::from_raw_fd(raw as i32) };
        let uid = std::fs::metadata(format!("/proc/{pid}")).map(|m| std::os::unix::fs::MetadataExt::uid(&m)).unwrap_or(u32::MAX);
        Peer::confirm(pidfd, uid)
    }

    /// This process (for tests and benchmarks).
    pub fn this_process() -> Peer {
        Peer::open(std::process::id() as i32).expect("a pidfd of this process")
    }

    /// The peer behind `pidfd`: its pid as this process sees it, while it lives.
    fn confirm(pidfd: OwnedFd, uid: u32) -> std::result::Result<Peer, String> {
        let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{}", pidfd.as_raw_fd())).unwrap_or_default();
        let pid = info.lines().find_map(|l| l.strip_prefix("Pid:")).and_then(|p| p.trim().parse::<i32>().ok()).unwrap_or(-1);
        if pid <= 0 {
            return Err("same-node copies: the process that opened this connection has exited (or is in another pid namespace)".into());
        }
        let mem = std::fs::File::open(format!("/proc/{pid}/mem"))
            .map_err(|e| format!("same-node copies: cannot open process {pid}'s memory ({e}); send payloads"))?;
        let peer = Peer { pid, uid, pidfd, mem };
        // Opened while the pidfd's process still held the pid: the file is its memory.
        if !peer.alive() {
            return Err("same-node copies: the process that opened this connection has exited".into());
        }
        Ok(peer)
    }

    /// Its process id.
    pub fn pid(&self) -> i32 {
        self.pid
    }

    /// Its user.
    pub fn uid(&self) -> u32 {
        self.uid
    }

    /// Whether the process is still there (not yet reaped, so its pid is still its own).
    fn alive(&self) -> bool {
        // SAFETY: signal 0 through a pidfd this value owns only checks the process exists.
        unsafe { libc::syscall(libc::SYS_pidfd_send_signal, self.pidfd.as_raw_fd(), 0, std::ptr::null::<libc::siginfo_t>(), 0) == 0 }
    }

    fn gone(&self) -> Error {
        Error::Unavailable(format!(
            "same-node copy: client process {} that opened this connection is gone; a process it passed the connection to \
             must connect itself",
            self.pid
        ))
    }

    /// Copies the runs `remote` (address, length) of the client's memory into `local` (their
    /// lengths must add up to its length), handing each piece copied to `seen` while it is in the
    /// cache. On an error, what `seen` was handed must be dropped unused: it may not be the client's.
    pub fn read(&self, remote: &[(u64, u64)], local: &mut [u8], seen: &mut dyn FnMut(&[u8])) -> Result<()> {
        let len = local.len();
        let base = local.as_mut_ptr();
        let copied = blocking(len, || {
            copy_in(&self.mem, self.pid, remote, base, len, &mut |from, to| {
                // SAFETY: `from..to` lies in `local` and the kernel has finished writing it.
                seen(unsafe { std::slice::from_raw_parts(base.add(from), to - from) })
            })
        });
        // Checked after the copy: alive now, so the pid was its own all along.
        if !self.alive() {
            return Err(self.gone());
        }
        copied
    }
}

/// `getsockopt(sock, SOL_SOCKET, opt)` into `out`.
fn getsockopt<T>(sock: BorrowedFd<'_>, opt: libc::c_int, out: &mut T) -> std::io::Result<()> {
    let mut len = std::mem::size_of::<T>() as libc::socklen_t;
    // SAFETY: `out` is a valid, writable `T` of `len` bytes.
    let rc = unsafe { libc::getsockopt(sock.as_raw_fd(), libc::SOL_SOCKET, opt, (out as *mut T).cast(), &mut len) };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
}

/// The error for a same-node request over a connection that is not a local Unix socket.
pub fn not_local() -> Error {
    Error::InvalidArgument(
        "a same-node copy (a request naming client memory) needs a Unix-socket connection from a process on this host".into(),
    )
}

/// Whether the runs add up to `len` bytes.
fn check_runs(remote: &[(u64, u64)], len: usize) -> Result<()> {
    let total = remote.iter().try_fold(0u64, |a, (_, n)| a.checked_add(*n));
    if total != Some(len as u64) {
        return Err(Error::InvalidArgument(format!(
            "same-node copy: the named runs of client memory add up to {total:?} bytes, the object has {len}"
        )));
    }
    Ok(())
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

/// The read, through the pinned image `mem`, in pieces of at most [`CHUNK`] bytes;
/// `done_with(from, to)` follows each with the range of `base` it moved.
fn copy_in(
    mem: &std::fs::File,
    pid: i32,
    remote: &[(u64, u64)],
    base: *mut u8,
    len: usize,
    done_with: &mut dyn FnMut(usize, usize),
) -> Result<()> {
    check_runs(remote, len)?;
    let mut done = 0usize;
    for &(addr, n) in remote {
        let mut at = 0u64;
        while at < n {
            let take = (n - at).min(CHUNK as u64) as usize;
            let off = addr.checked_add(at).ok_or_else(|| bad_address(addr))?;
            // SAFETY: `base[done..done + take]` lies in the caller's buffer of `len` bytes (the
            // runs add up to `len`, checked above), which nothing else touches meanwhile.
            let dst = unsafe { std::slice::from_raw_parts_mut(base.add(done), take) };
            match mem.read_at(dst, off) {
                // The image is gone (the process exited or exec'd another program).
                Ok(0) => return Err(Error::Unavailable(format!("same-node copy: client process {pid}'s memory image is gone"))),
                Ok(k) => {
                    done_with(done, done + k);
                    done += k;
                    at += k as u64;
                }
                Err(e) if e.raw_os_error() == Some(libc::EINTR) => {}
                Err(e) => {
                    return Err(Error::InvalidArgument(format!(
                        "same-node copy: reading {n} bytes at {addr:#x} of process {pid}'s memory failed ({e}); name memory of \
                         this process that stays mapped until the reply"
                    )))
                }
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
    fn copies_runs_of_this_process() {
        let me = Peer::this_process();
        let src: Vec<u8> = (0..10_000u32).map(|i| (i * 7) as u8).collect();
        let mut got = vec![0u8; src.len()];
        let mut crc = 0u32;
        if let Err(e) = me.read(&runs(&src, &[1, 2, 4000, 4000, 9999]), &mut got, &mut |b| crc = cairn_core::checksum::crc_append(crc, b)) {
            return eprintln!("cross-memory attach unavailable here, skipped: {e}");
        }
        assert_eq!(got, src);
        assert_eq!(crc, cairn_core::checksum::crc(&src), "every piece is seen once, in order");
    }

    #[test]
    fn more_runs_or_bytes_than_one_call_takes_are_copied_in_batches() {
        let me = Peer::this_process();
        let src: Vec<u8> = (0..3 * 1024 + 17u32).map(|i| i as u8).collect();
        let cuts: Vec<usize> = (1..src.len()).collect();
        let mut got = vec![0u8; src.len()];
        if me.read(&runs(&src, &cuts), &mut got, &mut |_| {}).is_err() {
            return;
        }
        assert_eq!(got, src);
        let big: Vec<u8> = (0..3 * CHUNK + 5).map(|i| (i % 251) as u8).collect();
        let mut got = vec![0u8; big.len()];
        let mut pieces = Vec::new();
        me.read(&runs(&big, &[CHUNK / 2]), &mut got, &mut |b| pieces.push(b.len())).unwrap();
        assert_eq!(got, big);
        assert!(pieces.iter().all(|n| *n <= CHUNK) && pieces.iter().sum::<usize>() == big.len(), "{pieces:?}");
    }

    #[test]
    fn runs_that_do_not_add_up_or_point_nowhere_are_errors_not_crashes() {
        let me = Peer::this_process();
        let mut got = vec![0u8; 8];
        let e = me.read(&[(0x1000, 4)], &mut got, &mut |_| {}).unwrap_err();
        assert!(e.to_string().contains("add up to"), "{e}");
        let e = me.read(&[(8, 8)], &mut got, &mut |_| {}).unwrap_err();
        assert!(e.to_string().contains("same-node copy"), "{e}");
        let e = me.read(&[(u64::MAX - 2, 8)], &mut got, &mut |_| {}).unwrap_err();
        assert!(e.to_string().contains("same-node copy"), "{e}");
    }

    #[test]
    fn a_peer_is_the_process_that_opened_the_connection() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        use std::os::fd::AsFd;
        let p = Peer::bind(a.as_fd(), false).unwrap();
        assert_eq!(p.pid(), std::process::id() as i32);
        // SAFETY: geteuid cannot fail.
        assert_eq!(p.uid(), unsafe { libc::geteuid() });
    }

    #[test]
    fn a_child_that_exited_is_neither_read_nor_written() {
        let mut child = std::process::Command::new("sleep").arg("30").spawn().unwrap();
        let peer = Peer::open(child.id() as i32).unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
        // Reaped: its pid may be anyone's now; the peer copies nothing.
        let mut got = vec![0u8; 8];
        let mine = vec![1u8; 8];
        let e = peer.read(&runs(&mine, &[]), &mut got, &mut |_| {}).unwrap_err();
        assert!(e.to_string().contains("gone"), "{e}");
        assert_eq!(got, vec![0u8; 8]);
    }

    #[test]
    fn a_process_that_execs_another_image_is_read_no_more() {
        // A shell that execs `sleep` once told: the image bound first is the shell's.
        let mut child =
            std::process::Command::new("sh").args(["-c", "read x; exec sleep 30"]).stdin(std::process::Stdio::piped()).spawn().unwrap();
        let peer = match Peer::open(child.id() as i32) {
            Ok(p) => p,
            Err(e) => {
                let _ = child.kill();
                let _ = child.wait();
                return eprintln!("no access to a child's memory here, skipped: {e}");
            }
        };
        // Readable now: the stack of the bound image (any mapped address of it will do).
        let maps = std::fs::read_to_string(format!("/proc/{}/maps", child.id())).unwrap();
        let stack = maps.lines().find(|l| l.ends_with("[stack]")).unwrap();
        let start = u64::from_str_radix(stack.split('-').next().unwrap(), 16).unwrap();
        let mut got = vec![0u8; 64];
        peer.read(&[(start, 64)], &mut got, &mut |_| {}).unwrap();
        use std::io::Write;
        child.stdin.take().unwrap().write_all(b"go\n").unwrap();
        // Wait for the exec: the process's command becomes sleep.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while std::fs::read_to_string(format!("/proc/{}/comm", child.id())).unwrap_or_default().trim() != "sleep" {
            assert!(std::time::Instant::now() < deadline, "the child did not exec");
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let maps = std::fs::read_to_string(format!("/proc/{}/maps", child.id())).unwrap();
        let stack = maps.lines().find(|l| l.ends_with("[stack]")).unwrap();
        let start = u64::from_str_radix(stack.split('-').next().unwrap(), 16).unwrap();
        let e = peer.read(&[(start, 64)], &mut got, &mut |_| {}).unwrap_err();
        assert!(e.to_string().contains("gone"), "the new image is never read: {e}");
        child.kill().unwrap();
        child.wait().unwrap();
    }
}
