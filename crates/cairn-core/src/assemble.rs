//! Copying a sub-box between two C-order buffers: how a reader's box is assembled from the blocks
//! that writers put (M×N redistribution), whatever the two decompositions are.

use crate::region::{c_strides, Region};

/// A C-order buffer laid out as `layout`, of which `bytes` holds the part starting at byte `base`
/// (a reader fetches only the span it needs, so `base` is often non-zero).
#[derive(Debug)]
pub struct Layout<'a> {
    /// The box the buffer describes.
    pub layout: &'a Region,
    /// Byte offset of `bytes[0]` within the full buffer.
    pub base: u64,
}

/// Copies `isect` (contained in both layouts) from `src` to `dst`, one contiguous run at a time.
/// Trailing dimensions that both buffers hold whole are merged into one run, so a slab copy is a
/// single `memcpy`.
///
/// # Panics
/// If `isect` is not inside both layouts or the buffers are too short: callers derive all three
/// boxes from validated metadata, so a mismatch is a bug, not bad input.
pub fn copy_box(src: &[u8], from: Layout<'_>, dst: &mut [u8], to: Layout<'_>, isect: &Region, elem: usize) {
    let n = isect.ndim();
    if n == 0 {
        let s = (0 - from.base) as usize;
        let d = (0 - to.base) as usize;
        dst[d..d + elem].copy_from_slice(&src[s..s + elem]);
        return;
    }
    // Merge trailing dimensions that are complete in the intersection and in both buffers.
    let mut k = n - 1;
    while k > 0
        && isect.count[k] == from.layout.count[k]
        && isect.count[k] == to.layout.count[k]
    {
        k -= 1;
    }
    let run_elems: u64 = isect.count[k..].iter().product();
    let run = run_elems as usize * elem;
    let ss = c_strides(&from.layout.count);
    let ds = c_strides(&to.layout.count);
    let mut idx = vec![0u64; k]; // odometer over dims 0..k, relative to isect.offset
    loop {
        let mut so = 0u64;
        let mut dof = 0u64;
        for d in 0..=k {
            let i = isect.offset[d] + if d < k { idx[d] } else { 0 };
            so += (i - from.layout.offset[d]) * ss[d];
            dof += (i - to.layout.offset[d]) * ds[d];
        }
        for d in k + 1..n {
            so += (isect.offset[d] - from.layout.offset[d]) * ss[d];
            dof += (isect.offset[d] - to.layout.offset[d]) * ds[d];
        }
        let s = (so * elem as u64 - from.base) as usize;
        let d = (dof * elem as u64 - to.base) as usize;
        dst[d..d + run].copy_from_slice(&src[s..s + run]);
        // Advance the odometer.
        let mut d = k;
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            idx[d] += 1;
            if idx[d] < isect.count[d] {
                break;
            }
            idx[d] = 0;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Value of a global index, unique per point: the test's ground truth.
    fn val(p: &[u64]) -> u32 {
        p.iter().fold(7u32, |h, v| h.wrapping_mul(31).wrapping_add(*v as u32))
    }

    fn fill(b: &Region) -> Vec<u8> {
        let mut out = Vec::new();
        for_each_point(b, |p| out.extend_from_slice(&val(p).to_le_bytes()));
        out
    }

    fn for_each_point(b: &Region, mut f: impl FnMut(&[u64])) {
        if b.volume() == 0 {
            return;
        }
        let mut p = b.offset.clone();
        loop {
            f(&p);
            let mut d = b.ndim();
            loop {
                if d == 0 {
                    return;
                }
                d -= 1;
                p[d] += 1;
                if p[d] < b.offset[d] + b.count[d] {
                    break;
                }
                p[d] = b.offset[d];
            }
        }
    }

    fn region(ndim: usize, lo: u64, hi: u64) -> impl Strategy<Value = Region> {
        (prop::collection::vec(0u64..lo, ndim), prop::collection::vec(1u64..hi, ndim))
            .prop_map(|(o, c)| Region::new(o, c).unwrap())
    }

    proptest! {
        #[test]
        fn assembled_box_holds_exactly_the_source_points(
            (src, dst, cut) in (1usize..=5).prop_flat_map(|n| (region(n, 4, 6), region(n, 4, 6), 0u64..3))
        ) {
            let Some(isect) = src.intersect(&dst) else { return Ok(()) };
            let sbuf = fill(&src);
            // Hand the kernel only the byte span it needs, minus a few leading bytes of slack.
            let (lo, hi) = src.byte_span(&isect, 4);
            let lo = lo.saturating_sub(cut * 4);
            let mut dbuf = vec![0xffu8; dst.volume() as usize * 4];
            copy_box(&sbuf[lo as usize..hi as usize], Layout { layout: &src, base: lo }, &mut dbuf, Layout { layout: &dst, base: 0 }, &isect, 4);
            let mut i = 0usize;
            let mut ok = true;
            for_each_point(&dst, |p| {
                let got = u32::from_le_bytes(dbuf[i * 4..i * 4 + 4].try_into().unwrap());
                let inside = isect.intersect(&Region::new(p.to_vec(), vec![1; p.len()]).unwrap()).is_some();
                ok &= if inside { got == val(p) } else { got == u32::MAX };
                i += 1;
            });
            prop_assert!(ok);
        }
    }
}
