//! Metadata that tools such as xarray, netCDF and Zarr carry beside the arrays: dimension names of
//! a variable, and attributes (free-form JSON) of a variable or of a whole dataset.

use crate::error::{Error, Result};
use serde_json::{Map, Value};

/// Attributes: names mapped to JSON values (numbers, strings, booleans, lists, objects).
pub type Attrs = Map<String, Value>;

/// Largest serialized size of one attribute set (a variable's, or a dataset's), in bytes: they
/// travel in every step's index, so they must stay small.
pub const MAX_ATTRS_BYTES: usize = 64 << 10;

/// Longest dimension or attribute name, in bytes.
pub const MAX_NAME: usize = 256;

fn bad_name(name: &str) -> bool {
    name.is_empty() || name.len() > MAX_NAME || name.chars().any(char::is_control)
}

/// The attributes of `owner` from a JSON object's text (what the C and Python bindings pass).
pub fn parse(text: &str, owner: &str) -> Result<Attrs> {
    match serde_json::from_str::<Value>(text) {
        Ok(Value::Object(map)) => Ok(map),
        Ok(other) => Err(Error::InvalidArgument(format!("attributes of {owner} must be a mapping of names to values, not {other}"))),
        Err(e) => Err(Error::InvalidArgument(format!("attributes of {owner} are not JSON ({e})"))),
    }
}

/// Checks `attrs` of `owner` (e.g. `variable 'p'`): printable names and at most
/// [`MAX_ATTRS_BYTES`] once serialized.
pub fn check_attrs(attrs: &Attrs, owner: &str) -> Result<()> {
    if let Some(k) = attrs.keys().find(|k| bad_name(k)) {
        return Err(Error::InvalidArgument(format!("attribute name {k:?} of {owner}: use 1 to {MAX_NAME} printable characters")));
    }
    let size = serde_json::to_vec(attrs).map(|v| v.len()).unwrap_or(usize::MAX);
    if size > MAX_ATTRS_BYTES {
        return Err(Error::InvalidArgument(format!(
            "attributes of {owner} take {size} bytes as JSON, more than {MAX_ATTRS_BYTES}; keep large metadata in a variable"
        )));
    }
    Ok(())
}

/// Checks the dimension names of variable `var` of `ndim` dimensions: one printable, distinct
/// name per dimension.
pub fn check_dims(dims: &[String], ndim: usize, var: &str) -> Result<()> {
    if dims.len() != ndim {
        return Err(Error::InvalidArgument(format!(
            "'{var}' has {ndim} dimensions but {} dimension names {dims:?}; name each dimension once",
            dims.len()
        )));
    }
    if let Some(d) = dims.iter().find(|d| bad_name(d)) {
        return Err(Error::InvalidArgument(format!("dimension name {d:?} of '{var}': use 1 to {MAX_NAME} printable characters")));
    }
    if let Some((i, d)) = dims.iter().enumerate().find(|(i, d)| dims[..*i].contains(d)) {
        return Err(Error::InvalidArgument(format!("'{var}' names dimension {i} {d:?} like an earlier one; dimension names must differ")));
    }
    Ok(())
}

/// Adds `from` to `into`; a name both hold with different values is a conflict between `a` and `b`.
pub fn merge_attrs(into: &mut Attrs, from: &Attrs, a: &str, b: &str) -> Result<()> {
    for (k, v) in from {
        match into.get(k) {
            Some(prev) if prev != v => {
                return Err(Error::Conflict(format!(
                    "dataset attribute {k:?} is {prev} for {a} but {v} for {b}; set each attribute to one value on every rank"
                )))
            }
            Some(_) => {}
            None => {
                into.insert(k.clone(), v.clone());
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn attrs(v: Value) -> Attrs {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn attribute_sets_are_bounded_and_named() {
        check_attrs(&attrs(json!({"units": "K", "scale": [1.5, 2], "n": 3})), "variable 'p'").unwrap();
        let e = check_attrs(&attrs(json!({"": 1})), "variable 'p'").unwrap_err().to_string();
        assert!(e.contains("attribute name \"\" of variable 'p'"), "{e}");
        let big = attrs(json!({"blob": "x".repeat(MAX_ATTRS_BYTES)}));
        let e = check_attrs(&big, "the dataset").unwrap_err().to_string();
        assert!(e.contains("more than 65536") && e.contains("the dataset"), "{e}");
    }

    #[test]
    fn dims_name_each_dimension_once() {
        let d = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        check_dims(&d(&["z", "y", "x"]), 3, "p").unwrap();
        assert!(check_dims(&d(&["y", "x"]), 3, "p").unwrap_err().to_string().contains("3 dimensions but 2"));
        assert!(check_dims(&d(&["x", ""]), 2, "p").unwrap_err().to_string().contains("printable"));
        assert!(check_dims(&d(&["x", "x"]), 2, "p").unwrap_err().to_string().contains("must differ"));
    }

    #[test]
    fn merging_keeps_agreeing_values_and_refuses_different_ones() {
        let mut a = attrs(json!({"title": "run", "n": 1}));
        merge_attrs(&mut a, &attrs(json!({"n": 1, "extra": true})), "rank 0", "rank 1").unwrap();
        assert_eq!(a.len(), 3);
        let e = merge_attrs(&mut a, &attrs(json!({"n": 2})), "rank 0", "rank 2").unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Conflict);
        assert!(e.to_string().contains("\"n\" is 1 for rank 0 but 2 for rank 2"), "{e}");
    }
}
