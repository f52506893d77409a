//! n-D boxes in a variable's global index space: `offset + count`, in C (row-major) order.

use crate::error::{Error, Result};
use serde::{Deserialize, Serialize};

/// The most dimensions a variable may have.
pub const MAX_DIMS: usize = 8;

/// A box: `offset[d] .. offset[d] + count[d]` along every dimension `d`. Decoding checks it like
/// [`Region::new`], so a box from the network or a file always has matching, bounded dimensions.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(try_from = "RawRegion")]
pub struct Region {
    /// First index along each dimension.
    pub offset: Vec<u64>,
    /// Extent along each dimension.
    pub count: Vec<u64>,
}

/// A region as it arrives, before [`Region::new`] checks it.
#[derive(Deserialize)]
struct RawRegion {
    offset: Vec<u64>,
    count: Vec<u64>,
}

impl TryFrom<RawRegion> for Region {
    type Error = Error;
    fn try_from(r: RawRegion) -> Result<Region> {
        Region::new(r.offset, r.count)
    }
}

impl Region {
    /// Builds a box, checking that offset and count have the same, supported, number of dimensions.
    pub fn new(offset: Vec<u64>, count: Vec<u64>) -> Result<Region> {
        if offset.len() != count.len() {
            return Err(Error::InvalidArgument(format!(
                "offset has {} dimensions but count has {}; give one value per dimension",
                offset.len(),
                count.len()
            )));
        }
        if offset.len() > MAX_DIMS {
            return Err(Error::InvalidArgument(format!("{} dimensions requested; Cairn supports at most {MAX_DIMS}", offset.len())));
        }
        for (d, (o, c)) in offset.iter().zip(&count).enumerate() {
            if o.checked_add(*c).is_none() {
                return Err(Error::InvalidArgument(format!("offset {o} + count {c} overflows along dimension {d}")));
            }
        }
        Ok(Region { offset, count })
    }

    /// The box `0..shape`.
    pub fn whole(shape: &[u64]) -> Region {
        Region { offset: vec![0; shape.len()], count: shape.to_vec() }
    }

    /// Number of dimensions.
    pub fn ndim(&self) -> usize {
        self.count.len()
    }

    /// Number of elements (saturating; a box that large cannot be allocated anyway).
    pub fn volume(&self) -> u64 {
        self.count.iter().fold(1u64, |v, c| v.saturating_mul(*c))
    }

    /// One past the last index along each dimension.
    pub fn end(&self) -> Vec<u64> {
        self.offset.iter().zip(&self.count).map(|(o, c)| o + c).collect()
    }

    /// The common part of two boxes of the same rank, if any element is shared.
    pub fn intersect(&self, other: &Region) -> Option<Region> {
        debug_assert_eq!(self.ndim(), other.ndim());
        let mut offset = Vec::with_capacity(self.ndim());
        let mut count = Vec::with_capacity(self.ndim());
        for d in 0..self.ndim() {
            let lo = self.offset[d].max(other.offset[d]);
            let hi = (self.offset[d] + self.count[d]).min(other.offset[d] + other.count[d]);
            if hi <= lo {
                return None;
            }
            offset.push(lo);
            count.push(hi - lo);
        }
        Some(Region { offset, count })
    }

    /// Checks that this box lies inside a global `shape`, naming the first offending dimension.
    pub fn check_within(&self, shape: &[u64], what: &str) -> Result<()> {
        if self.ndim() != shape.len() {
            return Err(Error::InvalidArgument(format!(
                "{what} has {} dimensions but the variable has {} (shape {shape:?})",
                self.ndim(),
                shape.len()
            )));
        }
        for (d, (end, n)) in self.end().iter().zip(shape).enumerate() {
            if end > n {
                return Err(Error::InvalidArgument(format!(
                    "{what} offset {:?} count {:?} ends at {end} along dimension {d}, \
                     outside the global shape {shape:?}",
                    self.offset, self.count
                )));
            }
        }
        Ok(())
    }

    /// Byte range `[lo, hi)` that `sub` (contained in `self`) spans inside a C-order buffer laid
    /// out as `self`, so a reader can fetch only that range.
    pub fn byte_span(&self, sub: &Region, elem: usize) -> (u64, u64) {
        let strides = c_strides(&self.count);
        let mut lo = 0u64;
        let mut hi = 0u64;
        for (d, stride) in strides.iter().enumerate() {
            let rel = sub.offset[d] - self.offset[d];
            lo += rel * stride;
            hi += (rel + sub.count[d].max(1) - 1) * stride;
        }
        (lo * elem as u64, (hi + 1) * elem as u64)
    }
}

/// Element strides of a C-order array of the given extents.
pub fn c_strides(count: &[u64]) -> Vec<u64> {
    let mut strides = vec![1u64; count.len()];
    for d in (0..count.len().saturating_sub(1)).rev() {
        strides[d] = strides[d + 1] * count[d + 1];
    }
    strides
}

/// Boxes kept sorted along dimension 0, so that which of them a box meets is found among its
/// neighbours instead of trying them all (a step of 1,000 small blocks was checked against
/// every box before it, twice: by the writer at each put and by the classifier at commit).
#[derive(Debug, Default, Clone)]
pub struct BoxSet {
    sorted: Vec<Region>,
    /// Longest extent along dimension 0: no box starting farther back reaches a point.
    longest: u64,
}

impl BoxSet {
    fn start(r: &Region) -> u64 {
        r.offset.first().copied().unwrap_or(0)
    }

    /// Adds a box.
    pub fn insert(&mut self, r: Region) {
        self.longest = self.longest.max(r.count.first().copied().unwrap_or(0));
        let at = self.sorted.partition_point(|b| Self::start(b) <= Self::start(&r));
        self.sorted.insert(at, r);
    }

    /// Removes every box equal to `r`.
    pub fn remove(&mut self, r: &Region) {
        self.sorted.retain(|b| b != r);
        // Without the longest box, lookups need not reach back as far.
        if r.count.first().copied().unwrap_or(0) >= self.longest {
            self.longest = Self::longest_of(&self.sorted);
        }
    }

    fn longest_of(boxes: &[Region]) -> u64 {
        boxes.iter().map(|b| b.count.first().copied().unwrap_or(0)).max().unwrap_or(0)
    }

    /// Whether it holds no box.
    pub fn is_empty(&self) -> bool {
        self.sorted.is_empty()
    }

    /// A box that `r` meets, if any (boxes of another number of dimensions never meet it: a
    /// local variable's blocks may change rank between steps).
    pub fn meeting(&self, r: &Region) -> Option<&Region> {
        let meets = |b: &&Region| b.ndim() == r.ndim() && b.intersect(r).is_some();
        let (Some(&start), Some(&len)) = (r.offset.first(), r.count.first()) else {
            return self.sorted.iter().find(meets);
        };
        let first = self.sorted.partition_point(|b| Self::start(b).saturating_add(self.longest) <= start);
        self.sorted[first..].iter().take_while(|b| Self::start(b) < start.saturating_add(len)).find(meets)
    }
}

impl FromIterator<Region> for BoxSet {
    fn from_iter<I: IntoIterator<Item = Region>>(iter: I) -> BoxSet {
        let mut sorted: Vec<Region> = iter.into_iter().collect();
        sorted.sort_by_key(Self::start);
        let longest = Self::longest_of(&sorted);
        BoxSet { sorted, longest }
    }
}

/// Finds a pair of overlapping boxes, if any, by a sweep along dimension 0
/// (O(n log n + overlaps checked) rather than all pairs).
pub fn find_overlap(boxes: &[&Region]) -> Option<(usize, usize)> {
    let mut order: Vec<usize> = (0..boxes.len()).filter(|&i| boxes[i].volume() > 0).collect();
    if order.first().is_some_and(|&i| boxes[i].ndim() == 0) {
        return (order.len() > 1).then(|| (order[0], order[1]));
    }
    order.sort_by_key(|&i| boxes[i].offset[0]);
    let mut active: Vec<usize> = Vec::new();
    for &i in &order {
        let start = boxes[i].offset[0];
        active.retain(|&j| boxes[j].offset[0] + boxes[j].count[0] > start);
        if let Some(&j) = active.iter().find(|&&j| boxes[j].intersect(boxes[i]).is_some()) {
            return Some((j, i));
        }
        active.push(i);
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn r(o: &[u64], c: &[u64]) -> Region {
        Region::new(o.to_vec(), c.to_vec()).unwrap()
    }

    #[test]
    fn decoding_checks_like_new() {
        let e = serde_json::from_str::<Region>(r#"{"offset": [], "count": [4]}"#).unwrap_err().to_string();
        assert!(e.contains("offset has 0 dimensions but count has 1"), "{e}");
        assert!(serde_json::from_str::<Region>(r#"{"offset": [18446744073709551615], "count": [2]}"#).is_err());
        assert!(serde_json::from_str::<Region>(&format!(r#"{{"offset": {0:?}, "count": {0:?}}}"#, vec![1; 9])).is_err());
        assert_eq!(serde_json::from_str::<Region>(r#"{"offset": [1], "count": [2]}"#).unwrap(), r(&[1], &[2]));
    }

    #[test]
    fn intersect_and_bounds() {
        let a = r(&[0, 0], &[4, 4]);
        assert_eq!(a.intersect(&r(&[2, 3], &[5, 5])), Some(r(&[2, 3], &[2, 1])));
        assert_eq!(a.intersect(&r(&[4, 0], &[1, 1])), None);
        assert!(r(&[90, 0], &[11, 3]).check_within(&[100, 3], "box").unwrap_err().to_string().contains("dimension 0"));
        assert!(r(&[0], &[3]).check_within(&[3, 3], "box").is_err());
    }

    #[test]
    fn byte_span_of_a_row_slab() {
        let block = r(&[10, 0], &[4, 8]);
        assert_eq!(block.byte_span(&r(&[11, 2], &[2, 3]), 8), ((8 + 2) * 8, (2 * 8 + 5) * 8));
    }

    fn boxes(ndim: usize) -> impl Strategy<Value = Vec<Region>> {
        prop::collection::vec(
            (prop::collection::vec(0u64..20, ndim), prop::collection::vec(1u64..8, ndim)).prop_map(|(o, c)| Region::new(o, c).unwrap()),
            0..12,
        )
    }

    proptest! {
        #[test]
        fn intersection_is_the_set_of_shared_points(a in boxes(3), b in boxes(3)) {
            for x in &a { for y in &b {
                let i = x.intersect(y);
                // A point is in the intersection iff it is in both boxes; check the corners.
                let contains = |b: &Region, p: &[u64]| p.iter().enumerate().all(|(d, v)| *v >= b.offset[d] && *v < b.offset[d] + b.count[d]);
                if let Some(i) = &i {
                    prop_assert!(contains(x, &i.offset) && contains(y, &i.offset));
                    let last: Vec<u64> = i.end().iter().map(|e| e - 1).collect();
                    prop_assert!(contains(x, &last) && contains(y, &last));
                } else {
                    prop_assert!(!contains(y, &x.offset) && !contains(x, &y.offset));
                }
            }}
        }

        #[test]
        fn sweep_matches_all_pairs(bs in boxes(2)) {
            let refs: Vec<&Region> = bs.iter().collect();
            let brute = (0..bs.len()).any(|i| (i + 1..bs.len()).any(|j| bs[i].intersect(&bs[j]).is_some()));
            prop_assert_eq!(find_overlap(&refs).is_some(), brute);
        }

        #[test]
        fn a_box_set_never_meets_a_box_of_another_rank(o in 0u64..8, c in 1u64..8) {
            let set: BoxSet = [r(&[o], &[c])].into_iter().collect();
            prop_assert!(set.meeting(&r(&[o, 0], &[c, 4])).is_none());
            prop_assert!(set.meeting(&r(&[], &[])).is_none());
            prop_assert!(set.meeting(&r(&[o], &[c])).is_some());
        }

        #[test]
        fn a_box_set_meets_what_trying_each_meets(bs in boxes(2), probe in boxes(2)) {
            let built: BoxSet = bs.iter().cloned().collect();
            let mut grown = BoxSet::default();
            bs.iter().cloned().for_each(|b| grown.insert(b));
            for p in &probe {
                let brute = bs.iter().any(|b| b.intersect(p).is_some());
                prop_assert_eq!(built.meeting(p).is_some(), brute, "{:?}", p);
                prop_assert_eq!(grown.meeting(p).is_some(), brute, "{:?}", p);
                prop_assert!(grown.meeting(p).is_none_or(|m| m.intersect(p).is_some()));
            }
            if let Some(first) = bs.first() {
                grown.remove(first);
                prop_assert!(grown.meeting(first).is_none_or(|m| m != first));
                // What is left is searched as if it had been built without it.
                let left: Vec<&Region> = bs.iter().filter(|b| *b != first).collect();
                prop_assert_eq!(grown.longest, BoxSet::longest_of(&grown.sorted));
                for p in &probe {
                    prop_assert_eq!(grown.meeting(p).is_some(), left.iter().any(|b| b.intersect(p).is_some()), "{:?}", p);
                }
            }
        }
    }
}
