//! Halting from C: the job's request to stop as this process sees it ([`cairn_halt_requested`]),
//! one answer every rank of a writer agrees on ([`cairn_halt_requested_all`]), and the wait for
//! the newest step on disk before the job ends ([`cairn_wait_drained`]).

use crate::{guard, invalid, status, writer, CairnFile, Status};
use std::ffi::c_int;
use std::time::Duration;

/// Reports a halt file older than the process, once, on stderr.
fn warn_stale() {
    if let Some(w) = cairn_client::halt::stale_warning() {
        eprintln!("cairn: warning: {w}");
    }
}

/// This process's answer (see [`warn_stale`]).
fn requested() -> cairn_client::Result<bool> {
    warn_stale();
    cairn_client::halt::requested()
}

/// 1 when the job asks the application to stop now (save its state, close, exit): the file
/// `$CAIRN_HALT_FILE` exists (the job script creates it on `SIGUSR1`), or fewer than
/// `$CAIRN_HALT_SECONDS` remain before `$SLURM_JOB_END_TIME`; else 0. -1 when one of those
/// variables does not parse ([`crate::cairn_last_error`] names it and its value). This is one
/// process's answer: ranks of a collective code ask [`cairn_halt_requested_all`].
#[no_mangle]
pub extern "C" fn cairn_halt_requested() -> c_int {
    match requested() {
        Ok(h) => c_int::from(h),
        Err(e) => {
            status(Err(e));
            -1
        }
    }
}

/// Into `*halt` (1 or 0), whether the job asks writer `f` to stop before the step it writes next
/// (the one after the newest it ended, else [`crate::cairn_next_step`]'s): one answer for every
/// rank. With `cairn_open_mpi`'s communicator it is collective (every rank calls it at the same
/// step; a logical OR of their answers); without, the first rank to ask for a step fixes the
/// answer every rank gets. `CAIRN_ERR_CONFIG` when `$CAIRN_HALT_SECONDS` or
/// `$SLURM_JOB_END_TIME` does not parse.
///
/// # Safety
/// `f` is a write handle; `halt` points to an `int`.
#[no_mangle]
pub unsafe extern "C" fn cairn_halt_requested_all(f: *mut CairnFile, halt: *mut c_int) -> Status {
    guard(|| {
        if halt.is_null() {
            return Err(invalid("halt is NULL"));
        }
        // SAFETY: per this function's contract.
        let comm = match unsafe { f.as_ref() } {
            Some(CairnFile::W(_, comm, _)) => comm.clone(),
            _ => None,
        };
        // SAFETY: per this function's contract.
        let w = unsafe { writer(f)? };
        let answer = match comm {
            // OR over the ranks: not every rank passes "no halt".
            Some(c) => {
                let mine = requested();
                let any = !c.all(!mine.as_ref().is_ok_and(|m| *m))?;
                mine?;
                any
            }
            None => {
                warn_stale();
                w.halt_requested_all(w.halt_step())?
            }
        };
        // SAFETY: checked non-null; valid for a write per the contract.
        unsafe { *halt = c_int::from(answer) };
        Ok(())
    })
}

/// Waits up to `timeout_s` seconds (negative: no limit) until step `step` (-1: the newest
/// committed) of writer `f`'s dataset is on the drain's disk, asking the drain for it whatever
/// its cadence (a job's last checkpoint); `*drained` is 1 once it is, 0 at the timeout. The
/// drain's error (a full disk: `CAIRN_ERR_CAPACITY`) is returned; the `file` engine's steps are on
/// disk when committed.
///
/// # Safety
/// `f` is a write handle; `drained` points to an `int`.
#[no_mangle]
pub unsafe extern "C" fn cairn_wait_drained(f: *mut CairnFile, step: i64, timeout_s: f64, drained: *mut c_int) -> Status {
    guard(|| {
        if drained.is_null() {
            return Err(invalid("drained is NULL"));
        }
        if step < -1 || timeout_s.is_nan() {
            return Err(invalid(&format!("step {step}, timeout_s {timeout_s}: give a step (-1: the newest) and seconds")));
        }
        // SAFETY: per this function's contract.
        let w = unsafe { writer(f)? };
        let timeout = (timeout_s >= 0.0).then(|| Duration::from_secs_f64(timeout_s.min(1e9)));
        let done = w.wait_drained(u64::try_from(step).ok(), timeout)?;
        // SAFETY: checked non-null; valid for a write per the contract.
        unsafe { *drained = c_int::from(done) };
        Ok(())
    })
}
