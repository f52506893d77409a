//! A dataset's queue policy (backpressure between its writers and streaming readers): named by
//! writers and configuration in the client, applied by the control plane (`cairn_meta::queue`).

use serde::{Deserialize, Serialize};

/// What happens when a dataset's queue is full.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Policy {
    /// The writers' next step waits until a step is released.
    Block,
    /// The oldest committed step is released (readers that had not read it miss it).
    DiscardOldest,
}

impl Policy {
    /// Parses "block" or "discard_oldest".
    pub fn parse(s: &str) -> crate::Result<Policy> {
        match s {
            "block" => Ok(Policy::Block),
            "discard_oldest" => Ok(Policy::DiscardOldest),
            other => Err(crate::Error::InvalidArgument(format!(
                "queue policy {other:?}: use \"block\" (writers wait) or \"discard_oldest\" (the oldest step is released)"
            ))),
        }
    }

    /// Its name, as [`Policy::parse`] takes it.
    pub fn name(self) -> &'static str {
        match self {
            Policy::Block => "block",
            Policy::DiscardOldest => "discard_oldest",
        }
    }
}
