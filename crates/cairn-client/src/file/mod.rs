//! The `file` engine: each writer appends its blocks to its own data file and publishes a fragment
//! of the step index when it ends a step; whichever writer completes the set merges the fragments
//! into `steps/<step>.json` with one atomic rename, which is the commit point. No servers, N→N.
//! Layout and format: `docs/format.md`.

mod claim;
mod layout;
mod reader;
mod writer;

pub use layout::Layout;
pub use reader::FileReader;
pub use writer::FileWriter;
