//! Cairn's pure logic, with no I/O: everything the engines (file, staging) and the bindings share.
//!
//! A simulation writes *blocks* (a box of a named variable at one step); readers ask for any box and
//! Cairn assembles it from the intersecting blocks. This crate owns the vocabulary and the math.
//!
//! # Layout
//! - [`dtype`]: element types and their names (`f8`, `i4`, …), parsing of user spellings.
//! - [`region`]: n-D boxes (`offset + count`), intersection, bounds checks, overlap detection.
//! - [`assemble`]: copying a sub-box between two C-order buffers (the M×N redistribution kernel).
//! - [`partition`]: splitting blocks into objects of a target size (CoREC Algorithm 1).
//! - [`placement`]: the server ring ordered by failure domain, and where each object goes.
//! - [`stats`]: per-block min/max/mean, computed while data is written.
//! - [`codec`]: the compression pipeline (pco for numbers, zstd/gzip for bytes) chosen by element type.
//! - [`erasure`]: the Reed–Solomon code of encoded (cold) objects: parity, shards, decode.
//! - [`checksum`]: crc32c per fixed-size chunk, so partial reads verify exactly what they return.
//! - [`attrs`]: dimension names and attributes of variables and datasets, checked and merged.
//! - [`index`]: variable definitions, block records and the committed step index (the on-disk schema).
//! - [`index_file`]: the bytes of a committed step index: format 2 (binary, crcs apart) written, format 1 (JSON) read.
//! - [`queue`]: a dataset's queue policy (backpressure with streaming readers).
//! - [`error`]: the crate's error type and the small public set of error kinds.

pub mod assemble;
pub mod attrs;
pub mod checksum;
pub mod codec;
pub mod corec;
pub mod dtype;
pub mod erasure;
pub mod error;
pub mod index;
pub mod index_file;
pub mod partition;
pub mod placement;
pub mod queue;
pub mod region;
pub mod stats;

pub use dtype::DType;
pub use error::{Error, ErrorKind, Reason, Result};
pub use region::{Region, MAX_DIMS};
