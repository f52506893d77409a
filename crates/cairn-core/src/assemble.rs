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

/// Calls `f(src_byte, dst_byte, len)` for each contiguous run of `isect` (contained in both
/// boxes) in two C-order buffers laid out as `from` and `to`. Trailing dimensions that both hold
/// whole are merged into one run, so a slab is a single run.
pub fn for_each_run(from: &Region, to: &Region, isect: &Region, elem: usize, mut f: impl FnMut(u64, u64, usize)) {
    let n = isect.ndim();
    if n == 0 {
        return f(0, 0, elem);
    }
    let mut k = n - 1;
    while k > 0 && isect.count[k] == from.count[k] && isect.count[k] == to.count[k] {
        k -= 1;
    }
    let run = isect.count[k..].iter().product::<u64>() as usize * elem;
    let (ss, ds) = (c_strides(&from.count), c_strides(&to.count));
    // Offsets of the intersection's first element, then steps along the odometer dims 0..k.
    let mut so: u64 = (0..n).map(|d| (isect.offset[d] - from.offset[d]) * ss[d]).sum();
    let mut dof: u64 = (0..n).map(|d| (isect.offset[d] - to.offset[d]) * ds[d]).sum();
    let mut idx = vec![0u64; k];
    loop {
        f(so * elem as u64, dof * elem as u64, run);
        let mut d = k;
        loop {
            if d == 0 {
                return;
            }
            d -= 1;
            idx[d] += 1;
            so += ss[d];
            dof += ds[d];
            if idx[d] < isect.count[d] {
                break;
            }
            so -= ss[d] * idx[d];
            dof -= ds[d] * idx[d];
            idx[d] = 0;
        }
    }
}

/// Copies `isect` (contained in both layouts) from `src` to `dst`, one contiguous run at a time.
///
/// # Panics
/// If `isect` is not inside both layouts or the buffers are too short: callers derive all three
/// boxes from validated metadata, so a mismatch is a bug, not bad input.
pub fn copy_box(src: &[u8], from: Layout<'_>, dst: &mut [u8], to: Layout<'_>, isect: &Region, elem: usize) {
    for_each_run(from.layout, to.layout, isect, elem, |s, d, len| {
        let (s, d) = ((s - from.base) as usize, (d - to.base) as usize);
        dst[d..d + len].copy_from_slice(&src[s..s + len]);
    });
}

/// Chunk ranges `[first, last)` of a buffer laid out as `layout` that hold bytes of `sub`,
/// merged where they touch: what a reader must fetch (and verify) to serve `sub`.
pub fn chunks_touched(layout: &Region, sub: &Region, elem: usize, chunk: u64) -> Vec<(u64, u64)> {
    let mut out: Vec<(u64, u64)> = Vec::new();
    for_each_run(layout, layout, sub, elem, |s, _, len| {
        let (lo, hi) = (s / chunk, (s + len as u64).div_ceil(chunk));
        match out.last_mut() {
            Some(last) if lo <= last.1 => last.1 = last.1.max(hi),
            _ => out.push((lo, hi)),
        }
    });
    out
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
        (prop::collection::vec(0u64..lo, ndim), prop::collection::vec(1u64..hi, ndim)).prop_map(|(o, c)| Region::new(o, c).unwrap())
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

        #[test]
        fn touched_chunks_cover_every_run_and_only_those(
            (outer, sub) in (1usize..=4).prop_flat_map(|n| (region(n, 3, 7), region(n, 3, 7))),
            chunk in 1u64..50,
        ) {
            let Some(isect) = outer.intersect(&sub) else { return Ok(()) };
            let ranges = chunks_touched(&outer, &isect, 4, chunk);
            let mut needed = std::collections::BTreeSet::new();
            for_each_run(&outer, &outer, &isect, 4, |s, _, len| needed.extend(s / chunk..(s + len as u64).div_ceil(chunk)));
            let got: std::collections::BTreeSet<u64> = ranges.iter().flat_map(|&(a, b)| a..b).collect();
            prop_assert_eq!(got, needed);
            prop_assert!(ranges.windows(2).all(|w| w[0].1 < w[1].0));
        }
    }
}
