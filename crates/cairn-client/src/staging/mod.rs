//! The `staging` engine: blocks go to staging servers that hold them in memory; a step commits
//! through the control plane (its Raft leader) when every writer has ended it and every server holding
//! its objects has sealed them. [`local`] starts and stops clusters of server processes.

mod admin;
mod conn;
mod control;
mod kv;
mod levels;
pub mod local;
mod owned;
mod queue;
mod reader;
mod shm;
mod stopped;
mod writer;

pub use admin::{add_servers, admin_request, replace_server, retire_server};
pub use kv::KvStore;
pub use reader::StagingReader;
pub use writer::StagingWriter;

use crate::config::StagingConfig;
use cairn_core::Result;

/// A reader of `dataset` in the cluster `cfg` names: from memory, and from the drained copy of
/// the steps when the cluster drains to disk.
pub(crate) fn reader(cfg: &StagingConfig, dataset: &str) -> Result<Box<dyn crate::engine::ReadEngine>> {
    if let Some(stopped) = cfg.cluster.as_deref().and_then(cairn_proto::cluster::StoppedFile::load) {
        return stopped::reader(cfg.cluster.as_deref().unwrap_or(std::path::Path::new("")), stopped, dataset);
    }
    let c = control::cluster(cfg)?;
    let drain = c.drain().map(|d| crate::file::Layout::new(&d.path, dataset));
    let id = c.id();
    let memory = StagingReader::open(c, dataset);
    Ok(match (drain, &cfg.cluster) {
        (Some(layout), Some(file)) => Box::new(levels::Levels::new(memory, layout, file.clone(), id)),
        _ => Box::new(memory),
    })
}
