//! Requests a client (or a peer server) sends, and the responses it gets. Array bytes never sit in
//! these headers: they follow as the frame's payload.

use cairn_core::index::{Fragment, StepIndex};
use cairn_core::{Error, ErrorKind, Region};
use serde::{Deserialize, Serialize};

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

/// A request. The first on every connection must be [`Request::Hello`].
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum Request {
    /// Authenticates the connection with the cluster secret.
    Hello {
        /// The secret from the cluster file.
        secret: String,
        /// Who is calling (for logs and status).
        client: String,
    },
    /// Stores one object; its bytes are the payload.
    Put {
        /// Dataset name.
        dataset: String,
        /// Step.
        step: u64,
        /// Writer session (objects of other sessions are dropped when this one commits).
        session: String,
        /// Variable.
        var: String,
        /// Object id (writer rank in the high 32 bits).
        id: u64,
        /// The object's box.
        region: Region,
        /// Element size in bytes.
        elem: u32,
        /// crc32c of the payload.
        checksum: u32,
    },
    /// Reads the box `want` (inside the object's box) of one object; the reply's payload holds it.
    Get {
        /// Dataset name.
        dataset: String,
        /// Step.
        step: u64,
        /// Object id.
        id: u64,
        /// Box to return, in C order.
        want: Region,
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
    /// Coordinator → server: verify that the objects of a step are all here, then seal them.
    Seal {
        /// Dataset name.
        dataset: String,
        /// Step.
        step: u64,
        /// Committing session.
        session: String,
        /// Objects expected.
        objects: u64,
        /// Bytes expected.
        bytes: u64,
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
    },
    /// Committed steps of a dataset.
    Steps {
        /// Dataset name.
        dataset: String,
    },
    /// The committed index of a step.
    Index {
        /// Dataset name.
        dataset: String,
        /// Step.
        step: u64,
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
    /// Releases a committed step: its index and objects are freed everywhere.
    Release {
        /// Dataset name.
        dataset: String,
        /// Step.
        step: u64,
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
    /// Datasets this server coordinates.
    Datasets,
    /// Memory, objects and request counts of this server.
    Status,
    /// Objects this server holds (placement view).
    Objects,
    /// Stops the server.
    Shutdown,
}

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
    /// Seconds since start.
    pub uptime_s: f64,
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
    /// Hello accepted.
    Welcome {
        /// The server's id.
        server: u32,
    },
    /// Failed; `kind` maps back to the client's error kinds.
    Error {
        /// Error kind.
        kind: ErrorKind,
        /// What was wrong and what to do.
        message: String,
    },
    /// Object bytes follow as the payload.
    Data {
        /// crc32c of the payload.
        checksum: u32,
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
    },
    /// A committed step index.
    Index {
        /// The index.
        index: StepIndex,
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
    /// Objects held.
    Objects {
        /// Objects.
        objects: Vec<ObjectInfo>,
    },
}

impl Response {
    /// The response for a failed request.
    pub fn error(e: &Error) -> Response {
        Response::Error { kind: e.kind(), message: e.to_string() }
    }

    /// Turns an error response back into an [`Error`]; any other response passes through.
    pub fn into_result(self) -> Result<Response, Error> {
        match self {
            Response::Error { kind, message } => Err(Error::from_kind(kind, message)),
            r => Ok(r),
        }
    }
}

/// The error for a response of the wrong kind (a protocol bug or a version mismatch).
pub fn unexpected(what: &str, got: &Response) -> Error {
    Error::Corrupt(format!("unexpected reply to {what}: {got:?}; are client and server the same Cairn version?"))
}
