//! Paths inside a dataset directory and the write-then-rename publication they rely on.

use crate::beneath::rename_noreplace;
use cairn_core::error::IoContext;
use cairn_core::index::{from_json, Fragment, StepIndex};
use cairn_core::index_file;
use cairn_core::{Error, Result};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

/// The directories and files of one dataset (`<path>/<name>`).
#[derive(Debug, Clone)]
pub struct Layout {
    /// The dataset directory.
    pub root: PathBuf,
}

impl Layout {
    /// Layout of dataset `name` under `path`.
    pub fn new(path: &Path, name: &str) -> Layout {
        Layout { root: path.join(name) }
    }

    /// Data file of a writer, relative to the root (as recorded in the index). Each session has
    /// its own, so writers of different sessions (claimers sharing a destination as rank 0 of 1)
    /// never append to one file.
    pub fn data_rel(rank: u32, session: &str) -> String {
        format!("data/rank-{rank:06}.{:016x}.bin", digest(session.as_bytes()))
    }

    /// A directory of the dataset (`steps`, `pending`, `taken`, `claims`, `closed`).
    pub fn dir(&self, name: &str) -> PathBuf {
        self.root.join(name)
    }

    /// Names of the files in directory `name` of the dataset (none if it does not exist:
    /// datasets written before it was introduced lack it).
    pub fn list(&self, name: &str) -> Result<Vec<String>> {
        let dir = self.dir(name);
        match std::fs::read_dir(&dir) {
            Ok(entries) => Ok(entries.filter_map(|e| e.ok()?.file_name().into_string().ok()).collect()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
            Err(e) => Err(Error::io(format!("listing {}", dir.display()), e)),
        }
    }

    /// A sibling dataset (same `[file] path`).
    pub fn sibling(&self, name: &str) -> Layout {
        Layout { root: self.root.with_file_name(name) }
    }

    /// The dataset's name (its directory's).
    pub fn name(&self) -> String {
        self.root.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned())
    }

    /// Committed index of a step.
    pub fn step_path(&self, step: u64) -> PathBuf {
        self.root.join("steps").join(Self::step_file(step))
    }

    /// The file name of a step's committed index in `steps`.
    pub fn step_file(step: u64) -> String {
        format!("{step:012}.json")
    }

    /// A writer's fragment for a step.
    pub fn fragment_path(&self, step: u64, rank: u32) -> PathBuf {
        self.root.join("pending").join(format!("{}{rank:06}.json", Self::fragment_prefix(step)))
    }

    /// Prefix shared by all fragments of a step.
    pub fn fragment_prefix(step: u64) -> String {
        format!("step-{step:012}.rank-")
    }

    /// Generation `generation` of a step's lease (`claims/S.G.json`: the claims of the file engine).
    pub fn lease_path(&self, step: u64, generation: u32) -> PathBuf {
        self.dir("claims").join(format!("{step:012}.{generation:06}.json"))
    }

    /// Forgets every lease of a consumed step (best effort: a lease left lapses).
    pub fn drop_leases(&self, step: u64) {
        let prefix = format!("{step:012}.");
        for name in self.list("claims").unwrap_or_default().into_iter().filter(|n| n.starts_with(&prefix)) {
            let _ = std::fs::remove_file(self.dir("claims").join(name));
        }
    }

    /// Discards the steps from `from` on (a restart from an older step): their committed
    /// indexes, newest first so a crash midway leaves a prefix of the steps, then the fragments
    /// of steps not committed and the claims' leases. Returns how many committed steps went. The
    /// data files are append-only: the steps' bytes stay as dead space.
    pub fn discard_from(&self, from: u64) -> Result<u64> {
        let gone: Vec<u64> = self.steps()?.into_iter().filter(|s| *s >= from).rev().collect();
        for step in &gone {
            let p = self.step_path(*step);
            match std::fs::remove_file(&p) {
                Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                    return Err(Error::io(format!("discarding step {step} (removing {})", p.display()), e))
                }
                _ => {}
            }
        }
        let step_of = |name: &str, prefix: &str| name.strip_prefix(prefix)?.get(..12)?.parse::<u64>().ok();
        for (dir, prefix) in [("pending", "step-"), ("claims", "")] {
            for name in self.list(dir)?.into_iter().filter(|n| step_of(n, prefix).is_some_and(|s| s >= from)) {
                let _ = std::fs::remove_file(self.dir(dir).join(name));
            }
        }
        Ok(gone.len() as u64)
    }

    /// Creates the dataset directories.
    pub fn create(&self) -> Result<()> {
        for d in ["data", "pending", "steps"] {
            let p = self.root.join(d);
            std::fs::create_dir_all(&p).ctx(|| format!("creating dataset directory {}", p.display()))?;
        }
        Ok(())
    }

    /// Removes temporary files (`.tmp-*`) older than `age`: what processes killed between writing
    /// and publishing a file left behind. A live writer's temporary file lives for one write and
    /// one rename, so an hour-old one is an orphan on any file system; the age, not a pid, tells,
    /// because writers on other hosts share the directory. Best effort.
    pub fn sweep_temporaries(&self, age: std::time::Duration) {
        for d in ["pending", "steps", "claims", "closed", "taken"] {
            for name in self.list(d).unwrap_or_default().into_iter().filter(|n| n.starts_with(".tmp-")) {
                let p = self.dir(d).join(name);
                let old = std::fs::metadata(&p).and_then(|m| m.modified()).ok().and_then(|t| t.elapsed().ok()).is_some_and(|e| e > age);
                if old {
                    let _ = std::fs::remove_file(p);
                }
            }
        }
    }

    /// Fails with a clear error unless the dataset exists.
    pub fn require(&self) -> Result<()> {
        if self.root.join("steps").is_dir() {
            Ok(())
        } else {
            Err(Error::NotFound(format!(
                "no Cairn dataset at {}; check the name and the [file] path in cairn.toml (or path=...)",
                self.root.display()
            )))
        }
    }

    /// The oldest committed step whose index holds blocks of `var` (each index read in turn:
    /// once per constant and writer).
    pub fn written_in(&self, var: &str) -> Result<Option<u64>> {
        if self.require().is_err() {
            return Ok(None);
        }
        for step in self.steps()? {
            if self.read_step(step)?.blocks.iter().any(|b| b.var == var) {
                return Ok(Some(step));
            }
        }
        Ok(None)
    }

    /// Committed steps, sorted (a directory listing: new commits show up without reopening).
    pub fn steps(&self) -> Result<Vec<u64>> {
        let dir = self.root.join("steps");
        let mut steps: Vec<u64> = std::fs::read_dir(&dir)
            .ctx(|| format!("listing {}", dir.display()))?
            .filter_map(|e| e.ok()?.file_name().to_str()?.strip_suffix(".json")?.parse().ok())
            .collect();
        steps.sort_unstable();
        Ok(steps)
    }

    /// Steps some writers ended but that are not committed: each step with the number of ranks of
    /// its most advanced session that ended it and the number it waits for.
    pub fn pending(&self) -> Result<Vec<(u64, u32, u32)>> {
        let dir = self.root.join("pending");
        let committed = self.steps()?;
        let mut by_step: BTreeMap<u64, BTreeMap<String, (u32, u32)>> = BTreeMap::new();
        for e in std::fs::read_dir(&dir).ctx(|| format!("listing {}", dir.display()))? {
            let Ok(e) = e else { continue };
            let name = e.file_name();
            let Some(step) = name.to_str().and_then(|n| n.strip_prefix("step-")?.split('.').next()?.parse::<u64>().ok()) else {
                continue;
            };
            // A fragment removed meanwhile (its step just committed) or half-damaged is passed over.
            let Some(frag) = std::fs::read(e.path()).ok().and_then(|b| from_json::<Fragment>(&b, "fragment").ok()) else { continue };
            if committed.binary_search(&step).is_err() {
                let n = by_step.entry(step).or_default().entry(frag.session).or_insert((0, frag.nranks));
                n.0 += 1;
            }
        }
        Ok(by_step.into_iter().filter_map(|(step, sessions)| sessions.into_values().max().map(|(ended, of)| (step, ended, of))).collect())
    }

    /// Records that rank `rank` of `nranks` of `session` closed the dataset.
    pub fn close_rank(&self, rank: u32, nranks: u32, session: &str, fsync: bool) -> Result<()> {
        let mark = Closed { session: session.to_string(), nranks, ranks: 1 };
        publish(&self.closed_path(rank), &serde_json::to_vec(&mark).expect("marks serialize"), fsync, rank)
    }

    /// Records, as rank 0's mark, that every rank of `session` closed the dataset (collective
    /// writers: no step can commit without rank 0 once it closed).
    pub fn close_all(&self, nranks: u32, session: &str, fsync: bool) -> Result<()> {
        let mark = Closed { session: session.to_string(), nranks, ranks: nranks };
        publish(&self.closed_path(0), &serde_json::to_vec(&mark).expect("marks serialize"), fsync, 0)
    }

    /// A writer of rank `rank` opened the dataset: it is being written again.
    pub fn reopen_rank(&self, rank: u32) -> Result<()> {
        let p = self.closed_path(rank);
        match std::fs::remove_file(&p) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(Error::io(format!("removing {}", p.display()), e)),
            _ => Ok(()),
        }
    }

    /// Whether every rank of one session closed the dataset (and none opened it since): no more
    /// steps come, so streams and claims end.
    pub fn finished(&self) -> Result<bool> {
        let mut ranks: BTreeMap<String, (u32, u32)> = BTreeMap::new();
        for name in self.list("closed")? {
            let Some(mark) = std::fs::read(self.dir("closed").join(name)).ok().and_then(|b| serde_json::from_slice::<Closed>(&b).ok())
            else {
                continue;
            };
            let n = ranks.entry(mark.session).or_insert((0, mark.nranks));
            n.0 += mark.ranks;
        }
        Ok(ranks.values().any(|(closed, of)| closed >= of))
    }

    fn closed_path(&self, rank: u32) -> PathBuf {
        self.dir("closed").join(format!("rank-{rank:06}.json"))
    }

    /// Reads and validates a committed step index (format 1 or 2).
    pub fn read_step(&self, step: u64) -> Result<StepIndex> {
        self.read_step_part(step, false)
    }

    /// A committed step index without its blocks (variables, attributes, the consume
    /// transaction): what listings need, read without the blocks and crcs of a format 2 index.
    pub fn read_step_meta(&self, step: u64) -> Result<StepIndex> {
        self.read_step_part(step, true)
    }

    fn read_step_part(&self, step: u64, meta_only: bool) -> Result<StepIndex> {
        let p = self.step_path(step);
        let bytes = std::fs::read(&p).map_err(|e| match e.kind() {
            std::io::ErrorKind::NotFound => Error::NotFound(format!("step {step} is not committed in {}", self.root.display())),
            _ => Error::io(format!("reading {}", p.display()), e),
        })?;
        parse_index(&bytes, &format!("index of step {step} ({})", p.display()), meta_only)
    }
}

/// A stable 64-bit digest of `bytes` (names of per-session files, published-bytes memos).
pub fn digest(bytes: &[u8]) -> u64 {
    use std::hash::Hasher;
    let mut h = std::hash::DefaultHasher::new();
    h.write(bytes);
    h.finish()
}

/// Decodes and validates the bytes of a step index (format 1 or 2; the blocks left out if
/// `meta_only`), naming `what` in errors.
pub fn parse_index(bytes: &[u8], what: &str, meta_only: bool) -> Result<StepIndex> {
    let idx = if meta_only { index_file::decode_meta(bytes, what)? } else { index_file::decode(bytes, what)? };
    idx.validate()?;
    Ok(idx)
}

/// A rank's mark in `closed/`.
#[derive(serde::Serialize, serde::Deserialize)]
struct Closed {
    session: String,
    nranks: u32,
    /// How many ranks the mark stands for (all, for collective writers).
    #[serde(default = "one", skip_serializing_if = "is_one")]
    ranks: u32,
}

fn one() -> u32 {
    1
}

fn is_one(n: &u32) -> bool {
    *n == 1
}

/// Writes `bytes` to `dest` atomically: a uniquely named temporary file in the same directory,
/// optionally flushed, then renamed over `dest`. Readers see the old file or the new one, never part.
pub fn publish(dest: &Path, bytes: &[u8], fsync: bool, tag: u32) -> Result<()> {
    let (tmp, _) = staged(dest, bytes, fsync, tag)?;
    std::fs::rename(&tmp, dest).ctx(|| format!("publishing {}", dest.display()))?;
    flush_dir(dest, fsync)
}

/// [`publish`], but only if `dest` does not exist: returns false if it does.
pub fn publish_new(dest: &Path, bytes: &[u8], fsync: bool, tag: u32) -> Result<bool> {
    let (tmp, _) = staged(dest, bytes, fsync, tag)?;
    let placed = rename_new(&tmp, dest);
    if !matches!(placed, Ok(true)) {
        let _ = std::fs::remove_file(&tmp);
    }
    let placed = placed?;
    if placed {
        flush_dir(dest, fsync)?;
    }
    Ok(placed)
}

/// Renames `src` to `dest` unless `dest` exists; returns whether it did (see
/// [`rename_noreplace`]).
fn rename_new(src: &Path, dest: &Path) -> Result<bool> {
    use std::os::unix::ffi::OsStrExt;
    let c = |p: &Path| std::ffi::CString::new(p.as_os_str().as_bytes()).expect("dataset paths have no NUL bytes");
    rename_noreplace(libc::AT_FDCWD, &c(src), &c(dest), dest)
}

/// Makes `dest` another name of `src` unless `dest` exists (a hard link, which unlike a rename
/// never replaces a file); returns whether it did.
pub fn link_new(src: &Path, dest: &Path) -> Result<bool> {
    match std::fs::hard_link(src, dest) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(false),
        Err(e) => Err(Error::io(format!("publishing {} (the file engine needs a POSIX file system with hard links)", dest.display()), e)),
    }
}

/// A uniquely named temporary file beside `dest` holding `bytes`, and the file, open.
pub fn staged(dest: &Path, bytes: &[u8], fsync: bool, tag: u32) -> Result<(PathBuf, std::fs::File)> {
    let dir = dest.parent().expect("published files live in a dataset directory");
    // Unique also among threads (a claimer's heartbeat renews while it claims).
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let tmp = dir.join(format!(".tmp-{}-{tag}-{n}-{}", std::process::id(), dest.file_name().unwrap().to_string_lossy()));
    // The directory is made on first use only: a lookup less per publish.
    let mut f = match std::fs::File::create(&tmp) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(dir).ctx(|| format!("creating directory {}", dir.display()))?;
            std::fs::File::create(&tmp)
        }
        other => other,
    }
    .ctx(|| format!("creating {}", tmp.display()))?;
    f.write_all(bytes).ctx(|| format!("writing {}", tmp.display()))?;
    if fsync {
        f.sync_all().ctx(|| format!("flushing {}", tmp.display()))?;
    }
    Ok((tmp, f))
}

fn flush_dir(dest: &Path, fsync: bool) -> Result<()> {
    let dir = dest.parent().expect("published files live in a dataset directory");
    if fsync {
        std::fs::File::open(dir).and_then(|d| d.sync_all()).ctx(|| format!("flushing directory {}", dir.display()))?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, SystemTime};

    #[test]
    fn only_old_temporaries_are_swept() {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout::new(dir.path(), "d");
        layout.create().unwrap();
        let old = layout.dir("steps").join(".tmp-1-0-0-000000000003.json");
        let fresh = layout.dir("pending").join(".tmp-2-0-0-step-000000000004.rank-000000.json");
        let step = layout.dir("steps").join("000000000001.json");
        for p in [&old, &fresh, &step] {
            std::fs::write(p, b"x").unwrap();
        }
        let two_hours_ago = SystemTime::now() - Duration::from_secs(7200);
        for p in [&old, &step] {
            std::fs::File::options().write(true).open(p).unwrap().set_modified(two_hours_ago).unwrap();
        }
        layout.sweep_temporaries(Duration::from_secs(3600));
        assert!(!old.exists(), "an hour-old temporary is a crashed writer's leftover");
        assert!(fresh.exists(), "a fresh temporary may be a live writer's");
        assert!(step.exists(), "only temporaries are swept");
    }
}
