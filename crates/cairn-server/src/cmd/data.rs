//! Objects in and out, the data plane alone: put (payload read straight into the object's
//! buffer after its space is reserved, or copied from a same-node client's memory, or its leased
//! segment kept), get (a whole object shared without copying, or a sub-box cut out of it), drop.

use super::check::{no_payload, runs_len};
use crate::cma::Peer;
use crate::local::Local;
use crate::objects::{seal_or_drop, store, store_checked};
use crate::reply::{discard, Payload, Reply};
use crate::segment::Memory;
use crate::state::State;
use cairn_core::assemble::{copy_box, Layout};
use cairn_core::erasure::MAX_SHARDS;
use cairn_core::{Error, Region, Result};
use cairn_proto::frame::Prefix;
use cairn_proto::message::{Geometry, ObjectPut, PutItem, Request, Response, MAX_PUT_MANY, MAX_UNMAPPED};
use tokio::io::{AsyncRead, AsyncReadExt};

/// Checks a data request whose frame announced `payload_len` payload bytes.
pub fn check(req: &Request, payload_len: u64) -> Result<()> {
    match req {
        Request::Put(ObjectPut { shard, from, stripe, object: PutItem { id, region, elem, .. }, .. }) => {
            // A same-node put names the bytes in the client's memory instead of sending them.
            let len = match from {
                Some(runs) if payload_len == 0 => runs_len(runs)?,
                Some(_) => return Err(Error::InvalidArgument("a same-node put names client memory and carries no payload".into())),
                None => payload_len,
            };
            piece_fits(*id, region, *elem, *shard, len)?;
            stripe_fits(*id, *shard, stripe.as_ref(), Some(len))
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
        other => {
            no_payload(&other.op_name(), payload_len)?;
            match other {
                Request::Get { map: Some(unmapped), .. } if unmapped.len() > MAX_UNMAPPED => {
                    Err(Error::InvalidArgument(format!("a get reports {} segments unmapped; at most {MAX_UNMAPPED}", unmapped.len())))
                }
                Request::Get { id, shard, stripe, .. } => stripe_fits(*id, *shard, stripe.as_ref(), None),
                Request::Lease { sizes, release } if sizes.len() > MAX_PUT_MANY || release.len() > MAX_PUT_MANY || sizes.contains(&0) => {
                    Err(Error::InvalidArgument(format!(
                        "a lease of {} segments (giving back {}): ask for 0 to {MAX_PUT_MANY}, each of at least one byte",
                        sizes.len(),
                        release.len()
                    )))
                }
                _ => Ok(()),
            }
        }
    }
}

/// A piece of `len` bytes fits object `id`'s box: a whole copy is exactly its bytes, a shard at
/// most its object's bytes (at least 1: an empty object's shards).
pub fn piece_fits(id: u64, region: &Region, elem: u32, shard: u32, len: u64) -> Result<()> {
    let fits = |want: u64| if shard == 0 { want == len } else { len >= 1 && len <= want.max(1) };
    region.volume().checked_mul(u64::from(elem)).filter(|want| fits(*want) && elem > 0).map(|_| ()).ok_or_else(|| {
        Error::InvalidArgument(format!(
            "object {id:#x} (shard {shard}): payload of {len} bytes does not match its box {:?} of {elem}-byte elements",
            region.count
        ))
    })
}

/// A shard's stripe geometry, where one is named, is a stripe this shard belongs to: at least
/// one data shard, at most [`MAX_SHARDS`] in all, and pieces of the length the payload has.
pub fn stripe_fits(id: u64, shard: u32, stripe: Option<&Geometry>, len: Option<u64>) -> Result<()> {
    let Some(g) = stripe else { return Ok(()) };
    let total = u64::from(g.k) + u64::from(g.m);
    if shard == 0 || g.k == 0 || total > MAX_SHARDS as u64 || u64::from(shard) > total || len.is_some_and(|n| n != g.len) {
        return Err(Error::InvalidArgument(format!(
            "object {id:#x} shard {shard}: a stripe of {}+{} shards of {} bytes{} does not hold it",
            g.k,
            g.m,
            g.len,
            len.map(|n| format!(" (the piece has {n})")).unwrap_or_default()
        )));
    }
    Ok(())
}

/// Runs a checked data request.
pub async fn apply<S: AsyncRead + Unpin>(
    state: &State,
    req: Request,
    p: Prefix,
    stream: &mut S,
    local: &mut Option<Local>,
) -> Result<Reply> {
    let bound = local.as_ref().map(Local::peer).transpose();
    let plain = |r: Result<Response>| r.map(Reply::Plain);
    if matches!(req, Request::Put(ObjectPut { .. }) | Request::PutMany { .. } | Request::Get { .. }) {
        super::guard::require_member(state, stream, p.payload_len).await?;
    }
    match req {
        Request::Put(mut h) => match h.from.take() {
            Some(runs) => plain(put_local(state, bound?, &runs, h)),
            None => plain(put(state, stream, p.payload_len, h, false).await),
        },
        Request::PutMany { dataset, step, session, writer, objects, from, leases } => {
            let headers = objects
                .into_iter()
                .map(|object| ObjectPut {
                    dataset: dataset.clone(),
                    step,
                    session: session.clone(),
                    writer,
                    shard: 0,
                    from: None,
                    stripe: None,
                    object,
                })
                .collect();
            match (from, leases) {
                (_, Some(ids)) => plain(put_leased(state, local.as_mut(), &ids, headers)),
                (Some(runs), None) => plain(put_many_local(state, bound?, &runs, headers)),
                (None, None) => plain(put_many(state, stream, p.payload_len, headers).await),
            }
        }
        Request::Lease { sizes, release } => {
            let local = local.as_mut().ok_or_else(crate::cma::not_local)?;
            plain(local.lease(&sizes, &release).map(|leases| Response::Leased { pid: std::process::id(), leases }))
        }
        // Gets answer with a payload, or a same-node reader's with a mapping of the segment:
        // a server never writes into a client's memory.
        Request::Get { dataset, step, id, want, shard: 0, map: Some(unmapped), .. } if local.is_some() => {
            get_mapped(state, local.as_mut().expect("checked"), &dataset, step, id, &want, &unmapped)
        }
        Request::Get { dataset, step, id, want, shard, stripe, .. } => {
            if shard > 0 {
                same_stripe(state, &dataset, step, (id, shard), stripe)?;
            }
            get(state, &dataset, step, (id, shard), &want)
        }
        req @ Request::Drop { .. } => plain(seal_or_drop(state, req).map(|_| Response::Ok)),
        other => Err(super::guard::misrouted("data", &other.op_name())),
    }
}

// A payload that stalls fails the read by the connection's deadline (`Deadline`): the
// reservation is dropped with it, so a stalled upload cannot hold space.

/// Stores one object (checked by [`super::check`]). On a refusal the payload is read and discarded so the connection stays usable.
pub async fn put<S: AsyncRead + Unpin>(state: &State, stream: &mut S, len: u64, h: ObjectPut, sealed: bool) -> Result<Response> {
    // A writer's object leaves room for older steps other writers still owe; a committed
    // step's piece (encoding, recovery) does not need to.
    let reserved =
        if sealed { state.store.reserve_buffer(len as usize) } else { state.store.reserve_buffer_for(&h.dataset, h.step, len as usize) };
    let (reservation, mut data) = match reserved {
        Ok(r) => r,
        Err(e) => {
            discard(stream, len).await?;
            return Err(e);
        }
    };
    // Checksummed a piece at a time as it arrives, while the piece is in the cache (as
    // `cma::read` does), instead of in a second pass over the whole object's memory.
    let mut crc = 0u32;
    for piece in data.chunks_mut(crate::cma::CHUNK) {
        stream.read_exact(piece).await.map_err(|e| Error::io("reading an object payload", e))?;
        crc = cairn_core::checksum::crc_append(crc, piece);
    }
    store_checked(state, h, sealed, Memory::Heap(data), crc, reservation)?;
    Ok(Response::Ok)
}

/// Stores one object whose bytes are runs of the local client's memory (a same-node put).
pub fn put_local(state: &State, local: Option<&Peer>, runs: &[(u64, u64)], h: ObjectPut) -> Result<Response> {
    let peer = local.ok_or_else(crate::cma::not_local)?;
    let len: u64 = runs.iter().map(|r| r.1).sum(); // bounded by check::request
    let (reservation, mut data) = state.store.reserve_buffer_for(&h.dataset, h.step, len as usize)?;
    let mut crc = 0u32;
    peer.read(runs, &mut data, &mut |piece| crc = cairn_core::checksum::crc_append(crc, piece))?;
    state.same_node_bytes.fetch_add(len, std::sync::atomic::Ordering::Relaxed);
    store_checked(state, h, false, Memory::Heap(data), crc, reservation)?;
    Ok(Response::Ok)
}

/// Stores the objects of a same-node put_many from the segments leased to the client
/// (`ids[i]` holds object `i`), which become their memory: no copy here. The checksums are the
/// writer's, computed as it filled the segments; readers verify them.
pub fn put_leased(state: &State, peer: Option<&mut Local>, ids: &[u64], headers: Vec<ObjectPut>) -> Result<Response> {
    let peer = peer.ok_or_else(crate::cma::not_local)?;
    for (i, (h, id)) in headers.into_iter().zip(ids).enumerate() {
        let len = item_len(&h);
        let stored = peer.take(*id, len).and_then(|seg| {
            state.same_node_bytes.fetch_add(len, std::sync::atomic::Ordering::Relaxed);
            let crc = h.object.checksum;
            // The lease's reservation passes to the object.
            store_checked(state, h, false, Memory::Shared(seg), crc, state.store.reserved(len))
        });
        if let Err(e) = stored {
            // The objects after it are not stored: their leases go back (the writer puts again).
            peer.lease(&[], &ids[i + 1..])?;
            return Err(e);
        }
    }
    Ok(Response::Ok)
}

/// The bytes of one object of a put_many (its box and element size were checked).
fn item_len(h: &ObjectPut) -> u64 {
    h.object.region.volume() * u64::from(h.object.elem)
}

/// Stores the objects of a put_many from its payload (`len` bytes, checked to be theirs back
/// to back), one after another as [`put`] would, read through one buffer. On a failure the rest
/// of the payload is read and discarded; the objects stored before it stay (the writer drops
/// what it put when a put fails).
pub async fn put_many<S: AsyncRead + Unpin>(state: &State, stream: &mut S, len: u64, headers: Vec<ObjectPut>) -> Result<Response> {
    let mut payload = tokio::io::BufReader::with_capacity(256 << 10, (&mut *stream).take(len));
    for h in headers {
        let n = item_len(&h);
        if let Err(e) = put(state, &mut payload, n, h, false).await {
            tokio::io::copy(&mut payload, &mut tokio::io::sink()).await.map_err(|e| Error::io("discarding a refused payload", e))?;
            return Err(e);
        }
    }
    Ok(Response::Ok)
}

/// Stores the objects of a same-node put_many, each copied from its share of `runs` (which were
/// checked to add up to their bytes).
pub fn put_many_local(state: &State, local: Option<&Peer>, runs: &[(u64, u64)], headers: Vec<ObjectPut>) -> Result<Response> {
    let shares = cut_runs(runs, headers.iter().map(item_len));
    for (h, mine) in headers.into_iter().zip(shares) {
        if mine.is_empty() {
            // An empty object: nothing to copy.
            let reservation = state.store.reserve(0)?;
            store(state, h, false, Vec::new(), reservation)?;
        } else {
            put_local(state, local, &mine, h)?;
        }
    }
    Ok(Response::Ok)
}

/// Cuts `runs` (address, length) into consecutive shares of `lens` bytes each, splitting a run
/// where a share ends inside it.
fn cut_runs(runs: &[(u64, u64)], lens: impl Iterator<Item = u64>) -> Vec<Vec<(u64, u64)>> {
    let mut runs = runs.iter().copied();
    let mut carry: Option<(u64, u64)> = None;
    lens.map(|mut want| {
        let mut mine = Vec::new();
        while want > 0 {
            let Some((addr, n)) = carry.take().or_else(|| runs.next()) else { break };
            let take = n.min(want);
            mine.push((addr, take));
            if take < n {
                carry = Some((addr + take, n - take));
            }
            want -= take;
        }
        mine
    })
    .collect()
}

/// A same-node reader's get of a whole copy: [`Response::Mapped`] when the object lies in a
/// segment of the reader's user (with the segment's read-only descriptor the first time), else
/// its bytes as [`get`] answers. The reader checks what it copies out against the committed
/// crc32c, so what the server does not send, it need not check.
fn get_mapped(state: &State, local: &mut Local, dataset: &str, step: u64, id: u64, want: &Region, unmapped: &[u64]) -> Result<Reply> {
    local.unmapped(unmapped);
    let found = state.store.get(dataset, step, (id, 0))?;
    if let Memory::Shared(seg) = &*found.0 {
        if let Some(fd) = local.mapping(seg)? {
            state.mapped_gets.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let r = Response::Mapped { segment: seg.id(), len: seg.len() as u64, fd: fd.is_some() };
            return Ok(match fd {
                Some(fd) => Reply::WithFd(r, fd),
                None => Reply::Plain(r),
            });
        }
    }
    payload(found, dataset, step, (id, 0), want)
}

/// A shard is served only to a get naming its stripe's geometry: a stripe encoded again under
/// the same keys (narrower after a loss, wider after `cluster add`) is another stripe, and its
/// pieces are `NotFound` to a reader of the old one, who reads the step's index again. A get
/// that names none (an older client) is served a shard of the length its own geometry implies.
fn same_stripe(state: &State, dataset: &str, step: u64, key: crate::store::ObjKey, want: Option<Geometry>) -> Result<()> {
    let Some(want) = want else { return Ok(()) };
    // A shard stored without its geometry (an older server's) is judged by its length alone.
    let held = state.store.with(dataset, step, key, |o| o.stripe.unwrap_or(Geometry { len: o.data.len() as u64, ..want }))?;
    if held == want {
        return Ok(());
    }
    let (id, shard) = key;
    Err(Error::NotFound(format!(
        "shard {} of object {id:#x} of '{dataset}' step {step} on server {} was encoded again: it is a piece of a {}+{} stripe \
         of {}-byte shards here, the reader's index names {}+{} of {} bytes; read the step's index again",
        shard - 1,
        state.id,
        held.k,
        held.m,
        held.len,
        want.k,
        want.m,
        want.len
    )))
}

/// Returns the box `want` of an object's copy, or a whole shard.
pub fn get(state: &State, dataset: &str, step: u64, key: crate::store::ObjKey, want: &Region) -> Result<Reply> {
    payload(state.store.get(dataset, step, key)?, dataset, step, key, want)
}

/// The reply to a get of `want` of the object `found` ([`crate::store::Store::get`]'s answer).
/// An object in a shared segment is checked against its crc32c first: its writer may still map
/// the segment, and no byte leaves the server that does not match what was committed.
fn payload(
    found: (std::sync::Arc<Memory>, Region, u32, u32),
    dataset: &str,
    step: u64,
    key: crate::store::ObjKey,
    want: &Region,
) -> Result<Reply> {
    Region::new(want.offset.clone(), want.count.clone())?;
    let (data, region, elem, checksum) = found;
    let id = key.0;
    crate::objects::intact(&data, checksum, || format!("object {id:#x} of '{dataset}' step {step}"))?;
    if want == &region || key.1 > 0 {
        return Ok(Reply::WithPayload(Response::Data { checksum }, Payload::Shared(data)));
    }
    if want.ndim() != region.ndim() || want.intersect(&region).as_ref() != Some(want) {
        return Err(Error::InvalidArgument(format!(
            "box {:?}+{:?} is not inside object {id:#x} ({:?}+{:?})",
            want.offset, want.count, region.offset, region.count
        )));
    }
    let mut out = vec![0u8; (want.volume() * u64::from(elem)) as usize];
    copy_box(&data, Layout { layout: &region, base: 0 }, &mut out, Layout { layout: want, base: 0 }, want, elem as usize);
    let checksum = cairn_core::checksum::crc(&out);
    Ok(Reply::WithPayload(Response::Data { checksum }, Payload::Owned(out)))
}

#[cfg(test)]
mod tests {
    use super::cut_runs;

    #[test]
    fn runs_are_cut_into_each_objects_share() {
        let runs = [(100, 10), (200, 4), (300, 6)];
        let shares = cut_runs(&runs, [4, 0, 10, 6].into_iter());
        assert_eq!(shares, vec![vec![(100, 4)], vec![], vec![(104, 6), (200, 4)], vec![(300, 6)]]);
        // Runs that fall short leave the last share short (the checks refuse that before).
        assert_eq!(cut_runs(&[(0, 3)], [2, 2].into_iter()), vec![vec![(0, 2)], vec![(2, 1)]]);
    }
}
