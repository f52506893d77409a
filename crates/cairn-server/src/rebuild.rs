//! The holders' side of recovery (the plan is the control plane's, [`crate::control::recovery`]):
//! a survivor hands out the pieces it holds (`pieces`), and the new holder of a lost piece
//! (`rebuild`) asks each survivor once per round for everything it needs from it, takes a copy
//! or decodes `k` shards, checks each object against its checksum and stores the piece.

use crate::reply::{Payload, Reply};
use crate::state::State;
use cairn_core::erasure::Code;
use cairn_core::{Error, Result};
use cairn_proto::message::{Geometry, ObjectPut, PeerRequest, PieceFailure, PieceHead, PutItem, RebuildPiece, Response};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

/// A holder's side of a rebuild: the pieces of `want` held here, back to back. A piece that
/// would take the reply past its bound is left out (the rebuilding server asks elsewhere).
pub fn pieces(state: &State, dataset: &str, want: &[(u64, u64, u32)]) -> Result<Reply> {
    let max = state.store.max_reply();
    let mut bytes = Vec::new();
    let found = want
        .iter()
        .map(|&(step, id, shard)| {
            let (data, head) = state
                .store
                .with(dataset, step, (id, shard), |o| {
                    let head = PieceHead {
                        var: o.var.clone(),
                        region: o.region.clone(),
                        elem: o.elem,
                        session: o.session.clone(),
                        writer: o.writer,
                        len: o.data.len() as u64,
                        checksum: o.checksum,
                    };
                    (o.data.clone(), head)
                })
                .ok()?;
            // A copy changed in its segment since its put is not sent (the rebuilder asks elsewhere).
            if (bytes.len() + data.len()) as u64 > max || crate::objects::intact(&data, head.checksum, String::new).is_err() {
                return None;
            }
            bytes.extend_from_slice(&data);
            Some(head)
        })
        .collect();
    Ok(Reply::WithPayload(Response::Pieces { found }, Payload::Owned(bytes)))
}

/// Asks `source` for pieces `want` ((step, id, piece) of `dataset`) within a third of the peer
/// deadline (a hung source leaves time to ask the others): per piece asked, its header and bytes
/// if the source had it whole and matching its crc32c. An error when the source did not answer.
pub async fn fetch_pieces(
    state: &State,
    source: u32,
    dataset: String,
    want: Vec<(u64, u64, u32)>,
) -> Result<Vec<Option<(PieceHead, Vec<u8>)>>> {
    let n = want.len();
    let req = PeerRequest::Pieces { dataset, want };
    let limit = state.limits.peer_timeout / 3;
    let (found, payload) = match crate::peer::fetch(state, source, &req, state.store.max_reply(), limit).await? {
        (Response::Pieces { found }, payload) if found.len() == n => (found, payload),
        (other, _) => return Err(cairn_proto::message::refused("pieces", other)),
    };
    let (mut at, mut whole) = (0usize, true);
    Ok(found
        .into_iter()
        .map(|head| {
            let head = head.filter(|_| whole)?;
            // A piece cut short leaves every one after it out of place.
            let Some(bytes) = payload.get(at..at.saturating_add(head.len as usize)) else {
                whole = false;
                return None;
            };
            at += bytes.len();
            (cairn_core::checksum::crc(bytes) == head.checksum).then(|| (head, bytes.to_vec()))
        })
        .collect())
}

/// One piece being rebuilt here: what was fetched for it so far.
struct Work {
    piece: RebuildPiece,
    /// Fetched pieces by stripe position (one slot for a copy).
    got: Vec<Option<Vec<u8>>>,
    head: Option<PieceHead>,
    /// Sources asked already.
    asked: BTreeSet<u32>,
}

impl Work {
    fn new(piece: RebuildPiece) -> Work {
        let slots = piece.stripe.len().max(1);
        Work { piece, got: vec![None; slots], head: None, asked: BTreeSet::new() }
    }

    /// The stripe position of the lost piece, when its own holder is among the sources (a
    /// retiring server hands its shard over as it is).
    fn direct(&self) -> Option<usize> {
        let lost = (self.piece.shard as usize).checked_sub(1)?;
        self.piece.sources.contains(&self.piece.stripe[lost]).then_some(lost)
    }

    /// A whole copy of an erasure-coded object, decoded from `k` of its shards (its stripe no
    /// longer fits on the live servers: recovery makes copies of it, to encode it again narrower).
    fn decodes_whole(&self) -> bool {
        self.piece.shard == 0 && self.piece.k > 0
    }

    fn complete(&self) -> bool {
        let have = self.got.iter().flatten().count();
        match self.direct() {
            Some(lost) if self.got[lost].is_some() => true,
            _ if self.piece.shard == 0 && !self.decodes_whole() => have >= 1,
            _ => have >= self.piece.k as usize,
        }
    }

    /// What to ask for next, (source, piece key there, stripe position): the piece itself from
    /// its own holder first, then sources not asked yet (and not failed) until enough are asked.
    fn asks(&mut self, failed: &BTreeSet<u32>) -> Vec<(u32, u32, usize)> {
        if self.complete() {
            return Vec::new();
        }
        let usable = |s: &u32| !self.asked.contains(s) && !failed.contains(s);
        let mut out = Vec::new();
        // The piece's own holder first; should it fail, the piece is decoded from the others.
        if let Some(lost) = self.direct().filter(|lost| usable(&self.piece.stripe[*lost])) {
            out.push((self.piece.stripe[lost], lost as u32 + 1, lost));
        } else if self.piece.shard == 0 && !self.decodes_whole() {
            out.extend(self.piece.sources.iter().find(|s| usable(s)).map(|s| (*s, 0, 0)));
        } else {
            let need = (self.piece.k as usize).saturating_sub(self.got.iter().flatten().count());
            // The stripe position not to fetch (none when the whole object is decoded).
            let lost = (self.piece.shard as usize).wrapping_sub(1);
            for &s in self.piece.sources.iter().filter(|s| usable(s)) {
                let Some(at) = self.piece.stripe.iter().position(|x| *x == s).filter(|at| *at != lost) else { continue };
                if out.len() == need {
                    break;
                }
                out.push((s, at as u32 + 1, at));
            }
        }
        self.asked.extend(out.iter().map(|a| a.0));
        out
    }

    /// The piece's bytes and the header storing it, checked against the object's checksum.
    fn finish(mut self, dataset: &str) -> Result<(ObjectPut, Vec<u8>)> {
        let p = &self.piece;
        let Some(head) = self.head.take().filter(|_| self.complete()) else {
            return Err(Error::Unavailable(format!(
                "fetched {} of the {} pieces object {:#x} needs from servers {:?}; try again once they answer",
                self.got.iter().flatten().count(),
                if p.shard == 0 && p.k == 0 { 1 } else { p.k },
                p.id,
                p.sources
            )));
        };
        let bytes = match self.direct() {
            Some(lost) if self.got[lost].is_some() => self.got[lost].take().unwrap_or_default(),
            _ if self.decodes_whole() => {
                let code = Code::new(p.k as usize, p.m as usize)?;
                let whole = code.decode(&mut self.got, (head.region.volume() * u64::from(head.elem)) as usize)?;
                if cairn_core::checksum::crc(&whole) != p.checksum {
                    return Err(Error::Corrupt(format!("object {:#x} decoded for recovery does not match its checksum", p.id)));
                }
                whole
            }
            _ if p.shard == 0 => {
                let whole = self.got[0].take().unwrap_or_default();
                if cairn_core::checksum::crc(&whole) != p.checksum {
                    return Err(Error::Corrupt(format!("the copy of object {:#x} fetched for recovery does not match its checksum", p.id)));
                }
                whole
            }
            _ => {
                let (k, m, lost) = (p.k as usize, p.m as usize, p.shard as usize - 1);
                let code = Code::new(k, m)?;
                let whole = code.decode(&mut self.got, (head.region.volume() * u64::from(head.elem)) as usize)?;
                if cairn_core::checksum::crc(&whole) != p.checksum {
                    return Err(Error::Corrupt(format!("object {:#x} decoded for recovery does not match its checksum", p.id)));
                }
                if lost < k {
                    cairn_core::erasure::data_shard(&whole, k, lost)
                } else {
                    code.parity(&whole).swap_remove(lost - k)
                }
            }
        };
        let stripe = (p.shard > 0).then(|| Geometry::of(head.region.volume() * u64::from(head.elem), p.k, p.m));
        let object = PutItem {
            var: head.var,
            id: p.id,
            region: head.region,
            elem: head.elem,
            checksum: cairn_core::checksum::crc(&bytes),
            // A whole copy is an extra copy (1); a shard is data (0) or parity (1).
            copy: if p.shard == 0 { 1 } else { u32::from(p.shard > p.k) },
        };
        let h = ObjectPut {
            dataset: dataset.to_string(),
            step: p.step,
            session: head.session,
            writer: head.writer,
            shard: p.shard,
            from: None,
            stripe,
            object,
        };
        Ok((h, bytes))
    }
}

/// The new holder's side: rebuilds `pieces` of committed objects of `dataset` here. Each
/// survivor is asked once per round for everything the pieces still need from it (a source that
/// fails is not asked again; the pieces short go to the next ones). Pieces not rebuilt are
/// answered with why; the others are stored.
pub async fn rebuild(state: &Arc<State>, dataset: &str, pieces: Vec<RebuildPiece>) -> Result<Response> {
    let mut work: Vec<Work> = pieces.into_iter().map(Work::new).collect();
    let mut failed = BTreeSet::new();
    loop {
        let mut asks: BTreeMap<u32, Vec<(usize, u32, usize)>> = BTreeMap::new();
        for (i, w) in work.iter_mut().enumerate() {
            for (source, key, at) in w.asks(&failed) {
                asks.entry(source).or_default().push((i, key, at));
            }
        }
        if asks.is_empty() {
            break;
        }
        let mut calls = tokio::task::JoinSet::new();
        for (source, items) in asks {
            let want = items.iter().map(|&(i, key, _)| (work[i].piece.step, work[i].piece.id, key)).collect();
            let (state, dataset) = (state.clone(), dataset.to_string());
            calls.spawn(async move { (source, items, fetch_pieces(&state, source, dataset, want).await) });
        }
        while let Some(done) = calls.join_next().await {
            let Ok((source, items, r)) = done else { continue };
            let Ok(found) = r else {
                failed.insert(source);
                continue;
            };
            for ((i, _, pos), piece) in items.into_iter().zip(found) {
                if let Some((head, bytes)) = piece {
                    work[i].got[pos] = Some(bytes);
                    work[i].head = Some(head);
                }
            }
        }
    }
    // Decoding is CPU work: off the runtime's threads.
    let dataset = dataset.to_string();
    let state2 = state.clone();
    tokio::task::spawn_blocking(move || {
        let failed = work
            .into_iter()
            .filter_map(|w| {
                let (step, id) = (w.piece.step, w.piece.id);
                let stored = w.finish(&dataset).and_then(|(h, bytes)| {
                    // Stored by an earlier rebuild whose record did not happen (its leader failed,
                    // or the batch failed elsewhere): the same piece again is done, not a failure.
                    let key = (h.object.id, h.shard);
                    if state2.store.with(&dataset, step, key, |o| o.sealed && o.checksum == h.object.checksum).unwrap_or(false) {
                        return Ok(());
                    }
                    let r = state2.store.reserve(bytes.len() as u64)?;
                    crate::objects::store(&state2, h, true, bytes, r)
                });
                stored.err().map(|e| PieceFailure { step, id, kind: e.kind(), message: e.to_string() })
            })
            .collect();
        Response::Rebuilt { failed }
    })
    .await
    .map_err(|e| Error::Unavailable(format!("rebuild task failed: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn piece(shard: u32, stripe: Vec<u32>, sources: Vec<u32>) -> RebuildPiece {
        let (k, m) = if stripe.is_empty() { (0, 0) } else { (3, stripe.len() as u32 - 3) };
        RebuildPiece { step: 1, id: 9, shard, k, m, stripe, checksum: 0, sources }
    }

    #[test]
    fn a_rebuild_asks_each_source_once_and_passes_over_failed_ones() {
        let none = BTreeSet::new();
        // A copy: one source at a time, in the leader's order.
        let mut w = Work::new(piece(0, vec![], vec![2, 3]));
        assert_eq!(w.asks(&none), vec![(2, 0, 0)]);
        assert_eq!(w.asks(&none), vec![(3, 0, 0)], "server 2 had nothing: the next one");
        assert_eq!(w.asks(&none), vec![], "every source asked");
        // Shard 2 (position 1) of a 3+2 stripe on 10..=14: three other shards, then one more
        // for each that did not come.
        let mut w = Work::new(piece(2, vec![10, 11, 12, 13, 14], vec![10, 12, 13, 14]));
        assert_eq!(w.asks(&none), vec![(10, 1, 0), (12, 3, 2), (13, 4, 3)]);
        w.got[0] = Some(vec![1]);
        w.got[3] = Some(vec![1]);
        assert!(!w.complete());
        assert_eq!(w.asks(&BTreeSet::from([12])), vec![(14, 5, 4)]);
        w.got[4] = Some(vec![1]);
        assert!(w.complete() && w.asks(&none).is_empty());
        // A retiring server's own shard is taken as it is; if it fails, the others decode it.
        let mut w = Work::new(piece(1, vec![10, 11, 12, 13, 14], vec![10, 11, 12, 13, 14]));
        assert_eq!(w.asks(&none), vec![(10, 1, 0)]);
        assert_eq!(w.asks(&BTreeSet::from([10])), vec![(11, 2, 1), (12, 3, 2), (13, 4, 3)]);
        let mut w = Work::new(piece(1, vec![10, 11, 12, 13, 14], vec![10]));
        w.asks(&none);
        w.got[0] = Some(vec![7]);
        assert!(w.complete());
    }

    #[test]
    fn a_whole_copy_is_decoded_from_any_k_shards_and_checked() {
        let none = BTreeSet::new();
        // Shard 0 of a 3+1 stripe whose server 11 is lost: three of the others, decoded whole.
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
        let code = Code::new(3, 1).unwrap();
        let mut shards: Vec<Vec<u8>> = (0..3).map(|i| code.shard(&data, i)).collect();
        shards.extend(code.parity(&data));
        let mut p = piece(0, vec![10, 11, 12, 13], vec![10, 12, 13]);
        p.checksum = cairn_core::checksum::crc(&data);
        let mut w = Work::new(p.clone());
        assert_eq!(w.asks(&none), vec![(10, 1, 0), (12, 3, 2), (13, 4, 3)], "every shard but the lost one's");
        for at in [0, 2, 3] {
            w.got[at] = Some(shards[at].clone());
        }
        let head = PieceHead {
            var: "u".into(),
            region: cairn_core::Region::new(vec![0], vec![1000]).unwrap(),
            elem: 1,
            session: "s".into(),
            writer: 0,
            len: 0,
            checksum: 0,
        };
        w.head = Some(head.clone());
        assert!(w.complete());
        let (h, bytes) = w.finish("d").unwrap();
        assert_eq!((bytes, h.shard, h.object.checksum), (data.clone(), 0, p.checksum));
        // A shard that lies is caught by the object's checksum, never stored.
        let mut w = Work::new(p);
        w.asks(&none);
        w.got[0] = Some(vec![0; shards[0].len()]);
        w.got[2] = Some(shards[2].clone());
        w.got[3] = Some(shards[3].clone());
        w.head = Some(head);
        assert!(w.finish("d").unwrap_err().to_string().contains("does not match its checksum"));
    }
}
