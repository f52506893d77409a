//! One writer per rank. Two writers claiming the same rank of a dataset would append to one data
//! file with separate ideas of its end, and overwrite each other's fragments (the step then never
//! commits, or commits with the wrong one). The second writer is refused: on opening when the
//! first still has the rank open or (mode "w") has ended steps in its session, else when it ends a
//! step the first already ended in that session.

use cairn_core::error::IoContext;
use cairn_core::index::{from_json, Fragment};
use cairn_core::{Error, Result};
use cairn_file::layout::{digest, Layout};
use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::Path;

/// What to do when two writers claim one rank, for the end of every refusal.
const ADVICE: &str = "each rank of a session must be written by one writer: check the rank= of your processes, \
                      and give a restarted run a new session (docs/guide.md, Sessions)";

/// Takes the advisory lock of a writer's data file, held until the file is closed (also when the
/// process dies). Fails if another writer holds it. File systems without `flock` (Lustre mounted
/// without `-o flock`) skip this; the fragment check of [`check_part`] still applies there.
pub(super) fn lock_data_file(data: &File, path: &Path, rank: u32, session: &str) -> Result<()> {
    // SAFETY: `flock` only reads the descriptor, which `data` keeps open for the call.
    if unsafe { libc::flock(data.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } == 0 {
        return Ok(());
    }
    match std::io::Error::last_os_error() {
        e if e.kind() == std::io::ErrorKind::WouldBlock => Err(Error::Conflict(format!(
            "cannot open rank {rank} of session {session:?} for writing: another writer has this rank open \
             ({} is locked); {ADVICE}",
            path.display()
        ))),
        _ => Ok(()),
    }
}

/// Refuses mode "w" when this rank has ended steps of `session` that did not commit yet: the
/// writer that did so is another one (or this session is reused), and truncating the data file
/// would leave its fragments pointing at nothing.
pub(super) fn check_no_pending_part(layout: &Layout, rank: u32, session: &str) -> Result<()> {
    let dir = layout.root.join("pending");
    let mine = format!(".rank-{rank:06}.json");
    for e in std::fs::read_dir(&dir).ctx(|| format!("listing {}", dir.display()))?.flatten() {
        if !e.file_name().to_string_lossy().ends_with(&mine) {
            continue;
        }
        let Some(part) = std::fs::read(e.path()).ok().and_then(|b| from_json::<Fragment>(&b, "fragment").ok()) else {
            continue;
        };
        if part.session == session {
            return Err(Error::Conflict(format!(
                "step {} of dataset {} already holds a part of rank {rank} of session {session:?} from another writer \
                 ({}); opening it with mode \"w\" would truncate the data that part points at; {ADVICE}",
                part.step,
                layout.root.display(),
                e.path().display()
            )));
        }
    }
    Ok(())
}

/// Whether this writer may publish `bytes` as its fragment of `step`: yes if there is none,
/// if it holds the same bytes (a retried end_step), if it is the one this writer published before
/// (digest `own`, e.g. a step rewritten after an abort), or if it is another session's (a crashed
/// run's leftover). A different fragment of this session is another writer's: refused.
pub(super) fn check_part(layout: &Layout, step: u64, rank: u32, session: &str, bytes: &[u8], own: Option<u64>) -> Result<()> {
    let dest = layout.fragment_path(step, rank);
    // Unreadable: publishing will report what is wrong with the directory.
    let Ok(there) = std::fs::read(&dest) else { return Ok(()) };
    if there == bytes || own == Some(digest(&there)) {
        return Ok(());
    }
    match from_json::<Fragment>(&there, "fragment") {
        Ok(other) if other.session == session => Err(Error::Conflict(format!(
            "step {step} of dataset {}: another writer already ended it as rank {rank} of session {session:?} ({}); \
             this writer's part is refused and the other one kept; {ADVICE}",
            layout.root.display(),
            dest.display()
        ))),
        _ => Ok(()),
    }
}
