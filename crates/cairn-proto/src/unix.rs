//! A client's Unix socket to a server on its host, read with `recvmsg` so that descriptors the
//! server passes along with its replies (`SCM_RIGHTS`: read-only shared segments for same-node
//! gets, see [`crate::message::Response::Mapped`]) are kept, in the order they came, instead
//! of being closed by a plain read.

use std::collections::VecDeque;
use std::io::{IoSlice, IoSliceMut, Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::net::UnixStream;

/// Descriptors one read takes at most (the server sends one per reply, and a read stops at
/// the first message that carries some); more are closed by the kernel.
const FDS_PER_READ: usize = 4;

/// Descriptors held unclaimed at most: a server that sends more than the replies claim is
/// misbehaving; the oldest are closed.
const MAX_QUEUED: usize = 64;

/// A Unix stream and the descriptors received on it, not yet claimed.
#[derive(Debug)]
pub struct UnixConn {
    /// The socket.
    pub sock: UnixStream,
    fds: VecDeque<OwnedFd>,
}

impl UnixConn {
    /// Wraps a connected socket.
    pub fn new(sock: UnixStream) -> UnixConn {
        UnixConn { sock, fds: VecDeque::new() }
    }

    /// The oldest descriptor received and not yet claimed.
    pub fn take_fd(&mut self) -> Option<OwnedFd> {
        self.fds.pop_front()
    }

    fn recv(&mut self, bufs: &mut [IoSliceMut<'_>]) -> std::io::Result<usize> {
        // SAFETY: CMSG_SPACE only computes a size.
        const SPACE: usize = unsafe { libc::CMSG_SPACE((FDS_PER_READ * std::mem::size_of::<libc::c_int>()) as u32) } as usize;
        // u64s: the control buffer must be aligned for `cmsghdr`.
        let mut control = [0u64; SPACE.div_ceil(8)];
        // SAFETY: an all-zero msghdr is valid; the fields set below point at live buffers.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = bufs.as_mut_ptr().cast();
        msg.msg_iovlen = bufs.len() as _;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = SPACE as _;
        // SAFETY: recvmsg into the buffers `msg` names (IoSliceMut is ABI-compatible with iovec).
        let n = unsafe { libc::recvmsg(self.sock.as_raw_fd(), &mut msg, libc::MSG_CMSG_CLOEXEC) };
        if n < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: walks the control messages recvmsg wrote into `control`, within msg_controllen.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&msg);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                    let data = libc::CMSG_DATA(c).cast::<libc::c_int>();
                    let count = ((*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize) / std::mem::size_of::<libc::c_int>();
                    for i in 0..count {
                        // Each descriptor is new in this process and now owned here.
                        self.fds.push_back(OwnedFd::from_raw_fd(data.add(i).read_unaligned()));
                    }
                }
                c = libc::CMSG_NXTHDR(&msg, c);
            }
        }
        while self.fds.len() > MAX_QUEUED {
            self.fds.pop_front();
        }
        Ok(n as usize)
    }
}

impl Read for UnixConn {
    fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
        self.recv(&mut [IoSliceMut::new(b)])
    }
    fn read_vectored(&mut self, b: &mut [IoSliceMut<'_>]) -> std::io::Result<usize> {
        self.recv(b)
    }
}

impl Write for UnixConn {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.sock.write(b)
    }
    fn write_vectored(&mut self, b: &[IoSlice<'_>]) -> std::io::Result<usize> {
        self.sock.write_vectored(b)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Sends `byte` with descriptor `fd` attached over the Unix socket `sock` (one `sendmsg`).
/// `WouldBlock` on a non-blocking socket whose buffer is full: nothing was sent.
pub fn send_fd(sock: &impl AsRawFd, byte: u8, fd: &impl AsRawFd) -> std::io::Result<()> {
    // SAFETY: CMSG_SPACE only computes a size.
    const SPACE: usize = unsafe { libc::CMSG_SPACE(std::mem::size_of::<libc::c_int>() as u32) } as usize;
    let mut control = [0u64; SPACE.div_ceil(8)];
    let mut data = [byte];
    let mut iov = [IoSliceMut::new(&mut data)];
    // SAFETY: as in `recv`; one control message of one descriptor, within `control`.
    unsafe {
        let mut msg: libc::msghdr = std::mem::zeroed();
        msg.msg_iov = iov.as_mut_ptr().cast();
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = SPACE as _;
        let c = libc::CMSG_FIRSTHDR(&msg);
        (*c).cmsg_level = libc::SOL_SOCKET;
        (*c).cmsg_type = libc::SCM_RIGHTS;
        (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<libc::c_int>() as u32) as _;
        libc::CMSG_DATA(c).cast::<libc::c_int>().write_unaligned(fd.as_raw_fd());
        loop {
            let n = libc::sendmsg(sock.as_raw_fd(), &msg, libc::MSG_NOSIGNAL | libc::MSG_DONTWAIT);
            if n == 1 {
                return Ok(());
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::Interrupted {
                return Err(e);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_sent_with_bytes_arrive_in_order_and_plain_bytes_read_as_usual() {
        let (a, b) = UnixStream::pair().unwrap();
        let mut conn = UnixConn::new(b);
        let files: Vec<std::fs::File> = (0..3).map(|_| tempfile::tempfile().unwrap()).collect();
        let mut a = a;
        a.write_all(b"head").unwrap();
        for (i, f) in files.iter().enumerate() {
            send_fd(&a, i as u8, f).unwrap();
        }
        a.write_all(b"tail").unwrap();
        let mut got = [0u8; 11];
        conn.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"head\x00\x01\x02tail");
        use std::os::unix::fs::MetadataExt;
        for f in &files {
            let fd = conn.take_fd().expect("one per message");
            let mine = std::fs::File::from(fd);
            assert_eq!(mine.metadata().unwrap().ino(), f.metadata().unwrap().ino(), "in order");
        }
        assert!(conn.take_fd().is_none());
    }
}
