//! Streaming readers that release what they passed (Python's `Reader.stream(release=True)`): the
//! reader registers on the dataset (with the writers' `define_queue`, backpressure); a step is
//! released once every registered reader has passed it. A heartbeat renews the registration
//! while the reader lives; one that dies or hangs is dropped after the staging `timeout`, and one
//! that comes back (SIGCONT) is registered again at the oldest kept step and goes on from there.

use crate::heartbeat::Heartbeat;
use crate::Reader;
use cairn_core::Result;
use std::sync::Arc;

/// A streaming reader's registration on a dataset, ended by [`Registration::leave`] or on drop.
pub struct Registration {
    reader: Arc<Reader>,
    id: String,
    beat: Heartbeat,
    start: Option<u64>,
    left: bool,
}

impl Registration {
    /// Registers a new streaming reader of `reader`'s dataset at `start` (`None`: the oldest
    /// kept step).
    pub fn join(reader: Arc<Reader>, start: Option<u64>) -> Result<Registration> {
        let id = crate::session::random_session();
        // The registration's lifetime unrenewed, and the first step it holds.
        let (lease, mark) = reader.stream_at(&id, start, false)?;
        let beat = {
            let (reader, id) = (reader.clone(), id.clone());
            // A failed beat is retried at the next.
            Heartbeat::start("cairn-stream", lease / 3, move || {
                let _ = reader.stream_at(&id, None, false);
            })?
        };
        // The stream starts at the mark, never below it, so it never yields a step another
        // reader may release; steps from `start` to the mark were released before it joined.
        let start = match (start, mark) {
            (s, None) => s,
            (None, m) => m,
            (Some(s), Some(m)) => Some(s.max(m)),
        };
        Ok(Registration { reader, id, beat, start, left: false })
    }

    /// The first step this reader holds (its stream starts there).
    pub fn start(&self) -> Option<u64> {
        self.start
    }

    /// Marks `step` passed: it may be released once every registered reader passed it. A
    /// failure (a leader changing) is left to the next step's mark, which moves it as far.
    pub fn passed(&self, step: u64) {
        let _ = self.reader.stream_at(&self.id, Some(step + 1), false);
    }

    /// Ends the registration: what this reader held no longer waits for it (on a failure here,
    /// the registration lapses unrenewed).
    pub fn leave(&mut self) {
        if std::mem::replace(&mut self.left, true) {
            return;
        }
        self.beat.stop();
        let _ = self.reader.stream_at(&self.id, None, true);
    }
}

impl Drop for Registration {
    fn drop(&mut self) {
        self.leave();
    }
}
