//! Idle, authenticated connections to other servers, kept for the next call ([`crate::peer`]).

use crate::sync::lock;
use std::collections::HashMap;
use std::sync::Mutex;
use tokio::net::TcpStream;

/// Idle connections kept per peer.
const POOLED_PER_PEER: usize = 8;

/// Idle connections to other servers, by server id.
#[derive(Debug, Default)]
pub struct Peers {
    idle: Mutex<HashMap<u32, Vec<TcpStream>>>,
}

impl Peers {
    /// An idle connection to server `to`, if one is kept.
    pub fn take(&self, to: u32) -> Option<TcpStream> {
        lock(&self.idle).get_mut(&to).and_then(Vec::pop)
    }

    /// Keeps a connection to server `to` that completed its exchange, unless enough are kept.
    pub fn give_back(&self, to: u32, s: TcpStream) {
        let mut idle = lock(&self.idle);
        let v = idle.entry(to).or_default();
        if v.len() < POOLED_PER_PEER {
            v.push(s);
        }
    }
}
