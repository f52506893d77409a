//! Objects in the store by request: storing an object or a piece of one (a copy or a shard)
//! under its header, checked against the crc32c its sender computed (what puts from clients,
//! shards an encoder cuts and pieces a rebuild decodes all end in), and the seals and drops a
//! commit sends every server holding a step's objects.

use crate::segment::Memory;
use crate::state::State;
use crate::store::{Reservation, Which};
use cairn_core::{Error, Result};
use cairn_proto::message::{ObjectPut, PeerRequest, PutItem, Request, ServerRequest};
use std::sync::Arc;

/// Stores the bytes of a put (from a client, or a piece of a committed object: then `sealed`),
/// checked against the header's crc32c, consuming the reservation of their space.
pub fn store(state: &State, h: ObjectPut, sealed: bool, data: Vec<u8>, reservation: Reservation<'_>) -> Result<()> {
    let crc = cairn_core::checksum::crc(&data);
    store_checked(state, h, sealed, Memory::Heap(data), crc, reservation)
}

/// [`store`] of bytes whose crc32c `crc` the caller computed (as they arrived).
pub fn store_checked(state: &State, h: ObjectPut, sealed: bool, data: Memory, crc: u32, reservation: Reservation<'_>) -> Result<()> {
    if !sealed {
        state.stats.put(&h.dataset, data.len() as u64);
    }
    let o = h.object;
    if crc != o.checksum {
        // Never the crc of what arrived: of bytes read from a client's memory, it would tell
        // the client something of memory it named (issue 40).
        return Err(Error::Corrupt(format!(
            "object {:#x} of '{}' arrived damaged (its crc32c is not the {:#x} the sender computed); put it again",
            o.id, o.var, o.checksum
        )));
    }
    let obj = crate::store::Object {
        var: o.var,
        region: o.region,
        elem: o.elem,
        session: h.session,
        writer: h.writer,
        checksum: crc,
        data: Arc::new(data),
        sealed,
        copy: o.copy,
        stripe: h.stripe,
    };
    state.store.insert(&h.dataset, h.step, (o.id, h.shard), obj, reservation)
}

/// The header that stores piece `shard` (0: a whole copy) of object `id` of a committed step,
/// held here as `o`, on another server or here (sealed), with `o`'s checksum and copy 0 until
/// the caller sets the piece's own.
pub fn piece_of(dataset: &str, step: u64, id: u64, o: &crate::store::Object, shard: u32) -> ObjectPut {
    ObjectPut {
        dataset: dataset.to_string(),
        step,
        session: o.session.clone(),
        writer: o.writer,
        shard,
        from: None,
        stripe: None,
        object: PutItem { var: o.var.clone(), id, region: o.region.clone(), elem: o.elem, checksum: o.checksum, copy: 0 },
    }
}

/// Applies a seal or drop to this server's store, whether it came from a client, a peer or
/// this server itself.
pub fn seal_or_drop(state: &State, req: impl Into<ServerRequest>) -> Result<()> {
    match req.into() {
        ServerRequest::Peer(PeerRequest::Seal { dataset, step, session, keys, bytes }) => {
            state.store.seal(&dataset, step, &session, &keys, bytes)
        }
        ServerRequest::Client(Request::Drop { dataset, step, session, writer, ids, except, shard }) => {
            let which = Which { session: session.as_deref(), writer, ids: &ids, except: except.as_deref(), shard };
            state.store.drop_objects(&dataset, step, &which);
            Ok(())
        }
        other => Err(Error::InvalidArgument(format!("expected a seal or drop request, got {}", other.op_name()))),
    }
}

/// Checks an object in a shared segment against its crc32c before any of it leaves the server
/// (a get's payload, encoding): the writer that filled the segment may still map it and could
/// have changed it after its put. Memory of this server's own was checked as it arrived.
pub fn intact(data: &Memory, checksum: u32, what: impl FnOnce() -> String) -> Result<()> {
    if let Memory::Shared(seg) = data {
        if cairn_core::checksum::crc(data) != checksum {
            return Err(Error::Corrupt(format!(
                "{} changed in its shared segment after it was put; what changed it, as far as this server knows: {}. It is \
                 not served: read it from another copy, or write the step again",
                what(),
                seg.writer()
            )));
        }
    }
    Ok(())
}
