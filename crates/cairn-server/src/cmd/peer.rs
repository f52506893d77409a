//! What servers ask of each other: store a sealed piece (an encoder's shard, a rebuilt piece),
//! encode a committed object, cut a data shard from a whole copy, rebuild lost pieces and hand
//! out the pieces a rebuild needs, seal a step's objects, and install a committed view.

use super::check::{no_payload, rebuild_piece};
use crate::control::Control;
use crate::objects::seal_or_drop;
use crate::reply::Reply;
use cairn_core::erasure::MAX_SHARDS;
use cairn_core::{Error, Result};
use cairn_proto::frame::Prefix;
use cairn_proto::message::{PeerRequest, Response, MAX_REBUILD};
use std::sync::Arc;
use tokio::io::AsyncRead;

/// Checks a peer request whose frame announced `payload_len` payload bytes.
pub fn check(req: &PeerRequest, payload_len: u64) -> Result<()> {
    if let PeerRequest::Piece(p) = req {
        if p.from.is_some() {
            return Err(Error::InvalidArgument("a piece comes as the payload, not as client memory".into()));
        }
        super::data::piece_fits(p.object.id, &p.object.region, p.object.elem, p.shard, payload_len)?;
        return super::data::stripe_fits(p.object.id, p.shard, p.stripe.as_ref(), Some(payload_len));
    }
    no_payload(&req.op_name(), payload_len)?;
    match req {
        PeerRequest::Encode { k, m, shards, .. } => {
            if *k < 2 || *m == 0 || shards.len() != (*k as usize).saturating_add(*m as usize) || shards.len() > MAX_SHARDS {
                return Err(Error::InvalidArgument(format!("encode into {k}+{m} shards on {} servers: not a valid stripe", shards.len())));
            }
            Ok(())
        }
        PeerRequest::Cut { k, shard, .. } => {
            if *k < 2 || *shard >= *k || *k as usize > MAX_SHARDS {
                return Err(Error::InvalidArgument(format!("cut data shard {shard} of {k}: not a shard of a valid stripe")));
            }
            Ok(())
        }
        PeerRequest::Rebuild { pieces, .. } => {
            if pieces.is_empty() || pieces.len() > MAX_REBUILD {
                return Err(Error::InvalidArgument(format!("{} pieces in one rebuild; send 1 to {MAX_REBUILD}", pieces.len())));
            }
            pieces.iter().try_for_each(rebuild_piece)
        }
        PeerRequest::Pieces { want, .. } if want.is_empty() || want.len() > MAX_REBUILD => {
            Err(Error::InvalidArgument(format!("{} pieces asked for at once; ask for 1 to {MAX_REBUILD}", want.len())))
        }
        PeerRequest::ViewChanged { view } => view.validate(),
        PeerRequest::DrainPart { index, .. } => {
            if index.blocks.is_empty() {
                return Err(Error::InvalidArgument("a drain part of no blocks".into()));
            }
            index.validate()
        }
        _ => Ok(()),
    }
}

/// Runs a checked peer request.
pub async fn apply<S: AsyncRead + Unpin>(ctl: &Arc<Control>, req: PeerRequest, p: Prefix, stream: &mut S) -> Result<Reply> {
    let state = &ctl.state;
    if !matches!(req, PeerRequest::Seal { .. } | PeerRequest::ViewChanged { .. }) {
        super::guard::require_member(state, stream, p.payload_len).await?;
    }
    let r = match req {
        PeerRequest::Piece(h) => super::data::put(state, stream, p.payload_len, h, true).await,
        PeerRequest::Encode { dataset, step, id, k, m, shards, holders } => {
            crate::encode::encode(state, &dataset, step, id, crate::encode::Stripe { k, m, shards, holders }).await
        }
        PeerRequest::Cut { dataset, step, id, k, shard, m } => {
            crate::encode::cut(state, &dataset, step, id, (k, m), shard).map(|_| Response::Ok)
        }
        PeerRequest::Rebuild { dataset, pieces } => crate::rebuild::rebuild(state, &dataset, pieces).await,
        PeerRequest::Pieces { dataset, want } => return crate::rebuild::pieces(state, &dataset, &want),
        req @ PeerRequest::Seal { .. } => seal_or_drop(state, req).map(|_| Response::Ok),
        PeerRequest::ViewChanged { view } => ctl.views.adopt(view).map(|_| Response::Ok),
        PeerRequest::DrainPart { dataset, index } => {
            ctl.drain.part(&dataset, index).await.map(|p| Response::Part { records: p.records, bytes: p.bytes, stored: p.stored })
        }
    };
    r.map(Reply::Plain)
}
