//! Element types. Canonical names follow numpy's kind+size spelling (`f8`, `i4`, `c16`).

use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};

/// The element type of a variable. Data is stored little-endian (the native order of every
/// machine Cairn targets); bindings convert other byte orders before writing.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(into = "String", try_from = "String")]
pub enum DType {
    /// 8-bit unsigned integer.
    U8,
    /// 16-bit unsigned integer.
    U16,
    /// 32-bit unsigned integer.
    U32,
    /// 64-bit unsigned integer.
    U64,
    /// 8-bit signed integer.
    I8,
    /// 16-bit signed integer.
    I16,
    /// 32-bit signed integer.
    I32,
    /// 64-bit signed integer.
    I64,
    /// IEEE-754 single precision.
    F32,
    /// IEEE-754 double precision.
    F64,
    /// Complex of two `f32`.
    C64,
    /// Complex of two `f64`.
    C128,
    /// Opaque bytes (no statistics).
    Bytes,
}

/// Every element type.
pub(crate) const ALL: [DType; 13] = [
    DType::U8,
    DType::U16,
    DType::U32,
    DType::U64,
    DType::I8,
    DType::I16,
    DType::I32,
    DType::I64,
    DType::F32,
    DType::F64,
    DType::C64,
    DType::C128,
    DType::Bytes,
];

impl DType {
    /// Bytes per element.
    pub fn size(self) -> usize {
        match self {
            DType::U8 | DType::I8 | DType::Bytes => 1,
            DType::U16 | DType::I16 => 2,
            DType::U32 | DType::I32 | DType::F32 => 4,
            DType::U64 | DType::I64 | DType::F64 | DType::C64 => 8,
            DType::C128 => 16,
        }
    }

    /// Canonical name (`u1`, `i8`, `f8`, `c16`, `bytes`).
    pub fn name(self) -> &'static str {
        match self {
            DType::U8 => "u1",
            DType::U16 => "u2",
            DType::U32 => "u4",
            DType::U64 => "u8",
            DType::I8 => "i1",
            DType::I16 => "i2",
            DType::I32 => "i4",
            DType::I64 => "i8",
            DType::F32 => "f4",
            DType::F64 => "f8",
            DType::C64 => "c8",
            DType::C128 => "c16",
            DType::Bytes => "bytes",
        }
    }

    /// Parses a user spelling: canonical names, numpy strings with a byte-order mark (`<f8`, `=i4`),
    /// and long names (`float64`, `int32`, `uint8`, `complex128`, `double`, `float`).
    pub fn parse(s: &str) -> Result<DType> {
        let t = s.trim().to_ascii_lowercase();
        let t = t.strip_prefix(['<', '=', '|']).unwrap_or(&t);
        let found = match t {
            "uint8" | "ubyte" => Some(DType::U8),
            "uint16" => Some(DType::U16),
            "uint32" => Some(DType::U32),
            "uint64" => Some(DType::U64),
            "int8" | "byte" => Some(DType::I8),
            "int16" | "short" => Some(DType::I16),
            "int32" | "int" => Some(DType::I32),
            "int64" | "long" => Some(DType::I64),
            "float32" | "float" | "single" => Some(DType::F32),
            "float64" | "double" => Some(DType::F64),
            "complex64" => Some(DType::C64),
            "complex128" => Some(DType::C128),
            "v1" | "s1" | "b" => Some(DType::Bytes),
            _ => ALL.iter().copied().find(|d| d.name() == t),
        };
        found.ok_or_else(|| {
            Error::InvalidArgument(format!(
                "unknown dtype '{s}'; use one of u1 u2 u4 u8 i1 i2 i4 i8 f4 f8 c8 c16 bytes \
                 (big-endian data must be converted to little-endian first)"
            ))
        })
    }

    /// Whether per-block min/max/mean are defined for this type.
    pub fn has_stats(self) -> bool {
        !matches!(self, DType::C64 | DType::C128 | DType::Bytes)
    }
}

impl std::fmt::Display for DType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

impl From<DType> for String {
    fn from(d: DType) -> String {
        d.name().to_string()
    }
}

impl TryFrom<String> for DType {
    type Error = Error;
    fn try_from(s: String) -> Result<DType> {
        DType::parse(&s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_canonical_name_round_trips() {
        for d in ALL {
            assert_eq!(DType::parse(d.name()).unwrap(), d);
        }
    }

    #[test]
    fn numpy_spellings_parse() {
        assert_eq!(DType::parse("<f8").unwrap(), DType::F64);
        assert_eq!(DType::parse("float32").unwrap(), DType::F32);
        assert_eq!(DType::parse("|u1").unwrap(), DType::U8);
        assert_eq!(DType::parse("complex128").unwrap(), DType::C128);
    }

    #[test]
    fn unknown_and_big_endian_are_refused_with_advice() {
        let e = DType::parse(">f8").unwrap_err().to_string();
        assert!(e.contains("'>f8'") && e.contains("little-endian"), "{e}");
        assert!(DType::parse("f16").is_err());
    }
}
