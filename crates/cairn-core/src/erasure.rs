//! The Reed–Solomon code for objects that CoREC keeps encoded (cold objects): an object of `len`
//! bytes becomes `k` data shards (its bytes, cut in `k` equal pieces, the last zero-padded) and
//! `m` parity shards, any `k` of which give the object back. The code is systematic, so reading
//! an encoded object with no shard missing needs no decode: its data shards are its bytes.
//! Galois-field arithmetic is `reed-solomon-erasure`'s (SIMD kernels with the `simd` feature).

use crate::{Error, Result};
use reed_solomon_erasure::galois_8::ReedSolomon;
use std::sync::Mutex;

/// Shards in a stripe at most (GF(2⁸)).
pub const MAX_SHARDS: usize = 256;

/// Shard buffers given back ([`recycle`]) for the next objects' shards. A fresh buffer is zeroed
/// (calloc), which on 1 MiB objects cost as much as the encoding itself: 0.65–0.69× the bare
/// call, 0.9×+ with buffers reused (docs/performance.md, "Encode throughput").
static SPARE: Mutex<Vec<Vec<u8>>> = Mutex::new(Vec::new());

/// Bytes of buffers kept for reuse at most.
const SPARE_BYTES: usize = 64 << 20;

/// A buffer of `n` bytes, reused where one was given back (its old bytes are overwritten by the
/// caller: only the part beyond an old buffer's length is zeroed).
fn buffer(n: usize) -> Vec<u8> {
    let reused = {
        let mut spare = SPARE.lock().unwrap_or_else(|e| e.into_inner());
        let at = spare.iter().position(|b| b.capacity() >= n && b.capacity() <= 2 * n.max(4096));
        at.map(|i| spare.swap_remove(i))
    };
    match reused {
        Some(mut b) => {
            b.truncate(n);
            b.resize(n, 0);
            b
        }
        None => vec![0; n],
    }
}

/// Gives shard buffers (from [`Code::parity`], [`data_shard`]) back once sent or stored
/// elsewhere, for the next objects' shards.
pub fn recycle(bufs: impl IntoIterator<Item = Vec<u8>>) {
    let mut spare = SPARE.lock().unwrap_or_else(|e| e.into_inner());
    let mut held: usize = spare.iter().map(Vec::capacity).sum();
    for b in bufs {
        if b.capacity() >= 4096 && held + b.capacity() <= SPARE_BYTES {
            held += b.capacity();
            spare.push(b);
        }
    }
}

/// Bytes of each of the `k` data (and every parity) shard of an object of `len` bytes (at least 1).
pub fn shard_len(len: u64, k: u32) -> u64 {
    len.div_ceil(u64::from(k.max(1))).max(1)
}

/// Data shard `i` (`i < k`) of an object cut in `k`: its bytes `i·n..(i+1)·n`, zero-padded to
/// `n` = [`shard_len`]. A holder of a whole copy cuts its own shard without the code.
pub fn data_shard(data: &[u8], k: usize, i: usize) -> Vec<u8> {
    let n = shard_len(data.len() as u64, k as u32) as usize;
    let lo = (i * n).min(data.len());
    let hi = ((i + 1) * n).min(data.len());
    let mut s = buffer(n);
    s[..hi - lo].copy_from_slice(&data[lo..hi]);
    s[hi - lo..].fill(0);
    s
}

/// A `k + m` Reed–Solomon code.
#[derive(Debug)]
pub struct Code {
    k: usize,
    m: usize,
    rs: ReedSolomon,
}

impl Code {
    /// The code with `k` data and `m` parity shards per stripe.
    pub fn new(k: usize, m: usize) -> Result<Code> {
        if k == 0 || m == 0 || k + m > MAX_SHARDS {
            return Err(Error::InvalidArgument(format!(
                "an erasure code of {k} data and {m} parity shards: both must be at least 1 and together at most {MAX_SHARDS}"
            )));
        }
        let rs = ReedSolomon::new(k, m).map_err(|e| Error::InvalidArgument(format!("erasure code {k}+{m}: {e:?}")))?;
        Ok(Code { k, m, rs })
    }

    /// Data shards per stripe.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Parity shards per stripe.
    pub fn m(&self) -> usize {
        self.m
    }

    /// Bytes of each shard of an object of `len` bytes (at least 1).
    pub fn shard_len(&self, len: usize) -> usize {
        shard_len(len as u64, self.k as u32) as usize
    }

    /// The `m` parity shards of `data` (its data shards are its own bytes: see [`Code::shard`]);
    /// give them to [`recycle`] once sent.
    /// Reed–Solomon works column by column, so the columns every data shard has in full are
    /// coded straight from `data`, and only the last few (fewer than `k` columns, where the
    /// object ends) from a zero-padded copy: padding the last shard whole cost 3+2 on 1 MiB
    /// 40% of the bare call's throughput.
    pub fn parity(&self, data: &[u8]) -> Vec<Vec<u8>> {
        let n = self.shard_len(data.len());
        let full = data.len().saturating_sub((self.k - 1) * n).min(n);
        // Every byte is written by the encoding: reused buffers need no zeroing.
        let mut parity: Vec<Vec<u8>> = (0..self.m).map(|_| buffer(n)).collect();
        if full > 0 {
            let head: Vec<&[u8]> = (0..self.k).map(|i| &data[i * n..i * n + full]).collect();
            let mut out: Vec<&mut [u8]> = parity.iter_mut().map(|p| &mut p[..full]).collect();
            self.rs.encode_sep(&head, &mut out).expect("shard counts and lengths are consistent by construction");
        }
        if full < n {
            let tail: Vec<Vec<u8>> = (0..self.k)
                .map(|i| {
                    let mut t = data.get(i * n + full..((i + 1) * n).min(data.len())).unwrap_or_default().to_vec();
                    t.resize(n - full, 0);
                    t
                })
                .collect();
            let mut out: Vec<&mut [u8]> = parity.iter_mut().map(|p| &mut p[full..]).collect();
            self.rs.encode_sep(&tail, &mut out).expect("shard counts and lengths are consistent by construction");
        }
        parity
    }

    /// The bare library call: parity of `k` equal data shards into `m` given buffers (the
    /// baseline the encode benchmark compares [`Code::parity`] with).
    pub fn parity_of_shards(&self, shards: &[&[u8]], parity: &mut [Vec<u8>]) -> Result<()> {
        self.rs.encode_sep(shards, parity).map_err(|e| Error::InvalidArgument(format!("erasure encode: {e:?}")))
    }

    /// Data shard `i` (`i < k`) of an object: see [`data_shard`].
    pub fn shard(&self, data: &[u8], i: usize) -> Vec<u8> {
        data_shard(data, self.k, i)
    }

    /// The object of `len` bytes from its shards (`k + m` slots, `None` where missing): the data
    /// shards are used as they are when all present, else any `k` shards are decoded.
    pub fn decode(&self, shards: &mut [Option<Vec<u8>>], len: usize) -> Result<Vec<u8>> {
        let n = self.shard_len(len);
        if shards.len() != self.k + self.m {
            return Err(Error::InvalidArgument(format!("{} shards given for a {}+{} code", shards.len(), self.k, self.m)));
        }
        if let Some(bad) = shards.iter().flatten().find(|s| s.len() != n) {
            return Err(Error::Corrupt(format!("a shard of {} bytes where a {len}-byte object has {n}-byte shards", bad.len())));
        }
        let have = shards.iter().filter(|s| s.is_some()).count();
        if have < self.k {
            return Err(Error::NotFound(format!(
                "only {have} of {} shards are left and {} are needed: the object is lost",
                self.k + self.m,
                self.k
            )));
        }
        if shards[..self.k].iter().any(Option::is_none) {
            self.rs.reconstruct_data(shards).map_err(|e| Error::Corrupt(format!("erasure decode failed: {e:?}")))?;
        }
        let mut out = Vec::with_capacity(n * self.k);
        for s in &shards[..self.k] {
            out.extend_from_slice(s.as_ref().expect("present or reconstructed"));
        }
        out.truncate(len);
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        /// Any `m` of `k + m` shards missing still decodes exactly; one more is a clear loss.
        #[test]
        fn any_m_missing_decode_exactly(
            data in proptest::collection::vec(any::<u8>(), 0..40_000),
            k in 1usize..9,
            m in 1usize..4,
            seed in any::<u64>(),
        ) {
            let code = Code::new(k, m).unwrap();
            let parity = code.parity(&data);
            let all: Vec<Vec<u8>> = (0..k).map(|i| code.shard(&data, i)).chain(parity).collect();
            // Lose m shards chosen by the seed (a permutation's first m).
            let mut order: Vec<usize> = (0..k + m).collect();
            let mut s = seed;
            for i in (1..order.len()).rev() {
                s = s.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                order.swap(i, (s >> 33) as usize % (i + 1));
            }
            let mut shards: Vec<Option<Vec<u8>>> = all.iter().cloned().map(Some).collect();
            for &i in &order[..m] {
                shards[i] = None;
            }
            prop_assert_eq!(code.decode(&mut shards.clone(), data.len()).unwrap(), data.clone());
            // Buffers given back carry their old bytes into the next shards: none may show.
            let expected = all.clone();
            recycle(all);
            let noise: Vec<u8> = data.iter().map(|b| !b).collect();
            recycle(code.parity(&noise));
            let again: Vec<Vec<u8>> = (0..k).map(|i| code.shard(&data, i)).chain(code.parity(&data)).collect();
            prop_assert_eq!(again, expected);
            shards[order[m]] = None;
            let e = code.decode(&mut shards, data.len()).unwrap_err();
            prop_assert!(e.to_string().contains("the object is lost"), "{}", e);
        }
    }

    #[test]
    fn bad_codes_and_shards_are_refused() {
        assert!(Code::new(0, 2).is_err() && Code::new(4, 0).is_err() && Code::new(200, 57).is_err());
        let code = Code::new(4, 2).unwrap();
        let mut shards: Vec<Option<Vec<u8>>> = vec![Some(vec![0; 3]); 6];
        assert_eq!(code.decode(&mut shards, 100).unwrap_err().kind(), crate::ErrorKind::Corrupt, "25-byte shards expected");
        assert!(code.decode(&mut shards[..5], 12).is_err());
    }
}
