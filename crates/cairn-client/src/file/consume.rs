//! Consume-and-produce on the file engine (D²T): the commit of step S of a destination and the
//! release of step S of its sources are one transaction, among processes on one file system.
//!
//! Why it is atomic. There is one commit point: the hard link that publishes the destination's
//! index `steps/S.json` (a link, unlike a rename, never replaces a file, so a step cannot commit
//! twice). Before it, the transaction *takes* each source's `steps/S.json` by renaming it to
//! `taken/S.<txn>.json`, beside a pointer `taken/S.<txn>.txn` naming the destination. Renaming
//! one file succeeds for one process only, so two claimers never both take a step. Readers of a
//! source count a taken step as still there until the destination holds an index whose
//! `consumed.txn` is `<txn>`, and as gone from then on: both datasets change at the link, and no
//! reader sees both or neither.
//!
//! Why a SIGKILL anywhere is harmless. The journal is the destination's index itself,
//! `pending/txn-S.<txn>.json`, written (and `flock`ed) before anything is taken and held locked
//! for the transaction's life; the kernel drops the lock when the process dies. Whoever finds a
//! journal it can lock (a writer opening the destination, a claimer of a source) completes it:
//! forwards if the destination's index is the journal's (removing the taken entries), else
//! backwards (renaming them back). Every state in between reads as before or as after.

use cairn_core::error::IoContext;
use cairn_core::index::{from_json, Consumed, Fragment, StepIndex};
use cairn_core::index_file;
use cairn_core::{Error, Result};
use cairn_file::layout::{digest, link_new, parse_index, publish, staged, Layout};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// The id of the transactions of `session` writing `dst`: the same for every rank of the
/// session, so two ranks that both complete a step's fragments carry one transaction.
pub(super) fn txn_id(dst: &Layout, session: &str) -> String {
    format!("{:016x}", digest(format!("{}\0{session}", dst.name()).as_bytes()))
}

/// Commits `index` as step `index.step` of `dst`, releasing that step of every dataset of
/// `sources` (siblings of `dst`) with it. Returns whether this call committed it (false when
/// another rank of `session` carries the transaction).
pub(super) fn commit(dst: &Layout, mut index: StepIndex, session: &str, mut sources: Vec<String>, fsync: bool, tag: u32) -> Result<bool> {
    let step = index.step;
    let txn = txn_id(dst, session);
    if committed(dst, step, &txn) {
        return Ok(true);
    }
    sources.sort();
    sources.dedup();
    for s in &sources {
        if *s == dst.name() {
            return Err(Error::InvalidArgument(format!("step {step} of '{s}' cannot consume its own dataset")));
        }
        dst.sibling(s).require()?;
    }
    index.consumed = Some(Consumed { txn: txn.clone(), datasets: sources.clone() });
    let journal = journal_path(dst, step, &txn);
    let (tmp, file) = staged(&journal, &index_file::encode(&index), fsync, tag)?;
    // Locked before it appears, so no one mistakes it for a dead transaction's (file systems
    // without `flock` cannot tell: their dead transactions stay until completed by hand).
    try_lock(&file);
    let linked = link_new(&tmp, &journal);
    let _ = std::fs::remove_file(&tmp);
    if !linked? {
        // Another rank of this session runs it (or a dead one left it: completed here).
        complete(dst, &journal)?;
        return Ok(committed(dst, step, &txn));
    }
    let t = Txn { dst: dst.clone(), step, txn, sources };
    let done = t.run(&journal, fsync, tag);
    match &done {
        Ok(()) => t.forwards(&journal),
        Err(_) => t.backwards(&journal),
    }
    // The lock goes with `file`, after the journal is gone.
    drop(file);
    done.map(|()| true)
}

/// Whether `dst` holds step `step` committed by transaction `txn`.
fn committed(dst: &Layout, step: u64, txn: &str) -> bool {
    let Ok(bytes) = std::fs::read(dst.step_path(step)) else { return false };
    index_file::decode_meta(&bytes, "step index").is_ok_and(|i| i.consumed.is_some_and(|c| c.txn == txn))
}

fn journal_path(dst: &Layout, step: u64, txn: &str) -> PathBuf {
    dst.dir("pending").join(format!("txn-{step:012}.{txn}.json"))
}

fn taken_path(src: &Layout, step: u64, txn: &str, ext: &str) -> PathBuf {
    src.dir("taken").join(format!("{step:012}.{txn}.{ext}"))
}

/// Takes the advisory lock of `f` if no other process holds it.
fn try_lock(f: &File) -> bool {
    // SAFETY: `flock` only reads the descriptor, which `f` keeps open for the call.
    unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) == 0 }
}

/// One transaction's names.
struct Txn {
    dst: Layout,
    step: u64,
    txn: String,
    sources: Vec<String>,
}

impl Txn {
    /// Takes every source's step, then links the journal in as the destination's index.
    fn run(&self, journal: &Path, fsync: bool, tag: u32) -> Result<()> {
        let step = self.step;
        for s in &self.sources {
            publish(&taken_path(&self.dst.sibling(s), step, &self.txn, "txn"), self.dst.name().as_bytes(), fsync, tag)?;
        }
        for s in &self.sources {
            let src = self.dst.sibling(s);
            let taken = taken_path(&src, step, &self.txn, "json");
            match std::fs::rename(src.step_path(step), &taken) {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    return Err(Error::Conflict(format!(
                        "step {step} of '{}' consumes step {step} of '{s}', which is no longer committed (another claimer \
                         consumed it after this one's lease lapsed, or it was released); this step is not committed, drop \
                         its result",
                        self.dst.name()
                    )))
                }
                Err(e) => return Err(Error::io(format!("taking step {step} of {}", src.root.display()), e)),
            }
        }
        if !link_new(journal, &self.dst.step_path(step))? {
            return Err(Error::AlreadyExists(format!(
                "step {step} of '{}' was committed meanwhile by another writer (one whose claim of step {step} outlived \
                 this one's lapsed lease?); a step commits once: this one's result is dropped and step {step} of {:?} stays",
                self.dst.name(),
                self.sources
            )));
        }
        Ok(())
    }

    /// After the commit: drops the taken steps, their leases and the step's fragments.
    fn forwards(&self, journal: &Path) {
        for s in &self.sources {
            let src = self.dst.sibling(s);
            let _ = std::fs::remove_file(taken_path(&src, self.step, &self.txn, "json"));
            let _ = std::fs::remove_file(taken_path(&src, self.step, &self.txn, "txn"));
            src.drop_leases(self.step);
        }
        self.drop_fragments(|_| true);
        let _ = std::fs::remove_file(journal);
    }

    /// Without the commit: puts the taken steps back and drops this session's fragments (the
    /// step is refused, as on the staging engine).
    fn backwards(&self, journal: &Path) {
        for s in &self.sources {
            let src = self.dst.sibling(s);
            let taken = taken_path(&src, self.step, &self.txn, "json");
            if taken.exists() {
                let _ = std::fs::rename(&taken, src.step_path(self.step));
            }
            let _ = std::fs::remove_file(taken_path(&src, self.step, &self.txn, "txn"));
        }
        self.drop_fragments(|f| txn_id(&self.dst, &f.session) == self.txn);
        let _ = std::fs::remove_file(journal);
    }

    fn drop_fragments(&self, which: impl Fn(&Fragment) -> bool) {
        let prefix = Layout::fragment_prefix(self.step);
        for name in self.dst.list("pending").unwrap_or_default().into_iter().filter(|n| n.starts_with(&prefix)) {
            let p = self.dst.dir("pending").join(name);
            if std::fs::read(&p).ok().and_then(|b| from_json::<Fragment>(&b, "fragment").ok()).is_some_and(|f| which(&f)) {
                let _ = std::fs::remove_file(p);
            }
        }
    }
}

/// Completes the transaction of `journal` if its process is gone (its lock is free): forwards if
/// it committed, else backwards. A live one is left alone.
pub(super) fn complete(dst: &Layout, journal: &Path) -> Result<()> {
    let Ok(f) = File::open(journal) else { return Ok(()) };
    if !try_lock(&f) {
        return Ok(());
    }
    // Finished and removed between opening and locking: nothing left to do.
    let same = match (f.metadata(), std::fs::metadata(journal)) {
        (Ok(a), Ok(b)) => a.ino() == b.ino() && a.dev() == b.dev(),
        _ => false,
    };
    if !same {
        return Ok(());
    }
    let bytes = std::fs::read(journal).ctx(|| format!("reading {}", journal.display()))?;
    let index = index_file::decode_meta(&bytes, &format!("transaction journal {}", journal.display()))?;
    let Some(c) = index.consumed else {
        return Err(Error::Corrupt(format!("transaction journal {} names no transaction", journal.display())));
    };
    let t = Txn { dst: dst.clone(), step: index.step, txn: c.txn, sources: c.datasets };
    if committed(dst, t.step, &t.txn) {
        t.forwards(journal);
    } else {
        t.backwards(journal);
    }
    Ok(())
}

/// Completes every transaction of `dst` whose process died.
pub(super) fn recover_destination(dst: &Layout) -> Result<()> {
    for name in dst.list("pending")?.into_iter().filter(|n| n.starts_with("txn-") && n.ends_with(".json")) {
        complete(dst, &dst.dir("pending").join(name))?;
    }
    Ok(())
}

/// Completes every transaction that took a step of `src` and whose process died.
pub(super) fn recover_source(src: &Layout) -> Result<()> {
    for (step, txn, dst) in pointers(src)? {
        let dst = src.sibling(&dst);
        let journal = journal_path(&dst, step, &txn);
        if journal.exists() {
            complete(&dst, &journal)?;
        } else if !taken_path(src, step, &txn, "json").exists() {
            // Left by a transaction that finished (its journal goes last).
            let _ = std::fs::remove_file(taken_path(src, step, &txn, "txn"));
        }
    }
    Ok(())
}

/// The pointers in `src/taken`: (step, transaction, destination dataset).
fn pointers(src: &Layout) -> Result<Vec<(u64, String, String)>> {
    let mut out = Vec::new();
    for name in src.list("taken")? {
        let Some((step, txn)) = name.strip_suffix(".txn").and_then(|n| n.split_once('.')) else { continue };
        let Ok(step) = step.parse() else { continue };
        // Removed meanwhile: its transaction finished.
        let Ok(dst) = std::fs::read_to_string(src.dir("taken").join(&name)) else { continue };
        out.push((step, txn.to_string(), dst));
    }
    Ok(out)
}

/// Steps of `src` taken by transactions that have not committed: they still count as committed
/// in `src`, read from their `taken/` entry.
pub(super) fn in_flight(src: &Layout) -> Result<Vec<(u64, PathBuf)>> {
    let mut out = Vec::new();
    for (step, txn, dst) in pointers(src)? {
        let taken = taken_path(src, step, &txn, "json");
        if taken.exists() && !committed(&src.sibling(&dst), step, &txn) {
            out.push((step, taken));
        }
    }
    Ok(out)
}

/// The committed steps of a dataset as readers see them: `steps/` and the steps in flight.
/// `taken/` is listed before and after `steps/`, so a step moving either way while listing
/// (taken, or put back) is seen in one of them.
pub(super) fn visible_steps(layout: &Layout) -> Result<Vec<u64>> {
    let before = in_flight(layout)?;
    let mut steps = layout.steps()?;
    let after = in_flight(layout)?;
    steps.extend(before.into_iter().chain(after).map(|(s, _)| s));
    steps.sort_unstable();
    steps.dedup();
    Ok(steps)
}

/// The index of a committed step, also of one in flight; without its blocks if `meta_only`.
pub(super) fn read_visible(layout: &Layout, step: u64, meta_only: bool) -> Result<StepIndex> {
    let committed = if meta_only { layout.read_step_meta(step) } else { layout.read_step(step) };
    match committed {
        Err(Error::NotFound(msg)) => {
            let Some((_, taken)) = in_flight(layout)?.into_iter().find(|(s, _)| *s == step) else {
                return Err(Error::NotFound(msg));
            };
            let bytes = std::fs::read(&taken).map_err(|_| Error::NotFound(msg))?;
            parse_index(&bytes, &format!("index of step {step} ({})", taken.display()), meta_only)
        }
        r => r,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_core::index::to_json;

    fn step_index(step: u64, txn: Option<&str>) -> StepIndex {
        let consumed = txn.map(|t| Consumed { txn: t.into(), datasets: vec!["src".into()] });
        StepIndex {
            format: 1,
            step,
            nranks: 1,
            vars: Default::default(),
            blocks: vec![],
            attrs: Default::default(),
            consumed,
            staged: None,
        }
    }

    fn index(step: u64, txn: Option<&str>) -> Vec<u8> {
        index_file::encode(&step_index(step, txn))
    }

    #[test]
    fn a_taken_step_counts_in_its_source_until_the_destination_links_its_index() {
        let dir = tempfile::tempdir().unwrap();
        let (src, dst) = (Layout::new(dir.path(), "src"), Layout::new(dir.path(), "dst"));
        src.create().unwrap();
        dst.create().unwrap();
        // A source written before format 2 (JSON) is taken the same way.
        std::fs::write(src.step_path(5), to_json(&step_index(5, None))).unwrap();
        publish(&taken_path(&src, 5, "t1", "txn"), b"dst", false, 0).unwrap();
        std::fs::rename(src.step_path(5), taken_path(&src, 5, "t1", "json")).unwrap();
        assert_eq!(visible_steps(&src).unwrap(), vec![5], "taken, not committed: still there");
        assert_eq!(read_visible(&src, 5, false).unwrap().step, 5);
        std::fs::write(dst.step_path(5), to_json(&step_index(5, Some("other")))).unwrap();
        assert_eq!(visible_steps(&src).unwrap(), vec![5], "another transaction's commit does not count");
        std::fs::write(dst.step_path(5), index(5, Some("t1"))).unwrap();
        assert_eq!(visible_steps(&src).unwrap(), Vec::<u64>::new(), "committed: released");
    }

    #[test]
    fn a_dead_transaction_is_undone_unless_it_committed_and_a_live_one_is_left_alone() {
        let dir = tempfile::tempdir().unwrap();
        let (src, dst) = (Layout::new(dir.path(), "src"), Layout::new(dir.path(), "dst"));
        src.create().unwrap();
        dst.create().unwrap();
        let journal = journal_path(&dst, 5, "t1");
        let take = || {
            std::fs::write(src.step_path(5), index(5, None)).unwrap();
            publish(&taken_path(&src, 5, "t1", "txn"), b"dst", false, 0).unwrap();
            std::fs::rename(src.step_path(5), taken_path(&src, 5, "t1", "json")).unwrap();
            std::fs::write(&journal, index(5, Some("t1"))).unwrap();
        };
        take();
        let live = File::open(&journal).unwrap();
        assert!(try_lock(&live));
        recover_source(&src).unwrap();
        assert!(journal.exists() && !src.step_path(5).exists(), "its process holds the lock: in flight");
        drop(live);
        recover_source(&src).unwrap();
        assert!(src.step_path(5).exists() && !journal.exists(), "dead before its commit: undone");
        assert!(src.list("taken").unwrap().is_empty());
        std::fs::remove_file(src.step_path(5)).unwrap();
        take();
        std::fs::hard_link(&journal, dst.step_path(5)).unwrap();
        recover_destination(&dst).unwrap();
        assert!(!src.step_path(5).exists() && !journal.exists() && dst.step_path(5).exists(), "dead after its commit: finished");
        assert!(src.list("taken").unwrap().is_empty());
    }
}
