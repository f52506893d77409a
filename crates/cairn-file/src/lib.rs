//! Cairn's on-disk format (docs/format.md), the one crate that writes it: the `file` engine
//! (`cairn-client`) and the servers' drain (`cairn-server`) both build on it, so neither depends
//! on the other.
//!
//! Layers, lowest first: [`beneath`] (opening below a drain folder, no symlinks, own uid) →
//! [`layout`] (a dataset's paths, atomic publication, index reads) → [`block`] (a block's record
//! and stored bytes) → [`drain`] (a committed staging step written out as a file-engine step);
//! [`owner`] (which cluster writes a drained dataset) beside it.

pub mod beneath;
pub mod block;
pub mod drain;
pub mod layout;
pub mod owner;
