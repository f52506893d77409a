//! A block as it goes into a data file: its record (box, chunk crc32cs, exact statistics) and,
//! when a codec shrinks it, the bytes stored instead of its own.

use cairn_core::checksum::chunk_crcs;
use cairn_core::codec::{self, Element, Policy};
use cairn_core::index::{BlockRecord, VarDef};
use cairn_core::{stats, Region, Result};
use std::fs::File;
use std::io::{IoSlice, Write};

/// A block handed to an engine: validated, C-order, little-endian.
#[derive(Debug)]
pub struct BlockData<'a> {
    /// The variable it belongs to.
    pub def: &'a VarDef,
    /// Its box (local variables: offset zero).
    pub region: Region,
    /// Its bytes.
    pub bytes: &'a [u8],
}

/// A block's record (its `file` and `pos` still to be set) and, when compression shrank it, the
/// bytes to store instead of the block's own.
pub fn encode(b: &BlockData<'_>, writer: u32, chunk: u32, compression: Option<Policy>) -> Result<(BlockRecord, Option<Vec<u8>>)> {
    let coded = match compression {
        Some(policy) => Some(codec::compress(b.bytes, Some(Element { dtype: b.def.dtype, big_endian: false }), policy)?),
        None => None,
    };
    // Blocks nothing shrank are stored raw, without a codec entry.
    let coded = coded.filter(|(pipe, _)| !pipe.is_raw()).map(|(pipe, c)| (pipe.to_string(), c.into_owned()));
    let (crcs, checksum) = chunk_crcs(b.bytes, chunk);
    let record = BlockRecord {
        var: b.def.name.clone(),
        writer,
        region: b.region.clone(),
        file: String::new(),
        pos: 0,
        len: b.bytes.len() as u64,
        chunk,
        crcs,
        checksum,
        stats: stats::compute(b.def.dtype, b.bytes),
        objects: Vec::new(),
        stored: coded.as_ref().map_or(0, |(_, c)| c.len() as u64),
        codec: coded.as_ref().map(|(pipe, _)| pipe.clone()),
    };
    Ok((record, coded.map(|(_, c)| c)))
}

/// Bytes a block takes in its data file.
pub fn stored_len(b: &BlockRecord) -> u64 {
    if b.codec.is_some() {
        b.stored
    } else {
        b.len
    }
}

/// Writes all of `parts` with as few system calls as the kernel allows (one for a trace flush).
pub fn write_all_vectored(f: &mut File, parts: &[&[u8]]) -> std::io::Result<()> {
    let mut slices: Vec<IoSlice<'_>> = parts.iter().filter(|p| !p.is_empty()).map(|p| IoSlice::new(p)).collect();
    let mut rest = &mut slices[..];
    while !rest.is_empty() {
        match f.write_vectored(rest) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => IoSlice::advance_slices(&mut rest, n),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}
