//! Requests a client (or a peer server) sends, and the responses it gets. Array bytes never sit in
//! these headers: they follow as the frame's payload.

use crate::view::ClusterView;
use cairn_core::index::{Fragment, StepIndex};
use cairn_core::{Error, ErrorKind, Reason, Region};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Most objects one `put_many` may carry.
pub const MAX_PUT_MANY: usize = 1024;

/// One object: what a `put` ([`ObjectPut::object`]) and each object of a [`Request::PutMany`] say of it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PutItem {
    /// Variable.
    pub var: String,
    /// Object id (writer rank in the high 32 bits).
    pub id: u64,
    /// The object's box.
    pub region: Region,
    /// Element size in bytes.
    pub elem: u32,
    /// crc32c of its bytes.
    pub checksum: u32,
    /// Which copy of the object this is.
    #[serde(default)]
    pub copy: u32,
}

/// Pieces one `rebuild` or `pieces` request may name at most.
pub const MAX_REBUILD: usize = 1024;

/// One piece of a committed object to rebuild ([`Request::Rebuild`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RebuildPiece {
    /// Step.
    pub step: u64,
    /// Object id.
    pub id: u64,
    /// 0: a whole copy; `i + 1`: shard `i` of the `k + m` stripe on `stripe`.
    pub shard: u32,
    /// Data shards (0 for a copy).
    #[serde(default)]
    pub k: u32,
    /// Parity shards (0 for a copy).
    #[serde(default)]
    pub m: u32,
    /// Server of each shard (empty for a copy).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub stripe: Vec<u32>,
    /// crc32c of the whole object (from its index entry): what is rebuilt is checked against it.
    pub checksum: u32,
    /// Surviving holders to fetch from, in order of preference: of a copy, any one; of a shard,
    /// the piece itself if its first holder still has it (a retiring server), else `k` shards.
    pub sources: Vec<u32>,
}

/// A piece a holder sends ([`Response::Pieces`]): what storing it needs, and its length.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PieceHead {
    /// Variable.
    pub var: String,
    /// The whole object's box.
    pub region: Region,
    /// Element size in bytes.
    pub elem: u32,
    /// Writer session.
    pub session: String,
    /// Rank of the writer.
    pub writer: u32,
    /// Bytes of the piece in the payload.
    pub len: u64,
    /// Their crc32c.
    pub checksum: u32,
}

/// A piece a rebuild could not store ([`Response::Rebuilt`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PieceFailure {
    /// Step.
    pub step: u64,
    /// Object id.
    pub id: u64,
    /// Why, as an error kind (`data_loss`: no surviving piece is enough).
    pub kind: ErrorKind,
    /// What was wrong.
    pub message: String,
}

/// Longest reason of an `abort_step`, in bytes.
pub const MAX_REASON: usize = 4096;

/// Longest key a keyed value may have, in bytes.
pub const MAX_KEY: usize = 1024;

/// How a writer's objects of one step spread over one server (checked at commit).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Share {
    /// Server id.
    pub server: u32,
    /// Objects put there.
    pub objects: u64,
    /// Their bytes.
    pub bytes: u64,
}

/// Most keys one `kv_get` or `kv_put` may name (keeps headers and replies bounded).
pub const MAX_KEYS: usize = 8192;

/// Runs of client memory one same-node put or get may name (more go as a payload).
pub const MAX_RUNS: usize = 4096;

/// Segments a reader reports unmapped in one get at most.
pub const MAX_UNMAPPED: usize = 1024;

/// What travels in a request frame's header: the request and the cluster-view epoch the sender
/// placed it by (absent for requests that do not depend on placement: hello, status, views).
/// Clients send [`Request`]s; servers, on connections whose hello says [`Role::Peer`], send
/// [`ServerRequest`]s.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Envelope<R = Request> {
    /// The sender's view epoch; a server with a newer view answers `stale_epoch` with it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub epoch: Option<u64>,
    /// The request.
    #[serde(flatten)]
    pub req: R,
}

/// Who opens a connection, as its hello says: a client names only [`Request`]s; another server
/// of the cluster (a peer) names [`PeerRequest`]s and [`RaftRequest`]s too.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// A client (writer, reader, tool).
    #[default]
    Client,
    /// Another server of the cluster.
    Peer,
}

/// What a server sends another: its own operations, Raft's, or anything a client sends.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ServerRequest {
    /// A peer operation.
    Peer(PeerRequest),
    /// A Raft message or a join.
    Raft(RaftRequest),
    /// What a client could send too (put, drop, view, kv_put).
    Client(Request),
}

impl From<Request> for ServerRequest {
    fn from(r: Request) -> Self {
        ServerRequest::Client(r)
    }
}

impl From<PeerRequest> for ServerRequest {
    fn from(r: PeerRequest) -> Self {
        ServerRequest::Peer(r)
    }
}

impl From<RaftRequest> for ServerRequest {
    fn from(r: RaftRequest) -> Self {
        ServerRequest::Raft(r)
    }
}

/// Operations only servers send each other: CoREC encoding, recovery, sealing and view pushes.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum PeerRequest {
    /// Stores a piece (a copy or a shard) of a committed object, sealed at once: an encoder's
    /// shard, a rebuilt piece. The payload is the piece (`from` is refused).
    Piece(ObjectPut),

    /// Leader → a holder of a committed object's whole copy: encode it into `k + m` shards and
    /// store shard `i` on `shards[i]`. Answered with [`Response::Encoded`].
    Encode {
        /// Dataset name.
        dataset: String,
        /// Step.
        step: u64,
        /// Object id.
        id: u64,
        /// Data shards.
        k: u32,
        /// Parity shards.
        m: u32,
        /// Server of each shard.
        shards: Vec<u32>,
        /// Servers that hold a whole copy: data shards bound for them are cut there
        /// ([`Request::Cut`]), not sent.
        #[serde(default)]
        holders: Vec<u32>,
    },
    /// Encoder → a server holding a whole copy of a committed object: store data shard `shard`
    /// (of `k`) cut from that copy, sealed. Answered with [`Response::Ok`].
    Cut {
        /// Dataset name.
        dataset: String,
        /// Step.
        step: u64,
        /// Object id.
        id: u64,
        /// Data shards in the stripe.
        k: u32,
        /// Which data shard (`< k`).
        shard: u32,
        /// Parity shards in the stripe (kept beside the shard: its geometry).
        #[serde(default)]
        m: u32,
    },
    /// Leader → the server that takes a lost server's pieces (the live heir of its slot, or the
    /// server itself back in its own slot): rebuild these pieces of committed objects of
    /// `dataset` here, fetching what each needs from surviving holders (a copy, or `k` shards
    /// to decode) with one [`Request::Pieces`] per holder. At most [`MAX_REBUILD`] pieces.
    /// Answered with [`Response::Rebuilt`].
    Rebuild {
        /// Dataset name.
        dataset: String,
        /// The pieces to rebuild.
        pieces: Vec<RebuildPiece>,
    },
    /// A server rebuilding pieces → a surviving holder: the pieces it holds of these committed
    /// objects, back to back in the reply's payload (at most [`MAX_REBUILD`]). Answered with
    /// [`Response::Pieces`].
    Pieces {
        /// Dataset name.
        dataset: String,
        /// (step, object id, piece: 0 a whole copy, `i + 1` shard `i`) of each.
        want: Vec<(u64, u64, u32)>,
    },
    /// Drain leader → a server: write these blocks of committed step `index.step` (the index
    /// holds only them, with the step's variables) into one new data file of this server under
    /// the drain folder, each gathered whole from its pieces (here, or fetched from their
    /// holders), and flush it; nothing refers to the file until the leader commits the step.
    /// Answered with [`Response::Part`].
    DrainPart {
        /// Dataset name.
        dataset: String,
        /// The step's index, cut to the blocks to write.
        index: cairn_core::index::StepIndex,
    },
    /// Coordinator → server: verify that the objects of a step are all here, then seal them.
    Seal {
        /// Dataset name.
        dataset: String,
        /// Step.
        step: u64,
        /// Committing session.
        session: String,
        /// The (object id, shard) keys the step's index places on this server. Objects of the
        /// session it holds beyond them are leftovers of puts that failed and were placed again;
        /// the seal drops them.
        keys: Vec<(u64, u32)>,
        /// Bytes expected.
        bytes: u64,
    },
    /// A committed view, pushed by the leader to every server (older epochs are ignored).
    ViewChanged {
        /// The view.
        view: ClusterView,
    },
}

/// An object (or a piece of one) to store: what a client's `put` says, and a peer's `piece`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ObjectPut {
    /// Dataset name.
    pub dataset: String,
    /// Step.
    pub step: u64,
    /// Writer session (objects of other sessions are dropped when this one commits).
    pub session: String,
    /// Rank of the writer (its objects are dropped together when it aborts a step).
    #[serde(default)]
    pub writer: u32,
    /// 0 for a whole copy; `i + 1` for erasure-code shard `i` (the payload is the shard,
    /// `region` the whole object's box).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub shard: u32,
    /// A same-node put: no payload; the bytes are these runs (address, length) of the memory
    /// of the client at the other end of the Unix socket, which the server copies once
    /// (cross-memory attach). At most [`MAX_RUNS`] runs.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub from: Option<Vec<(u64, u64)>>,
    /// For a shard: the stripe it is a piece of. A server keeps it beside the shard and serves
    /// the shard only to a get naming the same geometry (see [`Geometry`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stripe: Option<Geometry>,
    /// The object: variable, id, box, element size, checksum, copy.
    pub object: PutItem,
}

/// The geometry of an erasure-coded object's stripe: `k` data and `m` parity shards of `len`
/// bytes each. A stripe encoded again (narrower after a loss, wider after `cluster add`) keeps
/// its `(object, shard)` keys and changes its geometry, so a shard is named by both: a get whose
/// geometry differs from the stored piece's is answered `NotFound` (the reader reads the step's
/// index again), never with a piece of another stripe.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Geometry {
    /// Data shards.
    pub k: u32,
    /// Parity shards.
    pub m: u32,
    /// Bytes of each shard.
    pub len: u64,
}

impl Geometry {
    /// The geometry of an object of `bytes` bytes coded into `k + m` shards.
    pub fn of(bytes: u64, k: u32, m: u32) -> Geometry {
        Geometry { k, m, len: cairn_core::erasure::shard_len(bytes, k) }
    }
}

/// A claimer's request for a lease of a committed step (`claim`), or to extend its leases
/// (`renew`): as sent, and as the control plane's log records it with the leader's clock.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimLease {
    /// Dataset.
    pub dataset: String,
    /// Claimer id (1 to [`MAX_CLAIMER`] bytes).
    pub claimer: String,
    /// How long the lease lasts unless renewed (1 ms to a day).
    pub lease_ms: u64,
}

/// A claimer gives back every step it holds (`unclaim`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Unclaim {
    /// Dataset.
    pub dataset: String,
    /// The claimer.
    pub claimer: String,
}

/// A writer rank closes the dataset (`close`); once every rank of its session did, no more
/// steps come (readers' streams and claims end).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Close {
    /// Dataset.
    pub dataset: String,
    /// The writer session.
    pub session: String,
    /// Its rank.
    pub rank: u32,
    /// Ranks in the session.
    pub nranks: u32,
}

/// A committed step to forget (`release`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Release {
    /// Dataset.
    pub dataset: String,
    /// Step.
    pub step: u64,
}

/// A session's step that will not commit (`abort_step`): a rank's abort, a failed seal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Abort {
    /// Dataset.
    pub dataset: String,
    /// Step.
    pub step: u64,
    /// The writer session.
    pub session: String,
    /// Why, for the ranks that ended it (at most [`MAX_REASON`] bytes).
    #[serde(default)]
    pub reason: String,
}

/// The next cluster view (`set_view`), proposed at the leader; its epoch the current one's
/// plus one.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ViewChange {
    /// The view.
    pub view: ClusterView,
}

/// A request. The first on every connection must be [`Request::Hello`], answering the server's
/// [`Response::Challenge`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// Authenticates the connection: proves knowledge of the cluster secret for this connection's
    /// challenge (`cairn_proto::auth`).
    Hello {
        /// Who is calling (for logs and status).
        client: String,
        /// HMAC-SHA256 of the challenge's nonce under the secret, in hex.
        mac: String,
        /// Who opens the connection (a client unless it says otherwise).
        #[serde(default, skip_serializing_if = "is_client")]
        role: Role,
    },
    /// Stores one object; its bytes are the payload (see [`ObjectPut`]).
    Put(ObjectPut),
    /// Stores several whole objects of one writer's step in one frame (a writer's coalesced small
    /// puts), each as a `put` of its own would: their bytes back to back in the payload, or, on
    /// the same node, in the runs `from` names (in the objects' order). At most
    /// [`MAX_PUT_MANY`] objects.
    PutMany {
        /// Dataset name.
        dataset: String,
        /// Step.
        step: u64,
        /// Writer session.
        session: String,
        /// Rank of the writer.
        writer: u32,
        /// The objects, in the order of their bytes.
        objects: Vec<PutItem>,
        /// A same-node put: no payload; the bytes are these runs of the client's memory.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        from: Option<Vec<(u64, u64)>>,
        /// A same-node put into leased segments ([`Request::Lease`]): no payload; object `i`'s
        /// bytes fill lease `leases[i]`, which becomes its memory.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        leases: Option<Vec<u64>>,
    },
    /// Same-node writers: gives back the leases `release` names, then leases a shared-memory
    /// segment of each of `sizes` bytes (their space reserved) for the client to fill and put
    /// (`put_many` with `leases`). Answered with [`Response::Leased`]; only on a Unix socket.
    Lease {
        /// Bytes of each segment (each at least 1; at most [`MAX_PUT_MANY`] of them).
        sizes: Vec<u64>,
        /// Leases not used (at most [`MAX_PUT_MANY`]).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        release: Vec<u64>,
    },
    /// Reads the box `want` (inside the object's box) of one object; the reply's payload holds it.
    /// For a shard (`shard` > 0) the whole shard is returned and `want` must be the object's box.
    Get {
        /// Dataset name.
        dataset: String,
        /// Step.
        step: u64,
        /// Object id.
        id: u64,
        /// Box to return, in C order.
        want: Region,
        /// 0 for a whole copy, `i + 1` for shard `i`.
        #[serde(default, skip_serializing_if = "is_zero")]
        shard: u32,
        /// For a shard: the geometry of the stripe the reader's index names (required then). A
        /// server holding the shard under another geometry answers `NotFound`.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        stripe: Option<Geometry>,
        /// Set by a same-node reader that maps segments (on a Unix socket): a whole copy held
        /// in a segment of the reader's user is answered [`Response::Mapped`] instead of with its
        /// bytes. The ids are segments the reader unmapped since its last get (at most
        /// [`MAX_UNMAPPED`]), whose descriptors it must be handed again.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        map: Option<Vec<u64>>,
    },
    /// Reader → the control plane's leader: objects of a committed step were just read degraded
    /// (a piece on a lost server); lazy recovery rebuilds them next. Answered with [`Response::Ok`].
    Touch {
        /// Dataset name.
        dataset: String,
        /// Step.
        step: u64,
        /// Object ids.
        ids: Vec<u64>,
    },
    /// A writer's part of a step, sent to the dataset's coordinator server once its puts are done.
    EndStep {
        /// Dataset name.
        dataset: String,
        /// The writer's definitions and staged blocks.
        fragment: Fragment,
        /// Where its objects went.
        shares: Vec<Share>,
        /// Keep only this many newest committed steps (older ones are released at commit).
        keep_last: Option<u64>,
    },
    /// Frees objects of a step: all of them, or those of one session or one writer.
    Drop {
        /// Dataset name.
        dataset: String,
        /// Step.
        step: u64,
        /// Only this session's.
        session: Option<String>,
        /// Only this writer's.
        writer: Option<u32>,
        /// Only these objects (when not empty).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        ids: Vec<u64>,
        /// Keep this session's sealed objects: drop what every other session left (a crashed
        /// run) and this session's unsealed leftovers (puts placed again elsewhere).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        except: Option<String>,
        /// Only this shard (0: the whole copy) of each of `ids`, sealed or not: the leader
        /// dropping copies an encoding made redundant, or shards of a failed encoding.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        shard: Option<u32>,
    },
    /// Committed steps of a dataset.
    Steps {
        /// Dataset name.
        dataset: String,
        /// A follower may answer from its applied state when no leader can be confirmed (see
        /// `Index`).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        follower: bool,
    },
    /// The committed index of a step.
    Index {
        /// Dataset name.
        dataset: String,
        /// Step.
        step: u64,
        /// Read from the leader, linearized, as always when one answers; set, a meta server that
        /// cannot confirm a leader (an election, a lost majority) answers from its own applied
        /// state while it heard from a leader lately. Committed steps do not change, but a
        /// follower's index may still name copies that encoding or recovery moved since.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        follower: bool,
    },
    /// Waits until `step` commits or `timeout_ms` passes.
    WaitStep {
        /// Dataset name.
        dataset: String,
        /// Step.
        step: u64,
        /// Milliseconds to wait at most.
        timeout_ms: u64,
    },
    /// The drain to disk: waits until `step` of `dataset` is drained (default: the newest
    /// committed step the cadence drains), the drain fails, or `timeout_ms` passes; answered by
    /// the leader with [`Response::Drain`]. Without a dataset, the drain's state at once.
    WaitDrained {
        /// Dataset name.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        dataset: Option<String>,
        /// Step.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        step: Option<u64>,
        /// Milliseconds to wait at most.
        timeout_ms: u64,
        /// Drain the step (default: the newest committed) whatever the cadence, then wait for
        /// it: a writer's last checkpoint. Without a dataset: the newest committed step of
        /// every dataset, answered at once (the drain's state says when they are on disk).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        drain: bool,
    },
    /// What became of a step a writer session ended: answered with [`Response::Outcome`]
    /// (ranks that were not last learn whether it committed or aborted, and why).
    StepOutcome {
        /// Dataset name.
        dataset: String,
        /// Step.
        step: u64,
        /// Writer session.
        session: String,
    },
    /// A writer rank's abort of its session's step: it aborts for every rank.
    AbortStep(Abort),
    /// Forgets a committed step; its objects are freed.
    Release(Release),
    /// Forgets a dataset whole (`cairn rm`): every committed step (objects freed), its queue,
    /// readers, claims, released steps and drained mark; or with `from`, only its steps from
    /// `from` on (`cairn rm --from-step`, `open("a", from_step=)`), their drained copies too;
    /// answered with [`Response::Removed`].
    RemoveDataset {
        /// Dataset name.
        dataset: String,
        /// The first step discarded (none: the dataset whole).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        from: Option<u64>,
    },
    /// Leases the lowest free committed step to `claimer` (see [`ClaimLease`]).
    Claim(ClaimLease),
    /// Extends `claimer`'s leases; answers the steps it still holds.
    Renew(ClaimLease),
    /// Gives back every step a claimer holds.
    Unclaim(Unclaim),
    /// A writer rank closes the dataset.
    Close(Close),
    /// The writers' queue limit of a dataset (committed steps not yet released; 0: none) and
    /// its policy, "block" or "discard_oldest"; answered by the leader.
    SetQueue {
        /// Dataset name.
        dataset: String,
        /// Limit.
        limit: u64,
        /// Policy.
        policy: String,
    },
    /// A streaming reader registers, moves on, renews or (`leave`) ends its registration (see
    /// `cairn_meta::Cmd::Stream`); answered with [`Response::Queue`].
    StreamAt {
        /// Dataset name.
        dataset: String,
        /// The reader's id (at most [`MAX_KEY`] bytes).
        reader: String,
        /// The first step it has not passed (none: where it is, or the oldest kept step).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        next: Option<u64>,
        /// How long the registration lasts without renewal (ms, at most [`MAX_LEASE_MS`]); 0 leaves.
        lease_ms: u64,
    },
    /// Waits until the dataset's queue has room (fewer committed steps not yet released than
    /// its limit) or `timeout_ms` passes; answered by the leader with [`Response::Queue`].
    WaitQueue {
        /// Dataset name.
        dataset: String,
        /// Milliseconds to wait at most.
        timeout_ms: u64,
    },
    /// Sets each of `keys` to its piece of the payload (`sizes` back to back) or, with `member`,
    /// adds each piece to the set at its key (a member already there is kept once). One request
    /// and one reply per batch: all pieces are stored, or none. Keys live on the server their
    /// hash places them on.
    KvPut {
        /// Keys (each at most [`MAX_KEY`] bytes; a key may repeat).
        keys: Vec<String>,
        /// The length of each key's piece; they add up to the payload length.
        sizes: Vec<u64>,
        /// Add to sets instead of replacing values.
        #[serde(default)]
        member: bool,
    },
    /// The values of `keys` (with `members`: every member of each set), back to back in the
    /// reply's payload.
    KvGet {
        /// Keys.
        keys: Vec<String>,
        /// Read sets instead of values.
        #[serde(default)]
        members: bool,
    },
    /// Deletes `keys` or, with `prefix`, every key that starts with one of them.
    KvDelete {
        /// Keys (or prefixes).
        keys: Vec<String>,
        /// Treat `keys` as prefixes.
        #[serde(default)]
        prefix: bool,
    },
    /// The server's cluster view.
    View,
    /// Proposes the next cluster view (leader only).
    SetView(ViewChange),
    /// Datasets this server coordinates.
    Datasets,
    /// Memory, objects and request counts of this server.
    Status,
    /// Objects this server holds (placement view).
    Objects,
    /// Stops the server.
    Shutdown,
    /// Compare-and-set of a small value through the control plane (claims, leases, markers):
    /// set `key` to the payload (or delete it) if its version is `expect` (`None`: absent).
    /// Answered by the leader; other servers say `not_leader`.
    MetaCas {
        /// Key.
        key: String,
        /// The version the caller saw; `None` when the key must not exist.
        expect: Option<u64>,
        /// Delete instead of setting (the payload is then empty).
        #[serde(default)]
        delete: bool,
        /// A unique id of this call: its retry (the reply was lost with a leader) gets the first
        /// outcome instead of being decided again.
        #[serde(default)]
        call: Option<String>,
    },
    /// Reads a compare-and-set value and its version (at the leader, after confirming it leads).
    MetaGet {
        /// Key.
        key: String,
    },
}

/// Raft between meta servers, and a restarted or new meta server's join.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum RaftRequest {
    /// Server → meta server: a Raft RPC of the control plane. The payload is the RPC as JSON
    /// (`kind` says which); the reply is `raft` with the result as JSON in its payload.
    Raft {
        /// `append`, `vote` or `snapshot`.
        kind: RaftRpc,
        /// The Raft node it is meant for: a server that restarted under a new node id must not
        /// answer for its old one (it would vote twice in a term).
        target: u64,
        /// With `snapshot`: the vote and the snapshot's metadata (the payload is its data).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        head: Option<serde_json::Value>,
    },
    /// A meta server that restarted without its Raft state asks to rejoin under a new node id.
    MetaJoin {
        /// Its new Raft node id.
        node: u64,
        /// Its server id.
        server: u32,
        /// Its address.
        addr: String,
    },
}

/// Longest claimer id (ids are kept in the replicated state while they hold a lease).
pub const MAX_CLAIMER: usize = 64;

/// Longest lease a claim may ask for (a day).
pub const MAX_LEASE_MS: u64 = 86_400_000;

/// Datasets one step may consume.
pub const MAX_CONSUME: usize = 16;

/// Largest value a compare-and-set may store (they live in the replicated log and its snapshots).
pub const MAX_CAS_VALUE: u64 = 64 << 10;

/// The kinds of Raft RPC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RaftRpc {
    /// Append entries (and heartbeats).
    Append,
    /// Request a vote.
    Vote,
    /// Install a whole snapshot.
    Snapshot,
}

/// Largest Raft RPC payload accepted (entries carry step fragments, snapshots the whole state).
pub const MAX_RAFT_PAYLOAD: u64 = 256 << 20;

/// A server's counters.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ServerStatus {
    /// Server id.
    pub server: u32,
    /// Bytes of objects held (including pending ones).
    pub memory_used: u64,
    /// Memory limit in bytes.
    pub memory_limit: u64,
    /// Objects held.
    pub objects: u64,
    /// Distinct (dataset, step) pairs held.
    pub steps: u64,
    /// Requests served since start.
    pub requests: u64,
    /// Object bytes copied straight from or to clients' memory on this host (same-node puts and
    /// gets), since start.
    #[serde(default)]
    pub same_node_bytes: u64,
    /// Gets a same-node reader read out of its mapping of the shared segment holding the object
    /// (issue 55: one copy), since start.
    #[serde(default)]
    pub mapped_gets: u64,
    /// Bytes of objects held in shared segments that writers on this host filled (leases).
    #[serde(default)]
    pub shared_bytes: u64,
    /// Seconds since start.
    pub uptime_s: f64,
    /// Its part in the control plane: `leader`, `follower`, `candidate`, `learner` or `none`.
    #[serde(default)]
    pub meta: String,
    /// The server it knows to lead the control plane.
    #[serde(default)]
    pub leader: Option<u32>,
    /// Its cluster-view epoch.
    #[serde(default)]
    pub epoch: u64,
    /// Objects held that are extra copies (redundancy), not first copies.
    #[serde(default)]
    pub replicas: u64,
    /// Erasure-code shards held (none until cold objects are encoded).
    #[serde(default)]
    pub shards: u64,
    /// Keyed values and sets held (the task store).
    #[serde(default)]
    pub keys: u64,
    /// Bytes of first copies held: the data, as against `memory_used` (what storing it costs).
    #[serde(default)]
    pub data_bytes: u64,
    /// Where the steps this server committed (as the control plane's leader) spent their time.
    #[serde(default)]
    pub commits: CommitTimes,
    /// Objects of lost servers this server (as the leader) has still to rebuild.
    #[serde(default)]
    pub recovery_pending: u64,
    /// Objects it rebuilt.
    #[serde(default)]
    pub recovery_rebuilt: u64,
    /// Objects it could not rebuild (no surviving piece).
    #[serde(default)]
    pub recovery_lost: u64,
    /// Seconds the recovery under way has run past its deadline (0 when on time or idle): where
    /// the machine cannot rebuild within the deadline, it shows here.
    #[serde(default)]
    pub recovery_overdue_s: f64,
    /// Bytes of shared segments made ahead of leases and ready (see `[staging] prefault`).
    #[serde(default)]
    pub prefault_ready: u64,
    /// Bytes of them made of huge pages (the rest: small pages, where the kernel refused).
    #[serde(default)]
    pub prefault_huge: u64,
    /// Bytes of them the server aims to keep ready (lowered when its data needs the memory).
    #[serde(default)]
    pub prefault_target: u64,
    /// Bytes of those segments same-node puts took since start.
    #[serde(default)]
    pub prefault_taken: u64,
    /// Objects of committed steps below their redundancy level (a piece on a server declared
    /// down), as this server (the leader) counts them.
    #[serde(default)]
    pub recovery_degraded: u64,
    /// The control plane's voters (servers), as this server's replica knows them.
    #[serde(default)]
    pub voters: Vec<u32>,
    /// The cluster's health, from the control plane's leader (none from other servers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health: Option<crate::health::Health>,
}

/// The leader's drain of committed steps to disk (`cairn cluster status`, `wait_drained`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DrainStatus {
    /// Folder the datasets are drained to (none: no drain).
    pub path: Option<String>,
    /// Steps whose number is a multiple of this are drained (the cadence in use).
    pub every: u64,
    /// The automatic cadence: the checkpoint interval Young/Daly gives, in seconds.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub interval_s: Option<f64>,
    /// The newest drained step of each dataset.
    pub steps: BTreeMap<String, u64>,
    /// Bytes of committed steps still to drain.
    pub pending_bytes: u64,
    /// Drain throughput so far, in MB/s.
    #[serde(rename = "MBps")]
    pub mbps: f64,
    /// Why the last drain failed (a full or read-only disk), until one succeeds again.
    pub error: Option<String>,
    /// The kind of that error (`capacity` for a full disk).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_kind: Option<ErrorKind>,
    /// Its typed reason (`foreign_drain`: another run's step is in the way).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error_reason: Option<Reason>,
    /// Every dataset whose drain is failing, with why (each dataset's drain fails alone).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub errors: BTreeMap<String, String>,
    /// Steps' drains attempted so far: an error is news to a waiter once an attempt started
    /// after its wait began failed.
    #[serde(default)]
    pub attempts: u64,
    /// The attempt that failed with `error`.
    #[serde(default)]
    pub failed_attempt: u64,
}

/// Time spent in each phase of the step commits one server coordinated, summed over `steps`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct CommitTimes {
    /// Steps committed.
    pub steps: u64,
    /// From a step's first fragment arriving to its last one applied by the log (prepared).
    pub fragments_us: u64,
    /// Sealing its objects on the servers that hold them.
    pub seal_us: u64,
    /// Its `Commit` entry, from proposal to applied by a majority.
    pub commit_us: u64,
}

/// One object as `cairn cluster status --objects` lists it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ObjectInfo {
    /// Dataset.
    pub dataset: String,
    /// Step.
    pub step: u64,
    /// Variable.
    pub var: String,
    /// Object id.
    pub id: u64,
    /// 0 for a whole copy, `i + 1` for erasure-code shard `i`.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub shard: u32,
    /// Its box.
    pub region: Region,
    /// Bytes.
    pub bytes: u64,
    /// Whether its step committed.
    pub sealed: bool,
}

/// A response.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Response {
    /// Done.
    Ok,
    /// A dataset was removed ([`Request::RemoveDataset`]).
    Removed {
        /// The committed steps it had.
        steps: u64,
    },
    /// The first frame on every connection, from the server: answer it with a hello.
    Challenge {
        /// The server's id.
        server: u32,
        /// Random, fresh per connection.
        nonce: String,
    },
    /// Segments leased to a same-node writer: each lease's id and its descriptor in the
    /// server's process `pid` (the client opens `/proc/<pid>/fd/<fd>`).
    Leased {
        /// The server's process id.
        pid: u32,
        /// (lease id, descriptor) per size asked for.
        leases: Vec<(u64, i32)>,
    },
    /// Hello accepted.
    Welcome {
        /// The server's id.
        server: u32,
        /// Its cluster-view epoch.
        epoch: u64,
        /// Same-node copies work on this connection: a Unix socket whose connecting process the
        /// server bound (its memory image pinned at accept, docs/protocol.md *Threat model*), so
        /// puts may name runs of the client's memory. Said once, of the connection, never of an
        /// address.
        #[serde(default)]
        same_node: bool,
    },
    /// Failed; `kind` maps back to the client's error kinds. Redirections carry what the client
    /// needs to go on: `stale_epoch` the new view, `not_leader` a leader hint, `busy` a delay.
    Error {
        /// Error kind.
        kind: ErrorKind,
        /// What was wrong and what to do.
        message: String,
        /// Why, where callers act on it (`step_in_flight`, `lost_quorum`, `stale_epoch`,
        /// `released`): callers branch on this, never on the message.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<Reason>,
        /// With `stale_epoch`: the server's (newer) view.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        view: Option<Box<ClusterView>>,
        /// With `not_leader`: the server believed to lead.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        leader: Option<u32>,
        /// With `busy`: milliseconds to wait before retrying.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        retry_after_ms: Option<u64>,
    },
    /// A cluster view.
    View {
        /// The view.
        view: ClusterView,
    },
    /// A Raft RPC's result; the payload holds it as JSON.
    Raft,
    /// A compare-and-set's result, or a read's (`ok`: the key exists; its value is the payload).
    Cas {
        /// Whether the value was set (read: whether the key exists).
        ok: bool,
        /// The key's version now (0: absent).
        version: u64,
    },
    /// Object bytes follow as the payload.
    Data {
        /// crc32c of the payload.
        checksum: u32,
    },
    /// A same-node get's object is the whole of shared segment `segment` (`len` bytes) of the
    /// server; the reader copies it out of its read-only mapping and checks it against the
    /// committed crc32c. With `fd`, a one-byte payload follows that carries a descriptor of the
    /// segment, open read-only (`SCM_RIGHTS`): sent once per segment and connection, until the
    /// reader reports it unmapped.
    Mapped {
        /// The segment's id (unique in the server's lifetime).
        segment: u64,
        /// The segment's bytes (the object's).
        len: u64,
        /// Whether a descriptor comes with this reply.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        fd: bool,
    },
    /// What a rebuild could not do, piece by piece (the rest are stored).
    Rebuilt {
        /// The pieces not rebuilt, and why.
        failed: Vec<PieceFailure>,
    },
    /// Pieces a holder has, in the order asked for (`None`: not here); their bytes follow back
    /// to back as the payload.
    Pieces {
        /// Per piece asked for.
        found: Vec<Option<PieceHead>>,
    },
    /// A drain part was written ([`PeerRequest::DrainPart`]): the records of its blocks (data
    /// file and position set), in the order asked, and the bytes they hold and take.
    Part {
        /// One per block asked for.
        records: Vec<cairn_core::index::BlockRecord>,
        /// Bytes of the blocks.
        bytes: u64,
        /// Bytes on disk (after compression).
        stored: u64,
    },
    /// An object was encoded; the encoder's request rate rides along (the leader gives the next
    /// encoding of the group to its least loaded member).
    Encoded {
        /// Requests per second the encoder served lately.
        rate: f64,
    },
    /// What became of a step ([`Request::StepOutcome`]): `committed`, `pending` (not every
    /// rank ended it yet), `aborted` (with `reason`), or `unknown` (no record of the session's
    /// step: never ended, or aborted long ago).
    Outcome {
        /// One of the four words above.
        outcome: String,
        /// Why it aborted.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        reason: Option<String>,
    },
    /// Result of an end of step or a wait.
    Committed {
        /// Whether the step is (now) committed.
        committed: bool,
    },
    /// Committed steps, sorted.
    Steps {
        /// Step numbers.
        steps: Vec<u64>,
        /// Whether the writers closed the dataset (no more steps come).
        #[serde(default)]
        finished: bool,
        /// Steps some writer ranks ended that are not committed: (step, ranks that ended it,
        /// ranks it waits for).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        pending: Vec<(u64, u32, u32)>,
    },
    /// What a claim got.
    Claimed {
        /// The step now leased to the claimer, if one was free.
        step: Option<u64>,
        /// Nothing will ever be free for this claimer: the writers closed the dataset and every
        /// committed step left is leased to it.
        done: bool,
    },
    /// A committed step index.
    Index {
        /// The index.
        index: StepIndex,
        /// Answered by a follower from its applied state, not confirmed by the leader: it may be
        /// behind (name copies since dropped), so a reader that finds a piece missing asks again
        /// rather than calling it lost.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        follower: bool,
    },
    /// Keyed values; the payload holds them back to back. `sizes[i]` lists the lengths of key i's
    /// values: none when the key is absent, one for a value, one per member for a set.
    Values {
        /// Lengths per key.
        sizes: Vec<Vec<u64>>,
    },
    /// Keys deleted.
    Deleted {
        /// How many.
        count: u64,
    },
    /// Dataset names.
    Datasets {
        /// Names.
        names: Vec<String>,
    },
    /// Server counters.
    Status {
        /// Counters.
        status: ServerStatus,
    },
    /// The drain to disk, and whether the step waited for is drained.
    Drain {
        /// Its state.
        drain: DrainStatus,
        /// The step waited for (none when the dataset has no step the cadence drains).
        step: Option<u64>,
        /// Whether it is on disk.
        drained: bool,
        /// The drain failed during the wait (its error is `drain.error`): the caller raises it.
        #[serde(default)]
        failed: bool,
    },
    /// Objects held.
    Objects {
        /// Objects.
        objects: Vec<ObjectInfo>,
    },
    /// A dataset's queue: whether it has room, the committed steps not yet released, and its
    /// limit (0: none) and policy.
    Queue {
        /// Fewer steps than the limit are queued (or there is none).
        room: bool,
        /// Committed steps not yet released (but those holding a constant, kept for good).
        queued: u64,
        /// The limit.
        limit: u64,
        /// The policy at the limit.
        policy: String,
        /// The longest lease of a registered reader, in ms: a writer blocked by readers waits
        /// up to that (plus a second) for a dead or hung one to lapse, whatever its timeout.
        #[serde(default)]
        lease_ms: u64,
        /// To a streaming reader's registration: its mark, the first step it holds (none once
        /// it left).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        mark: Option<u64>,
    },
}

impl Response {
    /// The response for a failed request.
    pub fn error(e: &Error) -> Response {
        let leader = match e {
            Error::NotLeader { leader, .. } => *leader,
            _ => None,
        };
        Response::Error { kind: e.wire_kind(), message: e.to_string(), reason: e.reason(), view: None, leader, retry_after_ms: None }
    }

    /// The reply to a request placed by an older view than `view`.
    pub fn stale_epoch(given: u64, view: &ClusterView) -> Response {
        Response::Error {
            kind: ErrorKind::StaleEpoch,
            message: format!("request placed by cluster view {given}, but the cluster is at view {}; refresh and retry", view.epoch),
            reason: Some(Reason::StaleEpoch),
            view: Some(Box::new(view.clone())),
            leader: None,
            retry_after_ms: None,
        }
    }

    /// The reply when a limit is reached for now.
    pub fn busy(message: String, retry_after_ms: u64) -> Response {
        Response::Error { kind: ErrorKind::Busy, message, reason: None, view: None, leader: None, retry_after_ms: Some(retry_after_ms) }
    }

    /// Turns an error response back into an [`Error`]; any other response passes through.
    pub fn into_result(self) -> Result<Response, Error> {
        match self {
            Response::Error { kind, reason, message, .. } => Err(Error::from_wire(kind, reason, message)),
            r => Ok(r),
        }
    }
}

impl Request {
    /// The request's name as it appears on the wire (`put`, `end_step`, ...), for messages.
    pub fn op_name(&self) -> String {
        op_name(self)
    }
}

impl ServerRequest {
    /// The request's name as it appears on the wire, for messages.
    pub fn op_name(&self) -> String {
        op_name(self)
    }
}

impl PeerRequest {
    /// The request's name as it appears on the wire, for messages.
    pub fn op_name(&self) -> String {
        op_name(self)
    }
}

/// A request's name as it appears on the wire (its `op` tag).
fn op_name(req: &impl Serialize) -> String {
    {
        // The tag is the first thing serialized: write until it is out, then stop. (Serializing
        // the whole request, a fragment of every block of a step included, took 2% of the CPU
        // of a run of 4 KiB puts.)
        struct Head(Vec<u8>);
        impl std::io::Write for Head {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                if self.0.len() >= 64 {
                    return Err(std::io::ErrorKind::WriteZero.into());
                }
                self.0.extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let mut head = Head(Vec::with_capacity(80));
        let _ = serde_json::to_writer(&mut head, req);
        let text = String::from_utf8_lossy(&head.0);
        text.strip_prefix("{\"op\":\"").and_then(|rest| rest.split('"').next()).unwrap_or_default().to_string()
    }
}

fn is_client(r: &Role) -> bool {
    *r == Role::Client
}

fn is_zero(n: &u32) -> bool {
    *n == 0
}

/// The error a reply of the wrong kind stands for: its own if it is an error reply, else
/// [`unexpected`].
pub fn refused(what: &str, got: Response) -> Error {
    match got {
        Response::Error { kind, reason, message, .. } => Error::from_wire(kind, reason, message),
        other => unexpected(what, &other),
    }
}

/// The error for a response of the wrong kind (a protocol bug or a version mismatch).
pub fn unexpected(what: &str, got: &Response) -> Error {
    Error::Corrupt(format!("unexpected reply to {what}: {got:?}; are client and server the same Cairn version?"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn op_names_are_the_wire_tags() {
        assert_eq!(Request::Status.op_name(), "status");
        let wait = Request::WaitStep { dataset: "d".repeat(500), step: 3, timeout_ms: 10 };
        assert_eq!(wait.op_name(), "wait_step");
        let fragment = Fragment::new(1, 0, 1, "s".into(), Vec::new(), Vec::new());
        let end = Request::EndStep { dataset: "d".into(), fragment, shares: Vec::new(), keep_last: None };
        assert_eq!(end.op_name(), "end_step");
        let kv = Request::KvPut { keys: vec!["k".repeat(1000)], sizes: vec![1], member: false };
        assert_eq!(kv.op_name(), "kv_put");
    }
}
