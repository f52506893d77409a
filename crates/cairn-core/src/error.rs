//! Errors of the core, and the kinds every layer above maps onto.

/// The small public set of error kinds; bindings map each to one exception class.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorKind {
    /// Something named does not exist (variable, step, dataset, writer).
    NotFound,
    /// Something already exists and may not be created again.
    AlreadyExists,
    /// The request contradicts earlier state (overlapping blocks, redefinition, step order).
    Conflict,
    /// A resource is gone or full (server, disk, memory).
    Unavailable,
    /// Stored data failed a checksum or does not parse.
    Corrupt,
    /// The request itself is malformed (shape, dtype, box out of bounds).
    InvalidArgument,
    /// The configuration is wrong (unknown engine, missing path).
    Config,
    /// A staging server's memory limit would be exceeded; release old steps and retry.
    Capacity,
    /// Committed data is gone: every server holding a copy of it failed (more failures than
    /// its variable's redundancy level).
    DataLoss,
    /// On the wire only: the client's cluster view is older than the server's; the reply carries
    /// the new view, and the client refreshes and retries. Surfaces as [`Error::Unavailable`].
    StaleEpoch,
    /// On the wire only: this server does not lead the control plane; the reply names the leader
    /// it knows of. Surfaces as [`Error::Unavailable`].
    NotLeader,
    /// On the wire only: the server is at a limit for now; retry after the delay in the reply.
    /// Surfaces as [`Error::Unavailable`].
    Busy,
}

/// Why a request was refused, where callers act on it: it travels on the wire beside the kind
/// (`reason` of an error reply), so no caller decides by a message's text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Reason {
    /// Another end of the same step is being committed: wait for its outcome.
    StepInFlight,
    /// The control plane's leader has not heard from a majority: nothing commits until one
    /// answers, and no other leader may be known.
    LostQuorum,
    /// The request was placed by an older cluster view than the server's.
    StaleEpoch,
    /// The step was committed and then released: it is not coming back.
    Released,
    /// The server is not there: it refused or dropped the connection, or was declared down and
    /// holds nothing. (Not hung: a missed deadline may still be answered.)
    ServerGone,
    /// A dataset's drain folder holds committed steps this cluster did not drain (another run's,
    /// or without a drain's identity): a `"w"` open is refused, and the drain never takes them.
    ForeignDrain,
    /// A drain folder holds, below the folder, a symlink or an entry of another uid: the drain
    /// writes nothing there (another user could redirect a server's writes).
    UnsafePath,
}

impl Reason {
    /// [`Reason::code`] as a C string (the C API's `cairn_last_error_code`).
    pub fn c_code(self) -> &'static std::ffi::CStr {
        match self {
            Reason::StepInFlight => c"step_in_flight",
            Reason::LostQuorum => c"lost_quorum",
            Reason::StaleEpoch => c"stale_epoch",
            Reason::Released => c"released",
            Reason::ServerGone => c"server_gone",
            Reason::ForeignDrain => c"foreign_drain",
            Reason::UnsafePath => c"unsafe_path",
        }
    }

    /// The reason's snake_case name, as exceptions' `code` and the wire carry it.
    pub fn code(self) -> &'static str {
        self.c_code().to_str().expect("ASCII names")
    }
}

/// Errors raised by Cairn's core logic. Messages say what was wrong and what to do.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// A named thing is missing.
    #[error("{0}")]
    NotFound(String),
    /// A thing exists already.
    #[error("{0}")]
    AlreadyExists(String),
    /// The request conflicts with what was written before.
    #[error("{0}")]
    Conflict(String),
    /// A resource is unavailable.
    #[error("{0}")]
    Unavailable(String),
    /// Stored bytes are damaged.
    #[error("{0}")]
    Corrupt(String),
    /// The request is malformed.
    #[error("{0}")]
    InvalidArgument(String),
    /// The configuration is wrong.
    #[error("{0}")]
    Config(String),
    /// A server is out of memory for the request.
    #[error("{0}")]
    Capacity(String),
    /// Committed data is lost with the servers that held it.
    #[error("{0}")]
    DataLoss(String),
    /// This server does not lead the control plane; the request goes to `leader` (when known).
    #[error("{message}")]
    NotLeader {
        /// What happened and where to go.
        message: String,
        /// The staging server believed to lead.
        leader: Option<u32>,
    },
    /// Another end of the same step is being committed ([`Reason::StepInFlight`]; a conflict).
    #[error("{0}")]
    StepInFlight(String),
    /// A leader cut off from its majority ([`Reason::LostQuorum`]; unavailable, and a not-leader
    /// answer with no hint on the wire, see [`Error::wire_kind`]).
    #[error("{0}")]
    LostQuorum(String),
    /// A committed step was released ([`Reason::Released`]; not found, for good).
    #[error("{0}")]
    Released(String),
    /// A server is not there ([`Reason::ServerGone`]; unavailable).
    #[error("{0}")]
    ServerGone(String),
    /// Drained steps that are not this cluster's ([`Reason::ForeignDrain`]; already exists).
    #[error("{0}")]
    ForeignDrain(String),
    /// A symlink or another uid's entry below a drain folder ([`Reason::UnsafePath`]; config).
    #[error("{0}")]
    UnsafePath(String),
    /// An operating-system I/O error, with what was being done.
    #[error("{context}: {source}")]
    Io {
        /// What Cairn was doing, e.g. "writing block of 'pressure' to data/rank-000003.bin".
        context: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// The public kind of this error.
    pub fn kind(&self) -> ErrorKind {
        match self {
            Error::NotFound(_) => ErrorKind::NotFound,
            Error::AlreadyExists(_) => ErrorKind::AlreadyExists,
            Error::Conflict(_) => ErrorKind::Conflict,
            Error::Unavailable(_) => ErrorKind::Unavailable,
            Error::Corrupt(_) => ErrorKind::Corrupt,
            Error::InvalidArgument(_) => ErrorKind::InvalidArgument,
            Error::Config(_) => ErrorKind::Config,
            Error::Capacity(_) => ErrorKind::Capacity,
            Error::DataLoss(_) => ErrorKind::DataLoss,
            Error::NotLeader { .. } => ErrorKind::NotLeader,
            Error::LostQuorum(_) => ErrorKind::Unavailable,
            Error::StepInFlight(_) => ErrorKind::Conflict,
            Error::Released(_) => ErrorKind::NotFound,
            Error::ServerGone(_) => ErrorKind::Unavailable,
            Error::ForeignDrain(_) => ErrorKind::AlreadyExists,
            Error::UnsafePath(_) => ErrorKind::Config,
            Error::Io { source, .. } => match source.kind() {
                std::io::ErrorKind::NotFound => ErrorKind::NotFound,
                std::io::ErrorKind::AlreadyExists => ErrorKind::AlreadyExists,
                std::io::ErrorKind::InvalidData | std::io::ErrorKind::UnexpectedEof => ErrorKind::Corrupt,
                _ => ErrorKind::Unavailable,
            },
        }
    }

    /// Builds an error of `kind` (used to rebuild errors that crossed the network).
    pub fn from_kind(kind: ErrorKind, message: String) -> Self {
        match kind {
            ErrorKind::NotFound => Error::NotFound(message),
            ErrorKind::AlreadyExists => Error::AlreadyExists(message),
            ErrorKind::Conflict => Error::Conflict(message),
            ErrorKind::Unavailable | ErrorKind::StaleEpoch | ErrorKind::NotLeader | ErrorKind::Busy => Error::Unavailable(message),
            ErrorKind::Corrupt => Error::Corrupt(message),
            ErrorKind::InvalidArgument => Error::InvalidArgument(message),
            ErrorKind::Config => Error::Config(message),
            ErrorKind::Capacity => Error::Capacity(message),
            ErrorKind::DataLoss => Error::DataLoss(message),
        }
    }

    /// The kind an error reply carries: a lost quorum goes as `not_leader` (with no hint), so
    /// that clients look for a leader elsewhere before they give up.
    pub fn wire_kind(&self) -> ErrorKind {
        match self {
            Error::LostQuorum(_) => ErrorKind::NotLeader,
            e => e.kind(),
        }
    }

    /// The typed reason of this error, for the errors callers act on.
    pub fn reason(&self) -> Option<Reason> {
        match self {
            Error::StepInFlight(_) => Some(Reason::StepInFlight),
            Error::LostQuorum(_) => Some(Reason::LostQuorum),
            Error::Released(_) => Some(Reason::Released),
            Error::ServerGone(_) => Some(Reason::ServerGone),
            Error::ForeignDrain(_) => Some(Reason::ForeignDrain),
            Error::UnsafePath(_) => Some(Reason::UnsafePath),
            _ => None,
        }
    }

    /// Rebuilds an error that crossed the network from its kind, typed reason and message.
    pub fn from_wire(kind: ErrorKind, reason: Option<Reason>, message: String) -> Self {
        match reason {
            Some(Reason::StepInFlight) => Error::StepInFlight(message),
            Some(Reason::LostQuorum) => Error::LostQuorum(message),
            Some(Reason::Released) => Error::Released(message),
            Some(Reason::ServerGone) => Error::ServerGone(message),
            Some(Reason::ForeignDrain) => Error::ForeignDrain(message),
            Some(Reason::UnsafePath) => Error::UnsafePath(message),
            Some(Reason::StaleEpoch) | None => Error::from_kind(kind, message),
        }
    }

    /// The same error again, for another waiter (errors are not `Clone`: an I/O error's source
    /// is not): same kind and message, and a leader hint survives.
    pub fn duplicate(&self) -> Error {
        match self {
            Error::NotLeader { message, leader } => Error::NotLeader { message: message.clone(), leader: *leader },
            e => Error::from_wire(e.kind(), e.reason(), e.to_string()),
        }
    }

    /// Wraps an I/O error with what was being done.
    pub fn io(context: impl Into<String>, source: std::io::Error) -> Self {
        Error::Io { context: context.into(), source }
    }
}

/// Result with Cairn's [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Attaches context to an I/O result.
pub trait IoContext<T> {
    /// Maps an I/O error into [`Error::Io`] with a lazily built context.
    fn ctx(self, context: impl FnOnce() -> String) -> Result<T>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn ctx(self, context: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|e| Error::io(context(), e))
    }
}
