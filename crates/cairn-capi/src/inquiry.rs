//! What a reader that does not know the dataset asks before it reads (ADIOS2's
//! `InquireVariable`, `InquireAttribute` and `EndOfStream`): the variables and the dataset
//! attributes of a committed step, and whether the writers closed the dataset.

use crate::{guard, invalid, reader, CairnFile, Status};
use std::ffi::{c_char, c_int};

/// The names of the variables of committed `step`, sorted, one per line (`'\n'` between names;
/// names hold no newline). The text (NUL-terminated) goes into `buf` when it fits in `cap`
/// bytes; `*len` is its length without the NUL either way, so a call with `cap` 0 sizes the
/// buffer. Ask each one's type and shape with [`crate::cairn_var_info`].
///
/// # Safety
/// `f` is an open handle (a write handle reads through a reader of its own); `buf` has room for
/// `cap` bytes; `len` points to a `size_t`.
#[no_mangle]
pub unsafe extern "C" fn cairn_step_vars(f: *mut CairnFile, step: u64, buf: *mut c_char, cap: usize, len: *mut usize) -> Status {
    guard(|| {
        // SAFETY: per this function's contract.
        let r = unsafe { reader(f)? };
        if len.is_null() || (buf.is_null() && cap > 0) {
            return Err(invalid("len is NULL, or buf is NULL with cap > 0"));
        }
        let names: Vec<String> = r.step_variables(step)?.into_keys().collect();
        let text = names.join("\n");
        // SAFETY: checked non-null; `buf` has room for `cap` bytes.
        unsafe { copy_out(&text, buf, cap, len) };
        Ok(())
    })
}

/// The dataset's attributes as committed `step` has them, a JSON object (as [`crate::cairn_attrs`]
/// gives those of the newest step): into `buf` when it fits in `cap` bytes, NUL-terminated;
/// `*len` is its length without the NUL either way.
///
/// # Safety
/// `f` is an open handle; `buf` has room for `cap` bytes; `len` points to a `size_t`.
#[no_mangle]
pub unsafe extern "C" fn cairn_step_attrs(f: *mut CairnFile, step: u64, buf: *mut c_char, cap: usize, len: *mut usize) -> Status {
    guard(|| {
        // SAFETY: per this function's contract.
        let r = unsafe { reader(f)? };
        if len.is_null() || (buf.is_null() && cap > 0) {
            return Err(invalid("len is NULL, or buf is NULL with cap > 0"));
        }
        let json = serde_json::to_string(&r.step_attrs(step)?)
            .map_err(|e| cairn_client::Error::Corrupt(format!("attributes do not serialize: {e}")))?;
        // SAFETY: checked non-null; `buf` has room for `cap` bytes.
        unsafe { copy_out(&json, buf, cap, len) };
        Ok(())
    })
}

/// Writes `text` and its NUL into `buf` when they fit in `cap` bytes; its length into `*len`.
///
/// # Safety
/// `buf` has room for `cap` bytes; `len` is valid for a write.
unsafe fn copy_out(text: &str, buf: *mut c_char, cap: usize, len: *mut usize) {
    // SAFETY: per this function's contract.
    unsafe {
        *len = text.len();
        if text.len() < cap {
            std::ptr::copy_nonoverlapping(text.as_ptr().cast::<c_char>(), buf, text.len());
            *buf.add(text.len()) = 0;
        }
    }
}

/// Into `*closed`, 1 when the writers closed the dataset (every rank called
/// [`crate::cairn_close`]; no step comes after the committed ones until a writer opens it again
/// with mode "a"), else 0; into `*newest` the newest committed step and `*any` whether there is
/// one. What a stream reader asks to tell "no step yet" from "no step ever".
///
/// # Safety
/// `f` is an open handle; `newest`, `any` and `closed` point to their types.
#[no_mangle]
pub unsafe extern "C" fn cairn_stream_state(f: *mut CairnFile, newest: *mut u64, any: *mut c_int, closed: *mut c_int) -> Status {
    guard(|| {
        // SAFETY: per this function's contract.
        let r = unsafe { reader(f)? };
        if newest.is_null() || any.is_null() || closed.is_null() {
            return Err(invalid("newest, any and closed must not be NULL"));
        }
        let (steps, done) = r.listing()?;
        // SAFETY: checked non-null.
        unsafe {
            *newest = steps.last().copied().unwrap_or(0);
            *any = c_int::from(!steps.is_empty());
            *closed = c_int::from(done);
        }
        Ok(())
    })
}
