//! The file engine's N→M path, for writers that share an MPI communicator: ranks form groups
//! (one per node by default), and each group's aggregator writes the group's blocks into one data
//! file per session; fragments travel up a binomial tree of aggregators to rank 0, which merges
//! them and commits the step index with one no-replace link. A step then costs O(M) file-system
//! operations instead of O(N): mcrEngine's N→M aggregation and ADIOS2 BP5's aggregators with
//! gathered metadata. Messages go through an [`Exchange`] the caller supplies (mpi4py in Python);
//! `end_step` is collective: every rank of the communicator calls it, and it returns once the
//! step is committed (or with the same error on every rank). The steps a trace flush held end in
//! one exchange (`end_steps`): one message up and one down per rank, one flush of each group's
//! file, then rank 0 commits them in order. Ranks may group their steps differently (one holds
//! steps for its trace records while another, with none, ends each at once), but all end the
//! same steps in the same order: each exchange commits the steps every rank sent (the common
//! prefix of their lists), and a rank with more goes on with the rest.

use super::writer::commit_index;
use super::{claim, consume};
use crate::config::FileConfig;
use crate::engine::{BlockData, StepPart, WriteEngine};
use cairn_core::codec::Policy;
use cairn_core::error::IoContext;
use cairn_core::index::{BlockRecord, Fragment, StepIndex};
use cairn_core::{Error, ErrorKind, Result};
use cairn_file::block::{encode, stored_len};
use cairn_file::layout::Layout;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;

/// Point-to-point messages between the ranks of one job (an MPI communicator). Messages from
/// one rank to another arrive in the order they were sent.
pub trait Exchange: Send {
    /// Sends `data` to rank `dest`; returns once `data` may be reused.
    fn send(&self, dest: u32, data: &[u8]) -> Result<()>;
    /// Receives the next message rank `src` sent to this rank.
    fn recv(&self, src: u32) -> Result<Received>;
    /// Sets this rank's offset counter to `at`, then waits until every rank did (collective);
    /// returns whether every rank passed `ok`.
    fn start(&self, at: u64, ok: bool) -> Result<bool>;
    /// Atomically adds `len` to rank `owner`'s offset counter and returns its value before,
    /// without `owner` taking part (MPI one-sided fetch-and-add).
    fn reserve(&self, owner: u32, len: u64) -> Result<u64>;
}

/// A received message (held without copying where the exchange allows).
pub type Received = Box<dyn AsRef<[u8]> + Send>;

/// What a writer needs to aggregate: the exchange, and the node of every rank.
pub struct Collective {
    /// Messages between ranks.
    pub exchange: Box<dyn Exchange>,
    /// An id of each rank's node (ranks sharing memory share it), indexed by rank.
    pub nodes: Vec<u32>,
}

impl std::fmt::Debug for Collective {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Collective").field("nodes", &self.nodes.len()).finish()
    }
}

/// How a group's blocks reach its data file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Mode {
    /// Members send their blocks to the aggregator, which writes them.
    Send,
    /// Each rank reserves room in the group's file at every put (a fetch-and-add on the
    /// aggregator's counter) and writes its blocks there at once: no copy, no data messages.
    Offsets,
}

/// Which rank aggregates for which, and the tree over the aggregators.
#[derive(Debug, Clone, PartialEq)]
pub struct Groups {
    /// The aggregator of each rank (the lowest rank of its group).
    agg_of: Vec<u32>,
    /// The aggregators, ascending (rank 0 first: it is the lowest rank of its group).
    aggs: Vec<u32>,
}

impl Groups {
    /// `count` groups of consecutive ranks, or with `count` 0 one group per node of `nodes`.
    pub fn new(nodes: &[u32], count: u32) -> Groups {
        let n = nodes.len() as u64;
        let agg_of: Vec<u32> = if count > 0 {
            let m = u64::from(count).min(n.max(1));
            // Rank r is in group r·m/n, which starts at rank ⌈g·n/m⌉.
            (0..n).map(|r| ((r * m / n) * n).div_ceil(m) as u32).collect()
        } else {
            let mut first = HashMap::new();
            nodes.iter().enumerate().map(|(r, node)| *first.entry(*node).or_insert(r as u32)).collect()
        };
        let mut aggs = agg_of.clone();
        aggs.sort_unstable();
        aggs.dedup();
        Groups { agg_of, aggs }
    }

    /// The aggregator of `rank`.
    pub fn aggregator(&self, rank: u32) -> u32 {
        self.agg_of[rank as usize]
    }

    /// The members of `agg`'s group other than itself, ascending.
    pub fn members(&self, agg: u32) -> Vec<u32> {
        (agg + 1..self.agg_of.len() as u32).filter(|&r| self.agg_of[r as usize] == agg).collect()
    }

    /// Number of groups.
    pub fn len(&self) -> usize {
        self.aggs.len()
    }

    /// Whether there are no groups (no ranks).
    pub fn is_empty(&self) -> bool {
        self.aggs.is_empty()
    }

    /// The aggregator `agg`'s parent in the binomial tree rooted at rank 0, and its children in
    /// the order to receive from (smallest subtree first). Depth ⌈log₂ M⌉.
    pub fn tree(&self, agg: u32) -> (Option<u32>, Vec<u32>) {
        let i = self.aggs.binary_search(&agg).expect("tree() is asked about aggregators");
        let parent = (i > 0).then(|| self.aggs[i & (i - 1)]);
        let mut children = Vec::new();
        let mut k = 1;
        while i & k == 0 && i + k < self.aggs.len() {
            children.push(self.aggs[i + k]);
            k <<= 1;
        }
        (parent, children)
    }
}

/// One step as it travels up the tree: its fragments gathered so far, or why it failed.
#[derive(Serialize, Deserialize)]
enum Up {
    Frags(Vec<Fragment>),
    Failed(Failure),
}

/// What a rank sends up for the steps it ends together: their numbers and each one's [`Up`]
/// (after merging, the steps every rank of the subtree sent).
#[derive(Serialize, Deserialize)]
struct Batch {
    steps: Vec<u64>,
    ups: Vec<Up>,
}

/// What travels down: how many of the steps committed (in order), and why the next did not.
#[derive(Serialize, Deserialize)]
struct Outcome {
    committed: usize,
    failure: Option<Failure>,
}

impl Batch {
    /// Takes in a batch from another rank: its fragments join ours, its failures win, and only
    /// the steps both sent stay (the others are ended in a later exchange).
    fn merge(&mut self, from: Batch) {
        let common = self.steps.iter().zip(&from.steps).take_while(|(a, b)| a == b).count();
        self.steps.truncate(common);
        self.ups.truncate(common);
        for (mine, theirs) in self.ups.iter_mut().zip(from.ups) {
            match (mine, theirs) {
                (Up::Failed(_), _) => {}
                (mine, Up::Failed(f)) => *mine = Up::Failed(f),
                (Up::Frags(a), Up::Frags(b)) => a.extend(b),
            }
        }
    }

    /// Fails every step not failed yet with `e` (a write or flush of the group's file).
    fn fail_all(&mut self, e: &Error) {
        for up in self.ups.iter_mut().filter(|u| matches!(u, Up::Frags(_))) {
            *up = Up::Failed(Failure::of(e));
        }
    }

    fn any_left(&self) -> bool {
        self.ups.iter().any(|u| matches!(u, Up::Frags(_)))
    }
}

/// An error that crossed ranks.
#[derive(Debug, Clone, Serialize, Deserialize)]
struct Failure {
    kind: ErrorKind,
    message: String,
}

impl Failure {
    fn of(e: &Error) -> Failure {
        Failure { kind: e.kind(), message: e.to_string() }
    }
}

fn to_msg<T: Serialize>(v: &T) -> Vec<u8> {
    serde_json::to_vec(v).expect("aggregation messages serialize")
}

fn from_msg<'a, T: Deserialize<'a>>(b: &'a [u8], from: u32, what: &str) -> Result<T> {
    serde_json::from_slice(b)
        .map_err(|e| Error::Corrupt(format!("{what} from rank {from} does not parse ({e}); are all ranks the same Cairn version?")))
}

/// Sets the file of `frag`'s blocks and moves their positions (relative to the rank's bytes of
/// the step) to where those bytes start in the group's file.
fn rebase(frag: &mut Fragment, file: &str, at: u64) {
    for b in &mut frag.blocks {
        b.file = file.to_string();
        b.pos += at;
    }
}

/// One rank of a collective file writer; see the module documentation.
pub struct AggWriter {
    layout: Layout,
    rank: u32,
    nranks: u32,
    session: String,
    fsync: bool,
    chunk: u32,
    compression: Option<Policy>,
    mode: Mode,
    ex: Box<dyn Exchange>,
    groups: Groups,
    /// The group's data file: open on its aggregator, and on members in `offsets` mode.
    data: Option<File>,
    data_rel: String,
    /// Bytes in the group's file (the aggregator's count, `send` mode); the next step's bytes
    /// start here.
    end: u64,
    /// Blocks of each unpublished step and, in `send` mode, their bytes (positions relative to
    /// them until the aggregator places them).
    staged: BTreeMap<u64, (Vec<BlockRecord>, Vec<u8>)>,
    /// Members flush their own writes (`offsets` mode, `fsync`) when their aggregator runs on
    /// another node: its flush does not reach their pages there.
    member_fsync: bool,
    /// Puts of each unpublished step that could not be stored (`offsets` mode): the step fails
    /// on every rank (it travels up as the rank's part) until it is aborted.
    failed: BTreeMap<u64, Failure>,
    /// Steps committed when opened, and by this writer since: `is_committed` needs no
    /// file-system lookup per rank (a step another session commits meanwhile is refused at the
    /// commit).
    committed: std::collections::BTreeSet<u64>,
}

impl std::fmt::Debug for AggWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AggWriter").field("rank", &self.rank).field("nranks", &self.nranks).field("mode", &self.mode).finish()
    }
}

impl AggWriter {
    /// Opens rank `rank` of `nranks` (every rank of the communicator calls this).
    pub fn open(layout: Layout, rank: u32, nranks: u32, cfg: &FileConfig, session: String, group: Collective) -> Result<AggWriter> {
        if group.nodes.len() != nranks as usize {
            return Err(Error::InvalidArgument(format!("{} node ids for {nranks} ranks: give one per rank", group.nodes.len())));
        }
        let groups = Groups::new(&group.nodes, cfg.aggregators);
        let prepared = Self::prepare(&layout, rank, &groups, cfg, &session);
        // Every rank learns whether all opened, so that one rank's failure (a locked data file,
        // a full disk) is an error everywhere, not a wait in MPI for a rank that left.
        let all = group.exchange.start(prepared.as_ref().map_or(0, |p| p.3), prepared.is_ok())?;
        let (data, data_rel, committed, end) = match (prepared, all) {
            (Err(e), _) => return Err(e),
            (Ok(_), false) => {
                return Err(Error::Unavailable(format!(
                    "another writer rank of {} could not open it (its error says why); this rank opened but gives up with it",
                    layout.root.display()
                )))
            }
            (Ok(p), true) => p,
        };
        let agg = groups.aggregator(rank);
        let member_fsync = cfg.fsync && group.nodes[rank as usize] != group.nodes[agg as usize];
        Ok(AggWriter {
            layout,
            rank,
            nranks,
            session,
            fsync: cfg.fsync,
            member_fsync,
            chunk: cfg.chunk_size,
            compression: cfg.compression()?,
            mode: if cfg.aggregation == "offsets" { Mode::Offsets } else { Mode::Send },
            ex: group.exchange,
            groups,
            data,
            data_rel,
            end,
            staged: BTreeMap::new(),
            failed: BTreeMap::new(),
            committed,
        })
    }

    /// What this rank opens alone: the group's data file, rank 0's recovery; the steps
    /// committed so far, and (aggregators) the file's end.
    #[allow(clippy::type_complexity)]
    fn prepare(
        layout: &Layout,
        rank: u32,
        groups: &Groups,
        cfg: &FileConfig,
        session: &str,
    ) -> Result<(Option<File>, String, std::collections::BTreeSet<u64>, u64)> {
        cfg.compression()?;
        let agg = groups.aggregator(rank);
        layout.create()?;
        let data_rel = Layout::data_rel(agg, session);
        let path = layout.root.join(&data_rel);
        let data = if agg == rank || cfg.aggregation == "offsets" {
            // Written at reserved offsets (never truncated: committed steps point into it).
            let f = OpenOptions::new()
                .create(true)
                .write(true)
                .truncate(false)
                .open(&path)
                .ctx(|| format!("opening data file {}", path.display()))?;
            if agg == rank {
                claim::lock_data_file(&f, &path, rank, session)?;
            }
            Some(f)
        } else {
            None
        };
        let end = match (&data, agg == rank) {
            (Some(f), true) => f.metadata().ctx(|| format!("reading size of {}", path.display()))?.len(),
            _ => 0,
        };
        if rank == 0 {
            consume::recover_destination(layout)?;
            layout.sweep_temporaries(super::writer::ORPHANED);
            // Rank 0's mark is the collective one; removing it also breaks any earlier set.
            layout.reopen_rank(0)?;
        }
        Ok((data, data_rel, layout.steps()?.into_iter().collect(), end))
    }

    fn data(&self) -> &File {
        self.data.as_ref().expect("aggregators (and members in offsets mode) hold the group's file")
    }

    fn write_at(&self, at: u64, pieces: &[&[u8]]) -> Result<()> {
        let mut pos = at;
        for p in pieces {
            self.data().write_all_at(p, pos).map_err(|e| {
                Error::io(
                    format!(
                        "writing {} bytes of step data to {} (is the disk full? earlier steps are intact)",
                        p.len(),
                        self.layout.root.join(&self.data_rel).display()
                    ),
                    e,
                )
            })?;
            pos += p.len() as u64;
        }
        Ok(())
    }

    /// A member's part of the steps `batch` ends: their blocks reach the group's file, their
    /// fragments the aggregator; then it waits for the outcome.
    fn member_steps(&mut self, mut batch: Batch, bytes: &[&[u8]]) -> Result<Outcome> {
        let agg = self.groups.aggregator(self.rank);
        match self.mode {
            Mode::Send => {
                // The fragments, then each step's blocks as a message of its own: sent from where
                // the puts left them, uncopied.
                self.ex.send(agg, &to_msg(&batch))?;
                for b in bytes {
                    self.ex.send(agg, b)?;
                }
            }
            // The blocks are in the group's file since their puts.
            Mode::Offsets => {
                if self.member_fsync && batch.any_left() {
                    if let Err(e) = self.data().sync_data().ctx(|| format!("flushing {}", self.data_rel)) {
                        batch.fail_all(&e);
                    }
                }
                self.ex.send(agg, &to_msg(&batch))?
            }
        }
        self.outcome(agg)
    }

    /// Waits for the outcome of the steps from `from`, and passes it on to this rank's children
    /// in the tree and (aggregators) to its members.
    fn outcome(&mut self, from: u32) -> Result<Outcome> {
        let msg = self.ex.recv(from)?;
        let outcome: Outcome = from_msg((*msg).as_ref(), from, "steps' outcome")?;
        self.pass_down(&outcome)?;
        Ok(outcome)
    }

    fn pass_down(&self, outcome: &Outcome) -> Result<()> {
        if self.groups.aggregator(self.rank) != self.rank {
            return Ok(());
        }
        let msg = to_msg(outcome);
        for to in self.groups.tree(self.rank).1.into_iter().chain(self.groups.members(self.rank)) {
            self.ex.send(to, &msg)?;
        }
        Ok(())
    }

    /// An aggregator's part: its group's blocks into the group's file, the group's fragments
    /// and its subtree's up the tree; rank 0 commits the steps in order.
    fn aggregator_steps(&mut self, mut batch: Batch, bytes: &[&[u8]]) -> Result<Outcome> {
        let members = self.groups.members(self.rank);
        match self.mode {
            Mode::Send => {
                let base = self.end;
                let mut at = base;
                for (up, b) in batch.ups.iter_mut().zip(bytes) {
                    if let Up::Frags(fs) = up {
                        fs.iter_mut().for_each(|f| rebase(f, &self.data_rel, at));
                    }
                    at += b.len() as u64;
                }
                let mut received = Vec::new();
                for &m in &members {
                    let mut theirs: Batch = from_msg((*self.ex.recv(m)?).as_ref(), m, "step fragments")?;
                    // As many messages as steps it ended, whichever those are.
                    for up in &mut theirs.ups {
                        let data = self.ex.recv(m)?;
                        if let Up::Frags(fs) = up {
                            fs.iter_mut().for_each(|f| rebase(f, &self.data_rel, at));
                        }
                        at += (*data).as_ref().len() as u64;
                        received.push(data);
                    }
                    batch.merge(theirs);
                }
                let pieces: Vec<&[u8]> = bytes.iter().copied().chain(received.iter().map(|d| (**d).as_ref())).collect();
                if let Err(e) = self.write_at(base, &pieces) {
                    batch.fail_all(&e);
                }
                // Also after a failed write: its bytes, whole or partial, are dead space.
                self.end = at;
            }
            Mode::Offsets => {
                for &m in &members {
                    let theirs: Batch = from_msg((*self.ex.recv(m)?).as_ref(), m, "step fragments")?;
                    batch.merge(theirs);
                }
            }
        }
        if batch.any_left() && self.fsync {
            // Once for every step; covers the members' writes too (offsets mode): they went to
            // this file's pages.
            if let Err(e) = self.data().sync_data().ctx(|| format!("flushing {}", self.data_rel)) {
                batch.fail_all(&e);
            }
        }
        let (parent, children) = self.groups.tree(self.rank);
        for c in children {
            let theirs: Batch = from_msg((*self.ex.recv(c)?).as_ref(), c, "fragments")?;
            batch.merge(theirs);
        }
        if let Some(p) = parent {
            self.ex.send(p, &to_msg(&batch))?;
            return self.outcome(p);
        }
        // Rank 0: the whole of every step is here; they commit in order, up to the first failure.
        let mut outcome = Outcome { committed: 0, failure: None };
        if batch.ups.is_empty() {
            let e = Error::InvalidArgument(
                "the ranks of this collective writer ended different steps: every rank must begin and end the same steps, \
                 in the same order"
                    .into(),
            );
            outcome.failure = Some(Failure::of(&e));
        }
        for up in batch.ups {
            let done = match up {
                Up::Failed(f) => Err(f),
                Up::Frags(frags) => self.commit(frags).map_err(|e| Failure::of(&e)),
            };
            match done {
                Ok(()) => outcome.committed += 1,
                Err(f) => {
                    outcome.failure = Some(f);
                    break;
                }
            }
        }
        self.pass_down(&outcome)?;
        Ok(outcome)
    }

    /// One exchange of [`WriteEngine::end_steps`]: ends the first of `steps` that every rank
    /// sent (at least one, or an error); returns whether this call committed each.
    fn end_round(&mut self, steps: &[(u64, &StepPart)]) -> (Vec<bool>, Option<Error>) {
        let staged: Vec<(Vec<BlockRecord>, Vec<u8>)> = steps.iter().map(|(s, _)| self.staged.remove(s).unwrap_or_default()).collect();
        let ups = steps
            .iter()
            .zip(&staged)
            .map(|((step, part), (blocks, _))| match self.failed.get(step) {
                Some(f) => Up::Failed(f.clone()),
                None => {
                    let mut frag = Fragment::new(*step, self.rank, self.nranks, self.session.clone(), part.defs.clone(), blocks.clone());
                    frag.attrs = part.attrs.clone();
                    frag.consume = part.consume.clone();
                    Up::Frags(vec![frag])
                }
            })
            .collect();
        let batch = Batch { steps: steps.iter().map(|(s, _)| *s).collect(), ups };
        let bytes: Vec<&[u8]> = staged.iter().map(|(_, b)| b.as_slice()).collect();
        let outcome = if self.groups.aggregator(self.rank) == self.rank {
            self.aggregator_steps(batch, &bytes)
        } else {
            self.member_steps(batch, &bytes)
        };
        let (committed, error) = match outcome {
            Ok(o) => (o.committed, o.failure.map(|f| Error::from_kind(f.kind, f.message))),
            Err(e) => (0, Some(e)),
        };
        for (i, ((step, _), kept)) in steps.iter().zip(staged).enumerate() {
            if i < committed {
                self.committed.insert(*step);
            } else {
                // Kept, so that a retry ends the step with the same blocks.
                self.staged.insert(*step, kept);
            }
        }
        (vec![self.rank == 0; committed], error)
    }

    fn commit(&self, frags: Vec<Fragment>) -> Result<()> {
        let step = frags[0].step;
        let consume: Vec<String> = frags.iter().flat_map(|f| f.consume.iter().cloned()).collect();
        let index = StepIndex::merge(step, frags)?;
        commit_index(&self.layout, index, &self.session, consume, self.fsync, self.rank).map(|_| ())
    }
}

impl WriteEngine for AggWriter {
    fn last_index(&self) -> Result<Option<StepIndex>> {
        self.committed.last().map(|&s| self.layout.read_step(s)).transpose()
    }

    fn written_in(&self, var: &str) -> Result<Option<u64>> {
        self.layout.written_in(var)
    }

    fn is_committed(&self, step: u64) -> Result<bool> {
        Ok(self.committed.contains(&step))
    }

    fn agree(&self, key: &str, mine: bool) -> Result<bool> {
        super::writer::agree(&self.layout, key, mine)
    }

    fn put_batch(&mut self, blocks: Vec<(u64, BlockData<'_>)>) -> Result<()> {
        let encoded = blocks.iter().map(|(_, b)| encode(b, self.rank, self.chunk, self.compression)).collect::<Result<Vec<_>>>()?;
        if self.mode == Mode::Offsets {
            let stored: Vec<&[u8]> = blocks.iter().zip(&encoded).map(|((_, b), (_, c))| c.as_deref().unwrap_or(b.bytes)).collect();
            let total = stored.iter().map(|s| s.len() as u64).sum();
            // A put that cannot be stored fails its step on every rank at end_step (a failed put
            // raised here would leave this rank out of the collective step end); a failed write
            // leaves its reservation as dead space.
            let written = self.ex.reserve(self.groups.aggregator(self.rank), total).and_then(|at| self.write_at(at, &stored).map(|()| at));
            let mut at = match written {
                Ok(at) => at,
                Err(e) => {
                    for (step, _) in &blocks {
                        self.failed.entry(*step).or_insert_with(|| Failure::of(&e));
                    }
                    return Ok(());
                }
            };
            for ((step, _), (mut record, _)) in blocks.iter().zip(encoded) {
                record.file.clone_from(&self.data_rel);
                record.pos = at;
                at += stored_len(&record);
                self.staged.entry(*step).or_default().0.push(record);
            }
            return Ok(());
        }
        // Held until the step ends (the user's buffer may change after the put): the one copy.
        for ((step, b), (mut record, coded)) in blocks.iter().zip(encoded) {
            let (records, bytes) = self.staged.entry(*step).or_default();
            record.pos = bytes.len() as u64;
            bytes.extend_from_slice(coded.as_deref().unwrap_or(b.bytes));
            debug_assert_eq!(bytes.len() as u64, record.pos + stored_len(&record));
            records.push(record);
        }
        Ok(())
    }

    fn end_step(&mut self, step: u64, part: &StepPart) -> Result<bool> {
        match self.end_steps(&[(step, part)]) {
            (_, Some(e)) => Err(e),
            (committed, None) => Ok(committed.first().copied().unwrap_or(false)),
        }
    }

    fn end_steps(&mut self, steps: &[(u64, &StepPart)]) -> (Vec<bool>, Option<Error>) {
        let mut ended = Vec::with_capacity(steps.len());
        while ended.len() < steps.len() {
            let (committed, error) = self.end_round(&steps[ended.len()..]);
            ended.extend(committed);
            if error.is_some() {
                return (ended, error);
            }
        }
        (ended, None)
    }

    fn close(&mut self) -> Result<()> {
        // One mark for all ranks: every step is collective, so none commits after rank 0 closed.
        if self.rank == 0 {
            self.layout.close_all(self.nranks, &self.session, self.fsync)?;
        }
        Ok(())
    }

    fn abort_step(&mut self, step: u64) -> Result<()> {
        self.staged.remove(&step);
        self.failed.remove(&step);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_of_consecutive_ranks() {
        let g = Groups::new(&[0; 5], 2);
        assert_eq!(g.agg_of, vec![0, 0, 0, 3, 3]);
        assert_eq!(g.members(0), vec![1, 2]);
        assert_eq!(g.members(3), vec![4]);
        // More groups than ranks: every rank its own.
        assert_eq!(Groups::new(&[0; 3], 8).aggs, vec![0, 1, 2]);
    }

    #[test]
    fn groups_by_node_aggregate_on_the_lowest_rank() {
        let g = Groups::new(&[7, 9, 7, 9, 4], 0);
        assert_eq!(g.agg_of, vec![0, 1, 0, 1, 4]);
        assert_eq!(g.aggs, vec![0, 1, 4]);
    }

    #[test]
    fn binomial_tree_reaches_every_aggregator_once_in_log_depth() {
        for m in 1..70u32 {
            let g = Groups::new(&(0..m).collect::<Vec<_>>(), 0);
            let mut seen = vec![0; m as usize];
            let mut depth = vec![0u32; m as usize];
            for a in 0..m {
                let (parent, children) = g.tree(a);
                assert_eq!(parent.is_none(), a == 0);
                for c in children {
                    seen[c as usize] += 1;
                    assert_eq!(g.tree(c).0, Some(a));
                    assert!(c > a);
                    depth[c as usize] = depth[a as usize] + 1;
                }
            }
            assert!(seen[1..].iter().all(|&s| s == 1), "m={m}: {seen:?}");
            let max = depth.iter().copied().max().unwrap();
            assert!(max <= (m as f64).log2().ceil() as u32, "m={m}: depth {max}");
        }
    }
}
