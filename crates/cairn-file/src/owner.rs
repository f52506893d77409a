//! The owner record of a drained dataset, `DRAIN/<dataset>/owner.json`: which cluster writes the
//! dataset's steps into this folder. The first `"w"` or `"a"` open of a dataset by a cluster
//! creates it exclusively (`O_CREAT | O_EXCL`, which NFS and Lustre honour where
//! `RENAME_NOREPLACE` is refused), so of two runs racing for one name on one drain folder exactly
//! one owns it. A reader falling back to the drain serves another cluster's steps only below the
//! record's `first_step` (the history before this run).

use crate::beneath::Dir;
use crate::layout::Layout;
use cairn_core::{Error, ErrorKind, Result};
use serde::{Deserialize, Serialize};
use std::io::Write;
use std::time::Duration;

/// The record's file name, in the dataset's folder.
pub const OWNER_FILE: &str = "owner.json";

/// Who writes a drained dataset.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Owner {
    /// The owning cluster's id (its drained steps carry it).
    pub cluster: String,
    /// Its cluster file.
    pub cluster_file: String,
    /// The host that opened the dataset first.
    pub host: String,
    /// When (Unix seconds).
    pub created: f64,
    /// The step this cluster writes first: steps below it are the history before this run.
    pub first_step: u64,
}

/// Longest wait for the record's bytes after its file is seen (its creator writes them right
/// after creating it).
const FILL_WAIT: Duration = Duration::from_secs(5);

/// The dataset's folder below its drain folder, reached without following a symlink (see
/// [`crate::beneath`]); None if it is missing and not made.
fn folder(layout: &Layout, create: bool) -> Result<Option<Dir>> {
    let drain = layout.root.parent().ok_or_else(|| Error::InvalidArgument(format!("{} has no drain folder", layout.root.display())))?;
    Dir::root(drain)?.sub(&layout.name(), create)
}

/// Reads the owner record of the dataset at `layout`, if there is one.
pub fn read(layout: &Layout) -> Result<Option<Owner>> {
    let Some(dir) = folder(layout, false)? else { return Ok(None) };
    read_in(&dir, layout)
}

fn read_in(dir: &Dir, layout: &Layout) -> Result<Option<Owner>> {
    let until = std::time::Instant::now() + FILL_WAIT;
    loop {
        let Some(bytes) = dir.read(OWNER_FILE)? else { return Ok(None) };
        match serde_json::from_slice::<Owner>(&bytes) {
            Ok(o) => return Ok(Some(o)),
            // Being written by the process that created it.
            Err(_) if std::time::Instant::now() < until => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => {
                return Err(Error::Corrupt(format!(
                    "{} does not parse ({e}): remove it with `cairn rm {} --cluster FILE --all` if the dataset is to go",
                    dir.path(OWNER_FILE).display(),
                    layout.name()
                )))
            }
        }
    }
}

/// Claims the dataset at `layout` for `mine` (a `"w"` or, with `append`, an `"a"` open): creates
/// the record exclusively, or finds it. Found with this cluster's id: the record as it is.
/// Another cluster's: `"w"` is refused (`ForeignDrain`, naming both), and `"a"` takes the record
/// over only when `gone` says the recorded cluster is no more (its file stopped or missing, or
/// none of its servers answering). Nothing is written through a symlink below the drain folder.
pub fn claim(layout: &Layout, mine: &Owner, append: bool, gone: impl Fn(&Owner) -> bool) -> Result<Owner> {
    let dir = folder(layout, true)?.ok_or_else(|| Error::NotFound(format!("{} went meanwhile", layout.root.display())))?;
    let text = serde_json::to_vec_pretty(mine).expect("owner records serialize");
    let what = || format!("writing {}", dir.path(OWNER_FILE).display());
    match dir.create_new(OWNER_FILE) {
        Ok(mut f) => {
            f.write_all(&text).and_then(|()| f.sync_all()).map_err(|e| Error::io(what(), e))?;
            return Ok(mine.clone());
        }
        Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(e),
    }
    let found =
        read_in(&dir, layout)?.ok_or_else(|| Error::NotFound(format!("{} went meanwhile; open again", dir.path(OWNER_FILE).display())))?;
    if found.cluster == mine.cluster {
        return Ok(found);
    }
    if append && gone(&found) {
        // The previous run's cluster is no more: this one continues its history.
        let tmp = format!(".tmp-owner-{}-{}", std::process::id(), mine.cluster);
        dir.remove(&tmp);
        let mut f = dir.create_new(&tmp)?;
        f.write_all(&text).and_then(|()| f.sync_all()).map_err(|e| Error::io(what(), e))?;
        dir.rename_over(&tmp, OWNER_FILE)?;
        return Ok(mine.clone());
    }
    Err(foreign(layout, &found, &mine.cluster, append))
}

/// The refusal of cluster `mine` for a dataset `owner` writes.
pub fn foreign(layout: &Layout, owner: &Owner, mine: &str, append: bool) -> Error {
    let how = if append {
        "its cluster is still running (stop it with `cairn cluster stop`, then continue with mode \"a\")"
    } else {
        "continue that run with mode \"a\" once its cluster is stopped"
    };
    Error::ForeignDrain(format!(
        "{} in the drain folder {} belongs to cluster {} ({}, host {}, from step {}), not to this cluster {mine}: two runs would \
         mix their steps there; {how}, or remove it with `cairn rm {} --cluster FILE --all`",
        layout.name(),
        layout.root.parent().map_or_else(String::new, |p| p.display().to_string()),
        owner.cluster,
        owner.cluster_file,
        owner.host,
        owner.first_step,
        layout.name()
    ))
}

/// Whether `e` is the refusal [`foreign`] builds.
pub fn is_foreign(e: &Error) -> bool {
    e.kind() == ErrorKind::AlreadyExists && e.reason() == Some(cairn_core::Reason::ForeignDrain)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(cluster: &str, first_step: u64) -> Owner {
        Owner { cluster: cluster.into(), cluster_file: format!("/c/{cluster}.json"), host: "h".into(), created: 0.0, first_step }
    }

    #[test]
    fn one_cluster_owns_a_name_and_another_is_refused_or_takes_over_a_stopped_one() {
        let dir = tempfile::tempdir().unwrap();
        let layout = Layout::new(dir.path(), "d");
        assert_eq!(read(&layout).unwrap(), None);
        assert_eq!(claim(&layout, &owner("a", 0), false, |_| false).unwrap().cluster, "a");
        assert_eq!(claim(&layout, &owner("a", 7), true, |_| false).unwrap(), owner("a", 0), "found: kept as it is");
        let e = claim(&layout, &owner("b", 0), false, |_| true).unwrap_err();
        assert!(is_foreign(&e) && e.to_string().contains("cluster a") && e.to_string().contains("this cluster b"), "{e}");
        assert!(is_foreign(&claim(&layout, &owner("b", 5), true, |_| false).unwrap_err()), "a running owner keeps it");
        assert_eq!(claim(&layout, &owner("b", 5), true, |o| o.cluster_file == "/c/a.json").unwrap(), owner("b", 5));
        assert_eq!(read(&layout).unwrap(), Some(owner("b", 5)));
    }

    #[test]
    fn nothing_is_written_through_a_symlinked_dataset_folder() {
        let dir = tempfile::tempdir().unwrap();
        let elsewhere = dir.path().join("elsewhere");
        std::fs::create_dir_all(&elsewhere).unwrap();
        std::fs::create_dir_all(dir.path().join("drain")).unwrap();
        std::os::unix::fs::symlink(&elsewhere, dir.path().join("drain").join("d")).unwrap();
        let e = claim(&Layout::new(&dir.path().join("drain"), "d"), &owner("a", 0), false, |_| false).unwrap_err();
        assert_eq!(e.reason(), Some(cairn_core::Reason::UnsafePath), "{e}");
        assert_eq!(std::fs::read_dir(&elsewhere).unwrap().count(), 0);
    }

    #[test]
    fn of_racing_claims_exactly_one_wins() {
        for round in 0..20 {
            let dir = tempfile::tempdir().unwrap();
            let layout = Layout::new(dir.path(), "d");
            let won: Vec<bool> = std::thread::scope(|s| {
                let hs: Vec<_> = ["a", "b"]
                    .iter()
                    .map(|c| {
                        let layout = layout.clone();
                        s.spawn(move || claim(&layout, &owner(c, 0), false, |_| false).is_ok())
                    })
                    .collect();
                hs.into_iter().map(|h| h.join().unwrap()).collect()
            });
            assert_eq!(won.iter().filter(|w| **w).count(), 1, "round {round}: {won:?}");
        }
    }
}
