//! D²T claimers: any number of processes share a dataset's committed steps, each step leased to
//! one claimer at a time, lowest first. A heartbeat renews this claimer's leases every third of
//! the lease while it lives (a missed beat or two, a server failing over, still leaves them
//! alive); one that dies (SIGKILL) or hangs loses them after the lease and another claimer gets
//! its steps. A claimed step is consumed by committing a result that releases it in the same
//! transaction ([`crate::Writer::consume`]). Python's `Reader.claims` and C's `cairn_claims_*` are
//! this.

use crate::heartbeat::Heartbeat;
use crate::Reader;
use cairn_core::{Error, Result};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Leases from a millisecond to a day, in seconds.
pub const LEASE_RANGE: (f64, f64) = (0.001, 86_400.0);

/// Longest pause between two asks for a step while none is free.
const MAX_PAUSE: Duration = Duration::from_millis(200);

/// One claimer of a dataset's steps.
pub struct Claimer {
    reader: Arc<Reader>,
    id: String,
    lease: Duration,
    beat: Heartbeat,
    ended: bool,
}

impl Claimer {
    /// A new claimer on `reader` whose leases last `lease` without renewal (see [`LEASE_RANGE`]).
    pub fn start(reader: Arc<Reader>, lease: Duration) -> Result<Claimer> {
        let (lo, hi) = LEASE_RANGE;
        if !(lo..=hi).contains(&lease.as_secs_f64()) {
            return Err(Error::InvalidArgument(format!(
                "lease {:.3} s: give the seconds a claim lasts without renewal, from {lo} to {hi} (a day); the heartbeat \
                 renews it every third of that",
                lease.as_secs_f64()
            )));
        }
        let id = crate::session::random_session();
        let beat = {
            let (reader, id) = (reader.clone(), id.clone());
            // A missed beat is retried at the next; a lease that lapses meanwhile is handed on.
            Heartbeat::start("cairn-claims", lease / 3, move || {
                let _ = reader.renew(&id, lease);
            })?
        };
        Ok(Claimer { reader, id, lease, beat, ended: false })
    }

    /// The next step leased to this claimer, lowest first; `None` once the writers closed the
    /// dataset and nothing is left for it, when no step came for `timeout` (`None`: no limit), or
    /// when `interrupted` (asked between pauses) says so.
    pub fn next(&self, timeout: Option<Duration>, interrupted: &mut dyn FnMut() -> bool) -> Result<Option<u64>> {
        let deadline = timeout.map(|t| Instant::now() + t.min(Duration::from_secs(1 << 30)));
        let mut pause = Duration::from_millis(10);
        loop {
            let (step, done) = self.reader.claim(&self.id, self.lease)?;
            if step.is_some() {
                return Ok(step);
            }
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            if done || left == Some(Duration::ZERO) || interrupted() {
                return Ok(None);
            }
            std::thread::sleep(left.map_or(pause, |l| l.min(pause)));
            pause = (pause * 2).min(MAX_PAUSE);
        }
    }

    /// Ends the claimer: its heartbeat stops and the steps it holds and did not consume go back
    /// to the others (on a failure here, its unrenewed leases lapse by themselves).
    pub fn end(mut self) -> Result<()> {
        self.finish()
    }

    fn finish(&mut self) -> Result<()> {
        if std::mem::replace(&mut self.ended, true) {
            return Ok(());
        }
        self.beat.stop();
        self.reader.unclaim(&self.id)
    }
}

impl Drop for Claimer {
    fn drop(&mut self) {
        let _ = self.finish();
    }
}
