//! D²T claims from C, as Python's `Reader.claims()`: a claimer takes committed steps no other
//! claimer holds, lowest first, while a heartbeat thread renews its leases (a claimer that dies
//! loses them after the lease); a writer consumes a claimed step by committing its result with
//! [`cairn_consume`] in the open step.

use crate::{guard, invalid, reader, text, writer, CairnFile, Status};
use cairn_client::claims::Claimer;
use std::ffi::{c_char, c_int};
use std::time::Duration;

/// A claimer over a read handle (see [`cairn_claims_open`]).
pub struct CairnClaims(Claimer);

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
        let (lo, hi) = cairn_client::claims::LEASE_RANGE;
        if !(lo..=hi).contains(&lease_s) {
            return Err(invalid(&format!("lease_s {lease_s}: give the seconds a claim lasts without renewal, from {lo} to {hi}")));
        }
        let c = CairnClaims(Claimer::start(reader, Duration::from_secs_f64(lease_s))?);
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
        let timeout = (timeout_s >= 0.0).then(|| Duration::from_secs_f64(timeout_s.min(1e9)));
        let next = c.0.next(timeout, &mut || false)?;
        // SAFETY: checked non-null.
        unsafe { (*step, *got) = (next.unwrap_or(0), c_int::from(next.is_some())) };
        Ok(())
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
    guard(move || c.0.end())
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
