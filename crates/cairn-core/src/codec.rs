//! The compression pipeline: a type-specific first pass, then a general byte compressor
//! (mcrEngine's double compression, with faster successors to its codecs).
//!
//! A [`Pipeline`] is written as a short spec that travels in indexes: stages joined by `+`, e.g.
//! `pco:f8le:6+zstd:1`, `zstd:3`, `gzip:6`, `raw`. Decoding needs only the spec and the raw length.
//!
//! - `pco:<elem>:<level>` models numbers (pcodec: delta/bin/ANS; replaces FPC and fpzip). `<elem>` is
//!   the element type and byte order of the input (`f8le`, `i4be`, …); complex values are coded as
//!   their real and imaginary floats. A length that is not a whole number of elements keeps its
//!   tail bytes raw. Its output is `u64 LE length of the pco bytes | pco bytes | tail`.
//! - `zstd:<level>` and `gzip:<level>` compress bytes (zstd replaces QuickLZ and the gzip second
//!   pass; gzip stays as the paper's baseline).
//! - `raw` stores the bytes unchanged (chosen when nothing else shrinks them).
//!
//! [`compress`] picks the pipeline from a [`Policy`]: `Aware` is the data-aware choice by element
//! type, the others force one byte codec on everything (the data-agnostic baselines).

use crate::dtype::DType;
use crate::error::{Error, Result};
use std::borrow::Cow;
use std::io::{Read, Write};

/// Inputs shorter than this skip the type-specific pass (mcrEngine omits variables < 100 B from it:
/// the model's header outweighs the gain).
pub const MIN_MODELLED: usize = 100;

/// A second pass is kept only if it saves at least this share of its input.
const SECOND_PASS_MIN_GAIN: f64 = 0.02;

/// Element type and byte order of the bytes handed to the codec.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Element {
    /// The element type.
    pub dtype: DType,
    /// Whether the values are stored big-endian.
    pub big_endian: bool,
}

impl Element {
    /// Parses numpy's `dtype.str` spelling (`<f8`, `>i4`, `|u1`) or a canonical name (`f8`).
    pub fn parse(s: &str) -> Result<Element> {
        let t = s.trim();
        let (big_endian, rest) = match t.strip_prefix('>') {
            Some(rest) => (true, rest),
            None => (false, t),
        };
        Ok(Element { dtype: DType::parse(rest)?, big_endian })
    }

    /// The spec spelling, e.g. `f8le`.
    fn spec(self) -> String {
        format!("{}{}", self.dtype.name(), if self.big_endian { "be" } else { "le" })
    }

    fn parse_spec(s: &str) -> Option<Element> {
        let (name, big_endian) = match (s.strip_suffix("le"), s.strip_suffix("be")) {
            (Some(n), _) => (n, false),
            (_, Some(n)) => (n, true),
            _ => return None,
        };
        DType::parse(name).ok().filter(|d| *d != DType::Bytes).map(|dtype| Element { dtype, big_endian })
    }
}

/// How to choose the pipeline for a buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Policy {
    /// Data-aware: numbers of ≥ [`MIN_MODELLED`] bytes get pco then zstd (kept only if it helps);
    /// everything else gets zstd.
    Aware,
    /// zstd at a level on every buffer.
    Zstd(i32),
    /// gzip at a level on every buffer (the paper's baseline).
    Gzip(u32),
    /// Store raw.
    Raw,
}

impl Policy {
    /// Parses `aware`, `zstd`, `zstd:LEVEL`, `gzip`, `gzip:LEVEL`, `raw`.
    pub fn parse(s: &str) -> Result<Policy> {
        let (name, level) = match s.split_once(':') {
            Some((n, l)) => (n, Some(l)),
            None => (s, None),
        };
        let bad = || Error::InvalidArgument(format!("unknown codec '{s}'; use aware, zstd[:1-19], gzip[:1-9] or raw"));
        let level_in = |lo: i64, hi: i64, default: i64| -> Result<i64> {
            match level {
                None => Ok(default),
                Some(l) => l.parse::<i64>().ok().filter(|v| (lo..=hi).contains(v)).ok_or_else(bad),
            }
        };
        match name {
            "aware" if level.is_none() => Ok(Policy::Aware),
            "zstd" => Ok(Policy::Zstd(level_in(1, 19, 3)? as i32)),
            "gzip" => Ok(Policy::Gzip(level_in(1, 9, 6)? as u32)),
            "raw" if level.is_none() => Ok(Policy::Raw),
            _ => Err(bad()),
        }
    }
}

/// One stage of a pipeline.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// Numeric modelling with pcodec at a level (0–12).
    Pco(Element, u8),
    /// zstd at a level.
    Zstd(i32),
    /// gzip (DEFLATE in a gzip member) at a level.
    Gzip(u32),
    /// Bytes unchanged.
    Raw,
}

/// The stages a buffer went through, first applied first.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pipeline(pub Vec<Stage>);

impl std::fmt::Display for Pipeline {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for (i, s) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("+")?;
            }
            match s {
                Stage::Pco(e, level) => write!(f, "pco:{}:{level}", e.spec())?,
                Stage::Zstd(level) => write!(f, "zstd:{level}")?,
                Stage::Gzip(level) => write!(f, "gzip:{level}")?,
                Stage::Raw => f.write_str("raw")?,
            }
        }
        Ok(())
    }
}

impl Pipeline {
    /// Whether the bytes are stored unchanged.
    pub fn is_raw(&self) -> bool {
        self.0 == [Stage::Raw]
    }

    /// Parses a spec written by [`Pipeline`]'s `Display`.
    pub fn parse(spec: &str) -> Result<Pipeline> {
        let bad = |part: &str| Error::Corrupt(format!("codec spec '{spec}': cannot read stage '{part}'"));
        let mut stages = Vec::new();
        for part in spec.split('+') {
            let fields: Vec<&str> = part.split(':').collect();
            let stage = match fields.as_slice() {
                ["raw"] => Stage::Raw,
                ["zstd", l] => Stage::Zstd(l.parse().map_err(|_| bad(part))?),
                ["gzip", l] => Stage::Gzip(l.parse().ok().filter(|l| *l <= 9).ok_or_else(|| bad(part))?),
                ["pco", e, l] => Stage::Pco(
                    Element::parse_spec(e).ok_or_else(|| bad(part))?,
                    l.parse().ok().filter(|l| *l <= 12).ok_or_else(|| bad(part))?,
                ),
                _ => return Err(bad(part)),
            };
            stages.push(stage);
        }
        if stages.iter().skip(1).any(|s| matches!(s, Stage::Pco(..))) {
            return Err(Error::Corrupt(format!("codec spec '{spec}': pco can only be the first stage")));
        }
        if stages.len() > 2 {
            return Err(Error::Corrupt(format!("codec spec '{spec}' has {} stages; at most 2 are written", stages.len())));
        }
        Ok(Pipeline(stages))
    }

    /// Applies the stages to `src`.
    pub fn encode(&self, src: &[u8]) -> Result<Vec<u8>> {
        let mut cur: Option<Vec<u8>> = None;
        for stage in &self.0 {
            let input = cur.as_deref().unwrap_or(src);
            cur = Some(encode_stage(*stage, input)?);
        }
        Ok(cur.unwrap_or_else(|| src.to_vec()))
    }

    /// Undoes the stages into `out`, which must be exactly the raw length.
    pub fn decode_into(&self, src: &[u8], out: &mut [u8]) -> Result<()> {
        let Some((first, rest)) = self.0.split_first() else {
            return copy_exact(src, out, "raw");
        };
        // Stages other than the first produce an intermediate of unknown length; a damaged one
        // must not expand without bound, and no first stage grows data by more than this.
        let limit = 2 * out.len() as u64 + 4096;
        let mut cur: Option<Vec<u8>> = None;
        for stage in rest.iter().rev() {
            let input = cur.as_deref().unwrap_or(src);
            cur = Some(decode_stage_to_vec(*stage, input, limit)?);
        }
        decode_stage_into(*first, cur.as_deref().unwrap_or(src), out)
    }
}

/// Compresses `src` as `policy` says, `elem` being its element type when known; returns the
/// pipeline used and the bytes. Never grows the data: incompressible input is stored `raw`, and
/// then the bytes returned are `src` itself (callers writing it need no copy).
pub fn compress(src: &[u8], elem: Option<Element>, policy: Policy) -> Result<(Pipeline, Cow<'_, [u8]>)> {
    let raw = || (Pipeline(vec![Stage::Raw]), Cow::Borrowed(src));
    let first = match policy {
        Policy::Raw => return Ok(raw()),
        Policy::Zstd(l) => Stage::Zstd(l),
        Policy::Gzip(l) => Stage::Gzip(l),
        Policy::Aware => match elem.filter(|e| modelled(e.dtype)) {
            Some(e) if src.len() >= MIN_MODELLED => Stage::Pco(e, PCO_LEVEL),
            _ => Stage::Zstd(ZSTD_LEVEL),
        },
    };
    let mut stages = vec![first];
    let mut out = encode_stage(first, src)?;
    if matches!(first, Stage::Pco(..)) {
        // pco's output is already entropy coded, but repeated runs across processes (identical
        // initial values, masks) still shrink under zstd; keep the pass only when it pays.
        let second = encode_stage(Stage::Zstd(SECOND_PASS_LEVEL), &out)?;
        if (second.len() as f64) < out.len() as f64 * (1.0 - SECOND_PASS_MIN_GAIN) {
            stages.push(Stage::Zstd(SECOND_PASS_LEVEL));
            out = second;
        }
    }
    if out.len() >= src.len() {
        return Ok(raw());
    }
    Ok((Pipeline(stages), Cow::Owned(out)))
}

/// pco level for the aware policy. Measured on the pack benchmark's ALE3D- and Enzo-like sets:
/// level 8 gains about 5% ratio at 20–40% less speed; level 2 was both slower and worse.
const PCO_LEVEL: u8 = 4;
/// zstd level for untyped data under the aware policy.
const ZSTD_LEVEL: i32 = 3;
/// zstd level of the second pass after pco.
const SECOND_PASS_LEVEL: i32 = 1;

/// Types pco models well. Bytes are symbols, not numbers, so they go to zstd.
fn modelled(d: DType) -> bool {
    !matches!(d, DType::Bytes | DType::U8 | DType::I8)
}

fn copy_exact(src: &[u8], out: &mut [u8], what: &str) -> Result<()> {
    if src.len() != out.len() {
        return Err(Error::Corrupt(format!("{what} data has {} bytes where {} were recorded", src.len(), out.len())));
    }
    out.copy_from_slice(src);
    Ok(())
}

fn encode_stage(stage: Stage, src: &[u8]) -> Result<Vec<u8>> {
    match stage {
        Stage::Raw => Ok(src.to_vec()),
        Stage::Zstd(level) => zstd::bulk::compress(src, level).map_err(|e| Error::InvalidArgument(format!("zstd: {e}"))),
        Stage::Gzip(level) => {
            let mut enc = flate2::write::GzEncoder::new(Vec::with_capacity(src.len() / 2), flate2::Compression::new(level));
            enc.write_all(src).and_then(|_| enc.finish()).map_err(|e| Error::io("gzip compression", e))
        }
        Stage::Pco(elem, level) => pco_encode(elem, level, src),
    }
}

fn decode_stage_to_vec(stage: Stage, src: &[u8], limit: u64) -> Result<Vec<u8>> {
    let corrupt = |what: &str, e: &dyn std::fmt::Display| Error::Corrupt(format!("{what} data does not decode: {e}"));
    let bounded = |what: &str, out: Vec<u8>| {
        if out.len() as u64 > limit {
            return Err(Error::Corrupt(format!("{what} data expands past {limit} bytes, more than its recorded length allows")));
        }
        Ok(out)
    };
    match stage {
        Stage::Raw => Ok(src.to_vec()),
        Stage::Zstd(_) => {
            let mut out = Vec::new();
            zstd::stream::read::Decoder::new(src).and_then(|d| d.take(limit + 1).read_to_end(&mut out)).map_err(|e| corrupt("zstd", &e))?;
            bounded("zstd", out)
        }
        Stage::Gzip(_) => {
            let mut out = Vec::new();
            flate2::read::GzDecoder::new(src).take(limit + 1).read_to_end(&mut out).map_err(|e| corrupt("gzip", &e))?;
            bounded("gzip", out)
        }
        Stage::Pco(..) => Err(Error::Corrupt("codec pipeline has pco after another stage; pco can only be the first".into())),
    }
}

fn decode_stage_into(stage: Stage, src: &[u8], out: &mut [u8]) -> Result<()> {
    match stage {
        Stage::Raw => copy_exact(src, out, "raw"),
        Stage::Zstd(_) => {
            let n = zstd::bulk::decompress_to_buffer(src, out).map_err(|e| Error::Corrupt(format!("zstd data does not decode: {e}")))?;
            if n != out.len() {
                return Err(Error::Corrupt(format!("zstd data decodes to {n} bytes where {} were recorded", out.len())));
            }
            Ok(())
        }
        Stage::Gzip(_) => copy_exact(&decode_stage_to_vec(stage, src, out.len() as u64)?, out, "gzip"),
        Stage::Pco(elem, _) => pco_decode(elem, src, out),
    }
}

/// Calls `$body` with `$t` bound to the Rust number type pco codes for `$elem`.
macro_rules! with_number {
    ($elem:expr, $t:ident => $body:expr) => {
        match $elem.dtype {
            DType::U16 => {
                type $t = u16;
                $body
            }
            DType::U32 => {
                type $t = u32;
                $body
            }
            DType::U64 => {
                type $t = u64;
                $body
            }
            DType::I16 => {
                type $t = i16;
                $body
            }
            DType::I32 => {
                type $t = i32;
                $body
            }
            DType::I64 => {
                type $t = i64;
                $body
            }
            DType::F32 | DType::C64 => {
                type $t = f32;
                $body
            }
            DType::F64 | DType::C128 => {
                type $t = f64;
                $body
            }
            DType::U8 => {
                type $t = u8;
                $body
            }
            DType::I8 => {
                type $t = i8;
                $body
            }
            DType::Bytes => unreachable!("Element::parse_spec and compress never give pco Bytes"),
        }
    };
}

/// Number types read from and written to bytes in either order.
trait Bytes: Sized + Copy + Default {
    const N: usize;
    fn read(b: &[u8], big: bool) -> Self;
    fn write(self, b: &mut [u8], big: bool);
}

macro_rules! impl_bytes {
    ($($t:ty),*) => {$(
        impl Bytes for $t {
            const N: usize = std::mem::size_of::<$t>();
            fn read(b: &[u8], big: bool) -> Self {
                let a = b.try_into().expect("chunks_exact gives N bytes");
                if big { <$t>::from_be_bytes(a) } else { <$t>::from_le_bytes(a) }
            }
            fn write(self, b: &mut [u8], big: bool) {
                b.copy_from_slice(&if big { self.to_be_bytes() } else { self.to_le_bytes() });
            }
        }
    )*};
}
impl_bytes!(u8, u16, u32, u64, i8, i16, i32, i64, f32, f64);

fn pco_encode(elem: Element, level: u8, src: &[u8]) -> Result<Vec<u8>> {
    with_number!(elem, T => {
        let whole = src.len() / T::N * T::N;
        // pco needs aligned native numbers; the byte-order conversion is this copy.
        let nums: Vec<T> = src[..whole].chunks_exact(T::N).map(|c| T::read(c, elem.big_endian)).collect();
        let config = pco::ChunkConfig::default().with_compression_level(level as usize).with_enable_8_bit(true);
        let coded = if nums.is_empty() {
            Vec::new()
        } else {
            pco::standalone::simple_compress(&nums, &config).map_err(|e| Error::InvalidArgument(format!("pco: {e}")))?
        };
        let mut out = Vec::with_capacity(8 + coded.len() + src.len() - whole);
        out.extend_from_slice(&(coded.len() as u64).to_le_bytes());
        out.extend_from_slice(&coded);
        out.extend_from_slice(&src[whole..]);
        Ok(out)
    })
}

/// Splits a pco stage's output into the pco bytes and the raw tail.
fn pco_parts(src: &[u8]) -> Result<(&[u8], &[u8])> {
    let head: [u8; 8] =
        src.get(..8).and_then(|h| h.try_into().ok()).ok_or_else(|| Error::Corrupt("pco data is shorter than its header".into()))?;
    let n = u64::from_le_bytes(head);
    let rest = &src[8..];
    if n > rest.len() as u64 {
        return Err(Error::Corrupt(format!("pco data claims {n} bytes but {} follow", rest.len())));
    }
    Ok(rest.split_at(n as usize))
}

fn pco_decode(elem: Element, src: &[u8], out: &mut [u8]) -> Result<()> {
    let (coded, tail) = pco_parts(src)?;
    with_number!(elem, T => {
        let whole = out.len().checked_sub(tail.len()).filter(|w| w.is_multiple_of(T::N)).ok_or_else(|| {
            Error::Corrupt(format!("pco data has a {}-byte tail that does not fit {} recorded bytes", tail.len(), out.len()))
        })?;
        // Decoding into a buffer of the recorded size bounds memory whatever a damaged header claims.
        let mut nums: Vec<T> = vec![T::default(); whole / T::N];
        let n = if coded.is_empty() { 0 } else {
            let p = pco::standalone::simple_decompress_into(coded, &mut nums)
                .map_err(|e| Error::Corrupt(format!("pco data does not decode: {e}")))?;
            if !p.finished { usize::MAX } else { p.n_processed }
        };
        if n != nums.len() {
            return Err(Error::Corrupt(format!("pco data does not decode to the {} values recorded", nums.len())));
        }
        for (v, b) in nums.iter().zip(out[..whole].chunks_exact_mut(T::N)) {
            v.write(b, elem.big_endian);
        }
        out[whole..].copy_from_slice(tail);
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn round_trip(src: &[u8], elem: Option<Element>, policy: Policy) -> Pipeline {
        let (pipe, coded) = compress(src, elem, policy).unwrap();
        let parsed = Pipeline::parse(&pipe.to_string()).unwrap();
        assert_eq!(parsed, pipe);
        let mut out = vec![0u8; src.len()];
        parsed.decode_into(&coded, &mut out).unwrap();
        assert_eq!(out, src, "{pipe}");
        pipe
    }

    fn smooth_f64(n: usize, big: bool) -> Vec<u8> {
        (0..n)
            .flat_map(|i| {
                let v = (i as f64 * 0.01).sin() * 100.0;
                if big {
                    v.to_be_bytes()
                } else {
                    v.to_le_bytes()
                }
            })
            .collect()
    }

    #[test]
    fn aware_models_numbers_and_beats_zstd_on_smooth_floats() {
        let src = smooth_f64(50_000, false);
        let pipe = round_trip(&src, Some(Element::parse("<f8").unwrap()), Policy::Aware);
        assert!(matches!(pipe.0[0], Stage::Pco(..)), "{pipe}");
        let aware = compress(&src, Some(Element::parse("<f8").unwrap()), Policy::Aware).unwrap().1.len();
        let zstd = compress(&src, None, Policy::Zstd(3)).unwrap().1.len();
        assert!(aware * 2 < zstd, "pco {aware} vs zstd {zstd}");
    }

    #[test]
    fn big_endian_values_are_modelled_not_shuffled() {
        let le = smooth_f64(10_000, false);
        let be = smooth_f64(10_000, true);
        let a = compress(&le, Some(Element::parse("<f8").unwrap()), Policy::Aware).unwrap().1.len();
        let b = compress(&be, Some(Element::parse(">f8").unwrap()), Policy::Aware).unwrap().1.len();
        assert_eq!(a, b, "the same values in either byte order compress the same");
        round_trip(&be, Some(Element::parse(">f8").unwrap()), Policy::Aware);
    }

    #[test]
    fn small_or_untyped_buffers_skip_the_model() {
        let pipe = round_trip(&[7u8; 64], Some(Element::parse("<f8").unwrap()), Policy::Aware);
        assert_eq!(pipe.to_string(), "zstd:3");
        let pipe = round_trip(b"hello hello hello hello hello hello hello hello hello hello", None, Policy::Aware);
        assert_eq!(pipe.to_string(), "zstd:3");
    }

    #[test]
    fn incompressible_data_is_stored_raw() {
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let noise: Vec<u8> = (0..4096)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x >> 56) as u8
            })
            .collect();
        assert_eq!(round_trip(&noise, None, Policy::Gzip(6)).to_string(), "raw");
    }

    #[test]
    fn policies_parse_and_bad_ones_are_named() {
        assert_eq!(Policy::parse("gzip").unwrap(), Policy::Gzip(6));
        assert_eq!(Policy::parse("zstd:9").unwrap(), Policy::Zstd(9));
        let e = Policy::parse("lz5").unwrap_err().to_string();
        assert!(e.contains("'lz5'") && e.contains("aware"), "{e}");
        assert!(Policy::parse("gzip:11").is_err());
    }

    #[test]
    fn damaged_data_is_a_corrupt_error_never_a_panic() {
        let src = smooth_f64(4096, false);
        for policy in [Policy::Aware, Policy::Zstd(3), Policy::Gzip(6)] {
            let (pipe, coded) = compress(&src, Some(Element::parse("<f8").unwrap()), policy).unwrap();
            let mut coded = coded.into_owned();
            let mut out = vec![0u8; src.len()];
            coded.truncate(coded.len() / 2);
            let e = pipe.decode_into(&coded, &mut out).unwrap_err();
            assert_eq!(e.kind(), crate::ErrorKind::Corrupt, "{pipe}: {e}");
        }
        assert!(Pipeline::parse("pco:f8xx:4").is_err());
        assert!(Pipeline::parse("zstd:1+zstd:1+zstd:1").is_err());
        assert!(Pipeline::parse("zstd:1+pco:f8le:4").is_err());
    }

    fn elem_strategy() -> impl Strategy<Value = Element> {
        let numeric: Vec<DType> = crate::dtype::ALL.into_iter().filter(|d| *d != DType::Bytes).collect();
        (proptest::sample::select(numeric), any::<bool>()).prop_map(|(dtype, big_endian)| Element { dtype, big_endian })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(200))]
        /// Every pipeline restores any bytes exactly, whatever their claimed type, length or order.
        #[test]
        fn every_policy_round_trips(data in proptest::collection::vec(any::<u8>(), 0..3000),
                                    elem in elem_strategy(), which in 0usize..4) {
            let policy = [Policy::Aware, Policy::Zstd(1), Policy::Gzip(1), Policy::Raw][which];
            round_trip(&data, Some(elem), policy);
        }

        /// Arbitrary or bit-flipped input to any decoder is an error or some bytes, never a panic
        /// (containers and block files come from disks that may be damaged).
        #[test]
        fn decoders_survive_garbage(vals in proptest::collection::vec(any::<f64>(), 1..300), flips in proptest::collection::vec((any::<usize>(), any::<u8>()), 0..8),
                                    garbage in proptest::collection::vec(any::<u8>(), 0..200), elem in elem_strategy(), which in 0usize..3) {
            let src: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
            let policy = [Policy::Aware, Policy::Zstd(1), Policy::Gzip(1)][which];
            let (pipe, coded) = compress(&src, Some(elem), policy).unwrap();
            let mut coded = coded.into_owned();
            for (at, x) in flips {
                if !coded.is_empty() {
                    let n = coded.len();
                    coded[at % n] ^= x;
                }
            }
            let mut out = vec![0u8; src.len()];
            let _ = pipe.decode_into(&coded, &mut out);
            let _ = pipe.decode_into(&garbage, &mut out);
            let _ = Pipeline(vec![Stage::Pco(elem, 4), Stage::Zstd(1)]).decode_into(&garbage, &mut out);
            let _ = Pipeline(vec![Stage::Pco(elem, 4)]).decode_into(&garbage, &mut out);
        }

        /// Forced pco stages (not only the ones `compress` keeps) restore exactly, tails included.
        #[test]
        fn pco_stage_round_trips(vals in proptest::collection::vec(any::<u64>(), 0..500), tail in 0usize..16, elem in elem_strategy()) {
            let mut src: Vec<u8> = vals.iter().flat_map(|v| v.to_le_bytes()).collect();
            src.truncate(src.len().saturating_sub(tail));
            let pipe = Pipeline(vec![Stage::Pco(elem, 2), Stage::Zstd(1)]);
            let coded = pipe.encode(&src).unwrap();
            let mut out = vec![0u8; src.len()];
            pipe.decode_into(&coded, &mut out).unwrap();
            prop_assert_eq!(out, src);
        }
    }
}
