//! Keyed values and sets held beside the objects: the task store of `cairn.tasks` (task inputs,
//! results, step markers, memo buckets). Their bytes count against the server's memory limit
//! like objects do. Sets keep members sorted by bytes, so every reader sees them in one order.

use crate::store::Store;
use crate::sync::lock;
use cairn_core::{Error, Result};
use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;

#[derive(Debug)]
enum Entry {
    Value(Vec<u8>),
    Set(BTreeSet<Vec<u8>>),
}

impl Entry {
    fn bytes(&self) -> u64 {
        match self {
            Entry::Value(v) => v.len() as u64,
            Entry::Set(s) => s.iter().map(|m| m.len() as u64).sum(),
        }
    }
}

/// The keyed values of one server.
#[derive(Debug, Default)]
pub struct Kv {
    map: Mutex<HashMap<String, Entry>>,
}

impl Kv {
    /// Sets each key to its data, or adds the data to the set at the key, under one lock. The
    /// caller reserved the data's bytes and kept them; bytes no longer held (a replaced value, a
    /// member already present) are given back. A key that holds the other kind is replaced.
    pub fn put_many(&self, store: &Store, items: impl IntoIterator<Item = (String, Vec<u8>)>, member: bool) {
        let mut map = lock(&self.map);
        for (key, data) in items {
            Self::put_one(&mut map, store, key, data, member);
        }
    }

    fn put_one(map: &mut HashMap<String, Entry>, store: &Store, key: String, data: Vec<u8>, member: bool) {
        let added = data.len() as u64;
        let old = if member {
            match map.get_mut(&key) {
                Some(Entry::Set(s)) => {
                    if !s.insert(data) {
                        store.free(added);
                    }
                    return;
                }
                _ => map.insert(key, Entry::Set(BTreeSet::from([data]))),
            }
        } else {
            map.insert(key, Entry::Value(data))
        };
        if let Some(old) = old {
            store.free(old.bytes());
        }
    }

    /// The values of `keys` (every member of each, with `members`) and their lengths per key. A
    /// key of the other kind reads as absent. A reply of more than `max_bytes` (a key named many
    /// times counts each time) is refused before anything is copied.
    pub fn get(&self, keys: &[String], members: bool, max_bytes: u64) -> Result<(Vec<Vec<u64>>, Vec<u8>)> {
        let map = lock(&self.map);
        let found = |k: &String| -> Vec<&Vec<u8>> {
            match (map.get(k), members) {
                (Some(Entry::Value(v)), false) => vec![v],
                (Some(Entry::Set(s)), true) => s.iter().collect(),
                _ => Vec::new(),
            }
        };
        let total: u64 = keys.iter().map(|k| found(k).iter().map(|v| v.len() as u64).sum::<u64>()).fold(0, u64::saturating_add);
        if total > max_bytes {
            return Err(Error::Capacity(format!(
                "kv_get of {} keys would reply {total} bytes, more than the {max_bytes} bytes a reply may carry; ask for fewer keys per request",
                keys.len()
            )));
        }
        let mut out = Vec::with_capacity(total as usize);
        let sizes = keys
            .iter()
            .map(|k| {
                found(k)
                    .iter()
                    .map(|v| {
                        out.extend_from_slice(v);
                        v.len() as u64
                    })
                    .collect()
            })
            .collect();
        Ok((sizes, out))
    }

    /// Deletes `keys` or, with `prefix`, the keys starting with one of them; returns how many.
    pub fn delete(&self, store: &Store, keys: &[String], prefix: bool) -> u64 {
        let mut map = lock(&self.map);
        let mut freed = 0;
        let before = map.len();
        if prefix {
            map.retain(|k, e| {
                let keep = !keys.iter().any(|p| k.starts_with(p.as_str()));
                if !keep {
                    freed += e.bytes();
                }
                keep
            });
        } else {
            freed = keys.iter().filter_map(|k| map.remove(k)).map(|e| e.bytes()).sum();
        }
        store.free(freed);
        (before - map.len()) as u64
    }

    /// Every key for which `pred` holds, with its value (or each member of its set) and
    /// whether it is a set; copied out, so the lock is not held while they are sent on.
    pub fn select(&self, pred: impl Fn(&str) -> bool) -> Vec<(String, bool, Vec<Vec<u8>>)> {
        let map = lock(&self.map);
        map.iter()
            .filter(|(k, _)| pred(k))
            .map(|(k, e)| match e {
                Entry::Value(v) => (k.clone(), false, vec![v.clone()]),
                Entry::Set(s) => (k.clone(), true, s.iter().cloned().collect()),
            })
            .collect()
    }

    /// Keys held.
    pub fn len(&self) -> usize {
        lock(&self.map).len()
    }

    /// Whether no keys are held.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(kv: &Kv, s: &Store, key: &str, data: &[u8], member: bool) {
        s.reserve(data.len() as u64).unwrap().keep();
        kv.put_many(s, [(key.into(), data.to_vec())], member);
    }

    #[test]
    fn values_sets_and_accounting() {
        let (kv, s) = (Kv::default(), Store::new(0, 100));
        put(&kv, &s, "a", b"12345", false);
        put(&kv, &s, "a", b"12", false);
        assert_eq!(s.used(), 2, "a replaced value gives its bytes back");
        put(&kv, &s, "m", b"zz", true);
        put(&kv, &s, "m", b"aa", true);
        put(&kv, &s, "m", b"zz", true);
        assert_eq!(s.used(), 6, "a member added twice is held once");
        let (sizes, bytes) = kv.get(&["m".into(), "nope".into(), "a".into()], true, 100).unwrap();
        assert_eq!((sizes, bytes), (vec![vec![2, 2], vec![], vec![]], b"aazz".to_vec()), "sorted members; a value is not a set");
        let (sizes, bytes) = kv.get(&["a".into(), "m".into()], false, 100).unwrap();
        let e = kv.get(&vec!["a".to_string(); 2000], false, 100).unwrap_err();
        assert_eq!(e.kind(), cairn_core::ErrorKind::Capacity, "a key named 2000 times counts 2000 times: {e}");
        assert_eq!((sizes, bytes), (vec![vec![2], vec![]], b"12".to_vec()));
        put(&kv, &s, "a", b"x", true);
        assert_eq!(s.used(), 5, "a value turned into a set gives its bytes back");
        assert_eq!(kv.delete(&s, &["m".into()], true), 1);
        assert_eq!((s.used(), kv.len()), (1, 1));
        assert_eq!(kv.delete(&s, &["a".into(), "a".into(), "zz".into()], false), 1, "exact keys; absent ones count nothing");
        put(&kv, &s, "a", b"x", true);
        assert_eq!(kv.delete(&s, &["".into()], true), 1);
        assert_eq!((s.used(), kv.is_empty()), (0, true));
    }
}
