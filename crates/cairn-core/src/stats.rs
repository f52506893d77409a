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

/// Elements summed in `$sum` lanes before the lanes are added to the `f64` total: integers sum
/// exactly in integer lanes twice as wide that cannot overflow within this many. Measured on
/// 64 MiB: i32 in `f64` lanes 31 ms, in `i64` lanes 19 ms; u8 in 8 `f64` lanes ~100 ms, in 32
/// `u32` lanes 13 ms.
const SPAN: usize = 1 << 16;

/// Min, max, sum and count of the non-NaN values in `bytes` (whole elements of `$t`), in
/// `$lanes` independent accumulators (they break the dependency chain of one running min, max
/// and sum, so the loop vectorizes), the sums in lanes of `$sum`. With `$skip_nan` false the sum
/// takes every value and the count is the length: twice as fast, and exact unless a NaN is
/// there, which then shows in the sum (see `reduce_float`).
macro_rules! reduce {
    ($bytes:expr, $t:ty, $sum:ty, $lanes:expr, $lo:expr, $hi:expr, $skip_nan:expr) => {{
        const N: usize = std::mem::size_of::<$t>();
        const LANES: usize = $lanes;
        let (mut min, mut max) = ([$hi; LANES], [$lo; LANES]);
        let (mut total, mut n) = (0f64, [0u64; LANES]);
        for span in $bytes.chunks(N * SPAN) {
            let mut sum = [<$sum>::default(); LANES];
            let lanes = span.chunks_exact(N * LANES);
            let rest = lanes.remainder();
            let mut add = |i: usize, v: $t| {
                // A NaN never wins a comparison, so min and max skip it on their own.
                min[i] = if v < min[i] { v } else { min[i] };
                max[i] = if v > max[i] { v } else { max[i] };
                #[allow(clippy::float_cmp, clippy::eq_op)]
                let ok = !$skip_nan || v == v;
                sum[i] += if ok { v as $sum } else { <$sum>::default() };
                if $skip_nan {
                    n[i] += u64::from(ok);
                }
            };
            for c in lanes {
                for i in 0..LANES {
                    add(i, <$t>::from_le_bytes(c[i * N..(i + 1) * N].try_into().unwrap()));
                }
            }
            for (i, c) in rest.chunks_exact(N).enumerate() {
                add(i, <$t>::from_le_bytes(c.try_into().unwrap()));
            }
            total += sum.iter().map(|s| *s as f64).sum::<f64>();
        }
        let lo = min.into_iter().fold($hi, |a, b| if b < a { b } else { a });
        let hi = max.into_iter().fold($lo, |a, b| if b > a { b } else { a });
        let n = if $skip_nan { n.iter().sum::<u64>() } else { ($bytes.len() / N) as u64 };
        (lo as f64, hi as f64, total, n)
    }};
}

/// Statistics gathered in pieces: a block's values may be read a run at a time (each run whole
/// elements), by several threads, and merged. Integers are compared as `f64`, as they are kept.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Acc {
    dtype: DType,
    min: f64,
    max: f64,
    sum: f64,
    n: u64,
}

/// Floats: the fast reduction first; a NaN sum means a NaN (or both infinities) among the
/// values, and only then the NaN-skipping one runs. Measured on 256 MiB of f64 in cache:
/// one accumulator 38 ms, 8 NaN-skipping lanes 26 ms, 8 plain lanes 17 ms (crc32c: 13 ms).
macro_rules! reduce_float {
    ($bytes:expr, $t:ty) => {{
        let fast = reduce!($bytes, $t, f64, 8, <$t>::NEG_INFINITY, <$t>::INFINITY, false);
        if fast.2.is_nan() {
            reduce!($bytes, $t, f64, 8, <$t>::NEG_INFINITY, <$t>::INFINITY, true)
        } else {
            fast
        }
    }};
}

impl Acc {
    /// Nothing seen yet.
    pub fn new(dtype: DType) -> Acc {
        Acc { dtype, min: f64::INFINITY, max: f64::NEG_INFINITY, sum: 0.0, n: 0 }
    }

    /// Takes in `bytes`: whole little-endian elements.
    pub fn add(&mut self, bytes: &[u8]) {
        #[cfg(target_arch = "x86_64")]
        if std::arch::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2 (checked just above).
            return unsafe { self.add_avx2(bytes) };
        }
        self.reduce(bytes);
    }

    /// [`Acc::add`] compiled for AVX2: the lanes of `reduce!` become 256-bit vectors (the
    /// portable build targets SSE2). Measured on 256 MiB in cache, SSE2 → AVX2: f64 14.1 → 3.5 ms,
    /// f32 54 → 36, i32 39 → 17, u8 37 → 11 (AVX-512 was slower: f64 13.8 ms).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn add_avx2(&mut self, bytes: &[u8]) {
        self.reduce(bytes);
    }

    #[inline(always)]
    fn reduce(&mut self, bytes: &[u8]) {
        let (min, max, sum, n) = match self.dtype {
            DType::U8 => reduce!(bytes, u8, u32, 32, u8::MIN, u8::MAX, false),
            DType::U16 => reduce!(bytes, u16, u32, 16, u16::MIN, u16::MAX, false),
            DType::U32 => reduce!(bytes, u32, i64, 8, u32::MIN, u32::MAX, false),
            DType::U64 => reduce!(bytes, u64, f64, 8, u64::MIN, u64::MAX, false),
            DType::I8 => reduce!(bytes, i8, i32, 32, i8::MIN, i8::MAX, false),
            DType::I16 => reduce!(bytes, i16, i32, 16, i16::MIN, i16::MAX, false),
            DType::I32 => reduce!(bytes, i32, i64, 8, i32::MIN, i32::MAX, false),
            DType::I64 => reduce!(bytes, i64, f64, 8, i64::MIN, i64::MAX, false),
            DType::F32 => reduce_float!(bytes, f32),
            DType::F64 => reduce_float!(bytes, f64),
            DType::C64 | DType::C128 | DType::Bytes => return,
        };
        if n > 0 {
            self.merge(&Acc { dtype: self.dtype, min, max, sum, n });
        }
    }

    /// Takes in what `other` saw.
    pub fn merge(&mut self, other: &Acc) {
        if other.n > 0 {
            self.min = self.min.min(other.min);
            self.max = self.max.max(other.max);
            self.sum += other.sum;
            self.n += other.n;
        }
    }

    /// The statistics of everything seen.
    pub fn finish(&self) -> Stats {
        if self.n == 0 {
            return Stats::default();
        }
        Stats { min: Some(self.min), max: Some(self.max), mean: Some(self.sum / self.n as f64) }
    }
}

/// Computes the statistics of a little-endian buffer of `dtype` elements.
pub fn compute(dtype: DType, bytes: &[u8]) -> Stats {
    let mut acc = Acc::new(dtype);
    acc.add(bytes);
    acc.finish()
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

    #[test]
    fn infinities_are_values_and_only_nan_is_skipped() {
        let s = compute(DType::F64, &f64s(&[f64::INFINITY; 19]));
        assert_eq!((s.min, s.max), (Some(f64::INFINITY), Some(f64::INFINITY)));
        // Both infinities make the fast sum NaN; the NaN-skipping pass then gives the same NaN mean.
        let mut v = vec![1.0; 20];
        v[3] = f64::NEG_INFINITY;
        v[17] = f64::INFINITY;
        let s = compute(DType::F64, &f64s(&v));
        assert_eq!((s.min, s.max), (Some(f64::NEG_INFINITY), Some(f64::INFINITY)));
        assert!(s.mean.unwrap().is_nan());
    }

    #[test]
    fn integer_sums_do_not_overflow_their_lanes() {
        let n = 3 * SPAN + 5;
        let b: Vec<u8> = std::iter::repeat_n(u32::MAX.to_le_bytes(), n).flatten().collect();
        assert_eq!(compute(DType::U32, &b).mean, Some(f64::from(u32::MAX)));
        let b: Vec<u8> = std::iter::repeat_n(i32::MIN.to_le_bytes(), n).flatten().collect();
        assert_eq!(compute(DType::I32, &b).mean, Some(f64::from(i32::MIN)));
        assert_eq!(compute(DType::U8, &vec![255u8; n]).mean, Some(255.0));
        let b: Vec<u8> = std::iter::repeat_n(i16::MIN.to_le_bytes(), n).flatten().collect();
        assert_eq!(compute(DType::I16, &b).mean, Some(f64::from(i16::MIN)));
        let b: Vec<u8> = std::iter::repeat_n(u16::MAX.to_le_bytes(), n).flatten().collect();
        assert_eq!(compute(DType::U16, &b).mean, Some(f64::from(u16::MAX)));
    }

    /// One value at a time, as numpy's nanmin/nanmax/nanmean define them.
    fn naive(v: &[f64]) -> Stats {
        let ok: Vec<f64> = v.iter().copied().filter(|x| !x.is_nan()).collect();
        if ok.is_empty() {
            return Stats::default();
        }
        Stats {
            min: ok.iter().copied().reduce(f64::min),
            max: ok.iter().copied().reduce(f64::max),
            mean: Some(ok.iter().sum::<f64>() / ok.len() as f64),
        }
    }

    proptest::proptest! {
        /// The lanes and the fast path give what one value at a time gives, NaNs anywhere
        /// (including the tail that does not fill the lanes), for floats and integers.
        #[test]
        fn lanes_agree_with_one_value_at_a_time(v in proptest::collection::vec(-1e6f64..1e6, 0..100), nans in proptest::collection::vec(0usize..100, 0..4), cut in 0usize..20) {
            let mut v = v;
            let n = v.len();
            for i in nans.into_iter().filter(|i| *i < n) {
                v[i] = f64::NAN;
            }
            let (got, want) = (compute(DType::F64, &f64s(&v)), naive(&v));
            proptest::prop_assert_eq!((got.min, got.max), (want.min, want.max));
            proptest::prop_assert_eq!(got.mean.is_some(), want.mean.is_some());
            if let (Some(g), Some(w)) = (got.mean, want.mean) {
                proptest::prop_assert!((g - w).abs() <= 1e-9 * w.abs().max(1.0), "{} {}", g, w);
            }
            let ints: Vec<i32> = v.iter().filter(|x| !x.is_nan()).map(|x| *x as i32).collect();
            let b: Vec<u8> = ints.iter().flat_map(|x| x.to_le_bytes()).collect();
            let got = compute(DType::I32, &b);
            proptest::prop_assert_eq!(got.min, ints.iter().min().map(|x| f64::from(*x)));
            proptest::prop_assert_eq!(got.max, ints.iter().max().map(|x| f64::from(*x)));
            // In pieces of whole elements, merged: the same statistics.
            let mut acc = Acc::new(DType::F64);
            let bytes = f64s(&v);
            for piece in bytes.chunks(8 * cut.max(1)) {
                let mut part = Acc::new(DType::F64);
                part.add(piece);
                acc.merge(&part);
            }
            let (whole, pieces) = (compute(DType::F64, &bytes), acc.finish());
            proptest::prop_assert_eq!((whole.min, whole.max), (pieces.min, pieces.max));
            proptest::prop_assert_eq!(whole.mean.map(f64::is_nan), pieces.mean.map(f64::is_nan));
        }
    }
}
