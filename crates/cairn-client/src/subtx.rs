//! Sub-transactions (D²T): every box put in a step is one. A put whose bytes could not be stored
//! (a full or failed server, a disk that refused the write) is kept as a failure of its step,
//! which then does not commit until that box is put again (the application retries it) or the
//! step is aborted: a step is never partly visible.

use cairn_core::{Error, ErrorKind, Region};

/// A put of the open step that could not be stored.
#[derive(Debug, Clone, PartialEq)]
pub struct FailedPut {
    /// The variable.
    pub var: String,
    /// The box (local variables: offset zero).
    pub region: Region,
    /// Servers that refused or did not answer (none for the file engine: its disk).
    pub servers: Vec<u32>,
    /// Why, as the put's error said.
    pub error: String,
    /// The kind of that error.
    pub kind: ErrorKind,
}

impl FailedPut {
    /// The failure `e` of a put of `region` of `var` on `servers`.
    pub(crate) fn new(var: String, region: Region, servers: Vec<u32>, e: &Error) -> FailedPut {
        FailedPut { var, region, servers, error: e.to_string(), kind: e.kind() }
    }
}

/// The failed puts of the open step.
#[derive(Debug, Default)]
pub(crate) struct Failures(Vec<FailedPut>);

impl Failures {
    /// Whether an error of `kind` means the bytes could not be stored (worth a retry), rather
    /// than a request that is wrong.
    pub(crate) fn is_storage(kind: ErrorKind) -> bool {
        matches!(kind, ErrorKind::Capacity | ErrorKind::Unavailable)
    }

    /// Records a failed put of `region` of `var` (a local variable's block replaces its last).
    pub(crate) fn failed(&mut self, put: FailedPut, local: bool) {
        self.stored(&put.var, &put.region, local);
        self.0.push(put);
    }

    /// A put of `region` of `var` was stored: its earlier failure is retried.
    pub(crate) fn stored(&mut self, var: &str, region: &Region, local: bool) {
        self.0.retain(|f| !(f.var == var && (local || f.region == *region)));
    }

    pub(crate) fn clear(&mut self) {
        self.0.clear();
    }

    pub(crate) fn list(&self) -> &[FailedPut] {
        &self.0
    }

    /// Why `step` may not end while puts failed.
    pub(crate) fn refusal(&self, step: u64) -> Option<Error> {
        let first = self.0.first()?;
        let mut vars: Vec<&str> = self.0.iter().map(|f| f.var.as_str()).collect();
        vars.dedup();
        Some(Error::Conflict(format!(
            "step {step} is not committed: {} put(s) of {} could not be stored (first: {}); put those boxes again and \
             end the step, or abort it",
            self.0.len(),
            vars.join(", "),
            first.error
        )))
    }
}
