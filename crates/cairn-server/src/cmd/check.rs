//! Checks of a request that need no server state: every length, size and shape is consistent
//! before anything is reserved, locked or allocated. Pure, so the fuzz target runs it on
//! arbitrary input (`fuzz/fuzz_targets/request_decode.rs`).

use cairn_core::{Error, Result};
use cairn_proto::message::{
    RebuildPiece, Request, MAX_ATTACH_PROBE, MAX_CAS_VALUE, MAX_CLAIMER, MAX_CONSUME, MAX_KEY, MAX_KEYS, MAX_LEASE_MS, MAX_PUT_MANY,
    MAX_RAFT_PAYLOAD, MAX_REBUILD, MAX_RUNS,
};

/// Checks `req`, whose frame announced `payload_len` payload bytes.
pub fn request(req: &Request, payload_len: u64) -> Result<()> {
    if matches!(req, Request::Raft { .. }) && payload_len > MAX_RAFT_PAYLOAD {
        return Err(Error::InvalidArgument(format!("a raft message of {payload_len} bytes exceeds {MAX_RAFT_PAYLOAD}")));
    }
    if payload_len > 0
        && !matches!(
            req,
            Request::Put { .. } | Request::PutMany { .. } | Request::KvPut { .. } | Request::Raft { .. } | Request::MetaCas { .. }
        )
    {
        return Err(Error::InvalidArgument(format!("a {} request carries no payload, got {payload_len} bytes", req.op_name())));
    }
    match req {
        Request::Put { id, region, elem, shard, from, .. } => {
            // A same-node put names the bytes in the client's memory instead of sending them.
            let len = match from {
                Some(runs) if payload_len == 0 => runs_len(runs)?,
                Some(_) => return Err(Error::InvalidArgument("a same-node put names client memory and carries no payload".into())),
                None => payload_len,
            };
            // A shard is at most its object's bytes (at least 1: an empty object's shards).
            let fits = |want: u64| if *shard == 0 { want == len } else { len >= 1 && len <= want.max(1) };
            region.volume().checked_mul(u64::from(*elem)).filter(|want| fits(*want) && *elem > 0).map(|_| ()).ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "object {id:#x} (shard {shard}): payload of {len} bytes does not match its box {:?} of {elem}-byte elements",
                    region.count
                ))
            })
        }
        Request::PutMany { objects, from, leases, .. } => {
            if objects.is_empty() || objects.len() > MAX_PUT_MANY {
                return Err(Error::InvalidArgument(format!("a put_many of {} objects: send 1 to {MAX_PUT_MANY}", objects.len())));
            }
            let total = objects.iter().try_fold(0u64, |total, o| {
                o.region.volume().checked_mul(u64::from(o.elem)).filter(|_| o.elem > 0).and_then(|n| total.checked_add(n))
            });
            if let Some(leases) = leases {
                // Each object's size is checked against its lease's when it is taken.
                return if leases.len() != objects.len() || from.is_some() || payload_len > 0 || total.is_none() {
                    Err(Error::InvalidArgument(format!(
                        "a put_many into leases names one lease per object ({} for {}), and neither client memory nor a payload",
                        leases.len(),
                        objects.len()
                    )))
                } else {
                    Ok(())
                };
            }
            let len = match from {
                Some(runs) if payload_len == 0 => runs_len(runs)?,
                Some(_) => return Err(Error::InvalidArgument("a same-node put_many names client memory and carries no payload".into())),
                None => payload_len,
            };
            if total != Some(len) {
                return Err(Error::InvalidArgument(format!(
                    "a put_many whose objects' boxes add up to {total:?} bytes carries {len}: each object's bytes must follow in order"
                )));
            }
            Ok(())
        }
        Request::Lease { sizes, release } => {
            if sizes.len() > MAX_PUT_MANY || release.len() > MAX_PUT_MANY || sizes.contains(&0) {
                return Err(Error::InvalidArgument(format!(
                    "a lease of {} segments (giving back {}): ask for 0 to {MAX_PUT_MANY}, each of at least one byte",
                    sizes.len(),
                    release.len()
                )));
            }
            Ok(())
        }
        Request::Get { into: Some(runs), .. } => runs_len(runs).map(|_| ()),
        Request::Attach { len, .. } if *len == 0 || *len > MAX_ATTACH_PROBE => {
            Err(Error::InvalidArgument(format!("a same-node probe of {len} bytes: give 1 to {MAX_ATTACH_PROBE}")))
        }
        Request::Encode { k, m, shards, .. } => {
            if *k < 2
                || *m == 0
                || shards.len() != (*k as usize).saturating_add(*m as usize)
                || shards.len() > cairn_core::erasure::MAX_SHARDS
            {
                return Err(Error::InvalidArgument(format!("encode into {k}+{m} shards on {} servers: not a valid stripe", shards.len())));
            }
            Ok(())
        }
        Request::Cut { k, shard, .. } => {
            if *k < 2 || *shard >= *k || *k as usize > cairn_core::erasure::MAX_SHARDS {
                return Err(Error::InvalidArgument(format!("cut data shard {shard} of {k}: not a shard of a valid stripe")));
            }
            Ok(())
        }
        Request::Rebuild { pieces, .. } => {
            if pieces.is_empty() || pieces.len() > MAX_REBUILD {
                return Err(Error::InvalidArgument(format!("{} pieces in one rebuild; send 1 to {MAX_REBUILD}", pieces.len())));
            }
            pieces.iter().try_for_each(rebuild_piece)
        }
        Request::Pieces { want, .. } if want.is_empty() || want.len() > MAX_REBUILD => {
            Err(Error::InvalidArgument(format!("{} pieces asked for at once; ask for 1 to {MAX_REBUILD}", want.len())))
        }
        Request::Touch { ids, .. } if ids.len() > MAX_KEYS => {
            Err(Error::InvalidArgument(format!("{} object ids in one touch; send at most {MAX_KEYS}", ids.len())))
        }
        Request::EndStep { fragment, .. } => {
            if fragment.consume.len() > MAX_CONSUME || fragment.consume.iter().any(|d| d.is_empty() || d.len() > MAX_KEY) {
                return Err(Error::InvalidArgument(format!(
                    "a step may consume at most {MAX_CONSUME} datasets, each named by 1 to {MAX_KEY} bytes"
                )));
            }
            fragment.validate()
        }
        Request::Claim { claimer, lease_ms, .. } | Request::Renew { claimer, lease_ms, .. } => {
            check_claimer(claimer)?;
            if *lease_ms == 0 || *lease_ms > MAX_LEASE_MS {
                return Err(Error::InvalidArgument(format!("a lease of {lease_ms} ms: give 1 ms to {MAX_LEASE_MS} ms (a day)")));
            }
            Ok(())
        }
        Request::Unclaim { claimer, .. } => check_claimer(claimer),
        Request::KvPut { keys, sizes, .. } => check_batch(keys, sizes, payload_len),
        Request::KvGet { keys, .. } | Request::KvDelete { keys, .. } => check_keys(keys),
        Request::SetView { view } | Request::ViewChanged { view } => view.validate(),
        Request::MetaCas { key, delete, call, .. } => {
            check_key(key)?;
            // Call ids are kept by the control plane (4096 of them): short ones only.
            if call.as_ref().is_some_and(|o| o.is_empty() || o.len() > 64) {
                return Err(Error::InvalidArgument("a compare-and-set call id must have 1 to 64 bytes".into()));
            }
            if payload_len > MAX_CAS_VALUE || (*delete && payload_len > 0) {
                return Err(Error::InvalidArgument(format!(
                    "a compare-and-set value of {payload_len} bytes: at most {MAX_CAS_VALUE}, and none with delete; \
                     keep bulk values in kv_put"
                )));
            }
            Ok(())
        }
        Request::MetaGet { key } => check_key(key),
        Request::AbortStep { reason, .. } if reason.len() > cairn_proto::message::MAX_REASON => Err(Error::InvalidArgument(format!(
            "an abort's reason of {} bytes: at most {}",
            reason.len(),
            cairn_proto::message::MAX_REASON
        ))),
        _ => Ok(()),
    }
}

fn check_claimer(claimer: &str) -> Result<()> {
    if claimer.is_empty() || claimer.len() > MAX_CLAIMER {
        return Err(Error::InvalidArgument(format!("claimer id of {} bytes: give 1 to {MAX_CLAIMER}", claimer.len())));
    }
    Ok(())
}

fn check_keys(keys: &[String]) -> Result<()> {
    if keys.len() > MAX_KEYS {
        return Err(Error::InvalidArgument(format!("{} keys in one request; send at most {MAX_KEYS} per request", keys.len())));
    }
    keys.iter().try_for_each(|k| check_key(k))
}

fn check_key(key: &str) -> Result<()> {
    if key.is_empty() || key.len() > MAX_KEY {
        return Err(Error::InvalidArgument(format!("key of {} bytes: keys must have 1 to {MAX_KEY} bytes", key.len())));
    }
    Ok(())
}

/// The bytes of a same-node request's runs of client memory: at most [`MAX_RUNS`] runs, none
/// empty or wrapping around the address space, adding up to at most what any object may have.
fn runs_len(runs: &[(u64, u64)]) -> Result<u64> {
    if runs.is_empty() || runs.len() > MAX_RUNS {
        return Err(Error::InvalidArgument(format!("{} runs of client memory: name 1 to {MAX_RUNS}", runs.len())));
    }
    let total = runs.iter().try_fold(0u64, |a, &(addr, n)| addr.checked_add(n).filter(|_| n > 0).and_then(|_| a.checked_add(n)));
    total.filter(|t| *t <= MAX_LOCAL_OBJECT).ok_or_else(|| {
        Error::InvalidArgument("runs of client memory that are empty, wrap around or exceed an object's largest size".into())
    })
}

/// Largest object a same-node request may name (the frame payload bound applies to the rest).
const MAX_LOCAL_OBJECT: u64 = 1 << 40;

/// A batch's keys are valid, and its sizes match the keys and add up to the payload.
fn check_batch(keys: &[String], sizes: &[u64], len: u64) -> Result<()> {
    check_keys(keys)?;
    let total = sizes.iter().try_fold(0u64, |a, &n| a.checked_add(n));
    if keys.len() != sizes.len() || total != Some(len) {
        return Err(Error::InvalidArgument(format!(
            "kv_put of {} keys with {} sizes adding up to {total:?} bytes, but a payload of {len} bytes; \
             send one size per key, adding up to the payload",
            keys.len(),
            sizes.len()
        )));
    }
    Ok(())
}

/// A piece to rebuild is a whole copy, or one shard of a valid stripe, with somewhere to fetch
/// it from.
fn rebuild_piece(p: &RebuildPiece) -> Result<()> {
    let RebuildPiece { shard, k, m, stripe, sources, .. } = p;
    let n = (*k as usize).saturating_add(*m as usize);
    let copy = *shard == 0 && *k == 0 && *m == 0 && stripe.is_empty();
    let piece = *shard >= 1 && *k >= 2 && *m >= 1 && n <= cairn_core::erasure::MAX_SHARDS && stripe.len() == n && *shard as usize <= n;
    if !(copy || piece) || sources.is_empty() || sources.len() > cairn_core::erasure::MAX_SHARDS {
        return Err(Error::InvalidArgument(format!(
            "rebuild piece {shard} of a {k}+{m} stripe on {} servers from {} sources: not a piece",
            stripe.len(),
            sources.len()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stripes_and_cuts_outside_a_valid_code_are_refused() {
        let encode = |k, m, n| Request::Encode { dataset: "d".into(), step: 0, id: 1, k, m, shards: vec![0; n], holders: vec![] };
        assert!(request(&encode(4, 2, 6), 0).is_ok());
        for bad in [encode(1, 2, 3), encode(4, 0, 4), encode(4, 2, 5), encode(200, 100, 300)] {
            assert!(request(&bad, 0).unwrap_err().to_string().contains("not a valid stripe"));
        }
        let cut = |k, shard| Request::Cut { dataset: "d".into(), step: 0, id: 1, k, shard };
        assert!(request(&cut(4, 3), 0).is_ok());
        for bad in [cut(4, 4), cut(1, 0), cut(300, 2)] {
            assert!(request(&bad, 0).unwrap_err().to_string().contains("not a shard of a valid stripe"));
        }
        assert!(request(&cut(4, 0), 10).unwrap_err().to_string().contains("carries no payload"));
    }

    #[test]
    fn rebuilds_name_copies_or_shards_of_valid_stripes_with_sources_and_stay_bounded() {
        let piece =
            |shard, k, m, stripe: Vec<u32>, sources: Vec<u32>| RebuildPiece { step: 3, id: 7, shard, k, m, stripe, checksum: 0, sources };
        let rebuild = |pieces| Request::Rebuild { dataset: "d".into(), pieces };
        assert!(request(&rebuild(vec![piece(0, 0, 0, vec![], vec![2]), piece(5, 3, 2, vec![0, 1, 2, 3, 4], vec![0, 1, 3])]), 0).is_ok());
        for bad in [
            piece(0, 0, 0, vec![], vec![]),
            piece(0, 3, 2, vec![], vec![1]),
            piece(6, 3, 2, vec![0, 1, 2, 3, 4], vec![0]),
            piece(1, 3, 2, vec![0, 1, 2], vec![0]),
            piece(1, 1, 2, vec![0, 1, 2], vec![0]),
            piece(1, 300, 2, vec![0; 302], vec![0]),
        ] {
            assert!(request(&rebuild(vec![bad]), 0).unwrap_err().to_string().contains("not a piece"));
        }
        assert!(request(&rebuild(vec![]), 0).is_err());
        assert!(request(&rebuild(vec![piece(0, 0, 0, vec![], vec![2]); MAX_REBUILD + 1]), 0).is_err());
        let pieces = |n| Request::Pieces { dataset: "d".into(), want: vec![(0, 1, 0); n] };
        assert!(request(&pieces(MAX_REBUILD), 0).is_ok());
        assert!(request(&pieces(0), 0).is_err() && request(&pieces(MAX_REBUILD + 1), 0).is_err());
        assert!(request(&pieces(1), 8).unwrap_err().to_string().contains("carries no payload"));
    }

    #[test]
    fn claims_bound_their_ids_and_leases() {
        let claim = |claimer: &str, lease_ms| Request::Claim { dataset: "d".into(), claimer: claimer.into(), lease_ms };
        assert!(request(&claim("c", 1000), 0).is_ok());
        assert!(request(&claim("", 1000), 0).unwrap_err().to_string().contains("claimer id of 0 bytes"));
        assert!(request(&claim(&"x".repeat(MAX_CLAIMER + 1), 1000), 0).is_err());
        for lease in [0, MAX_LEASE_MS + 1] {
            assert!(request(&claim("c", lease), 0).unwrap_err().to_string().contains("a lease of"));
        }
        let unclaim = Request::Unclaim { dataset: "d".into(), claimer: String::new() };
        assert!(request(&unclaim, 0).is_err());
    }

    #[test]
    fn same_node_requests_bound_their_runs_and_carry_no_payload() {
        let put = |from: Option<Vec<(u64, u64)>>| Request::Put {
            dataset: "d".into(),
            step: 0,
            session: "s".into(),
            var: "v".into(),
            id: 1,
            region: cairn_core::Region::new(vec![0], vec![4]).unwrap(),
            elem: 8,
            checksum: 0,
            copy: 0,
            writer: 0,
            shard: 0,
            sealed: false,
            from,
        };
        assert!(request(&put(Some(vec![(4096, 16), (8192, 16)])), 0).is_ok());
        assert!(request(&put(Some(vec![(4096, 16), (8192, 16)])), 32).unwrap_err().to_string().contains("no payload"));
        assert!(request(&put(Some(vec![(4096, 16)])), 0).unwrap_err().to_string().contains("does not match its box"));
        for bad in [vec![], vec![(4096, 0), (0, 32)], vec![(u64::MAX - 8, 32)], vec![(1, 1); MAX_RUNS + 1]] {
            assert!(request(&put(Some(bad)), 0).is_err());
        }
        let get = |into| Request::Get {
            dataset: "d".into(),
            step: 0,
            id: 1,
            want: cairn_core::Region::new(vec![0], vec![4]).unwrap(),
            shard: 0,
            into: Some(into),
        };
        assert!(request(&get(vec![(4096, 32)]), 0).is_ok());
        assert!(request(&get(vec![(u64::MAX, 1)]), 0).is_err());
        let attach = |len| Request::Attach { addr: 4096, len, checksum: 0 };
        assert!(request(&attach(64), 0).is_ok());
        assert!(request(&attach(0), 0).is_err() && request(&attach(MAX_ATTACH_PROBE + 1), 0).is_err());
    }
}
