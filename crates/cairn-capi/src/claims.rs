//! D²T claims from C, as Python's `Reader.claims()`: a claimer takes committed steps no other
//! claimer holds, lowest first, while a heartbeat thread renews its leases (a claimer that dies
//! loses them after the lease); a writer consumes a claimed step by committing its result with
//! [`cairn_consume`] in the open step.

use crate::{guard, invalid, reader, text, writer, CairnFile, Status};
use cairn_client::{Error, Reader};
use std::ffi::{c_char, c_int};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

/// Leases from a millisecond to a day (as Python's `LEASE_RANGE`).
const LEASE: (f64, f64) = (0.001, 86_400.0);

/// A claimer over a read handle (see [`cairn_claims_open`]).
pub struct CairnClaims {
    reader: Arc<Reader>,
    claimer: String,
    lease: Duration,
    stop: Arc<(Mutex<bool>, Condvar)>,
    beat: Option<std::thread::JoinHandle<()>>,
}

impl CairnClaims {
    /// Stops the heartbeat and gives back what this claimer holds (unrenewed leases lapse anyway).
    fn end(mut self) -> Result<(), Error> {
        *self.stop.0.lock().unwrap_or_else(|e| e.into_inner()) = true;
        self.stop.1.notify_all();
        if let Some(b) = self.beat.take() {
            let _ = b.join();
        }
        self.reader.unclaim(&self.claimer)
    }
}

/// Starts a claimer on read handle `r` whose leases last `lease_s` seconds (0.001 to 86400)
/// without renewal; a background thread renews them every third of that while the claimer is
/// open. Close it with [`cairn_claims_close`] before closing `r`.
///
/// # Safety
/// `r` is a read handle; `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cairn_claims_open(r: *mut CairnFile, lease_s: f64, out: *mut *mut CairnClaims) -> Status {
    guard(|| {
        // SAFETY: per this function's contract.
        let reader = unsafe { reader(r)? }.clone();
        if out.is_null() {
            return Err(invalid("out (the claimer pointer) is NULL"));
        }
        if !(LEASE.0..=LEASE.1).contains(&lease_s) {
            return Err(invalid(&format!("lease_s {lease_s}: give the seconds a claim lasts without renewal, from 0.001 to 86400")));
        }
        let lease = Duration::from_secs_f64(lease_s);
        let claimer = cairn_client::session::random_session();
        let stop = Arc::new((Mutex::new(false), Condvar::new()));
        let beat = {
            let (reader, claimer, stop) = (reader.clone(), claimer.clone(), stop.clone());
            std::thread::Builder::new()
                .name("cairn-claims".into())
                .spawn(move || loop {
                    let (flag, wake) = &*stop;
                    let stopped = flag.lock().unwrap_or_else(|e| e.into_inner());
                    let (stopped, _) = wake.wait_timeout_while(stopped, lease / 3, |s| !*s).unwrap_or_else(|e| e.into_inner());
                    if *stopped {
                        return;
                    }
                    drop(stopped);
                    // A missed beat is retried at the next; a lease that lapses is handed on.
                    let _ = reader.renew(&claimer, lease);
                })
                .map_err(|e| Error::Unavailable(format!("cannot start the claims heartbeat thread: {e}")))?
        };
        let c = CairnClaims { reader, claimer, lease, stop, beat: Some(beat) };
        // SAFETY: checked non-null.
        unsafe { *out = Box::into_raw(Box::new(c)) };
        Ok(())
    })
}

/// The next step leased to claimer `c`, lowest first: `*got` is 1 and `*step` the step, or
/// `*got` is 0 when the writers closed the dataset and nothing is left for this claimer, or when
/// no step came for `timeout_s` seconds (negative: wait for ever).
///
/// # Safety
/// `c` is a claimer from [`cairn_claims_open`]; `step` and `got` are valid for writes.
#[no_mangle]
pub unsafe extern "C" fn cairn_claims_next(c: *mut CairnClaims, timeout_s: f64, step: *mut u64, got: *mut c_int) -> Status {
    guard(|| {
        // SAFETY: per this function's contract.
        let c = unsafe { c.as_ref() }.ok_or_else(|| invalid("claimer is NULL"))?;
        if step.is_null() || got.is_null() {
            return Err(invalid("step or got is NULL"));
        }
        if timeout_s.is_nan() {
            return Err(invalid("timeout_s is NaN: give seconds, or a negative value to wait for ever"));
        }
        let deadline = (timeout_s >= 0.0).then(|| Instant::now() + Duration::from_secs_f64(timeout_s.min(1e9)));
        let mut pause = Duration::from_millis(10);
        loop {
            let (next, done) = c.reader.claim(&c.claimer, c.lease)?;
            if let Some(s) = next {
                // SAFETY: checked non-null.
                unsafe { (*step, *got) = (s, 1) };
                return Ok(());
            }
            let left = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            if done || left == Some(Duration::ZERO) {
                unsafe { *got = 0 };
                return Ok(());
            }
            std::thread::sleep(left.map_or(pause, |l| l.min(pause)));
            pause = (pause * 2).min(Duration::from_millis(200));
        }
    })
}

/// Ends claimer `c` and frees it: its heartbeat stops and the steps it holds and did not
/// consume go back to the other claimers.
///
/// # Safety
/// `c` is NULL or a claimer from [`cairn_claims_open`], not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn cairn_claims_close(c: *mut CairnClaims) -> Status {
    if c.is_null() {
        return Status::CairnOk;
    }
    // SAFETY: per this function's contract, `c` came from Box::into_raw in cairn_claims_open.
    let c = unsafe { Box::from_raw(c) };
    guard(move || c.end())
}

/// Makes the open step's commit release the same step of each of the `n` datasets named in
/// `datasets` (D²T consume-and-produce: both happen or neither), which live where this writer
/// writes (the same staging cluster or `file` engine path). If another claimer consumed that step
/// first (this one's lease lapsed), [`crate::cairn_end_step`] fails with CAIRN_ERR_CONFLICT and
/// nothing changes. Call it between [`crate::cairn_begin_step`] and [`crate::cairn_end_step`].
///
/// # Safety
/// `f` is a write handle; `datasets` holds `n` NUL-terminated strings.
#[no_mangle]
pub unsafe extern "C" fn cairn_consume(f: *mut CairnFile, datasets: *const *const c_char, n: c_int) -> Status {
    guard(|| {
        // SAFETY: per this function's contract.
        let w = unsafe { writer(f)? };
        if n < 1 || datasets.is_null() {
            return Err(invalid("consume: give at least one dataset name (n >= 1, datasets not NULL)"));
        }
        let names = unsafe { std::slice::from_raw_parts(datasets, n as usize) };
        let names = names.iter().map(|p| unsafe { text(*p, "a dataset name") }.map(str::to_string)).collect::<Result<Vec<_>, _>>()?;
        w.consume(names)
    })
}
