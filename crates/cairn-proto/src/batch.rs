//! How keyed values are cut into `kv_put` requests, the same for clients and for servers that
//! copy keys to one another: bounded in keys and bytes, so no request is refused for its size.

use crate::message::MAX_KEYS;

/// Bytes of values per `kv_put`: large enough that a request's round trip is small against
/// sending it, small enough that a batch refused for space is a small part of a server's memory.
pub const KV_BATCH_BYTES: u64 = 8 << 20;

/// `items` cut into consecutive runs of at most [`MAX_KEYS`] items and `max_bytes` bytes (an
/// item larger than that goes alone), a new run starting wherever `apart` says two neighbours
/// may not share a request (a value next to a set member).
pub fn kv_batches<T>(items: &[T], max_bytes: u64, size: impl Fn(&T) -> u64, apart: impl Fn(&T, &T) -> bool) -> Vec<&[T]> {
    let mut out = Vec::new();
    let (mut start, mut bytes) = (0, 0u64);
    for (n, item) in items.iter().enumerate() {
        if n > start && (n - start == MAX_KEYS || bytes + size(item) > max_bytes || apart(&items[start], item)) {
            out.push(&items[start..n]);
            (start, bytes) = (n, 0);
        }
        bytes += size(item);
    }
    if start < items.len() {
        out.push(&items[start..]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const MAX: u64 = KV_BATCH_BYTES;

    #[test]
    fn batches_bound_keys_and_bytes() {
        let idx: Vec<usize> = (0..20_000).collect();
        let b = kv_batches(&idx, MAX, |_| 10, |_, _| false);
        assert_eq!(b.iter().map(|b| b.len()).collect::<Vec<_>>(), vec![MAX_KEYS, MAX_KEYS, 20_000 - 2 * MAX_KEYS]);
        let big = MAX / 2 + 1;
        let b = kv_batches(&[0u64, 1, 2, 3], MAX, |&i| if i == 2 { 3 * MAX } else { big }, |_, _| false);
        assert_eq!(b, vec![&[0][..], &[1], &[2], &[3]], "two halves do not fit one batch; a huge value goes alone");
        assert!(kv_batches(&[] as &[u8], 1, |_| 1, |_, _| false).is_empty());
    }

    #[test]
    fn batches_keep_one_kind() {
        let items = [(false, 1u64), (false, 2), (true, 3), (true, 4), (false, 1)];
        let b = kv_batches(&items, MAX, |i| i.1, |a, b| a.0 != b.0);
        assert_eq!(b.iter().map(|b| b.len()).collect::<Vec<_>>(), vec![2, 2, 1]);
    }
}
