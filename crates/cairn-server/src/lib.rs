//! Cairn's staging server: a tokio daemon that holds objects in memory under a memory limit and
//! coordinates atomic step commits for the datasets placed on it. `cairn serve` runs one.
//!
//! # Layout
//! - [`serve`]: starting a server process and meeting the others through the cluster file.
//! - [`server`]: `run(listeners, shutdown)`: the accept loop (TCP and Unix socket) and the
//!   connection bounds (unauthenticated connections evict each other; authenticated ones are counted).
//! - [`handler`]: one connection: challenge and hello, then framed requests in order.
//! - [`deadline`]: the progress deadline on a connection's reads and writes.
//! - [`views`]: cluster views as entries of the control plane's log, and how servers learn them.
//! - [`control`]: this server's replica of the control plane (meta servers), and Raft's
//!   transport over the staging protocol.
//! - [`cmd`]: one module per kind of request.
//! - [`cma`]: same-node copies straight between a local client's memory and object buffers.
//! - [`store`]: objects with memory accounting.
//! - [`kv`]: keyed values and sets (the task store of `cairn.tasks`).
//! - [`meta`]: the coordinator's side of commits, as commands of the control plane's log
//!   (`cairn-meta`).
//! - [`peer`]: calls to other servers (seal, drop).
//! - [`rehome`]: keyed values copied to the servers a view change adds to their groups.
//! - [`state`]: what all connections share: limits, the cluster view, the stores.
//! - [`testing`]: a cluster of servers in one process that tests kill and restart.

pub mod cma;
pub mod cmd;
pub mod control;
pub mod corec;
pub mod deadline;
pub mod detect;
pub mod encode;
pub mod handler;
pub mod kv;
pub mod meta;
pub mod peer;
pub mod recover;
pub mod rehome;
pub mod segment;
pub mod serve;
pub mod server;
pub mod state;
pub mod store;
pub mod testing;
pub mod views;

pub use serve::{serve, ServeOptions};
pub use server::{run, Listeners};
pub use state::Limits;
