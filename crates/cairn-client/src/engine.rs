//! The engine interface: what the file and staging engines implement. The [`crate::Writer`] and
//! [`crate::Reader`] in front of them do all argument checking, so engines see only valid requests.

use cairn_core::attrs::Attrs;
use cairn_core::index::{BlockRecord, StepIndex, VarDef};
use cairn_core::{Error, Region, Result};
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

pub use cairn_file::block::BlockData;

/// What a writer publishes with its blocks at the end of a step.
#[derive(Debug, Clone, Default)]
pub struct StepPart {
    /// Its variable definitions.
    pub defs: Vec<VarDef>,
    /// The dataset attributes it set.
    pub attrs: Attrs,
    /// Datasets whose same step the step's commit releases.
    pub consume: Vec<String>,
}

/// What became of a step a writer session ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StepOutcome {
    /// Every rank ended it and it committed.
    Committed,
    /// Not every rank ended it yet.
    Pending,
    /// It will never commit, for this reason (a failed seal, a rank's abort).
    Aborted(String),
    /// No record of the session's step: never ended, or aborted long ago.
    Unknown,
}

/// The writing side of an engine, for one writer rank.
pub trait WriteEngine: Send {
    /// The index of the last committed step, if any: its definitions keep later ones consistent,
    /// and a restarted writer takes its definitions and attributes over.
    fn last_index(&self) -> Result<Option<StepIndex>>;
    /// Definition of a variable in steps already committed, to keep later definitions consistent.
    fn committed_def(&self, name: &str) -> Result<Option<VarDef>> {
        Ok(self.last_index()?.and_then(|i| i.vars.get(name).cloned()))
    }
    /// Whether a step is already committed (and so may not be written again).
    fn is_committed(&self, step: u64) -> Result<bool>;
    /// The oldest committed step holding blocks of `var` (where a constant was written).
    fn written_in(&self, var: &str) -> Result<Option<u64>>;
    /// Stores one block of an unpublished step.
    fn put(&mut self, step: u64, block: BlockData<'_>) -> Result<()> {
        self.put_batch(vec![(step, block)])
    }
    /// Whether small blocks are better sent together (see [`crate::small`]) than one by one.
    fn coalesces_small_puts(&self) -> bool {
        false
    }
    /// Refuses at once a block this engine could never store (a redundancy level the cluster
    /// cannot give), so that a coalesced put still fails at the put.
    fn admits(&self, _def: &VarDef) -> Result<()> {
        Ok(())
    }
    /// Stores blocks of one or more unpublished steps as one write (the file engine appends them
    /// with one call, the staging engine pipelines them to each server); a buffered trace flush
    /// uses this. On error none of them is recorded.
    fn put_batch(&mut self, blocks: Vec<(u64, BlockData<'_>)>) -> Result<()>;
    /// Publishes this writer's part of `step` (its blocks, with `part`'s definitions and dataset
    /// attributes); the step commits once every rank has, and its commit releases step `step` of
    /// each dataset in `part.consume` with it (one transaction). Returns whether this call
    /// committed it. Several steps may be unpublished at once (steps held for a trace flush);
    /// they are published in order.
    fn end_step(&mut self, step: u64, part: &StepPart) -> Result<bool>;
    /// Publishes the parts of several steps in order, as [`WriteEngine::end_step`] one after
    /// another would (the steps a trace flush held); the collective file writer ends them all in
    /// one exchange. Returns whether this call committed each step ended, and the error that
    /// stopped the others (which stay unpublished, for a retry).
    fn end_steps(&mut self, steps: &[(u64, &StepPart)]) -> (Vec<bool>, Option<Error>) {
        let mut ended = Vec::with_capacity(steps.len());
        for (step, part) in steps {
            match self.end_step(*step, part) {
                Ok(committed) => ended.push(committed),
                Err(e) => return (ended, Some(e)),
            }
        }
        (ended, None)
    }
    /// Records that this rank closed the dataset; once every rank did, streams and claims of it
    /// end after its last step.
    fn close(&mut self) -> Result<()> {
        Ok(())
    }
    /// Drops what this writer put in an unpublished step; the step stays invisible.
    fn abort_step(&mut self, step: u64) -> Result<()>;
    /// What became of `step` as this writer session ended it (the file engine, whose ranks
    /// cannot abort each other's steps, knows committed or not yet).
    fn outcome(&self, step: u64) -> Result<StepOutcome> {
        Ok(if self.is_committed(step)? { StepOutcome::Committed } else { StepOutcome::Pending })
    }
    /// Redundancy level of variables that do not name one.
    fn default_redundancy(&self) -> u32 {
        0
    }
    /// Servers that refused or did not answer the last failed put (none for files).
    fn failed_servers(&self) -> Vec<u32> {
        Vec::new()
    }
    /// Agrees with the other ranks of this writer session on `mine` under `key`: the first rank
    /// to ask fixes the answer every rank gets (staging: a compare-and-set in the control plane;
    /// `file`: a file created exclusively in the dataset's folder).
    fn agree(&self, key: &str, mine: bool) -> Result<bool>;
    /// Waits until `step` (default: the newest committed step; a staging writer asks the drain
    /// for it whatever the cadence) is drained to disk; see [`ReadEngine::wait_drained`].
    fn wait_drained(&self, _step: Option<u64>, _timeout: Option<Duration>) -> Result<bool> {
        Ok(true)
    }
    /// Sets the dataset's queue limit (committed steps not yet released; 0: none) and its
    /// policy, "block" or "discard_oldest". The file engine keeps every step: nothing to do.
    fn define_queue(&mut self, _limit: u64, _policy: cairn_core::queue::Policy) -> Result<()> {
        Ok(())
    }
    /// Under a `block` queue, waits until it has room (a capacity error at the timeout).
    fn wait_queue(&self) -> Result<()> {
        Ok(())
    }
}

/// The reading side of an engine.
pub trait ReadEngine: Send + Sync {
    /// Committed steps, sorted.
    fn steps(&self) -> Result<Vec<u64>>;
    /// Variables of a committed step.
    fn step_vars(&self, step: u64) -> Result<BTreeMap<String, VarDef>>;
    /// Attributes of the dataset as of a committed step.
    fn step_attrs(&self, step: u64) -> Result<Attrs>;
    /// Blocks of a variable in a committed step.
    fn blocks(&self, var: &str, step: u64) -> Result<Vec<BlockRecord>>;
    /// Copies `isect` of `block` (of `step`) into `out`, which is laid out as `dst`.
    fn read_into(&self, step: u64, block: &BlockRecord, elem: usize, isect: &Region, dst: &Region, out: &mut [u8]) -> Result<()>;
    /// Waits until `step` is committed or `timeout` passes; returns whether it is.
    fn wait_step(&self, step: u64, timeout: Duration) -> Result<bool> {
        let deadline = Instant::now() + timeout;
        loop {
            if self.steps()?.contains(&step) {
                return Ok(true);
            }
            if Instant::now() >= deadline {
                return Ok(false);
            }
            std::thread::sleep(Duration::from_millis(20).min(deadline - Instant::now()));
        }
    }

    /// Forgets what is cached of a committed step's index (objects may have been encoded since).
    fn forget(&self, _step: u64) {}

    /// Servers the cluster records as down (their copies are gone); none for files.
    fn down_servers(&self) -> Vec<u32> {
        Vec::new()
    }

    /// Frees a committed step (its data is gone for every reader).
    fn release(&self, step: u64) -> Result<()>;

    /// Steps some writers ended but that are not committed yet: each with the number of ranks
    /// that ended it and the number it waits for.
    fn pending(&self) -> Result<Vec<(u64, u32, u32)>>;

    /// Committed steps, and whether the writers closed the dataset (no more steps come).
    fn listing(&self) -> Result<(Vec<u64>, bool)> {
        Ok((self.steps()?, false))
    }

    /// Leases the lowest committed step no live claimer holds to `claimer` for `lease`; returns
    /// it, and whether nothing will ever be free for this claimer (see [`crate::Reader::claim`]).
    fn claim(&self, claimer: &str, lease: Duration) -> Result<(Option<u64>, bool)>;

    /// Extends `claimer`'s leases; returns the steps it still holds.
    fn renew(&self, claimer: &str, lease: Duration) -> Result<Vec<u64>>;

    /// Gives back every step `claimer` holds.
    fn unclaim(&self, claimer: &str) -> Result<()>;

    /// Waits until `step` (default: the newest committed step the drain's cadence names) is
    /// on disk: true once it is, false at the timeout (none: no limit); the drain's error if it
    /// failed. A file engine's committed steps are on disk already.
    fn wait_drained(&self, _step: Option<u64>, _timeout: Option<Duration>) -> Result<bool> {
        Ok(true)
    }

    /// What a reader should add to "step not committed" errors (a stopped cluster's note of the
    /// steps its drain kept), if anything.
    fn note(&self) -> Option<&str> {
        None
    }

    /// Removes the dataset whole from the staging cluster (`cairn rm`): every committed step and
    /// what the control plane knows of it; returns how many committed steps it had. The file
    /// engine's dataset is a folder: remove that.
    fn remove(&self) -> Result<u64> {
        Err(Error::InvalidArgument("a file-engine dataset is its folder: remove that (`cairn rm PATH`)".into()))
    }

    /// Discards the committed steps from `from` on, on every level (see
    /// [`crate::Reader::discard_from`]); returns how many committed steps went.
    fn discard_from(&self, from: u64) -> Result<u64>;

    /// Registers streaming reader `reader`, moves it to `next` (the first step it has not
    /// passed), renews it (`next` none) or, with `leave`, ends its registration; returns how
    /// long a registration lasts unrenewed and the reader's mark (the first step it holds; none
    /// once it left). The file engine keeps every step: nothing to do.
    fn stream_at(&self, _reader: &str, next: Option<u64>, _leave: bool) -> Result<(Duration, Option<u64>)> {
        Ok((Duration::from_secs(10), next))
    }
}
