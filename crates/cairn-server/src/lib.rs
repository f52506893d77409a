//! Cairn's staging server: a tokio daemon that holds objects in memory under a memory limit and
//! coordinates atomic step commits for the datasets placed on it. `cairn serve` runs one.
//!
//! # Layout
//! - [`serve`]: starting a server and meeting the others through the cluster file.
//! - [`server`]: the accept loop (TCP and Unix socket) and the connection limit.
//! - [`handler`]: one connection: hello with the secret, then framed requests in order.
//! - [`cmd`]: one module per kind of request.
//! - [`store`]: objects with memory accounting.
//! - [`kv`]: keyed values and sets (the task store of `cairn.tasks`).
//! - [`meta`]: the coordinator's fragments and committed step indexes.
//! - [`peer`]: calls to other servers (seal, drop).
//! - [`state`]: what all connections share.

pub mod cmd;
pub mod handler;
pub mod kv;
pub mod meta;
pub mod peer;
pub mod serve;
pub mod server;
pub mod state;
pub mod store;

pub use serve::{serve, ServeOptions};
