//! Requests, one module per family, each with its own `check` (stateless: every length, size
//! and shape is consistent before anything is reserved, locked or allocated; the fuzz target runs
//! them on arbitrary input) and `apply`. Clients' requests come in six families; servers send
//! each other peer and Raft requests too, which a client's connection cannot even name.
//!
//! - [`data`]: put, get, drop and same-node leases of objects (the data plane alone).
//! - [`step`]: ends of steps, aborts, releases, and the queries of committed steps.
//! - [`claims`]: claims of committed steps (leases) and the writers' close.
//! - [`queue`]: the writers' queue limit and streaming readers' marks (backpressure).
//! - [`kv`]: keyed values and sets (the task store), and compare-and-set values in the log.
//! - [`admin`]: views, status, object listing, datasets, shutdown.
//! - [`peer`]: a server's requests to another: CoREC encoding, recovery, seals, view pushes.
//! - [`raft`]: Raft between meta servers, and joins.
//! - [`check`]: the bounds the families' checks share; [`guard`]: what their applies share.

pub mod admin;
pub mod check;
pub mod claims;
pub mod data;
pub mod guard;
pub mod kv;
pub mod peer;
pub mod queue;
pub mod raft;
pub mod step;

use crate::control::Control;
use crate::local::Local;
use crate::reply::{discard, Reply};
use cairn_core::Result;
use cairn_proto::frame::Prefix;
use cairn_proto::message::{Request, ServerRequest};
use std::sync::Arc;
use tokio::io::{AsyncRead, AsyncWrite};

/// The families of client requests.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Family {
    Data,
    Step,
    Claims,
    Queue,
    Kv,
    Admin,
}

/// The family of a client request: the one place each operation is assigned to its family.
fn family(req: &Request) -> Family {
    use Request as R;
    match req {
        R::Put { .. } | R::PutMany { .. } | R::Lease { .. } | R::Get { .. } | R::Drop { .. } => Family::Data,
        R::EndStep { .. }
        | R::AbortStep(_)
        | R::Release(_)
        | R::RemoveDataset { .. }
        | R::WaitStep { .. }
        | R::WaitDrained { .. }
        | R::StepOutcome { .. }
        | R::Steps { .. }
        | R::Index { .. }
        | R::Touch { .. } => Family::Step,
        R::Claim(_) | R::Renew(_) | R::Unclaim(_) | R::Close(_) => Family::Claims,
        R::SetQueue { .. } | R::StreamAt { .. } | R::WaitQueue { .. } => Family::Queue,
        R::KvPut { .. } | R::KvGet { .. } | R::KvDelete { .. } | R::MetaCas { .. } | R::MetaGet { .. } => Family::Kv,
        R::Hello { .. } | R::View | R::SetView(_) | R::Datasets | R::Status | R::Objects | R::Shutdown => Family::Admin,
    }
}

/// The stateless checks of a request whose frame announced `payload_len` payload bytes.
pub fn check(req: &ServerRequest, payload_len: u64) -> Result<()> {
    match req {
        ServerRequest::Client(r) => match family(r) {
            Family::Data => data::check(r, payload_len),
            Family::Step => step::check(r, payload_len),
            Family::Claims => claims::check(r, payload_len),
            Family::Queue => queue::check(r, payload_len),
            Family::Kv => kv::check(r, payload_len),
            Family::Admin => admin::check(r, payload_len),
        },
        ServerRequest::Peer(r) => peer::check(r, payload_len),
        ServerRequest::Raft(r) => raft::check(r, payload_len),
    }
}

/// Runs one request. `stream` is positioned at its payload (if any), which the request consumes
/// (a refused request's payload is read past). `local` is the client when it runs on this host
/// (for same-node copies and leases).
pub async fn dispatch<S: AsyncRead + AsyncWrite + Unpin>(
    ctl: &Arc<Control>,
    req: ServerRequest,
    p: Prefix,
    stream: &mut S,
    local: &mut Option<Local>,
) -> Result<Reply> {
    if let Err(e) = check(&req, p.payload_len) {
        discard(stream, p.payload_len).await?;
        return Err(e);
    }
    match req {
        ServerRequest::Client(r) => match family(&r) {
            Family::Data => data::apply(&ctl.state, r, p, stream, local).await,
            Family::Step => step::apply(ctl, r).await,
            Family::Claims => claims::apply(ctl, r).await,
            Family::Queue => queue::apply(ctl, r).await,
            Family::Kv => kv::apply(ctl, r, p, stream).await,
            Family::Admin => admin::apply(ctl, r).await,
        },
        ServerRequest::Peer(r) => peer::apply(ctl, r, p, stream).await,
        ServerRequest::Raft(r) => raft::apply(ctl, r, p, stream).await,
    }
}
