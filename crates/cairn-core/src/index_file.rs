//! The bytes of a committed step index (`steps/S.json` of the file engine): format 2, binary, is
//! written; format 1, a JSON [`StepIndex`], is still read. See *Step index, version 2* in
//! `docs/format.md` for the layout.
//!
//! Format 2 keeps apart what listings need from what reads need: a small JSON *meta* section
//! (variables, attributes, the consume transaction), a *blocks* section of fixed-layout binary
//! records (zstd-compressed), and the per-chunk crcs, which dominate a JSON index, as a raw table
//! of little-endian u32s. [`decode_meta`] reads the meta section alone; [`decode`] copies each
//! block's crcs out of the table.

use crate::attrs::Attrs;
use crate::error::{Error, Result};
use crate::index::{from_json, BlockRecord, Consumed, ObjectRef, Staged, StepIndex, VarDef, FORMAT_VERSION};
use crate::stats::Stats;
use crate::{Region, MAX_DIMS};
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::io::Read;

/// The first bytes of a format 2 index.
pub const MAGIC: &[u8; 8] = b"CAIRNIX2";
/// The container version this build writes (and the newest it reads).
pub const VERSION: u32 = 2;
/// Bytes of the fixed header.
pub const HEADER_LEN: usize = 68;
/// zstd level of the blocks section (see the measurements in `docs/format.md`).
pub const BLOCKS_LEVEL: i32 = 1;
/// Largest decoded blocks section accepted (about 8 million blocks).
const MAX_BLOCKS_RAW: u64 = 1 << 30;
/// Smallest encoded block record, bounding the block count a blocks section can claim.
const MIN_RECORD: u64 = 42;

const HAS_MIN: u8 = 1;
const HAS_MAX: u8 = 2;
const HAS_MEAN: u8 = 4;
const HAS_CODEC: u8 = 8;
const HAS_STORED: u8 = 16;
const HAS_OBJECTS: u8 = 32;

/// The meta section: the index without its blocks.
#[derive(Serialize)]
struct MetaOut<'a> {
    step: u64,
    nranks: u32,
    vars: &'a BTreeMap<String, VarDef>,
    #[serde(skip_serializing_if = "Attrs::is_empty")]
    attrs: &'a Attrs,
    #[serde(skip_serializing_if = "Option::is_none")]
    consumed: &'a Option<Consumed>,
    #[serde(skip_serializing_if = "Option::is_none")]
    staged: &'a Option<Staged>,
}

/// The meta section as read; also a format 1 document with its blocks skipped.
#[derive(Deserialize)]
struct MetaIn {
    #[serde(default = "format_1")]
    format: u32,
    step: u64,
    nranks: u32,
    vars: BTreeMap<String, VarDef>,
    #[serde(default)]
    attrs: Attrs,
    #[serde(default)]
    consumed: Option<Consumed>,
    #[serde(default)]
    staged: Option<Staged>,
}

fn format_1() -> u32 {
    FORMAT_VERSION
}

impl MetaIn {
    fn into_index(self, blocks: Vec<BlockRecord>) -> StepIndex {
        StepIndex {
            format: FORMAT_VERSION,
            step: self.step,
            nranks: self.nranks,
            vars: self.vars,
            blocks,
            attrs: self.attrs,
            consumed: self.consumed,
            staged: self.staged,
        }
    }
}

/// Encodes `index` in format 2 (its `format` field, the schema version of its records, is not
/// stored: the container's version stands for it).
pub fn encode(index: &StepIndex) -> Vec<u8> {
    encode_with(index, Some(BLOCKS_LEVEL))
}

/// [`encode`] with the blocks section compressed at zstd `level`, or stored raw (`None`); for
/// measurements, every choice decodes.
pub fn encode_with(index: &StepIndex, level: Option<i32>) -> Vec<u8> {
    let meta = serde_json::to_vec(&MetaOut {
        step: index.step,
        nranks: index.nranks,
        vars: &index.vars,
        attrs: &index.attrs,
        consumed: &index.consumed,
        staged: &index.staged,
    })
    .expect("index documents always serialize");
    let raw = encode_blocks(&index.blocks);
    let (kind, blocks) = match level.map(|l| zstd::bulk::compress(&raw, l)) {
        Some(Ok(z)) if z.len() < raw.len() => (b'Z', z),
        _ => (b'R', raw.clone()),
    };
    let ncrcs: usize = index.blocks.iter().map(|b| b.crcs.len()).sum();
    let mut crcs = Vec::with_capacity(ncrcs * 4);
    for c in index.blocks.iter().flat_map(|b| &b.crcs) {
        crcs.extend_from_slice(&c.to_le_bytes());
    }
    let mut out = Vec::with_capacity(HEADER_LEN + meta.len() + blocks.len() + crcs.len());
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&VERSION.to_le_bytes());
    out.extend_from_slice(&(meta.len() as u32).to_le_bytes());
    out.extend_from_slice(&(blocks.len() as u64).to_le_bytes());
    out.extend_from_slice(&(raw.len() as u64).to_le_bytes());
    out.extend_from_slice(&(index.blocks.len() as u64).to_le_bytes());
    out.extend_from_slice(&(ncrcs as u64).to_le_bytes());
    out.extend_from_slice(&[kind, 0, 0, 0]);
    for section in [&meta, &blocks, &crcs] {
        out.extend_from_slice(&crate::checksum::crc(section).to_le_bytes());
    }
    let head = crate::checksum::crc(&out);
    out.extend_from_slice(&head.to_le_bytes());
    debug_assert_eq!(out.len(), HEADER_LEN);
    out.extend_from_slice(&meta);
    out.extend_from_slice(&blocks);
    out.extend_from_slice(&crcs);
    out
}

fn encode_blocks<'a>(blocks: &'a [BlockRecord]) -> Vec<u8> {
    let mut names: Vec<&'a str> = Vec::new();
    let mut ids: HashMap<&'a str, u32> = HashMap::new();
    let mut intern = |s: &'a str| {
        let id = *ids.entry(s).or_insert_with(|| {
            names.push(s);
            names.len() as u32 - 1
        });
        u32::to_le_bytes(id)
    };
    let mut recs = Vec::with_capacity(blocks.len() * 64);
    for b in blocks {
        let stats = [(HAS_MIN, b.stats.min), (HAS_MAX, b.stats.max), (HAS_MEAN, b.stats.mean)];
        let mut flags = stats.iter().filter(|(_, v)| v.is_some()).fold(0, |f, (bit, _)| f | bit);
        flags |= if b.codec.is_some() { HAS_CODEC } else { 0 } | if b.stored != 0 { HAS_STORED } else { 0 };
        flags |= if b.objects.is_empty() { 0 } else { HAS_OBJECTS };
        recs.push(flags);
        recs.extend_from_slice(&intern(&b.var));
        recs.extend_from_slice(&b.writer.to_le_bytes());
        recs.push(b.region.ndim() as u8);
        for v in b.region.offset.iter().chain(&b.region.count) {
            recs.extend_from_slice(&v.to_le_bytes());
        }
        recs.extend_from_slice(&intern(&b.file));
        recs.extend_from_slice(&b.pos.to_le_bytes());
        recs.extend_from_slice(&b.len.to_le_bytes());
        recs.extend_from_slice(&b.chunk.to_le_bytes());
        recs.extend_from_slice(&b.checksum.to_le_bytes());
        recs.extend_from_slice(&(b.crcs.len() as u32).to_le_bytes());
        for v in stats.iter().filter_map(|(_, v)| *v) {
            recs.extend_from_slice(&v.to_le_bytes());
        }
        if let Some(c) = &b.codec {
            recs.extend_from_slice(&intern(c));
        }
        if b.stored != 0 {
            recs.extend_from_slice(&b.stored.to_le_bytes());
        }
        if !b.objects.is_empty() {
            let json = serde_json::to_vec(&b.objects).expect("object lists always serialize");
            recs.extend_from_slice(&(json.len() as u32).to_le_bytes());
            recs.extend_from_slice(&json);
        }
    }
    let mut out = Vec::with_capacity(recs.len() + names.iter().map(|n| n.len() + 4).sum::<usize>() + 4);
    out.extend_from_slice(&(names.len() as u32).to_le_bytes());
    for n in &names {
        out.extend_from_slice(&(n.len() as u32).to_le_bytes());
        out.extend_from_slice(n.as_bytes());
    }
    out.extend_from_slice(&recs);
    out
}

/// Whether `bytes` start like a format 2 index (a format 1 one is JSON, starting with `{`).
pub fn is_v2(bytes: &[u8]) -> bool {
    bytes.starts_with(&MAGIC[..4])
}

/// Decodes a committed step index of either format, reporting damage as [`Error::Corrupt`]
/// naming `what` (e.g. the file). The caller validates it ([`StepIndex::validate`]).
pub fn decode(bytes: &[u8], what: &str) -> Result<StepIndex> {
    if !is_v2(bytes) {
        return from_json(bytes, what);
    }
    let h = Header::parse(bytes, what)?;
    let meta = h.meta(bytes, what)?;
    let blocks = h.blocks(bytes, what)?;
    Ok(meta.into_index(blocks))
}

/// Decodes the index without its blocks (`blocks` empty): variables, attributes and the consume
/// transaction, for listings. Neither the blocks nor the crc table of a format 2 index is read.
pub fn decode_meta(bytes: &[u8], what: &str) -> Result<StepIndex> {
    if !is_v2(bytes) {
        let m: MetaIn = serde_json::from_slice(bytes)
            .map_err(|e| Error::Corrupt(format!("{what} does not parse ({e}); the file is damaged or truncated")))?;
        if m.format > FORMAT_VERSION {
            return Err(Error::Corrupt(format!(
                "{what} has format version {} but this Cairn reads up to {FORMAT_VERSION}; upgrade Cairn",
                m.format
            )));
        }
        return Ok(m.into_index(Vec::new()));
    }
    let h = Header::parse(bytes, what)?;
    Ok(h.meta(bytes, what)?.into_index(Vec::new()))
}

fn corrupt(what: &str, why: impl std::fmt::Display) -> Error {
    Error::Corrupt(format!("{what} is damaged or truncated: {why}"))
}

/// The fixed header of a format 2 index, checked against its own crc and the file's length.
struct Header {
    meta_len: usize,
    blocks_len: usize,
    blocks_raw: u64,
    nblocks: u64,
    kind: u8,
    crc_meta: u32,
    crc_blocks: u32,
    crc_table: u32,
}

impl Header {
    fn parse(bytes: &[u8], what: &str) -> Result<Header> {
        if bytes.len() < HEADER_LEN {
            return Err(corrupt(what, format!("{} bytes, shorter than the {HEADER_LEN}-byte header", bytes.len())));
        }
        let mut c = Cursor { b: &bytes[..HEADER_LEN], at: 0, what };
        if c.take(8)? != MAGIC {
            return Err(corrupt(what, "not a Cairn step index (bad magic)"));
        }
        let version = c.u32()?;
        let (meta_len, blocks_len, blocks_raw, nblocks, ncrcs) = (c.u32()?, c.u64()?, c.u64()?, c.u64()?, c.u64()?);
        let kind = c.take(4)?[0];
        let (crc_meta, crc_blocks, crc_table, crc_head) = (c.u32()?, c.u32()?, c.u32()?, c.u32()?);
        let sound = crate::checksum::crc(&bytes[..HEADER_LEN - 4]) == crc_head;
        // Checked first: a newer version may lay its header out otherwise.
        if version > VERSION {
            let unless = if sound { "" } else { " (unless its header is damaged: it fails its checksum)" };
            return Err(Error::Corrupt(format!(
                "{what} has format version {version} but this Cairn reads up to {VERSION}; upgrade Cairn{unless}"
            )));
        }
        if !sound {
            return Err(corrupt(what, "header checksum mismatch"));
        }
        let body = (bytes.len() - HEADER_LEN) as u64;
        let want = (meta_len as u64).checked_add(blocks_len).and_then(|n| n.checked_add(ncrcs.checked_mul(4)?));
        if want != Some(body) {
            return Err(corrupt(what, format!("its sections need {want:?} bytes after the header but it has {body}")));
        }
        let ratio_ok = match kind {
            b'R' => blocks_raw == blocks_len,
            b'Z' => blocks_raw <= blocks_len.saturating_mul(4096),
            _ => return Err(corrupt(what, format!("unknown blocks section kind {kind:#x}"))),
        };
        if !ratio_ok || blocks_raw > MAX_BLOCKS_RAW || nblocks > blocks_raw / MIN_RECORD {
            return Err(corrupt(
                what,
                format!("blocks section of {blocks_len} bytes cannot hold {blocks_raw} raw bytes and {nblocks} blocks"),
            ));
        }
        Ok(Header {
            meta_len: meta_len as usize,
            blocks_len: blocks_len as usize,
            blocks_raw,
            nblocks,
            kind,
            crc_meta,
            crc_blocks,
            crc_table,
        })
    }

    fn meta(&self, bytes: &[u8], what: &str) -> Result<MetaIn> {
        let meta = &bytes[HEADER_LEN..HEADER_LEN + self.meta_len];
        if crate::checksum::crc(meta) != self.crc_meta {
            return Err(corrupt(what, "meta section checksum mismatch"));
        }
        serde_json::from_slice(meta).map_err(|e| corrupt(what, format!("meta section does not parse ({e})")))
    }

    fn blocks(&self, bytes: &[u8], what: &str) -> Result<Vec<BlockRecord>> {
        let at = HEADER_LEN + self.meta_len;
        let stored = &bytes[at..at + self.blocks_len];
        let table = &bytes[at + self.blocks_len..];
        if crate::checksum::crc(stored) != self.crc_blocks {
            return Err(corrupt(what, "blocks section checksum mismatch"));
        }
        if crate::checksum::crc(table) != self.crc_table {
            return Err(corrupt(what, "crc table checksum mismatch"));
        }
        let unpacked;
        let raw = match self.kind {
            b'Z' => {
                // Streamed, so memory grows with what the bytes decode to, not with what the
                // header claims.
                let mut out = Vec::new();
                zstd::stream::read::Decoder::new(stored)
                    .and_then(|d| d.take(self.blocks_raw + 1).read_to_end(&mut out))
                    .map_err(|e| corrupt(what, format!("blocks section does not decode ({e})")))?;
                unpacked = out;
                if unpacked.len() as u64 != self.blocks_raw {
                    return Err(corrupt(what, "blocks section decodes to another length than its header says"));
                }
                &unpacked[..]
            }
            _ => stored,
        };
        decode_blocks(raw, self.nblocks as usize, table, what)
    }
}

fn decode_blocks(raw: &[u8], nblocks: usize, table: &[u8], what: &str) -> Result<Vec<BlockRecord>> {
    let mut c = Cursor { b: raw, at: 0, what };
    let nnames = c.u32()? as usize;
    if nnames > raw.len() / 4 {
        return Err(corrupt(what, format!("blocks section claims {nnames} strings")));
    }
    let mut names = Vec::with_capacity(nnames);
    for _ in 0..nnames {
        let n = c.u32()? as usize;
        let s = std::str::from_utf8(c.take(n)?).map_err(|_| corrupt(what, "a string of the blocks section is not UTF-8"))?;
        names.push(s);
    }
    let name = |c: &mut Cursor<'_>| -> Result<String> {
        let i = c.u32()? as usize;
        names.get(i).map(|s| s.to_string()).ok_or_else(|| corrupt(what, format!("string {i} of {nnames}")))
    };
    let mut crcs = table.chunks_exact(4).map(|c| u32::from_le_bytes(c.try_into().unwrap()));
    let mut left = table.len() / 4;
    let mut out = Vec::with_capacity(nblocks);
    for i in 0..nblocks {
        let flags = c.u8()?;
        let var = name(&mut c)?;
        let writer = c.u32()?;
        let ndim = c.u8()? as usize;
        if ndim > MAX_DIMS {
            return Err(corrupt(what, format!("block {i} has {ndim} dimensions")));
        }
        let offset = (0..ndim).map(|_| c.u64()).collect::<Result<Vec<_>>>()?;
        let count = (0..ndim).map(|_| c.u64()).collect::<Result<Vec<_>>>()?;
        let region = Region::new(offset, count).map_err(|e| corrupt(what, format!("block {i}: {e}")))?;
        let file = name(&mut c)?;
        let (pos, len, chunk, checksum, n) = (c.u64()?, c.u64()?, c.u32()?, c.u32()?, c.u32()? as usize);
        if n > left {
            return Err(corrupt(what, format!("block {i} has {n} crcs but the table holds {left} more")));
        }
        left -= n;
        let block_crcs: Vec<u32> = crcs.by_ref().take(n).collect();
        let mut stat = |bit: u8| -> Result<Option<f64>> {
            Ok(if flags & bit != 0 { Some(f64::from_le_bytes(c.take(8)?.try_into().unwrap())) } else { None })
        };
        let stats = Stats { min: stat(HAS_MIN)?, max: stat(HAS_MAX)?, mean: stat(HAS_MEAN)? };
        let codec = if flags & HAS_CODEC != 0 { Some(name(&mut c)?) } else { None };
        let stored = if flags & HAS_STORED != 0 { c.u64()? } else { 0 };
        let objects: Vec<ObjectRef> = if flags & HAS_OBJECTS != 0 {
            let n = c.u32()? as usize;
            serde_json::from_slice(c.take(n)?).map_err(|e| corrupt(what, format!("objects of block {i} do not parse ({e})")))?
        } else {
            Vec::new()
        };
        out.push(BlockRecord { var, writer, region, file, pos, len, chunk, crcs: block_crcs, checksum, stats, objects, codec, stored });
    }
    if c.at != raw.len() || left != 0 {
        return Err(corrupt(what, format!("{} bytes of the blocks section and {left} crcs are left over", raw.len() - c.at)));
    }
    Ok(out)
}

/// Reads little-endian fields, failing (never panicking) past the end.
struct Cursor<'a> {
    b: &'a [u8],
    at: usize,
    what: &'a str,
}

impl<'a> Cursor<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.b.len()).ok_or_else(|| corrupt(self.what, "a section ends early"))?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn u8(&mut self) -> Result<u8> {
        Ok(self.take(1)?[0])
    }
    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }
    fn u64(&mut self) -> Result<u64> {
        Ok(u64::from_le_bytes(self.take(8)?.try_into().unwrap()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DType;
    use crate::index::{to_json, Redundancy};
    use proptest::prelude::*;

    /// An index of `n` blocks of one 2-D variable, `crcs` 64 KiB chunks each (the shape of the
    /// measurement in `docs/format.md`).
    fn index(n: u64, crcs: u64) -> StepIndex {
        let len = crcs * 65536;
        let var = VarDef::new("pressure", DType::F64, Some(vec![n, len / 8])).unwrap();
        let blocks = (0..n)
            .map(|i| BlockRecord {
                var: "pressure".into(),
                writer: i as u32,
                region: Region::new(vec![i, 0], vec![1, len / 8]).unwrap(),
                file: format!("data/rank-{i:06}.00000000deadbeef.bin"),
                pos: i * len,
                len,
                chunk: 65536,
                crcs: (0..crcs).map(|c| (i * 977 + c) as u32 ^ 0x9e37_79b9).collect(),
                checksum: i as u32,
                stats: Stats { min: Some(-(i as f64)), max: Some(f64::NAN), mean: if i % 2 == 0 { None } else { Some(0.5) } },
                objects: Vec::new(),
                codec: (i % 3 == 0).then(|| "pco:f8le:4+zstd:1".to_string()),
                stored: if i % 3 == 0 { len / 2 } else { 0 },
            })
            .collect();
        StepIndex {
            format: FORMAT_VERSION,
            step: 7,
            nranks: n as u32,
            vars: [("pressure".into(), var)].into(),
            blocks,
            attrs: Attrs::new(),
            consumed: None,
            staged: None,
        }
    }

    #[test]
    fn round_trips_and_reads_format_1() {
        let mut idx = index(50, 3);
        idx.attrs.insert("title".into(), "run".into());
        idx.consumed = Some(Consumed { txn: "t1".into(), datasets: vec!["src".into()] });
        idx.blocks[1].objects = vec![ObjectRef {
            id: 1,
            region: idx.blocks[1].region.clone(),
            server: 2,
            checksum: 3,
            redundancy: Redundancy::Replicated { servers: vec![2, 4] },
        }];
        idx.staged = Some(Staged::of("c0ffee", &idx));
        assert_eq!(idx.staged.as_ref().unwrap().blocks[1].len(), 1);
        for level in [None, Some(1), Some(19)] {
            let bytes = encode_with(&idx, level);
            assert!(is_v2(&bytes));
            assert_eq!(to_json(&decode(&bytes, "x").unwrap()), to_json(&idx));
        }
        assert_eq!(to_json(&decode(&to_json(&idx), "x").unwrap()), to_json(&idx), "format 1 reads");
        for bytes in [encode(&idx), to_json(&idx)] {
            let meta = decode_meta(&bytes, "x").unwrap();
            assert!(meta.blocks.is_empty());
            assert_eq!((meta.step, &meta.vars, &meta.attrs, &meta.consumed), (idx.step, &idx.vars, &idx.attrs, &idx.consumed));
            assert_eq!(meta.staged, idx.staged, "a drained step's identity is in the meta section");
        }
    }

    #[test]
    fn damage_is_corrupt_naming_the_file() {
        let bytes = encode(&index(20, 2));
        let mut newer = bytes.clone();
        newer[8] = 3;
        let crc = crate::checksum::crc(&newer[..HEADER_LEN - 4]);
        newer[HEADER_LEN - 4..HEADER_LEN].copy_from_slice(&crc.to_le_bytes());
        assert!(decode(&newer, "steps/7.json").unwrap_err().to_string().contains("upgrade Cairn"));
        let mut table = bytes.clone();
        *table.last_mut().unwrap() ^= 1;
        let e = decode(&table, "steps/7.json").unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Corrupt);
        assert!(e.to_string().contains("steps/7.json") && e.to_string().contains("crc table"), "{e}");
        assert!(decode_meta(&table, "x").is_ok(), "listings do not read the crc table");
        for cut in [0, 4, HEADER_LEN - 1, HEADER_LEN, bytes.len() - 1] {
            let e = decode(&bytes[..cut], "steps/7.json").unwrap_err();
            assert!(e.to_string().contains("steps/7.json"), "{e}");
        }
    }

    proptest! {
        #[test]
        fn random_bytes_and_damage_never_panic(
            junk in prop::collection::vec(any::<u8>(), 0..400),
            n in 0u64..6,
            cut in any::<prop::sample::Index>(),
            flip in any::<prop::sample::Index>(),
            bit in 0u8..8,
        ) {
            let _ = decode(&junk, "x");
            let mut prefixed = MAGIC.to_vec();
            prefixed.extend_from_slice(&junk);
            let _ = decode(&prefixed, "x");
            let bytes = encode(&index(n, 2));
            prop_assert_eq!(to_json(&decode(&bytes, "x").unwrap()), to_json(&index(n, 2)));
            let cut = cut.index(bytes.len());
            prop_assert!(decode(&bytes[..cut], "x").is_err());
            let mut flipped = bytes.clone();
            flipped[flip.index(bytes.len())] ^= 1 << bit;
            prop_assert!(decode(&flipped, "x").is_err(), "every byte is under a crc");
        }

        #[test]
        fn decoding_unchecked_sections_never_panics(raw in prop::collection::vec(any::<u8>(), 0..300), n in 0usize..10, table in prop::collection::vec(any::<u8>(), 0..40)) {
            let _ = decode_blocks(&raw, n, &table, "x");
        }
    }
}
