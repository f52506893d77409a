//! Cairn's wire protocol (spec: `docs/protocol.md`). Every message is a frame:
//!
//! ```text
//! magic "CRN3" | header length u32 LE | payload length u64 LE | header (JSON) | payload (raw bytes)
//! ```
//!
//! Headers are small serde messages ([`Request`], [`Response`]); array bytes travel as the raw
//! payload, written from and read into the caller's buffers, never re-encoded. Every length read
//! from the network is bounded before anything is allocated.
//!
//! # Layout
//! - [`auth`]: the secret and the challenge–response hello.
//! - [`cluster`]: the cluster file through which clients and servers meet; sizes and topology files.
//! - [`view`]: the cluster view (ring slots, spares, epoch) everyone places by.
//! - [`frame`]: the prefix, bounds, encoding and decoding of one frame (pure; fuzzed).
//! - [`message`]: requests by audience (clients' [`Request`]; servers' [`PeerRequest`] and
//!   [`RaftRequest`], only on connections whose hello says [`Role::Peer`]) and responses, whose
//!   errors carry a typed [`cairn_core::Reason`] where callers act on them.
//! - [`health`]: a cluster's health, its state and reasons.
//! - [`batch`]: how keyed values are cut into `kv_put` requests.
//! - [`shm`]: mappings of same-node shared segments, on huge-page boundaries.
//! - [`sync_io`]: blocking frame I/O over `Read`/`Write` (clients).
//! - `async_io` (feature `tokio`): the same over tokio streams (servers).

#[cfg(feature = "tokio")]
pub mod async_io;
pub mod auth;
pub mod batch;
pub mod cluster;
pub mod frame;
pub mod health;
pub mod message;
pub mod shm;
pub mod sync_io;
pub mod unix;
pub mod view;

pub use frame::{Prefix, MAX_HEADER, MAX_HELLO, PREFIX_LEN};
pub use message::{Envelope, PeerRequest, RaftRequest, Request, Response, Role, ServerRequest};
pub use view::ClusterView;
