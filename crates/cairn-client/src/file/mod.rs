//! The `file` engine: each writer appends its blocks to its own data file and publishes a fragment
//! of the step index when it ends a step; whichever writer completes the set merges the fragments
//! into `steps/<step>.json` with one hard link (atomic, and never replacing a committed step),
//! which is the commit point. No servers, N→N. With an MPI communicator, groups of ranks share a
//! data file and rank 0 merges fragments gathered over MPI (N→M, `aggregate`).
//! Claims of committed steps are lease files (`lease`); consume-and-produce commits a step and
//! releases it in its sources as one transaction (`consume`).
//! A staging step is written out as a file-engine step by `drain` (multi-level checkpoints).
//! Layout and format: `docs/format.md`.

mod aggregate;
mod claim;
mod consume;
mod lease;
mod reader;
mod writer;

pub use aggregate::{AggWriter, Collective, Exchange, Groups, Received};
pub use cairn_file::drain::foreign_steps;
pub use cairn_file::layout::Layout;
pub use reader::FileReader;
pub use writer::FileWriter;
