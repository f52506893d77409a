//! Connections to the servers of a cluster: one per server, opened when first needed (a Unix
//! socket when the server runs on this host, else TCP), authenticated with the cluster secret.

use cairn_core::placement::Ring;
use cairn_core::{Error, Result};
use cairn_proto::cluster::{hostname, ClusterFile, ServerEntry};
use cairn_proto::message::{unexpected, Request, Response};
use cairn_proto::sync_io::{read_head, write_frame};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::{Arc, Mutex};

/// A byte stream to one server.
#[derive(Debug)]
pub(crate) enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Read for Stream {
    fn read(&mut self, b: &mut [u8]) -> std::io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(b),
            Stream::Unix(s) => s.read(b),
        }
    }
    fn read_vectored(&mut self, b: &mut [std::io::IoSliceMut<'_>]) -> std::io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read_vectored(b),
            Stream::Unix(s) => s.read_vectored(b),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(b),
            Stream::Unix(s) => s.write(b),
        }
    }
    fn write_vectored(&mut self, b: &[std::io::IoSlice<'_>]) -> std::io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write_vectored(b),
            Stream::Unix(s) => s.write_vectored(b),
        }
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// An authenticated connection to one server.
#[derive(Debug)]
pub(crate) struct Conn {
    pub(crate) stream: Stream,
}

impl Conn {
    fn open(entry: &ServerEntry, secret: &str, transport: Transport) -> Result<Conn> {
        let id = entry.spec.id;
        let gone = |e: std::io::Error| {
            Error::Unavailable(format!(
                "cannot reach staging server {id} at {}: {e}; is the cluster up? (`cairn cluster status`)",
                entry.addr
            ))
        };
        let unix = entry.unix.as_deref().filter(|p| transport == Transport::Auto && entry.host == hostname() && p.exists());
        let stream = match unix {
            Some(p) => Stream::Unix(UnixStream::connect(p).map_err(gone)?),
            None => {
                let s = TcpStream::connect(&entry.addr).map_err(gone)?;
                s.set_nodelay(true).map_err(gone)?;
                Stream::Tcp(s)
            }
        };
        let mut c = Conn { stream };
        match c.call(&Request::Hello { secret: secret.to_string(), client: format!("client pid {}", std::process::id()) })? {
            Response::Welcome { .. } => Ok(c),
            other => Err(unexpected("hello", &other)),
        }
    }

    /// Sends a request without payload and returns the (non-error) reply, which has none either.
    pub(crate) fn call(&mut self, req: &Request) -> Result<Response> {
        write_frame(&mut self.stream, req, &[])?;
        self.recv_plain()
    }

    /// Reads a reply that carries no payload.
    pub(crate) fn recv_plain(&mut self) -> Result<Response> {
        let (resp, _) = read_head::<Response>(&mut self.stream, 0)?;
        resp.into_result()
    }
}

/// Which transport clients use.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Transport {
    /// Unix socket for servers on this host, else TCP.
    Auto,
    /// TCP always (benchmarks).
    Tcp,
}

/// A cluster as a client sees it: the cluster file, the ring, and a connection slot per server.
#[derive(Debug)]
pub(crate) struct Cluster {
    pub(crate) file: ClusterFile,
    pub(crate) ring: Ring,
    slots: Vec<Mutex<Option<Conn>>>,
    transport: Transport,
}

impl Cluster {
    pub(crate) fn open(path: &Path) -> Result<Arc<Cluster>> {
        let file = ClusterFile::load(path)?;
        let ring = file.ring();
        let max = file.servers.iter().map(|s| s.spec.id).max().unwrap_or(0) as usize;
        let transport = if std::env::var_os("CAIRN_TRANSPORT").is_some_and(|t| t == "tcp") { Transport::Tcp } else { Transport::Auto };
        Ok(Arc::new(Cluster { file, ring, slots: (0..=max).map(|_| Mutex::new(None)).collect(), transport }))
    }

    /// Runs `f` on the connection to `server`, connecting first if needed. A connection that
    /// failed is dropped, so the next call reconnects.
    pub(crate) fn with<T>(&self, server: u32, f: impl FnOnce(&mut Conn) -> Result<T>) -> Result<T> {
        let slot = self.slots.get(server as usize).ok_or_else(|| Error::NotFound(format!("server {server} is not in the cluster")))?;
        let mut guard = slot.lock().unwrap_or_else(|p| p.into_inner());
        if guard.is_none() {
            *guard = Some(Conn::open(self.file.server(server)?, &self.file.secret, self.transport)?);
        }
        let r = f(guard.as_mut().expect("connected above"));
        if matches!(&r, Err(e) if matches!(e.kind(), cairn_core::ErrorKind::Unavailable | cairn_core::ErrorKind::Corrupt)) {
            *guard = None;
        }
        r
    }

    /// One request to `server` without payloads.
    pub(crate) fn call(&self, server: u32, req: &Request) -> Result<Response> {
        self.with(server, |c| c.call(req))
    }

    /// One request to the coordinator of `dataset`.
    pub(crate) fn coord(&self, dataset: &str, req: &Request) -> Result<Response> {
        self.call(self.file.coordinator(dataset), req)
    }
}
