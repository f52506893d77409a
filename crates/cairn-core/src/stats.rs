//! Per-block statistics (min, max, mean), computed as a block is written and kept in the index so
//! that queries can skip blocks and users can inspect data without reading it.
//!
//! Exact where it can be: min and max are elements converted to `f64` (exact for every type but
//! 64-bit integers beyond ±2⁵³, rounded to nearest there), so every path (staging, drain, `file`,
//! Python, C) gives the same bits. The mean is within 1 ulp of the exact mean of the non-NaN
//! values: integers sum exactly (`i128`), floats in double-double lanes (Knuth's TwoSum keeps
//! each addition's rounding error), and a piece whose error bound could reach the mean's last
//! bit (heavy cancellation) is summed again exactly (Shewchuk's partials). Pieces merge in
//! double-double. A block holding both +inf and −inf has mean NaN.

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

/// Elements summed in `$sum` lanes before the lanes are added to the exact `i128` total: integers
/// sum exactly in integer lanes twice as wide that cannot overflow within this many. Measured on
/// 64 MiB: i32 in `f64` lanes 31 ms, in `i64` lanes 19 ms; u8 in 8 `f64` lanes ~100 ms, in 32
/// `u32` lanes 13 ms.
const SPAN: usize = 1 << 16;

/// Min, max, exact sum (`i128`) and count of integer `bytes` (whole elements of `$t`), in
/// `$lanes` independent accumulators (they break the dependency chain of one running min, max
/// and sum, so the loop vectorizes), the sums in lanes of `$sum`.
macro_rules! reduce_int {
    ($bytes:expr, $t:ty, $sum:ty, $lanes:expr) => {{
        const N: usize = std::mem::size_of::<$t>();
        const LANES: usize = $lanes;
        let (mut min, mut max) = ([<$t>::MAX; LANES], [<$t>::MIN; LANES]);
        let mut total = 0i128;
        for span in $bytes.chunks(N * SPAN) {
            let mut sum = [<$sum>::default(); LANES];
            let lanes = span.chunks_exact(N * LANES);
            let rest = lanes.remainder();
            let mut add = |i: usize, v: $t| {
                min[i] = min[i].min(v);
                max[i] = max[i].max(v);
                sum[i] += v as $sum;
            };
            for c in lanes {
                for i in 0..LANES {
                    add(i, <$t>::from_le_bytes(c[i * N..(i + 1) * N].try_into().unwrap()));
                }
            }
            for (i, c) in rest.chunks_exact(N).enumerate() {
                add(i, <$t>::from_le_bytes(c.try_into().unwrap()));
            }
            total += sum.iter().map(|s| *s as i128).sum::<i128>();
        }
        let lo = min.into_iter().min().unwrap_or(<$t>::MAX);
        let hi = max.into_iter().max().unwrap_or(<$t>::MIN);
        let n = ($bytes.len() / N) as u64;
        Piece { min: lo as f64, max: hi as f64, sum: Dd::of_i128(total), n, exact: true }
    }};
}

/// Min, max, double-double sum and count of the non-NaN values of float `bytes` (whole elements
/// of `$t`) in 8 lanes, each a TwoSum accumulator `(s, c)` with the sum of its rounding errors'
/// magnitudes (`e`, for the error bound). With `$skip_nan` false every value is summed and the
/// count is the length: faster, and exact unless a NaN is there, which then shows in the sum.
macro_rules! reduce_float {
    ($bytes:expr, $t:ty, $skip_nan:expr) => {{
        const N: usize = std::mem::size_of::<$t>();
        const LANES: usize = 8;
        let (mut min, mut max) = ([<$t>::INFINITY; LANES], [<$t>::NEG_INFINITY; LANES]);
        let (mut s, mut c, mut e, mut n) = ([0f64; LANES], [0f64; LANES], [0f64; LANES], [0u64; LANES]);
        let lanes = $bytes.chunks_exact(N * LANES);
        let rest = lanes.remainder();
        // One value into lane `i`: inlined in the loop (no closure capturing the lanes, which
        // kept them in memory and the loop scalar: 5.4 GB/s for f64 against 20 for a plain sum).
        macro_rules! lane {
            ($i:expr, $v:expr) => {{
                let (i, v): (usize, $t) = ($i, $v);
                // A NaN never wins a comparison, so min and max skip it on their own.
                min[i] = if v < min[i] { v } else { min[i] };
                max[i] = if v > max[i] { v } else { max[i] };
                #[allow(clippy::float_cmp, clippy::eq_op)]
                let ok = !$skip_nan || v == v;
                let x = if ok { v as f64 } else { 0.0 };
                // TwoSum: s + x == t + err exactly.
                let t = s[i] + x;
                let bp = t - s[i];
                let err = (s[i] - (t - bp)) + (x - bp);
                s[i] = t;
                c[i] += err;
                e[i] += err.abs();
                if $skip_nan {
                    n[i] += u64::from(ok);
                }
            }};
        }
        for ch in lanes {
            for i in 0..LANES {
                lane!(i, <$t>::from_le_bytes(ch[i * N..(i + 1) * N].try_into().unwrap()));
            }
        }
        for (i, ch) in rest.chunks_exact(N).enumerate() {
            lane!(i, <$t>::from_le_bytes(ch.try_into().unwrap()));
        }
        let lo = min.into_iter().fold(<$t>::INFINITY, |a, b| if b < a { b } else { a });
        let hi = max.into_iter().fold(<$t>::NEG_INFINITY, |a, b| if b > a { b } else { a });
        let mut sum = Dd::default();
        for i in 0..LANES {
            // An infinity made the lane's error terms NaN; its sum is the infinity (or NaN).
            if !s[i].is_finite() {
                c[i] = 0.0;
            }
            sum = sum.add(Dd { hi: s[i], lo: 0.0 }).add(Dd { hi: c[i], lo: 0.0 });
        }
        let n = if $skip_nan { n.iter().sum::<u64>() } else { ($bytes.len() / N) as u64 };
        // Each lane's `c` is a sum of at most n/8 + 1 terms, each rounded once: its error is
        // below that count × ε × Σ|err|; the merges of the lanes above add 16 roundings of
        // at most ε × |sum| each (a bound of a bound: counted generously).
        let terms = (n / LANES as u64 + 1) as f64;
        let bound = terms * f64::EPSILON * e.iter().sum::<f64>() + 32.0 * f64::EPSILON * f64::EPSILON * sum.hi.abs();
        let exact = sum.hi.is_finite() && bound <= ulp(sum.hi) / 8.0;
        Piece { min: lo as f64, max: hi as f64, sum, n, exact }
    }};
}

/// A double-double number `hi + lo` (|lo| ≤ ulp(hi)/2): a sum kept to about 106 bits.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
struct Dd {
    hi: f64,
    lo: f64,
}

impl Dd {
    /// `self + o`, renormalised (TwoSum of the high parts, the low parts added to its error).
    fn add(self, o: Dd) -> Dd {
        let s = self.hi + o.hi;
        if !s.is_finite() {
            return Dd { hi: s, lo: 0.0 };
        }
        let bp = s - self.hi;
        let err = (self.hi - (s - bp)) + (o.hi - bp) + self.lo + o.lo;
        let hi = s + err;
        Dd { hi, lo: err - (hi - s) }
    }

    /// An exact integer sum, to 106 bits.
    fn of_i128(v: i128) -> Dd {
        let hi = v as f64;
        // |v - hi| ≤ ulp(hi)/2 < 2^75 fits an i128 exactly.
        let rest = v - hi as i128;
        Dd { hi, lo: 0.0 }.add(Dd { hi: rest as f64, lo: 0.0 })
    }

    /// `self / n`, rounded once: the quotient of the high part, corrected by the remainder
    /// (computed exactly with a fused multiply-add) and the low part.
    fn div(self, n: u64) -> f64 {
        let d = n as f64;
        let q = self.hi / d;
        if !q.is_finite() || q == 0.0 && self.hi == 0.0 && self.lo == 0.0 {
            return q;
        }
        let r = (-q).mul_add(d, self.hi) + self.lo;
        q + r / d
    }
}

/// The unit in the last place of `x` (of the smallest normal for zero and subnormals).
fn ulp(x: f64) -> f64 {
    let x = x.abs();
    if x < f64::MIN_POSITIVE {
        return f64::MIN_POSITIVE * f64::EPSILON;
    }
    let next = f64::from_bits(x.to_bits() + 1);
    if next.is_finite() {
        next - x
    } else {
        x - f64::from_bits(x.to_bits() - 1)
    }
}

/// The exact sum of finite `values`, as Shewchuk's non-overlapping partials (Python's
/// `math.fsum`), returned as a double-double: for the pieces whose fast sum cannot promise the
/// mean's last bit.
fn exact_sum(values: impl Iterator<Item = f64>) -> Dd {
    let mut partials: Vec<f64> = Vec::new();
    for mut x in values {
        let mut i = 0;
        for j in 0..partials.len() {
            let mut y = partials[j];
            if x.abs() < y.abs() {
                std::mem::swap(&mut x, &mut y);
            }
            let hi = x + y;
            let lo = y - (hi - x);
            if lo != 0.0 {
                partials[i] = lo;
                i += 1;
            }
            x = hi;
        }
        partials.truncate(i);
        partials.push(x);
    }
    // Largest last: summing from the top keeps the two largest parts.
    partials.iter().rev().fold(Dd::default(), |acc, p| acc.add(Dd { hi: *p, lo: 0.0 }))
}

/// The float lanes of [`reduce_float!`] written with AVX2 intrinsics: LLVM keeps the TwoSum
/// lanes scalar (measured: f64 5.4 GB/s, f32 2.8 GB/s, against 20 and 7 for the plain sum they
/// replace), vectors of 4 doubles run them at the plain sum's speed. Same results: the tail
/// that does not fill a vector goes through the portable lanes, merged in double-double.
#[cfg(target_arch = "x86_64")]
mod avx2 {
    use super::{ulp, Dd, Piece};
    use std::arch::x86_64::*;

    /// Min, max, double-double sum and count of the float values in `bytes` (f32 when `single`,
    /// else f64), NaNs left out of the sum with `skip_nan` (else summed: a NaN sum tells).
    ///
    /// # Safety
    /// The CPU must have AVX2.
    #[target_feature(enable = "avx2")]
    pub(super) unsafe fn lanes(bytes: &[u8], single: bool, skip_nan: bool) -> Piece {
        const V: usize = 8; // values per iteration: two vectors of 4 doubles
        let size = if single { 4 } else { 8 };
        let whole = bytes.len() / (size * V) * (size * V);
        let (head, tail) = bytes.split_at(whole);
        let sign = _mm256_set1_pd(-0.0);
        let (mut lo, mut hi) = ([_mm256_set1_pd(f64::INFINITY); 2], [_mm256_set1_pd(f64::NEG_INFINITY); 2]);
        let (mut s, mut c, mut e) = ([_mm256_setzero_pd(); 2], [_mm256_setzero_pd(); 2], [_mm256_setzero_pd(); 2]);
        let mut n = 0u64;
        for chunk in head.chunks_exact(size * V) {
            let p = chunk.as_ptr();
            // SAFETY: the chunk holds 8 values of `size` bytes (unaligned loads).
            let xs: [__m256d; 2] = if single {
                let f = unsafe { _mm256_loadu_ps(p as *const f32) };
                [_mm256_cvtps_pd(_mm256_castps256_ps128(f)), _mm256_cvtps_pd(_mm256_extractf128_ps(f, 1))]
            } else {
                unsafe { [_mm256_loadu_pd(p as *const f64), _mm256_loadu_pd((p as *const f64).add(4))] }
            };
            for j in 0..2 {
                let mut x = xs[j];
                // min/max return their second operand when one is NaN: a NaN value never wins.
                lo[j] = _mm256_min_pd(x, lo[j]);
                hi[j] = _mm256_max_pd(x, hi[j]);
                if skip_nan {
                    let ok = _mm256_cmp_pd(x, x, _CMP_ORD_Q);
                    x = _mm256_and_pd(x, ok);
                    n += u64::from((_mm256_movemask_pd(ok) as u32).count_ones());
                }
                // TwoSum: s + x == t + err exactly.
                let t = _mm256_add_pd(s[j], x);
                let bp = _mm256_sub_pd(t, s[j]);
                let err = _mm256_add_pd(_mm256_sub_pd(s[j], _mm256_sub_pd(t, bp)), _mm256_sub_pd(x, bp));
                s[j] = t;
                c[j] = _mm256_add_pd(c[j], err);
                e[j] = _mm256_add_pd(e[j], _mm256_andnot_pd(sign, err));
            }
        }
        let out = |v: __m256d| -> [f64; 4] {
            let mut a = [0f64; 4];
            // SAFETY: a holds 4 doubles.
            unsafe { _mm256_storeu_pd(a.as_mut_ptr(), v) };
            a
        };
        let mut sum = Dd::default();
        let mut errs = 0f64;
        let (mut min, mut max) = (f64::INFINITY, f64::NEG_INFINITY);
        for j in 0..2 {
            for ((sv, cv), ev) in out(s[j]).into_iter().zip(out(c[j])).zip(out(e[j])) {
                // An infinity made the lane's error terms NaN; its sum is the infinity (or NaN).
                let cv = if sv.is_finite() { cv } else { 0.0 };
                sum = sum.add(Dd { hi: sv, lo: 0.0 }).add(Dd { hi: cv, lo: 0.0 });
                errs += ev;
            }
            for v in out(lo[j]) {
                min = if v < min { v } else { min };
            }
            for v in out(hi[j]) {
                max = if v > max { v } else { max };
            }
        }
        let n = if skip_nan { n } else { (whole / size) as u64 };
        let terms = (n / V as u64 + 1) as f64;
        let bound = terms * f64::EPSILON * errs + 32.0 * f64::EPSILON * f64::EPSILON * sum.hi.abs();
        let mut p = Piece { min, max, sum, n, exact: sum.hi.is_finite() && bound <= ulp(sum.hi) / 8.0 };
        if !tail.is_empty() {
            let t = match (single, skip_nan) {
                (true, false) => reduce_float!(tail, f32, false),
                (true, true) => reduce_float!(tail, f32, true),
                (false, false) => reduce_float!(tail, f64, false),
                (false, true) => reduce_float!(tail, f64, true),
            };
            p.min = if t.min < p.min { t.min } else { p.min };
            p.max = if t.max > p.max { t.max } else { p.max };
            p.sum = p.sum.add(t.sum);
            p.n += t.n;
            p.exact &= t.exact;
        }
        p
    }
}

/// What one reduction saw.
struct Piece {
    min: f64,
    max: f64,
    sum: Dd,
    n: u64,
    /// The sum's error cannot reach the mean's last bit.
    exact: bool,
}

/// Statistics gathered in pieces: a block's values may be read a run at a time (each run whole
/// elements), by several threads, and merged. Integers are compared as `f64`, as they are kept.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Acc {
    dtype: DType,
    min: f64,
    max: f64,
    sum: Dd,
    n: u64,
}

/// The floats of `bytes` as `f64`, NaNs left out (for the exact re-summation).
fn finite_values<'a, const N: usize>(bytes: &'a [u8], conv: fn([u8; N]) -> f64) -> impl Iterator<Item = f64> + 'a {
    bytes.chunks_exact(N).map(move |c| conv(c.try_into().unwrap())).filter(|v| !v.is_nan())
}

/// Floats: the fast reduction first; a NaN sum means a NaN (or both infinities) among the
/// values, and only then the NaN-skipping one runs; a finite sum whose error bound could reach
/// the mean's last bit is summed again exactly. Measured on 256 MiB of f64 in cache (AVX2): one
/// plain accumulator 38 ms, 8 plain lanes 3.5 ms, 8 TwoSum lanes with the error bound 5.9 ms.
macro_rules! reduce_floats {
    ($bytes:expr, $t:ty) => {{
        let lanes = |skip_nan: bool| -> Piece {
            #[cfg(target_arch = "x86_64")]
            if std::arch::is_x86_feature_detected!("avx2") {
                // SAFETY: the CPU has AVX2 (checked just above).
                return unsafe { avx2::lanes($bytes, std::mem::size_of::<$t>() == 4, skip_nan) };
            }
            if skip_nan {
                reduce_float!($bytes, $t, true)
            } else {
                reduce_float!($bytes, $t, false)
            }
        };
        let fast = lanes(false);
        let mut p = if fast.sum.hi.is_nan() { lanes(true) } else { fast };
        if p.sum.hi.is_finite() && !p.exact {
            p.sum = exact_sum(finite_values::<{ std::mem::size_of::<$t>() }>($bytes, |b| <$t>::from_le_bytes(b) as f64));
        }
        p
    }};
}

impl Acc {
    /// Nothing seen yet.
    pub fn new(dtype: DType) -> Acc {
        Acc { dtype, min: f64::INFINITY, max: f64::NEG_INFINITY, sum: Dd::default(), n: 0 }
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

    /// [`Acc::add`] compiled for AVX2: the lanes become 256-bit vectors (the portable build
    /// targets SSE2). Measured on 256 MiB in cache, SSE2 → AVX2: f64 14.1 → 3.5 ms, f32 54 → 36,
    /// i32 39 → 17, u8 37 → 11 (AVX-512 was slower: f64 13.8 ms).
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn add_avx2(&mut self, bytes: &[u8]) {
        self.reduce(bytes);
    }

    #[inline(always)]
    fn reduce(&mut self, bytes: &[u8]) {
        let p = match self.dtype {
            DType::U8 => reduce_int!(bytes, u8, u32, 32),
            DType::U16 => reduce_int!(bytes, u16, u32, 16),
            DType::U32 => reduce_int!(bytes, u32, i64, 8),
            DType::U64 => reduce_int!(bytes, u64, i128, 8),
            DType::I8 => reduce_int!(bytes, i8, i32, 32),
            DType::I16 => reduce_int!(bytes, i16, i32, 16),
            DType::I32 => reduce_int!(bytes, i32, i64, 8),
            DType::I64 => reduce_int!(bytes, i64, i128, 8),
            DType::F32 => reduce_floats!(bytes, f32),
            DType::F64 => reduce_floats!(bytes, f64),
            DType::C64 | DType::C128 | DType::Bytes => return,
        };
        if p.n > 0 {
            self.merge(&Acc { dtype: self.dtype, min: p.min, max: p.max, sum: p.sum, n: p.n });
        }
    }

    /// Takes in what `other` saw.
    pub fn merge(&mut self, other: &Acc) {
        if other.n > 0 {
            self.min = self.min.min(other.min);
            self.max = self.max.max(other.max);
            self.sum = self.sum.add(other.sum);
            self.n += other.n;
        }
    }

    /// The statistics of everything seen.
    pub fn finish(&self) -> Stats {
        if self.n == 0 {
            return Stats::default();
        }
        Stats { min: Some(self.min), max: Some(self.max), mean: Some(self.sum.div(self.n)) }
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
        assert_eq!((s.min, s.max, s.mean), (Some(f64::INFINITY), Some(f64::INFINITY), Some(f64::INFINITY)));
        let mut v = vec![1.0; 20];
        v[5] = f64::NEG_INFINITY;
        v[9] = f64::NAN;
        assert_eq!(compute(DType::F64, &f64s(&v)).mean, Some(f64::NEG_INFINITY));
        // Both infinities: the mean is NaN.
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
        let b: Vec<u8> = std::iter::repeat_n(u64::MAX.to_le_bytes(), n).flatten().collect();
        assert_eq!(compute(DType::U64, &b).mean, Some(u64::MAX as f64));
        let b: Vec<u8> = std::iter::repeat_n(i64::MIN.to_le_bytes(), n).flatten().collect();
        assert_eq!(compute(DType::I64, &b).mean, Some(i64::MIN as f64));
    }

    #[test]
    fn cancellation_that_defeats_double_double_is_summed_exactly() {
        // TwoSum's error terms 1 and 1e-300 round together, losing the 1e-300 the sum is made of.
        let v = [1e300, 1.0, -1e300, -1.0, 1e-300];
        assert_eq!(compute(DType::F64, &f64s(&v)).mean, Some(1e-300 / 5.0));
    }

    /// Mantissa and exponent of a finite nonzero double: `x == a × 2^b`, `|a| < 2^53`.
    fn split(x: f64) -> (i128, i32) {
        let bits = x.to_bits();
        let exp = ((bits >> 52) & 0x7ff) as i32;
        let frac = (bits & ((1 << 52) - 1)) as i128;
        let (a, b) = if exp == 0 { (frac, -1074) } else { (frac | (1 << 52), exp - 1075) };
        (if x < 0.0 { -a } else { a }, b)
    }

    /// Whether `mean` is within 1 ulp of `sum / den` (integers), compared exactly.
    fn within_ulp(mean: f64, sum: i128, den: i128) -> bool {
        if sum == 0 || mean == 0.0 {
            return sum == 0 && mean == 0.0;
        }
        let (a, b) = split(mean);
        // |a·2^b − sum/den| ≤ 2^b  ⇔  |a·den − sum·2^−b| ≤ den (b < 0), scaled the other way for b ≥ 0.
        if b < 0 {
            (a * den - (sum << -b)).abs() <= den
        } else {
            ((a * den) << b) - sum <= den << b && sum - ((a * den) << b) <= den << b
        }
    }

    /// The bytes of `vals` cast to `dtype`.
    fn ints_of(dtype: DType, vals: &[i64]) -> Vec<u8> {
        vals.iter()
            .flat_map(|&v| match dtype {
                DType::U8 => (v as u8).to_le_bytes().to_vec(),
                DType::U16 => (v as u16).to_le_bytes().to_vec(),
                DType::U32 => (v as u32).to_le_bytes().to_vec(),
                DType::U64 => (v as u64).to_le_bytes().to_vec(),
                DType::I8 => (v as i8).to_le_bytes().to_vec(),
                DType::I16 => (v as i16).to_le_bytes().to_vec(),
                DType::I32 => (v as i32).to_le_bytes().to_vec(),
                _ => v.to_le_bytes().to_vec(),
            })
            .collect()
    }

    fn int_value(dtype: DType, v: i64) -> i128 {
        match dtype {
            DType::U8 => i128::from(v as u8),
            DType::U16 => i128::from(v as u16),
            DType::U32 => i128::from(v as u32),
            DType::U64 => i128::from(v as u64),
            DType::I8 => i128::from(v as i8),
            DType::I16 => i128::from(v as i16),
            DType::I32 => i128::from(v as i32),
            _ => i128::from(v),
        }
    }

    const INTS: [DType; 8] = [DType::U8, DType::U16, DType::U32, DType::U64, DType::I8, DType::I16, DType::I32, DType::I64];

    proptest::proptest! {
        /// Every integer type: min and max are the extreme elements as f64, the mean within 1 ulp
        /// of the exact mean (the sum is exact in i128), in one piece or many.
        #[test]
        fn integer_stats_are_exact(vals in proptest::collection::vec(proptest::num::i64::ANY, 1..200), t in 0usize..8, cut in 1usize..40) {
            let dtype = INTS[t];
            let bytes = ints_of(dtype, &vals);
            let exact: Vec<i128> = vals.iter().map(|&v| int_value(dtype, v)).collect();
            let s = compute(dtype, &bytes);
            proptest::prop_assert_eq!(s.min, exact.iter().min().map(|v| *v as f64));
            proptest::prop_assert_eq!(s.max, exact.iter().max().map(|v| *v as f64));
            let sum: i128 = exact.iter().sum();
            proptest::prop_assert!(within_ulp(s.mean.unwrap(), sum, exact.len() as i128), "{:?} vs {}/{}", s.mean, sum, exact.len());
            let mut acc = Acc::new(dtype);
            for piece in bytes.chunks(dtype.size() * cut) {
                let mut part = Acc::new(dtype);
                part.add(piece);
                acc.merge(&part);
            }
            proptest::prop_assert_eq!(acc.finish(), s);
        }

        /// Floats (f64 and f32) of every magnitude and sign, NaNs and infinities anywhere: min and
        /// max are elements, the mean within 1 ulp of the exact mean of the non-NaN values (each
        /// value is `m × 2^k`, summed exactly as an integer over 2^30, or 2^53 for f32's rounded
        /// values), +inf alone gives +inf, both
        /// infinities NaN.
        #[test]
        fn float_means_are_within_one_ulp(parts in proptest::collection::vec((-(1i64 << 53)..(1i64 << 53), -30i32..10), 1..200),
                                          specials in proptest::collection::vec((0usize..200, 0u8..3), 0..4), single in proptest::bool::ANY) {
            let mut v: Vec<f64> = parts.iter().map(|&(m, k)| m as f64 * 2f64.powi(k)).collect();
            if single {
                v = v.iter().map(|x| f64::from(*x as f32)).collect();
            }
            let n = v.len();
            let (mut pos, mut neg) = (false, false);
            for (i, kind) in specials {
                if i < n {
                    v[i] = [f64::NAN, f64::INFINITY, f64::NEG_INFINITY][kind as usize];
                }
            }
            for x in &v {
                pos |= *x == f64::INFINITY;
                neg |= *x == f64::NEG_INFINITY;
            }
            let (dtype, bytes) = if single {
                (DType::F32, v.iter().flat_map(|x| (*x as f32).to_le_bytes()).collect::<Vec<u8>>())
            } else {
                (DType::F64, f64s(&v))
            };
            let s = compute(dtype, &bytes);
            let ok: Vec<f64> = v.iter().copied().filter(|x| !x.is_nan()).collect();
            if ok.is_empty() {
                proptest::prop_assert_eq!(s, Stats::default());
                return Ok(());
            }
            proptest::prop_assert_eq!(s.min, ok.iter().copied().reduce(f64::min));
            proptest::prop_assert_eq!(s.max, ok.iter().copied().reduce(f64::max));
            let mean = s.mean.unwrap();
            match (pos, neg) {
                (true, true) => proptest::prop_assert!(mean.is_nan()),
                (true, false) => proptest::prop_assert_eq!(mean, f64::INFINITY),
                (false, true) => proptest::prop_assert_eq!(mean, f64::NEG_INFINITY),
                (false, false) => {
                    let scale = if single { 53 } else { 30 };
                    let sum: i128 = ok.iter().map(|&x| {
                        let (a, b) = split(x);
                        // Exact: every value is a multiple of 2^-scale.
                        match b + scale { 0.. => a << (b + scale), sh => a >> -sh }
                    }).sum();
                    proptest::prop_assert!(within_ulp(mean, sum, (ok.len() as i128) << scale), "{} vs {}/{}", mean, sum, ok.len());
                }
            }
        }
    }
}
