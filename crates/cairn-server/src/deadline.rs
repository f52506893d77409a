//! A stream whose reads and writes must make progress within a deadline. Between frames an
//! authenticated connection may sit idle; once a frame's first byte arrives, the rest of it (its
//! payload too) must keep flowing, and so must every reply. A peer that stalls mid-frame (hung,
//! SIGSTOPped, or hostile) gets `TimedOut`, its connection closes and the space reserved for
//! its payload comes back.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::time::{Instant, Sleep};

/// A stream with a progress deadline.
#[derive(Debug)]
pub struct Deadline<S> {
    inner: S,
    timeout: Duration,
    sleep: Pin<Box<Sleep>>,
    /// Waiting for the next frame: reads have no deadline until a byte arrives.
    idle: bool,
}

impl<S> Deadline<S> {
    /// Wraps `inner`; every read and write must progress within `timeout`.
    pub fn new(inner: S, timeout: Duration) -> Deadline<S> {
        Deadline { inner, timeout, sleep: Box::pin(tokio::time::sleep(timeout)), idle: false }
    }

    /// Reads wait without a deadline until the next byte arrives (between frames).
    pub fn expect_frame(&mut self) {
        self.idle = true;
    }

    /// Starts the deadline now (before a reply is written, after work between reads).
    pub fn arm(&mut self) {
        self.idle = false;
        self.progress();
    }

    fn progress(&mut self) {
        let at = Instant::now() + self.timeout;
        self.sleep.as_mut().reset(at);
    }

    /// A write's outcome: progress resets the deadline; waiting checks it.
    fn wrote(&mut self, cx: &mut Context<'_>, r: Poll<io::Result<usize>>) -> Poll<io::Result<usize>> {
        match r {
            Poll::Ready(Ok(n)) => {
                self.progress();
                Poll::Ready(Ok(n))
            }
            Poll::Ready(e) => Poll::Ready(e),
            Poll::Pending => self.expired(cx, "reading our reply").map_ok(|()| 0),
        }
    }

    fn expired(&mut self, cx: &mut Context<'_>, what: &str) -> Poll<io::Result<()>> {
        match self.sleep.as_mut().poll(cx) {
            Poll::Ready(()) => Poll::Ready(Err(io::Error::new(
                io::ErrorKind::TimedOut,
                format!("the peer made no progress {what} for {:?}", self.timeout),
            ))),
            Poll::Pending => Poll::Pending,
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Deadline<S> {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        match Pin::new(&mut self.inner).poll_read(cx, buf) {
            Poll::Ready(r) => {
                if buf.filled().len() > before {
                    self.idle = false;
                    self.progress();
                }
                Poll::Ready(r)
            }
            Poll::Pending if self.idle => Poll::Pending,
            Poll::Pending => self.expired(cx, "sending"),
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Deadline<S> {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write(cx, buf);
        self.wrote(cx, r)
    }

    fn poll_write_vectored(mut self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        let r = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        self.wrote(cx, r)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match Pin::new(&mut self.inner).poll_flush(cx) {
            Poll::Pending => self.expired(cx, "reading our reply"),
            r => r,
        }
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match Pin::new(&mut self.inner).poll_shutdown(cx) {
            Poll::Pending => self.expired(cx, "closing"),
            r => r,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    #[tokio::test(start_paused = true)]
    async fn a_stalled_frame_times_out_but_an_idle_connection_does_not() {
        let (client, server) = tokio::io::duplex(64);
        let mut s = Deadline::new(server, Duration::from_secs(5));
        let mut client = client;
        s.expect_frame();
        let mut buf = [0u8; 4];
        // Idle between frames: an hour passes without a deadline.
        let waited = tokio::time::timeout(Duration::from_secs(3600), s.read_exact(&mut buf[..1])).await;
        assert!(waited.is_err(), "no deadline while idle");
        client.write_all(b"a").await.unwrap();
        s.read_exact(&mut buf[..1]).await.unwrap();
        // Mid-frame: the next bytes must come within 5 s.
        let started = Instant::now();
        let e = s.read_exact(&mut buf).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
        assert_eq!(started.elapsed(), Duration::from_secs(5));
    }

    #[tokio::test(start_paused = true)]
    async fn progress_resets_the_deadline_and_writes_to_a_stalled_reader_fail() {
        let (mut client, server) = tokio::io::duplex(16);
        let mut s = Deadline::new(server, Duration::from_secs(5));
        s.arm();
        let feeder = tokio::spawn(async move {
            for _ in 0..4 {
                tokio::time::sleep(Duration::from_secs(4)).await;
                client.write_all(b"x").await.unwrap();
            }
            client
        });
        let mut buf = [0u8; 4];
        s.read_exact(&mut buf).await.expect("a byte every 4 s keeps a 5 s deadline");
        let _client = feeder.await.unwrap();
        s.arm();
        // Nobody reads: the 16-byte pipe fills and the write stalls.
        let e = s.write_all(&[0u8; 1024]).await.unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::TimedOut);
    }
}
