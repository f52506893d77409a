//! Cairn's client: open a dataset with the engine `cairn.toml` names, write steps of named n-D
//! arrays, read any box of any committed step. The C and Python bindings are thin layers over it.
//!
//! # Layout
//! - [`config`]: `cairn.toml`, `$CAIRN_CONFIG` and keyword overrides.
//! - [`writer`]: [`Writer`], one rank's handle; checks every request before an engine sees it.
//! - [`reader`]: [`Reader`], box reads assembled from intersecting blocks (M×N).
//! - [`session`]: the writer session when the caller names none (environment, launcher, random).
//! - [`subtx`]: sub-transactions: puts of a step that could not be stored, which keep it open.
//! - [`engine`]: the traits engines implement; `names`: the checks of dataset and variable names.
//! - [`file`]: the `file` engine (per-writer data files, atomically published step indexes).
//! - [`staging`]: the `staging` engine (objects in staging servers' memory, commits through the control plane).
//! - `trace`: the writer's trace buffer (per-process records written every `trace_flush` steps).
//! - [`halt`]: whether the job asks the application to stop (halt file, time limit).
//! - [`claims`], [`stream`]: D²T claimers and releasing stream readers, each kept alive by a `heartbeat` thread.

pub mod claims;
pub mod config;
pub mod engine;
pub mod file;
pub mod halt;
mod heartbeat;
mod names;
pub mod reader;
pub mod session;
pub mod small;
pub mod staging;
pub mod stream;
pub mod subtx;
mod trace;
pub mod writer;

pub use cairn_core::{DType, Error, ErrorKind, Region, Result};
pub use config::Config;
pub use reader::Reader;
pub use writer::Writer;
