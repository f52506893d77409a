//! The bounds the families' checks share: keys, claimer ids, runs of client memory, batches,
//! rebuild pieces. Pure, so the fuzz target runs them on arbitrary input
//! (`fuzz/fuzz_targets/request_decode.rs`, through [`super::check`]).

use cairn_core::{Error, Result};
use cairn_proto::message::{RebuildPiece, MAX_CLAIMER, MAX_KEY, MAX_KEYS, MAX_RUNS};

/// Refuses a payload on a request that carries none.
pub fn no_payload(op: &str, payload_len: u64) -> Result<()> {
    if payload_len > 0 {
        return Err(Error::InvalidArgument(format!("a {op} request carries no payload, got {payload_len} bytes")));
    }
    Ok(())
}

/// A claimer id has 1 to [`MAX_CLAIMER`] bytes.
pub fn check_claimer(claimer: &str) -> Result<()> {
    if claimer.is_empty() || claimer.len() > MAX_CLAIMER {
        return Err(Error::InvalidArgument(format!("claimer id of {} bytes: give 1 to {MAX_CLAIMER}", claimer.len())));
    }
    Ok(())
}

/// At most [`MAX_KEYS`] keys, each valid.
pub fn check_keys(keys: &[String]) -> Result<()> {
    if keys.len() > MAX_KEYS {
        return Err(Error::InvalidArgument(format!("{} keys in one request; send at most {MAX_KEYS} per request", keys.len())));
    }
    keys.iter().try_for_each(|k| check_key(k))
}

/// A key has 1 to [`MAX_KEY`] bytes.
pub fn check_key(key: &str) -> Result<()> {
    if key.is_empty() || key.len() > MAX_KEY {
        return Err(Error::InvalidArgument(format!("key of {} bytes: keys must have 1 to {MAX_KEY} bytes", key.len())));
    }
    Ok(())
}

/// The bytes of a same-node request's runs of client memory: at most [`MAX_RUNS`] runs, none
/// empty or wrapping around the address space, adding up to at most what any object may have.
pub fn runs_len(runs: &[(u64, u64)]) -> Result<u64> {
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
pub fn check_batch(keys: &[String], sizes: &[u64], len: u64) -> Result<()> {
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
pub fn rebuild_piece(p: &RebuildPiece) -> Result<()> {
    let RebuildPiece { shard, k, m, stripe, sources, .. } = p;
    let n = (*k as usize).saturating_add(*m as usize);
    let copy = *shard == 0 && *k == 0 && *m == 0 && stripe.is_empty();
    // Shard 0 of a stripe: the whole object, decoded (recovery narrowing a stripe).
    let piece = *k >= 2 && *m >= 1 && n <= cairn_core::erasure::MAX_SHARDS && stripe.len() == n && *shard as usize <= n;
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
    use cairn_proto::message::{ClaimLease, ObjectPut, PeerRequest, PutItem, Request, ServerRequest, MAX_LEASE_MS, MAX_REBUILD};

    fn request(req: &Request, len: u64) -> Result<()> {
        crate::cmd::check(&ServerRequest::Client(req.clone()), len)
    }

    fn peer(req: &PeerRequest, len: u64) -> Result<()> {
        crate::cmd::check(&ServerRequest::Peer(req.clone()), len)
    }

    #[test]
    fn stripes_and_cuts_outside_a_valid_code_are_refused() {
        let encode = |k, m, n| PeerRequest::Encode { dataset: "d".into(), step: 0, id: 1, k, m, shards: vec![0; n], holders: vec![] };
        assert!(peer(&encode(4, 2, 6), 0).is_ok());
        for bad in [encode(1, 2, 3), encode(4, 0, 4), encode(4, 2, 5), encode(200, 100, 300)] {
            assert!(peer(&bad, 0).unwrap_err().to_string().contains("not a valid stripe"));
        }
        let cut = |k, shard| PeerRequest::Cut { dataset: "d".into(), step: 0, id: 1, k, shard, m: 1 };
        assert!(peer(&cut(4, 3), 0).is_ok());
        for bad in [cut(4, 4), cut(1, 0), cut(300, 2)] {
            assert!(peer(&bad, 0).unwrap_err().to_string().contains("not a shard of a valid stripe"));
        }
        assert!(peer(&cut(4, 0), 10).unwrap_err().to_string().contains("carries no payload"));
    }

    #[test]
    fn rebuilds_name_copies_or_shards_of_valid_stripes_with_sources_and_stay_bounded() {
        let piece =
            |shard, k, m, stripe: Vec<u32>, sources: Vec<u32>| RebuildPiece { step: 3, id: 7, shard, k, m, stripe, checksum: 0, sources };
        let rebuild = |pieces| PeerRequest::Rebuild { dataset: "d".into(), pieces };
        assert!(peer(&rebuild(vec![piece(0, 0, 0, vec![], vec![2]), piece(5, 3, 2, vec![0, 1, 2, 3, 4], vec![0, 1, 3])]), 0).is_ok());
        // Shard 0 of a stripe: the whole object decoded from it.
        assert!(peer(&rebuild(vec![piece(0, 3, 2, vec![0, 1, 2, 3, 4], vec![0, 1, 3])]), 0).is_ok());
        for bad in [
            piece(0, 0, 0, vec![], vec![]),
            piece(0, 3, 2, vec![], vec![1]),
            piece(6, 3, 2, vec![0, 1, 2, 3, 4], vec![0]),
            piece(1, 3, 2, vec![0, 1, 2], vec![0]),
            piece(1, 1, 2, vec![0, 1, 2], vec![0]),
            piece(1, 300, 2, vec![0; 302], vec![0]),
        ] {
            assert!(peer(&rebuild(vec![bad]), 0).unwrap_err().to_string().contains("not a piece"));
        }
        assert!(peer(&rebuild(vec![]), 0).is_err());
        assert!(peer(&rebuild(vec![piece(0, 0, 0, vec![], vec![2]); MAX_REBUILD + 1]), 0).is_err());
        let pieces = |n| PeerRequest::Pieces { dataset: "d".into(), want: vec![(0, 1, 0); n] };
        assert!(peer(&pieces(MAX_REBUILD), 0).is_ok());
        assert!(peer(&pieces(0), 0).is_err() && peer(&pieces(MAX_REBUILD + 1), 0).is_err());
        assert!(peer(&pieces(1), 8).unwrap_err().to_string().contains("carries no payload"));
    }

    #[test]
    fn claims_bound_their_ids_and_leases() {
        let claim = |claimer: &str, lease_ms| Request::Claim(ClaimLease { dataset: "d".into(), claimer: claimer.into(), lease_ms });
        assert!(request(&claim("c", 1000), 0).is_ok());
        assert!(request(&claim("", 1000), 0).unwrap_err().to_string().contains("claimer id of 0 bytes"));
        assert!(request(&claim(&"x".repeat(MAX_CLAIMER + 1), 1000), 0).is_err());
        for lease in [0, MAX_LEASE_MS + 1] {
            assert!(request(&claim("c", lease), 0).unwrap_err().to_string().contains("a lease of"));
        }
        let unclaim = Request::Unclaim(cairn_proto::message::Unclaim { dataset: "d".into(), claimer: String::new() });
        assert!(request(&unclaim, 0).is_err());
    }

    #[test]
    fn same_node_requests_bound_their_runs_and_carry_no_payload() {
        let put = |from: Option<Vec<(u64, u64)>>| {
            Request::Put(ObjectPut {
                dataset: "d".into(),
                step: 0,
                session: "s".into(),
                writer: 0,
                shard: 0,
                from,
                stripe: None,
                object: PutItem {
                    var: "v".into(),
                    id: 1,
                    region: cairn_core::Region::new(vec![0], vec![4]).unwrap(),
                    elem: 8,
                    checksum: 0,
                    copy: 0,
                },
            })
        };
        assert!(request(&put(Some(vec![(4096, 16), (8192, 16)])), 0).is_ok());
        assert!(request(&put(Some(vec![(4096, 16), (8192, 16)])), 32).unwrap_err().to_string().contains("no payload"));
        assert!(request(&put(Some(vec![(4096, 16)])), 0).unwrap_err().to_string().contains("does not match its box"));
        for bad in [vec![], vec![(4096, 0), (0, 32)], vec![(u64::MAX - 8, 32)], vec![(1, 1); MAX_RUNS + 1]] {
            assert!(request(&put(Some(bad)), 0).is_err());
        }
        // Neither a probe of client memory nor a get into it is a request any more (issue 52):
        // a frame naming them does not decode.
        for op in [r#"{"op":"attach","addr":4096,"len":64,"checksum":0}"#, r#"{"op":"nonsense"}"#] {
            assert!(serde_json::from_str::<Request>(op).is_err(), "{op}");
        }
        // An old get naming client memory at most reads as a plain get (its answer a payload).
        let get = r#"{"op":"get","dataset":"d","step":0,"id":1,"want":{"offset":[0],"count":[4]},"into":[[4096,32]]}"#;
        let decoded = serde_json::to_string(&serde_json::from_str::<Request>(get).unwrap()).unwrap();
        assert!(!decoded.contains("into") && !decoded.contains("4096"), "{decoded}");
    }
}
