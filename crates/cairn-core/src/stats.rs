//! Per-block statistics (min, max, mean), computed as a block is written and kept in the index so
//! that queries can skip blocks and users can inspect data without reading it.

use crate::dtype::DType;
use serde::{Deserialize, Serialize};

/// Summary of one block's values. `None` where undefined: complex or opaque types, empty blocks,
/// or floating-point blocks with no non-NaN value. NaNs are skipped, as numpy's `nanmin` does.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct Stats {
    /// Smallest value.
    #[serde(with = "crate::index::opt_f64")]
    pub min: Option<f64>,
    /// Largest value.
    #[serde(with = "crate::index::opt_f64")]
    pub max: Option<f64>,
    /// Arithmetic mean.
    #[serde(with = "crate::index::opt_f64")]
    pub mean: Option<f64>,
}

macro_rules! reduce {
    ($bytes:expr, $t:ty) => {{
        const N: usize = std::mem::size_of::<$t>();
        let mut min = <$t>::MAX;
        let mut max = <$t>::MIN;
        let mut sum = 0f64;
        let mut n = 0usize;
        for c in $bytes.chunks_exact(N) {
            let v = <$t>::from_le_bytes(c.try_into().unwrap());
            #[allow(clippy::float_cmp, unused_comparisons, clippy::eq_op)]
            if v == v {
                min = if v < min { v } else { min };
                max = if v > max { v } else { max };
                sum += v as f64;
                n += 1;
            }
        }
        if n == 0 {
            Stats::default()
        } else {
            Stats { min: Some(min as f64), max: Some(max as f64), mean: Some(sum / n as f64) }
        }
    }};
}

/// Computes the statistics of a little-endian buffer of `dtype` elements.
pub fn compute(dtype: DType, bytes: &[u8]) -> Stats {
    match dtype {
        DType::U8 => reduce!(bytes, u8),
        DType::U16 => reduce!(bytes, u16),
        DType::U32 => reduce!(bytes, u32),
        DType::U64 => reduce!(bytes, u64),
        DType::I8 => reduce!(bytes, i8),
        DType::I16 => reduce!(bytes, i16),
        DType::I32 => reduce!(bytes, i32),
        DType::I64 => reduce!(bytes, i64),
        DType::F32 => reduce!(bytes, f32),
        DType::F64 => reduce!(bytes, f64),
        DType::C64 | DType::C128 | DType::Bytes => Stats::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f64s(v: &[f64]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    #[test]
    fn float_stats_skip_nan() {
        let s = compute(DType::F64, &f64s(&[3.0, f64::NAN, -1.0, 4.0]));
        assert_eq!((s.min, s.max, s.mean), (Some(-1.0), Some(4.0), Some(2.0)));
        assert_eq!(compute(DType::F64, &f64s(&[f64::NAN])), Stats::default());
    }

    #[test]
    fn integer_and_undefined_stats() {
        let b: Vec<u8> = [-5i32, 7, 1].iter().flat_map(|x| x.to_le_bytes()).collect();
        let s = compute(DType::I32, &b);
        assert_eq!((s.min, s.max, s.mean), (Some(-5.0), Some(7.0), Some(1.0)));
        assert_eq!(compute(DType::C128, &[0u8; 32]), Stats::default());
        assert_eq!(compute(DType::U8, &[]), Stats::default());
    }
}
