//! Which drained steps of a dataset are a cluster's to serve when no server of it answers:
//! its own (they carry its id), and another run's only as the history before it (below the owner
//! record's `first_step` when the record is this cluster's; without a record, below this
//! cluster's oldest drained step). Any other is refused (`ForeignDrain`, naming both clusters).

use crate::file::Layout;
use cairn_core::{Error, Result};
use std::sync::OnceLock;

/// The ownership rules of one cluster's dataset in its drain folder.
pub(crate) struct Owned {
    layout: Layout,
    /// The cluster's id, which its drained steps carry.
    id: String,
    /// This cluster's oldest drained step, looked up once.
    first_mine: OnceLock<Option<u64>>,
}

impl Owned {
    pub(crate) fn new(layout: Layout, id: String) -> Owned {
        Owned { layout, id, first_mine: OnceLock::new() }
    }

    /// Whether drained `step` carries this cluster's identity.
    pub(crate) fn mine(&self, step: u64) -> Result<bool> {
        Ok(self.layout.read_step_meta(step)?.staged.is_some_and(|s| s.cluster == self.id))
    }

    /// Whether another cluster's drained `step`, which this cluster never had, may be served:
    /// by the owner record, history below the step this cluster wrote first (`None`: no record).
    pub(crate) fn history(&self, step: u64) -> Result<Option<bool>> {
        Ok(cairn_file::owner::read(&self.layout)?.map(|o| o.cluster == self.id && step < o.first_step))
    }

    /// The refusal of another cluster's `step` this one may not serve.
    pub(crate) fn foreign(&self, step: u64) -> Error {
        let whose = self.layout.read_step_meta(step).ok().and_then(|i| i.staged).map_or_else(|| "no cluster's".into(), |s| s.cluster);
        let owner = cairn_file::owner::read(&self.layout).ok().flatten().map_or_else(|| "none".into(), |o| o.cluster);
        Error::ForeignDrain(format!(
            "step {step} drained to {} is cluster {whose}'s (another run's), not this cluster {}'s; the dataset's owner record \
             names cluster {owner}: two runs wrote this name into one drain folder. Read that run's steps with \
             `cairn.open(name, \"r\", path=DRAIN)`, or remove the dataset with `cairn rm {} --cluster FILE --all`",
            self.layout.root.display(),
            self.id,
            self.layout.name()
        ))
    }

    /// Whether drained `step` may be served with no server answering: this cluster's, or
    /// history from before this cluster's first drained step (by the owner record, where one is).
    pub(crate) fn servable_alone(&self, step: u64) -> Result<bool> {
        if self.mine(step)? {
            return Ok(true);
        }
        if let Some(ok) = self.history(step)? {
            return Ok(ok);
        }
        let first = match self.first_mine.get() {
            Some(f) => *f,
            None => {
                let mut first = None;
                for s in self.layout.steps()? {
                    if self.mine(s)? {
                        first = Some(s);
                        break;
                    }
                }
                *self.first_mine.get_or_init(|| first)
            }
        };
        Ok(first.is_none_or(|f| step < f))
    }
}
