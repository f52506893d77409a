//! Splitting a block into staging objects: CoREC Algorithm 1. A block larger than the target object
//! size is halved along its longest dimension until every piece fits, so objects stay within
//! `[max/2, max]` (blocks already smaller are kept whole) and keep a compact n-D shape, which keeps
//! box reads touching few objects. One change: a cut may not leave the piece made of contiguous
//! runs shorter than [`MIN_RUN`] (unless the block's own rows are), so the longest dimension whose
//! cut keeps runs that long is halved, the slower one on ties. Cutting the fastest dimension of a
//! (128, 256, 256) f64 block gave 16 MiB cubes of 16,384 runs of 1 KiB: gathering, checksumming
//! and sending those cost the writer 4× the CPU of 64 runs of 256 KiB, and a (128, 512, 512)
//! block's 8,192 runs of 2 KiB were too many for one same-node copy (it fell back to the socket,
//! at half the speed).

use crate::region::Region;

/// Shortest contiguous run a cut may leave in a piece: 64 KiB.
pub const MIN_RUN: u64 = 64 << 10;

/// Bytes of the contiguous runs that a piece of `block` with extents `count` is made of (in the
/// block's C-order buffer): the fastest dimensions it spans whole, and the first it does not.
fn run_bytes(block: &Region, count: &[u64], elem: usize) -> u64 {
    let mut run = elem as u64;
    for d in (0..count.len()).rev() {
        run = run.saturating_mul(count[d]);
        if count[d] != block.count[d] {
            break;
        }
    }
    run
}

/// Splits `block` (elements of `elem` bytes) into pieces of at most `max_bytes` each, in C order
/// of their offsets. A single element larger than `max_bytes` stays one piece.
pub fn split(block: &Region, elem: usize, max_bytes: u64) -> Vec<Region> {
    let max_bytes = max_bytes.max(1);
    let mut out = Vec::new();
    let mut todo = vec![block.clone()];
    while let Some(r) = todo.pop() {
        let bytes = r.volume().saturating_mul(elem as u64);
        let now = run_bytes(block, &r.count, elem);
        // The lower half is the shorter one.
        let after = |d: usize| {
            let mut c = r.count.clone();
            c[d] /= 2;
            run_bytes(block, &c, elem)
        };
        // Cuts that keep runs long enough, the longest (then slowest) dimension first; failing
        // those, the cut that keeps the longest runs.
        let cut = (0..r.ndim()).filter(|&d| r.count[d] > 1).max_by_key(|&d| {
            let a = after(d);
            let keeps = a == now || a >= MIN_RUN;
            (keeps, if keeps { r.count[d] } else { a }, std::cmp::Reverse(d))
        });
        match cut {
            Some(d) if bytes > max_bytes => {
                let half = r.count[d] / 2;
                let mut lo = r.clone();
                lo.count[d] = half;
                let mut hi = r;
                hi.offset[d] += half;
                hi.count[d] -= half;
                todo.push(hi);
                todo.push(lo);
            }
            _ => out.push(r),
        }
    }
    out.sort_by(|a, b| a.offset.cmp(&b.offset));
    out
}

/// Whether `sub` (inside `block`) occupies one contiguous byte range of `block`'s C-order buffer.
pub fn is_contiguous(block: &Region, sub: &Region) -> bool {
    if sub.volume() == 0 {
        return true;
    }
    let (lo, hi) = block.byte_span(sub, 1);
    hi - lo == sub.volume()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn halves_the_longest_dimension_whose_cut_keeps_long_runs() {
        // Rows of 256 B are shorter than MIN_RUN already: the fastest dimension is not cut.
        let b = Region::new(vec![0, 0], vec![4, 32]).unwrap();
        let p = split(&b, 8, 8 * 32);
        assert!(p.len() == 4 && p.iter().all(|r| r.count == vec![1, 32]), "{p:?}");
        // Long rows: the longest dimension is cut while the runs stay at least MIN_RUN.
        let b = Region::new(vec![0, 0], vec![8, 1 << 16]).unwrap();
        let p = split(&b, 8, 8 << 16);
        assert!(p.len() == 8 && p.iter().all(|r| r.count == vec![8, 1 << 13]), "{p:?}");
        // A cube-ish block: 16 MiB objects of 64 runs of 256 KiB, not 8,192 runs of 2 KiB.
        let b = Region::new(vec![0, 0, 0], vec![128, 512, 512]).unwrap();
        let p = split(&b, 8, 16 << 20);
        assert!(p.len() == 16 && p.iter().all(|r| r.count == vec![64, 64, 512]), "{:?}", &p[..2]);
        // A 256 MiB f64 slab into 16 MiB objects: runs of 256 KiB, not 1 KiB.
        let b = Region::new(vec![0, 0, 0], vec![512, 256, 256]).unwrap();
        let p = split(&b, 8, 16 << 20);
        assert!(p.len() == 16 && p.iter().all(|r| r.count == vec![64, 128, 256]), "{:?}", &p[..2]);
    }

    #[test]
    fn small_blocks_and_single_elements_stay_whole() {
        let b = Region::new(vec![3], vec![5]).unwrap();
        assert_eq!(split(&b, 8, 1 << 20), vec![b.clone()]);
        let one = Region::new(vec![0, 0], vec![1, 1]).unwrap();
        assert_eq!(split(&one, 1 << 20, 16).len(), 1);
    }

    #[test]
    fn contiguity() {
        let b = Region::new(vec![0, 0, 0], vec![4, 6, 8]).unwrap();
        let slab = Region::new(vec![1, 0, 0], vec![2, 6, 8]).unwrap();
        let row = Region::new(vec![1, 2, 0], vec![1, 3, 8]).unwrap();
        let cube = Region::new(vec![0, 0, 0], vec![2, 3, 4]).unwrap();
        assert!(is_contiguous(&b, &slab) && is_contiguous(&b, &row) && is_contiguous(&b, &b));
        assert!(!is_contiguous(&b, &cube));
    }

    fn block() -> impl Strategy<Value = Region> {
        prop::collection::vec((0u64..50, 1u64..40), 1..5)
            .prop_map(|d| Region::new(d.iter().map(|x| x.0).collect(), d.iter().map(|x| x.1).collect()).unwrap())
    }

    proptest! {
        /// Pieces tile the block exactly, each fits, and none is needlessly small.
        #[test]
        fn pieces_tile_the_block(b in block(), elem in 1usize..9, parts in 1u64..100) {
            let max = (b.volume() * elem as u64 / parts).max(1);
            let pieces = split(&b, elem, max);
            let total: u64 = pieces.iter().map(Region::volume).sum();
            prop_assert_eq!(total, b.volume());
            for (i, p) in pieces.iter().enumerate() {
                prop_assert_eq!(p.intersect(&b), Some(p.clone()));
                let bytes = p.volume() * elem as u64;
                prop_assert!(bytes <= max || p.volume() == 1);
                for q in &pieces[i + 1..] {
                    prop_assert!(p.intersect(q).is_none());
                }
                if (b.volume() * elem as u64) > max {
                    // A piece is at least a third of the limit (halving an odd extent rounds down).
                    prop_assert!(bytes * 3 >= max.min(b.volume() * elem as u64) || p.volume() * 3 <= 4, "{:?} {}", p, bytes);
                }
            }
        }

        /// A contiguous piece is one run when copied out of its block.
        #[test]
        fn contiguous_pieces_are_one_run(b in block(), parts in 1u64..100) {
            for p in split(&b, 1, (b.volume() / parts).max(1)) {
                let mut runs = 0;
                crate::assemble::for_each_run(&b, &p, &p, 1, |_, _, _| runs += 1);
                prop_assert_eq!(is_contiguous(&b, &p), runs == 1);
            }
        }
    }
}
