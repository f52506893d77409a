//! Whole objects of a committed step, for the drain: each from this server's own piece where it
//! holds one, else from its holders over the peer protocol (`pieces`, the request recovery
//! uses), a copy or `k` shards (data shards first, so most need no decoding), each piece
//! checked against its crc32c and each object against its own.

use crate::state::State;
use cairn_core::erasure::Code;
use cairn_core::index::{ObjectRef, Redundancy};
use cairn_core::{Error, Result};
use cairn_proto::message::MAX_REBUILD;
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// One object being gathered.
struct Want<'a> {
    obj: &'a ObjectRef,
    /// Its bytes.
    len: usize,
    /// Data shards (0 for copies, where any one slot gives the object).
    k: usize,
    /// (holder, piece key) of each slot: the copies, or the shards in stripe order.
    slots: Vec<(u32, u32)>,
    got: Vec<Option<Vec<u8>>>,
    asked: BTreeSet<usize>,
}

impl<'a> Want<'a> {
    fn new(obj: &'a ObjectRef, elem: u64) -> Want<'a> {
        let len = (obj.region.volume() * elem) as usize;
        let (k, slots) = match &obj.redundancy {
            Redundancy::Encoded { k, shards, .. } => (*k as usize, shards.iter().enumerate().map(|(i, s)| (*s, i as u32 + 1)).collect()),
            _ => (0, obj.holders().into_iter().map(|s| (s, 0)).collect::<Vec<_>>()),
        };
        Want { obj, len, k, got: vec![None; slots.len()], slots, asked: BTreeSet::new() }
    }

    fn have(&self) -> usize {
        self.got.iter().flatten().count()
    }

    fn complete(&self) -> bool {
        self.have() >= self.k.max(1)
    }

    /// Slots to ask for next: as many as are still needed, from holders not failed and not
    /// asked yet, in slot order (copies as the index orders them; data shards before parity).
    fn asks(&mut self, failed: &BTreeSet<u32>) -> Vec<usize> {
        if self.complete() {
            return Vec::new();
        }
        let need = self.k.max(1) - self.have();
        let next: Vec<usize> = (0..self.slots.len())
            .filter(|i| self.got[*i].is_none() && !self.asked.contains(i) && !failed.contains(&self.slots[*i].0))
            .take(need)
            .collect();
        self.asked.extend(&next);
        next
    }

    /// The object's bytes, checked against its crc32c.
    fn finish(&mut self, what: &str) -> Result<Vec<u8>> {
        let bytes = if self.k == 0 {
            self.got.iter_mut().find_map(Option::take).unwrap_or_default()
        } else {
            let m = self.slots.len() - self.k;
            Code::new(self.k, m)?.decode(&mut self.got, self.len)?
        };
        if cairn_core::checksum::crc(&bytes) != self.obj.checksum {
            return Err(Error::Corrupt(format!("{what} gathered for the drain does not match its checksum; the drain tries again")));
        }
        Ok(bytes)
    }
}

/// The bytes of objects `objs` of step `step` of `dataset` (elements of `elem` bytes), in order.
/// An object is [`Error::DataLoss`] when every holder of a piece it still lacks was declared
/// down (the rest of the step is not), else [`Error::Unavailable`] while a holder may answer
/// later (hung is not lost).
pub async fn objects(state: &Arc<State>, dataset: &str, step: u64, objs: &[ObjectRef], elem: u64) -> Result<Vec<Vec<u8>>> {
    let mut wants: Vec<Want<'_>> = objs.iter().map(|o| Want::new(o, elem)).collect();
    // This server's own pieces first.
    for w in &mut wants {
        for (i, &(srv, key)) in w.slots.iter().enumerate() {
            if srv == state.id && !w.complete() {
                w.got[i] = state.store.with(dataset, step, (w.obj.id, key), |o| o.data.to_vec()).ok();
            }
        }
    }
    let view = state.view()?;
    let mut failed: BTreeSet<u32> = view.down.iter().copied().collect();
    failed.insert(state.id); // asked above
                             // Holders that answered (this one included): one that answered without a piece the index
                             // places on it means the object moved (encoded, rebuilt) or went with a release.
    let mut answered = BTreeSet::from([state.id]);
    let max = state.store.max_reply();
    loop {
        // Per holder, batches of at most MAX_REBUILD pieces and a reply's bound of bytes.
        let mut asks: BTreeMap<u32, Vec<Vec<(usize, usize)>>> = BTreeMap::new();
        for (j, w) in wants.iter_mut().enumerate() {
            let piece = if w.k == 0 { w.len } else { cairn_core::erasure::shard_len(w.len as u64, w.k as u32) as usize } as u64;
            for i in w.asks(&failed) {
                let batches = asks.entry(w.slots[i].0).or_default();
                let fits = batches.last().is_some_and(|b| b.len() < MAX_REBUILD && (b.len() as u64 + 1) * piece <= max.max(piece));
                if !fits {
                    batches.push(Vec::new());
                }
                batches.last_mut().expect("pushed").push((j, i));
            }
        }
        if asks.is_empty() {
            break;
        }
        let mut calls = tokio::task::JoinSet::new();
        for (srv, batches) in asks {
            for items in batches {
                let want = items.iter().map(|&(j, i)| (step, wants[j].obj.id, wants[j].slots[i].1)).collect();
                let (state, dataset) = (state.clone(), dataset.to_string());
                calls.spawn(async move { (srv, items, crate::rebuild::fetch_pieces(&state, srv, dataset, want).await) });
            }
        }
        while let Some(done) = calls.join_next().await {
            let Ok((srv, items, r)) = done else { continue };
            let Ok(found) = r else {
                failed.insert(srv);
                continue;
            };
            answered.insert(srv);
            for ((j, i), piece) in items.into_iter().zip(found) {
                wants[j].got[i] = piece.map(|(_, bytes)| bytes);
            }
        }
    }
    let down = state.view()?.down.clone();
    let what = |o: &ObjectRef| format!("object {:#x} of step {step} of '{dataset}'", o.id);
    let mut out = Vec::with_capacity(wants.len());
    for w in &mut wants {
        if w.complete() {
            out.push(w.finish(&what(w.obj))?);
            continue;
        }
        let holders: BTreeSet<u32> = w.slots.iter().map(|s| s.0).filter(|s| *s != state.id).collect();
        let msg = format!(
            "{} could not be gathered: {} of the {} pieces it needs came from its holders {:?}",
            what(w.obj),
            w.have(),
            w.k.max(1),
            w.slots.iter().map(|s| s.0).collect::<Vec<_>>()
        );
        let moved = w
            .slots
            .iter()
            .enumerate()
            .any(|(i, (s, _))| w.got[i].is_none() && (*s == state.id || (answered.contains(s) && w.asked.contains(&i))));
        return Err(if holders.iter().all(|s| down.contains(s)) && !moved {
            Error::DataLoss(format!("{msg}, all declared down: it is lost, and this step is never drained"))
        } else if moved {
            // The caller reads the step's index again.
            Error::NotFound(format!("{msg}: not where the index says (moved, or released)"))
        } else {
            Error::Unavailable(format!("{msg}; the drain tries again"))
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use cairn_core::Region;

    fn obj(redundancy: Redundancy) -> ObjectRef {
        ObjectRef { id: 7, region: Region::new(vec![0], vec![100]).unwrap(), server: 1, checksum: 0, redundancy }
    }

    #[test]
    fn a_copy_needs_one_holder_and_a_stripe_k_data_shards_first() {
        let none = BTreeSet::new();
        let copies = obj(Redundancy::Replicated { servers: vec![1, 2] });
        let mut w = Want::new(&copies, 8);
        assert_eq!((w.len, w.k), (800, 0));
        assert_eq!(w.asks(&BTreeSet::from([1])), vec![1], "the next copy when the first holder failed");
        assert_eq!(w.asks(&none), vec![0]);
        assert!(w.asks(&none).is_empty(), "every holder asked");
        let stripe = obj(Redundancy::Encoded { k: 3, m: 2, shards: vec![10, 11, 12, 13, 14] });
        let mut w = Want::new(&stripe, 8);
        assert_eq!(w.slots[4], (14, 5), "shard i is piece i + 1");
        assert_eq!(w.asks(&none), vec![0, 1, 2], "data shards first");
        w.got[0] = Some(vec![0]);
        w.got[2] = Some(vec![0]);
        assert_eq!(w.asks(&none), vec![3], "one more for the shard that did not come");
        assert_eq!(w.asks(&BTreeSet::from([14])), Vec::<usize>::new());
    }

    #[test]
    fn gathered_objects_are_decoded_and_checked() {
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
        let code = Code::new(3, 2).unwrap();
        let mut shards: Vec<Option<Vec<u8>>> = (0..3).map(|i| Some(cairn_core::erasure::data_shard(&data, 3, i))).collect();
        shards.extend(code.parity(&data).into_iter().map(Some));
        let mut o = obj(Redundancy::Encoded { k: 3, m: 2, shards: vec![1, 2, 3, 4, 5] });
        o.region = Region::new(vec![0], vec![1000]).unwrap();
        o.checksum = cairn_core::checksum::crc(&data);
        let mut w = Want::new(&o, 1);
        w.got = shards.clone();
        w.got[0] = None;
        w.got[2] = None;
        assert_eq!(w.finish("o").unwrap(), data, "decoded from a data shard and both parities");
        let mut w = Want::new(&o, 1);
        w.got = shards;
        w.got[1].as_mut().unwrap()[0] ^= 1;
        w.got[0] = None;
        w.got[2] = None;
        assert_eq!(w.finish("o").unwrap_err().kind(), cairn_core::ErrorKind::Corrupt);
    }
}
