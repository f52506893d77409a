//! Cairn's staging server: a tokio daemon that holds objects in memory under a memory limit and
//! coordinates atomic step commits for the datasets placed on it. `cairn serve` runs one.
//!
//! # Layout
//! Three layers, each importing only from those below it (`make test` checks this with
//! `cargo run -p cairn-layers`, from the parsed sources and `layers.toml`):
//!
//! 1. Requests and connections, on top:
//!    - [`serve`]: starting a server process and meeting the others through the cluster file;
//!      [`settings`]: its settings, from flags and the `[staging]` table, parsed in one place.
//!    - [`server`]: `run(control, listeners, shutdown)`: the accept loop (TCP and Unix socket),
//!      authenticated connections counted; [`admission`]: unauthenticated connections evict
//!      each other.
//!    - [`handler`]: one connection: challenge and hello (a client, or a peer server), then
//!      framed requests in order.
//!    - [`cmd`]: one module per family of requests, each with its `check` and `apply`.
//! 2. The control plane's services, [`control`]: the Raft replica and leadership gate, the
//!    commit coordinator, the CoREC encoder, recovery, failure detection, view changes; each
//!    handed only what it uses.
//! 3. The data plane, at the bottom:
//!    - [`state`]: what all connections share: limits, the cluster view, the stores, counters.
//!    - [`store`]: objects with memory accounting; [`segment`]: their memory, heap or shared;
//!      [`kv`]: keyed values and sets (the task store of `cairn.tasks`).
//!    - [`objects`]: storing, sealing and dropping objects by request; [`encode`] and
//!      [`rebuild`]: the holders' side of CoREC encoding and of recovery; [`drainer`]: each
//!      server's part of the drain to disk, its blocks whole from [`gather`]ed pieces.
//!    - [`prefault`]: shared segments made ahead, so a fresh server's first steps run warm.
//!    - [`local`] and [`cma`]: same-node clients, their leases and copies straight between their
//!      memory and object buffers.
//!    - [`peer`]: calls to other servers, over [`pool`]ed connections; [`deadline`]: the progress deadline on a connection;
//!      [`reply`]: what a request produces; [`sync`]: locks that outlive a panic;
//!      [`failpoint`]: the tests' fail points (`CAIRN_FAILPOINTS`, `failpoints` feature).
//!
//! Tests of this and other crates run servers in one process with `cairn-testing`, which uses
//! only this public API.

pub mod admission;
pub mod cma;
pub mod cmd;
pub mod control;
pub mod deadline;
pub mod drainer;
pub mod encode;
pub mod failpoint;
pub mod gather;
pub mod handler;
pub mod kv;
pub mod local;
pub mod logging;
pub mod metrics;
pub mod objects;
pub mod peer;
pub mod pool;
pub mod prefault;
pub mod rebuild;
pub mod reply;
pub mod segment;
pub mod serve;
pub mod server;
pub mod settings;
pub mod state;
pub mod stats;
pub mod store;
pub mod sync;

pub use serve::serve;
pub use server::{run, Listeners};
pub use settings::ServeOptions;
pub use state::Limits;
