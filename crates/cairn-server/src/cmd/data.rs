//! Objects in and out: put (payload read straight into the object's buffer after its space is
//! reserved), get (a whole object shared without copying, or a sub-box cut out of it).

use super::{Payload, Reply};
use crate::cma::Peer;
use crate::segment::Memory;
use crate::state::State;
use cairn_core::assemble::{copy_box, Layout};
use cairn_core::{Error, Region, Result};
use cairn_proto::message::{Request, Response};
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncReadExt};

// A payload that stalls fails the read by the connection's deadline (`Deadline`): the
// reservation is dropped with it, so a stalled upload cannot hold space.

/// The header fields of a put.
#[derive(Debug, Clone)]
pub struct PutHeader {
    /// Dataset.
    pub dataset: String,
    /// Step.
    pub step: u64,
    /// Writer session.
    pub session: String,
    /// Variable.
    pub var: String,
    /// Object id.
    pub id: u64,
    /// Its box.
    pub region: Region,
    /// Element size.
    pub elem: u32,
    /// crc32c of the payload.
    pub checksum: u32,
    /// Which copy it is.
    pub copy: u32,
    /// Writer rank.
    pub writer: u32,
    /// 0 for a whole copy, `i + 1` for shard `i`.
    pub shard: u32,
    /// Stored sealed (an encoder's shard of a committed object).
    pub sealed: bool,
}

/// Stores one object (checked by [`super::check`]). On a refusal the payload is read and discarded so the connection stays usable.
pub async fn put<S: AsyncRead + Unpin>(state: &State, stream: &mut S, len: u64, h: PutHeader) -> Result<Response> {
    let (reservation, mut data) = match state.store.reserve_buffer(len as usize) {
        Ok(r) => r,
        Err(e) => {
            crate::handler::discard(stream, len).await?;
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
    store_checked(state, h, Memory::Heap(data), crc, reservation)?;
    Ok(Response::Ok)
}

/// Stores one object whose bytes are runs of the local client's memory (a same-node put).
pub fn put_local(state: &State, local: Option<&Peer>, runs: &[(u64, u64)], h: PutHeader) -> Result<Response> {
    let peer = local.ok_or_else(crate::cma::not_local)?;
    let len: u64 = runs.iter().map(|r| r.1).sum(); // bounded by check::request
    let (reservation, mut data) = state.store.reserve_buffer(len as usize)?;
    let mut crc = 0u32;
    peer.read(runs, &mut data, &mut |piece| crc = cairn_core::checksum::crc_append(crc, piece))?;
    state.same_node_bytes.fetch_add(len, std::sync::atomic::Ordering::Relaxed);
    store_checked(state, h, Memory::Heap(data), crc, reservation)?;
    Ok(Response::Ok)
}

/// Stores the objects of a same-node put_many from the segments leased to the client
/// (`ids[i]` holds object `i`), which become their memory: no copy here. The checksums are the
/// writer's, computed as it filled the segments; readers verify them.
pub fn put_leased(state: &State, peer: Option<&mut crate::segment::Local>, ids: &[u64], headers: Vec<PutHeader>) -> Result<Response> {
    let peer = peer.ok_or_else(crate::cma::not_local)?;
    for (i, (h, id)) in headers.into_iter().zip(ids).enumerate() {
        let len = item_len(&h);
        let stored = peer.take(*id, len).and_then(|seg| {
            state.same_node_bytes.fetch_add(len, std::sync::atomic::Ordering::Relaxed);
            let crc = h.checksum;
            // The lease's reservation passes to the object.
            store_checked(state, h, Memory::Shared(seg), crc, state.store.reserved(len))
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
fn item_len(h: &PutHeader) -> u64 {
    h.region.volume() * u64::from(h.elem)
}

/// Stores the objects of a put_many from its payload (`len` bytes, checked to be theirs back
/// to back), one after another as [`put`] would, read through one buffer. On a failure the rest
/// of the payload is read and discarded; the objects stored before it stay (the writer drops
/// what it put when a put fails).
pub async fn put_many<S: AsyncRead + Unpin>(state: &State, stream: &mut S, len: u64, headers: Vec<PutHeader>) -> Result<Response> {
    let mut payload = tokio::io::BufReader::with_capacity(256 << 10, (&mut *stream).take(len));
    for h in headers {
        let n = item_len(&h);
        if let Err(e) = put(state, &mut payload, n, h).await {
            tokio::io::copy(&mut payload, &mut tokio::io::sink()).await.map_err(|e| Error::io("discarding a refused payload", e))?;
            return Err(e);
        }
    }
    Ok(Response::Ok)
}

/// Stores the objects of a same-node put_many, each copied from its share of `runs` (which were
/// checked to add up to their bytes).
pub fn put_many_local(state: &State, local: Option<&Peer>, runs: &[(u64, u64)], headers: Vec<PutHeader>) -> Result<Response> {
    let shares = cut_runs(runs, headers.iter().map(item_len));
    for (h, mine) in headers.into_iter().zip(shares) {
        if mine.is_empty() {
            // An empty object: nothing to copy.
            let reservation = state.store.reserve(0)?;
            store(state, h, Vec::new(), reservation)?;
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

/// Writes a get's reply bytes into runs of the local client's memory, which answers without a payload.
pub fn deliver_local(state: &State, local: Option<&Peer>, runs: &[(u64, u64)], reply: Reply) -> Result<Reply> {
    let peer = local.ok_or_else(crate::cma::not_local)?;
    match reply {
        Reply::WithPayload(resp, payload) => {
            peer.write(runs, payload.bytes())?;
            state.same_node_bytes.fetch_add(payload.bytes().len() as u64, std::sync::atomic::Ordering::Relaxed);
            Ok(Reply::Plain(resp))
        }
        plain => Ok(plain),
    }
}

/// Stores the bytes of a put (from a client, or a shard this server encoded), checked against
/// the header's crc32c, consuming the reservation of their space.
pub fn store(state: &State, h: PutHeader, data: Vec<u8>, reservation: crate::store::Reservation<'_>) -> Result<()> {
    let crc = cairn_core::checksum::crc(&data);
    store_checked(state, h, Memory::Heap(data), crc, reservation)
}

/// [`store`] of bytes whose crc32c `crc` the caller computed (as they arrived).
fn store_checked(state: &State, h: PutHeader, data: Memory, crc: u32, reservation: crate::store::Reservation<'_>) -> Result<()> {
    if crc != h.checksum {
        // Never the crc of what arrived: of bytes read from a client's memory, it would tell
        // the client something of memory it named (issue 40).
        return Err(Error::Corrupt(format!(
            "object {:#x} of '{}' arrived damaged (its crc32c is not the {:#x} the sender computed); put it again",
            h.id, h.var, h.checksum
        )));
    }
    let obj = crate::store::Object {
        var: h.var,
        region: h.region,
        elem: h.elem,
        session: h.session,
        writer: h.writer,
        checksum: crc,
        data: Arc::new(data),
        sealed: h.sealed,
        copy: h.copy,
    };
    state.store.insert(&h.dataset, h.step, (h.id, h.shard), obj, reservation)
}

impl PutHeader {
    /// The header that stores piece `shard` (0: a whole copy) of object `id` of a committed step,
    /// held here as `o`, on another server or here: sealed, with `o`'s checksum and copy 0 until
    /// the caller sets the piece's own.
    pub fn piece_of(dataset: &str, step: u64, id: u64, o: &crate::store::Object, shard: u32) -> PutHeader {
        PutHeader {
            dataset: dataset.to_string(),
            step,
            session: o.session.clone(),
            var: o.var.clone(),
            id,
            region: o.region.clone(),
            elem: o.elem,
            checksum: o.checksum,
            copy: 0,
            writer: o.writer,
            shard,
            sealed: true,
        }
    }

    /// The put request carrying this header (to another server).
    pub fn request(&self) -> Request {
        Request::Put {
            dataset: self.dataset.clone(),
            step: self.step,
            session: self.session.clone(),
            var: self.var.clone(),
            id: self.id,
            region: self.region.clone(),
            elem: self.elem,
            checksum: self.checksum,
            copy: self.copy,
            writer: self.writer,
            shard: self.shard,
            sealed: self.sealed,
            from: None,
        }
    }
}

/// Returns the box `want` of an object's copy, or a whole shard.
pub fn get(state: &State, dataset: &str, step: u64, key: crate::store::ObjKey, want: &Region) -> Result<Reply> {
    Region::new(want.offset.clone(), want.count.clone())?;
    let (data, region, elem, checksum) = state.store.get(dataset, step, key)?;
    let id = key.0;
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
