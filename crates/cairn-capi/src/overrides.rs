//! Opening with settings that win over the configuration, as `cairn.open`'s keyword arguments
//! do (`engine="file"`, `path=`, `cluster=`): what a front that takes the configuration and a
//! few settings from elsewhere (ADIOS2's XML parameters) passes on.

use crate::{invalid, open_with, text, CairnFile, Status};
use cairn_client::Writer;
use std::ffi::{c_char, c_int};

/// Parses `key=value` lines (blank lines skipped).
fn parse(text: &str) -> Result<Vec<(String, String)>, cairn_client::Error> {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(|l| match l.split_once('=') {
            Some((k, v)) if !k.trim().is_empty() => Ok((k.trim().to_string(), v.trim().to_string())),
            _ => Err(invalid(&format!("override {l:?}: write key=value, one per line (e.g. \"engine=file\")"))),
        })
        .collect()
}

/// [`crate::cairn_open`] with `overrides`: NULL, or `key=value` lines (`"engine=file\npath=out"`)
/// whose keys are `cairn.open`'s keyword arguments (`engine`, `path`, `cluster`, …), applied
/// after the configuration `config` names and winning over it.
///
/// # Safety
/// As [`crate::cairn_open`]; `overrides` is NULL or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn cairn_open_overrides(
    name: *const c_char,
    mode: *const c_char,
    config: *const c_char,
    overrides: *const c_char,
    rank: c_int,
    nranks: c_int,
    out: *mut *mut CairnFile,
) -> Status {
    let pairs = if overrides.is_null() {
        Ok(Vec::new())
    } else {
        // SAFETY: per this function's contract.
        unsafe { text(overrides, "overrides") }.and_then(parse)
    };
    let pairs = match pairs {
        Ok(p) => p,
        Err(e) => return crate::status(Err(e)),
    };
    // SAFETY: per this function's contract.
    unsafe {
        open_with(name, mode, config, &pairs, out, |name, cfg, append| {
            if rank < 0 || nranks < 1 || rank >= nranks {
                return Err(invalid(&format!("rank {rank} of {nranks}: need 0 <= rank < nranks")));
            }
            let session = cairn_client::session::default_session(rank as u32, nranks as u32)?;
            Ok((Writer::open(name, cfg, rank as u32, nranks as u32, append, &session)?, None))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::parse;

    #[test]
    fn overrides_are_key_value_lines() {
        let p = parse("engine=file\n\n path = out dir \n").unwrap();
        assert_eq!(p, vec![("engine".into(), "file".into()), ("path".into(), "out dir".into())]);
        assert!(parse("engine").unwrap_err().to_string().contains("key=value"));
    }
}
