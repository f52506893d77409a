//! crc32c checksums per fixed-size chunk. A reader that fetches part of a block verifies the chunks
//! it touched, so even a partial read never returns damaged bytes unnoticed.

use crate::error::{Error, Result};

/// Default chunk size: small enough that a box read fetches little beyond the rows it needs,
/// large enough that the index stays small (a 256 MiB block carries 4096 checksums, 40 KB).
pub const DEFAULT_CHUNK: u32 = 64 << 10;

/// Checksums of `data` split into `chunk`-byte pieces, and the checksum of the whole.
pub fn chunk_crcs(data: &[u8], chunk: u32) -> (Vec<u32>, u32) {
    let mut whole = 0u32;
    let crcs = data
        .chunks(chunk.max(1) as usize)
        .map(|c| {
            let crc = crc32c::crc32c(c);
            whole = crc32c::crc32c_combine(whole, crc, c.len());
            crc
        })
        .collect();
    (crcs, whole)
}

/// Verifies `data`, which holds chunks `first..` of a block (the last may be short), against the
/// recorded checksums; `what` names the block in the error.
pub fn verify(data: &[u8], first: usize, chunk: u32, crcs: &[u32], what: &dyn Fn() -> String) -> Result<()> {
    for (i, c) in data.chunks(chunk.max(1) as usize).enumerate() {
        let k = first + i;
        let want = crcs.get(k).copied();
        let got = crc32c::crc32c(c);
        if want != Some(got) {
            return Err(Error::Corrupt(format!(
                "checksum mismatch in {} (chunk {k}, bytes {}..{}): the file was damaged after it was \
                 written; restore it from a copy or re-run the step",
                what(),
                k as u64 * chunk as u64,
                k as u64 * chunk as u64 + c.len() as u64
            )));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn whole_checksum_matches_one_pass(data in prop::collection::vec(any::<u8>(), 0..5000), chunk in 1u32..700) {
            let (crcs, whole) = chunk_crcs(&data, chunk);
            prop_assert_eq!(whole, crc32c::crc32c(&data));
            prop_assert_eq!(crcs.len(), data.len().div_ceil(chunk as usize));
            verify(&data, 0, chunk, &crcs, &|| "b".into()).unwrap();
        }

        #[test]
        fn any_flipped_bit_is_caught(data in prop::collection::vec(any::<u8>(), 1..3000), chunk in 1u32..500, pos in any::<prop::sample::Index>(), bit in 0u8..8) {
            let (crcs, _) = chunk_crcs(&data, chunk);
            let mut bad = data.clone();
            let i = pos.index(bad.len());
            bad[i] ^= 1 << bit;
            let first = i / chunk as usize;
            let span = &bad[first * chunk as usize..];
            prop_assert!(verify(span, first, chunk, &crcs, &|| "b".into()).is_err());
        }
    }
}
