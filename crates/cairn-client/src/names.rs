//! Checks of the names both handles take: dataset names (one plain file name, as the file
//! engine makes a directory of it) and the error for a variable no one defined.

use cairn_core::{Error, Result};

/// The error for variable `var`, naming the ones `known`.
pub(crate) fn unknown_var<'a>(var: &str, known: impl Iterator<Item = &'a String>) -> Error {
    let known: Vec<&str> = known.map(String::as_str).collect();
    Error::NotFound(format!("unknown variable '{var}'; defined: [{}]", known.join(", ")))
}

/// Longest dataset name, in bytes: the longest file name most file systems allow.
const MAX_NAME: usize = 255;

/// Refuses dataset names that are not one plain file name: the file engine makes a directory of
/// it, and both engines take the same names.
pub(crate) fn check_name(name: &str) -> Result<()> {
    if name.is_empty() || name.len() > MAX_NAME || name.contains(['/', '\0']) || name == "." || name == ".." {
        return Err(Error::InvalidArgument(format!(
            "invalid dataset name {name:?} ({} bytes): use a plain name of 1 to {MAX_NAME} bytes, without '/' or NUL, \
             other than \".\" and \"..\"",
            name.len()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dataset_names_are_plain_file_names() {
        for bad in ["", ".", "..", "a/b", "/", "a\0b", &"x".repeat(256), &"é".repeat(128)] {
            let e = check_name(bad).unwrap_err();
            assert_eq!(e.kind(), cairn_core::ErrorKind::InvalidArgument, "{bad:?}");
            assert!(e.to_string().contains("1 to 255 bytes"), "{e}");
        }
        for good in ["run1", "a.b", "...", ".hidden", "é", &"x".repeat(255)] {
            check_name(good).unwrap();
        }
    }
}
