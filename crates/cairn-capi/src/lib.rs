//! The C ABI of Cairn (`libcairn`), a thin layer over `cairn-client`: every function returns a
//! [`Status`] and, on failure, leaves a message for [`cairn_last_error`]. Panics never cross the
//! boundary. The header `include/cairn.h` is generated from this file by cbindgen.
//!
//! # Layout
//! - this file: the handle type, status codes, the last-error slot and the functions.
//! - `claims`: D²T claimers and consume-and-produce commits.
//! - `halt`: the job's request to stop (one process's, and one every rank agrees on) and the
//!   wait for the last checkpoint on disk.
//! - `overrides`: [`cairn_open`] with settings that win over the configuration, as
//!   `cairn.open`'s keyword arguments.
//! - `inquiry`: the variables of a step and whether the writers closed the dataset (what
//!   ADIOS2's plugin engine asks).
//! - `mpi`: the communicator of [`cairn_open_mpi`], through a shim built against the program's MPI.

use cairn_client::{Config, DType, Error, ErrorKind, Reader, Writer};
use std::cell::RefCell;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, OnceLock};

pub mod claims;
pub mod halt;
pub mod inquiry;
pub mod mpi;
pub mod overrides;

/// Result of every call. `OK` is 0; other values name the kind of failure.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    /// Success.
    CairnOk = 0,
    /// A variable, step, writer or dataset does not exist.
    CairnErrNotFound = 1,
    /// The thing to create exists already (a committed step, a dataset).
    CairnErrAlreadyExists = 2,
    /// The request contradicts earlier writes (overlap, redefinition, step order).
    CairnErrConflict = 3,
    /// A resource is gone or full (server, disk, memory).
    CairnErrUnavailable = 4,
    /// Stored data failed a checksum or does not parse.
    CairnErrCorrupt = 5,
    /// The request is malformed (null pointer, shape, dtype, box out of bounds).
    CairnErrInvalidArgument = 6,
    /// The configuration is wrong.
    CairnErrConfig = 7,
    /// A bug in Cairn (a caught panic); please report it with the message.
    CairnErrInternal = 8,
    /// A staging server's memory limit would be exceeded; release old steps and retry.
    CairnErrCapacity = 9,
    /// Committed data is gone: every server holding a copy failed.
    CairnErrDataLoss = 10,
}

/// An open dataset: a writer (mode "w" or "a") or a reader (mode "r").
pub enum CairnFile {
    /// Write handle, with the communicator of [`cairn_open_mpi`] (freed after the writer) and
    /// what its read calls use (a restart reads its state through the handle it goes on with).
    W(Box<Writer>, Option<Arc<mpi::Comm>>, Box<LaterReader>),
    /// Read handle (shared with its claimers' heartbeats).
    R(Arc<Reader>),
}

/// The reader of a write handle, opened at its first read call: a writer that never reads
/// costs no second connection.
pub struct LaterReader {
    name: String,
    cfg: Config,
    reader: OnceLock<Arc<Reader>>,
}

impl LaterReader {
    fn get(&self) -> Result<&Arc<Reader>, Error> {
        if let Some(r) = self.reader.get() {
            return Ok(r);
        }
        let r = Arc::new(Reader::open(&self.name, &self.cfg)?);
        Ok(self.reader.get_or_init(|| r))
    }
}

thread_local! {
    static LAST: RefCell<CString> = RefCell::new(CString::default());
    /// The typed reason of the last failure (`""`: none).
    static LAST_CODE: RefCell<&'static CStr> = const { RefCell::new(c"") };
}

fn fail(kind: Status, msg: String) -> Status {
    fail_with(kind, msg, None)
}

pub(crate) fn fail_with(kind: Status, msg: String, reason: Option<cairn_core::Reason>) -> Status {
    LAST.with(|l| *l.borrow_mut() = CString::new(msg.replace('\0', " ")).unwrap_or_default());
    LAST_CODE.with(|c| *c.borrow_mut() = reason.map_or(c"", cairn_core::Reason::c_code));
    kind
}

pub(crate) fn status(r: Result<(), Error>) -> Status {
    match r {
        Ok(()) => Status::CairnOk,
        Err(e) => {
            let kind = match e.kind() {
                ErrorKind::NotFound => Status::CairnErrNotFound,
                ErrorKind::AlreadyExists => Status::CairnErrAlreadyExists,
                ErrorKind::Conflict => Status::CairnErrConflict,
                ErrorKind::Unavailable | ErrorKind::StaleEpoch | ErrorKind::NotLeader | ErrorKind::Busy => Status::CairnErrUnavailable,
                ErrorKind::Corrupt => Status::CairnErrCorrupt,
                ErrorKind::InvalidArgument => Status::CairnErrInvalidArgument,
                ErrorKind::Config => Status::CairnErrConfig,
                ErrorKind::Capacity => Status::CairnErrCapacity,
                ErrorKind::DataLoss => Status::CairnErrDataLoss,
            };
            fail_with(kind, e.to_string(), e.reason())
        }
    }
}

/// Runs `f`, converting errors and panics into a status.
pub(crate) fn guard(f: impl FnOnce() -> Result<(), Error>) -> Status {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => status(r),
        Err(_) => fail(Status::CairnErrInternal, "internal error (panic) in Cairn; please report it".into()),
    }
}

pub(crate) fn invalid(msg: &str) -> Error {
    Error::InvalidArgument(msg.to_string())
}

/// # Safety
/// `p` is null or a NUL-terminated string.
pub(crate) unsafe fn text<'a>(p: *const c_char, what: &str) -> Result<&'a str, Error> {
    if p.is_null() {
        return Err(invalid(&format!("{what} is NULL")));
    }
    // SAFETY: the caller passes a NUL-terminated string.
    unsafe { CStr::from_ptr(p) }.to_str().map_err(|_| invalid(&format!("{what} is not UTF-8")))
}

/// # Safety
/// `p` is null or points to `n` values.
unsafe fn dims<'a>(p: *const u64, n: c_int, what: &str) -> Result<&'a [u64], Error> {
    if n < 0 || n as usize > cairn_core::MAX_DIMS {
        return Err(invalid(&format!("{what}: ndim {n} is outside 0 to {}", cairn_core::MAX_DIMS)));
    }
    if n == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(invalid(&format!("{what} is NULL")));
    }
    // SAFETY: the caller passes `n` values.
    Ok(unsafe { std::slice::from_raw_parts(p, n as usize) })
}

/// # Safety
/// `f` is null or a handle from [`cairn_open`].
pub(crate) unsafe fn writer<'a>(f: *mut CairnFile) -> Result<&'a mut Writer, Error> {
    // SAFETY: the caller passes a live handle.
    match unsafe { f.as_mut() } {
        Some(CairnFile::W(w, ..)) => Ok(&mut **w),
        Some(CairnFile::R(_)) => Err(invalid("this handle was opened for reading (mode \"r\"); open with \"w\" or \"a\" to write")),
        None => Err(invalid("file handle is NULL")),
    }
}

/// The message of the last failed call on this thread (empty if none). Valid until the next call.
#[no_mangle]
pub extern "C" fn cairn_last_error() -> *const c_char {
    LAST.with(|l| l.borrow().as_ptr())
}

/// The typed reason of the last failed call on this thread, as Python's `e.code` has it: one of
/// `"step_in_flight"`, `"lost_quorum"`, `"stale_epoch"`, `"released"`, `"server_gone"`,
/// `"foreign_drain"`, `"unsafe_path"`, or `""` when the failure had none. Valid until the next
/// call, as [`cairn_last_error`].
#[no_mangle]
pub extern "C" fn cairn_last_error_code() -> *const c_char {
    LAST_CODE.with(|c| c.borrow().as_ptr())
}

/// Opens dataset `name`. `mode` is "w" (new), "a" (add steps) or "r" (read); a write handle reads
/// committed steps too ([`cairn_steps`], [`cairn_get`], …: a restart opens "a", reads its state at
/// [`cairn_next_step`] − 1 and goes on). `config` is the path of a cairn.toml, or TOML text itself
/// (text holding a newline or `=`, e.g. `"engine = \"file\"\npath = \"out\""`), or NULL for
/// $CAIRN_CONFIG / ./cairn.toml / defaults. Writers are `rank` of
/// `nranks`; readers ignore both. Ranks of one launch are told apart from a crashed earlier run by
/// their session: `$CAIRN_SESSION`, else the launcher's (PMIx namespace, Slurm step), else for a
/// single writer a random one; several writers without one are refused. On success `*out` holds a
/// handle to pass to [`cairn_close`].
///
/// # Safety
/// String arguments are NUL-terminated or NULL (`config` only); `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn cairn_open(
    name: *const c_char,
    mode: *const c_char,
    config: *const c_char,
    rank: c_int,
    nranks: c_int,
    out: *mut *mut CairnFile,
) -> Status {
    // SAFETY: per this function's contract.
    unsafe {
        open_with(name, mode, config, &[], out, |name, cfg, append| {
            if rank < 0 || nranks < 1 || rank >= nranks {
                return Err(invalid(&format!("rank {rank} of {nranks}: need 0 <= rank < nranks")));
            }
            let session = cairn_client::session::default_session(rank as u32, nranks as u32)?;
            Ok((Writer::open(name, cfg, rank as u32, nranks as u32, append, &session)?, None))
        })
    }
}

/// The checks and the reader of [`cairn_open`] and [`cairn_open_mpi`]; `writer` opens a
/// writer (mode "w" or "a": `append`); `overrides` win over the configuration.
///
/// # Safety
/// As [`cairn_open`].
unsafe fn open_with(
    name: *const c_char,
    mode: *const c_char,
    config: *const c_char,
    overrides: &[(String, String)],
    out: *mut *mut CairnFile,
    writer: impl FnOnce(&str, &Config, bool) -> Result<(Writer, Option<Arc<mpi::Comm>>), Error>,
) -> Status {
    guard(|| {
        // SAFETY: per this function's contract.
        let (name, mode) = unsafe { (text(name, "name")?, text(mode, "mode")?) };
        let cfg_path = if config.is_null() { None } else { Some(unsafe { text(config, "config") }?) };
        if out.is_null() {
            return Err(invalid("out (the handle pointer) is NULL"));
        }
        let cfg = config_of(cfg_path, overrides)?;
        let file = match mode {
            "r" => CairnFile::R(Arc::new(Reader::open(name, &cfg)?)),
            "w" | "a" => {
                let (w, comm) = writer(name, &cfg, mode == "a")?;
                let later = LaterReader { name: name.to_string(), cfg, reader: OnceLock::new() };
                CairnFile::W(Box::new(w), comm, Box::new(later))
            }
            m => return Err(invalid(&format!("mode {m:?}: use \"w\", \"a\" or \"r\""))),
        };
        // SAFETY: `out` was checked non-null and is valid for a write per the contract.
        unsafe { *out = Box::into_raw(Box::new(file)) };
        Ok(())
    })
}

/// The configuration `config` names: TOML text when it holds a newline or `=` (no file name of
/// a cairn.toml does), else a file's path; `None`: $CAIRN_CONFIG, ./cairn.toml, defaults. Then
/// `overrides` (keys as `cairn.open`'s keyword arguments).
fn config_of(config: Option<&str>, overrides: &[(String, String)]) -> Result<Config, Error> {
    match config {
        Some(text) if text.contains('\n') || text.contains('=') => {
            let mut cfg = Config::parse(text, "the config text")?;
            for (k, v) in overrides {
                cfg.set(k, v)?;
            }
            Ok(cfg)
        }
        path => Config::load(path.map(std::path::Path::new), overrides),
    }
}

/// Opens dataset `name` as [`cairn_open`] does, for the ranks of an MPI communicator: `comm` is
/// its Fortran handle (`MPI_Comm_c2f(comm)` in C, the integer itself in Fortran), so this header
/// needs no MPI. Collective: every rank of `comm` calls it (after `MPI_Init`). Writers take their
/// rank and count from `comm` and share a session rank 0 draws; with the `file` engine they write
/// as Python's `comm=` does: N→M aggregation (`[file] aggregation`, one data file per node by
/// default) and a collective commit (every rank calls [`cairn_end_step`], each returns once the
/// step is committed). [`cairn_close`] waits for every rank. Works with the MPI the program links
/// (Open MPI or MPICH): libcairn loads `libcairn_mpi_openmpi.so` or `libcairn_mpi_mpich.so` from
/// its own directory (or `$CAIRN_MPI_SHIM`). Readers (mode "r") ignore `comm`.
///
/// # Safety
/// As [`cairn_open`]; `comm` is a valid communicator handle of the MPI in this process.
#[no_mangle]
pub unsafe extern "C" fn cairn_open_mpi(
    name: *const c_char,
    mode: *const c_char,
    config: *const c_char,
    comm: i64,
    out: *mut *mut CairnFile,
) -> Status {
    // Writers attach to the communicator first (collective), and the ranks agree on the checks of
    // the arguments and the configuration before any other collective call, so a rank whose
    // checks fail never leaves the others waiting in one.
    // SAFETY: per this function's contract.
    let writing = matches!(unsafe { text(mode, "mode") }, Ok("w" | "a"));
    let attached = std::cell::Cell::new(if writing { Some(mpi::Comm::attach(comm)) } else { None });
    // SAFETY: per this function's contract.
    let status = unsafe {
        open_with(name, mode, config, &[], out, |name, cfg, append| {
            let comm = attached.take().expect("attached for writers")?;
            if !comm.all(true)? {
                return Err(Error::Unavailable("another rank of the communicator failed to open the dataset; see its error".into()));
            }
            let session = comm.bcast(&if comm.rank == 0 { cairn_client::session::random_session() } else { String::new() })?;
            let (rank, size) = (comm.rank, comm.size);
            let w = if cfg.engine == cairn_client::config::EngineKind::File && cfg.file.aggregation != "none" && size > 1 {
                let (nodes, poll) = comm.nodes()?;
                let exchange = Box::new(mpi::MpiExchange { comm: comm.clone(), poll });
                let group = cairn_client::file::Collective { exchange, nodes };
                // Collective: the ranks agree on the outcome before returning.
                Writer::open_collective(name, cfg, rank, size, append, &session, group)?
            } else {
                let opened = Writer::open(name, cfg, rank, size, append, &session);
                // Every rank learns whether all opened, so none goes on to a step alone.
                let all = comm.all(opened.is_ok())?;
                match opened {
                    Ok(w) if all => w,
                    Ok(_) => {
                        return Err(Error::Unavailable("another rank of the communicator failed to open the dataset; see its error".into()))
                    }
                    Err(e) => return Err(e),
                }
            };
            Ok((w, Some(comm)))
        })
    };
    // This rank's checks failed before it got to the agreement: it tells the others.
    if let Some(Ok(comm)) = attached.take() {
        let _ = comm.all(false);
    }
    status
}

/// Defines a variable of element type `dtype` ("f8", "i4", "u1", "c16", …). A global array has
/// `ndim` dimensions of extents `shape`; pass `ndim` = -1 for a local (per-writer, ragged) variable.
/// It survives the staging cluster's default number of server failures (as Python's `define`).
///
/// # Safety
/// `f` is a write handle; strings are NUL-terminated; `shape` holds `ndim` values.
#[no_mangle]
pub unsafe extern "C" fn cairn_define(
    f: *mut CairnFile,
    name: *const c_char,
    dtype: *const c_char,
    ndim: c_int,
    shape: *const u64,
) -> Status {
    // SAFETY: per this function's contract, which is cairn_define_ex's without dims or attributes.
    unsafe { cairn_define_ex(f, name, dtype, ndim, shape, std::ptr::null(), std::ptr::null(), 0) }
}

/// The step constant variable `var` was written in, into `*step`: read it there with
/// [`cairn_get`]. A per-step variable is `CAIRN_ERR_INVALID_ARGUMENT`.
///
/// # Safety
/// `f` is an open handle (a write handle reads through a reader of its own); `var` is NUL-terminated; `step` points to a `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn cairn_constant_step(f: *mut CairnFile, var: *const c_char, step: *mut u64) -> Status {
    guard(|| {
        // SAFETY: per this function's contract.
        let r = unsafe { reader(f)? };
        if step.is_null() {
            return Err(invalid("step is NULL"));
        }
        let var = unsafe { text(var, "var")? };
        let s = r.constant_step(var)?;
        // SAFETY: checked non-null; valid for a write per the contract.
        unsafe { *step = s };
        Ok(())
    })
}

/// [`cairn_define`] with dimension names (`dim_names`: NULL, or `ndim` NUL-terminated names in C
/// order), attributes (`attrs_json`: NULL, or a JSON object such as `{"units": "K"}`) and
/// `constant` (non-zero: step-invariant, a coordinate or a mesh: written in one step only, the
/// first in which any rank puts it, a put in a later step being `CAIRN_ERR_CONFLICT`; read at the
/// step [`cairn_constant_step`] gives).
///
/// # Safety
/// `f` is a write handle; strings are NUL-terminated; `shape` (and `dims`, unless NULL) hold
/// `ndim` values.
#[no_mangle]
pub unsafe extern "C" fn cairn_define_ex(
    f: *mut CairnFile,
    name: *const c_char,
    dtype: *const c_char,
    ndim: c_int,
    shape: *const u64,
    dim_names: *const *const c_char,
    attrs_json: *const c_char,
    constant: c_int,
) -> Status {
    guard(|| {
        // SAFETY: per this function's contract.
        let w = unsafe { writer(f)? };
        let (name, dtype) = unsafe { (text(name, "name")?, text(dtype, "dtype")?) };
        if ndim < -1 || ndim > CAIRN_MAX_DIMS as c_int {
            return Err(invalid(&format!("ndim {ndim}: give -1 (a local variable) or 0 to CAIRN_MAX_DIMS ({CAIRN_MAX_DIMS}) dimensions")));
        }
        let shape = if ndim == -1 { None } else { Some(unsafe { dims(shape, ndim, "shape")? }.to_vec()) };
        let names = if dim_names.is_null() {
            None
        } else {
            let n = shape.as_ref().map_or(0, Vec::len);
            // SAFETY: `dim_names` holds `ndim` pointers to NUL-terminated strings.
            let ptrs = unsafe { std::slice::from_raw_parts(dim_names, n) };
            Some(ptrs.iter().map(|p| unsafe { text(*p, "a dimension name") }.map(str::to_string)).collect::<Result<Vec<_>, _>>()?)
        };
        let attrs = if attrs_json.is_null() {
            Default::default()
        } else {
            cairn_core::attrs::parse(unsafe { text(attrs_json, "attrs_json")? }, &format!("variable '{name}'"))?
        };
        let def =
            cairn_core::index::VarDef::new(name, DType::parse(dtype)?, shape)?.with_meta(names, attrs)?.with_constant(constant != 0)?;
        let level = w.default_redundancy();
        w.define_var(def.with_redundancy(level))
    })
}

/// [`cairn_put`] that first checks the data's element type `dtype` ("f8", "i4", …) against the
/// variable's (what typed bindings such as Fortran's pass), so a mismatch is an error, not a
/// misread buffer.
///
/// # Safety
/// As [`cairn_put`]; `dtype` is NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn cairn_put_typed(
    f: *mut CairnFile,
    var: *const c_char,
    dtype: *const c_char,
    data: *const c_void,
    ndim: c_int,
    offset: *const u64,
    count: *const u64,
) -> Status {
    let checked = guard(|| {
        // SAFETY: per this function's contract.
        let w = unsafe { writer(f)? };
        let (name, given) = unsafe { (text(var, "var")?, DType::parse(text(dtype, "dtype")?)?) };
        let defined = w.dtype_of(name)?;
        if given != defined {
            return Err(invalid(&format!("'{name}' is defined as {defined} but the data is {given}; pass an array of its type")));
        }
        Ok(())
    });
    if checked != Status::CairnOk {
        return checked;
    }
    // SAFETY: per this function's contract.
    unsafe { cairn_put(f, var, data, ndim, offset, count) }
}

/// The reader of a handle: a read handle's, or the one a write handle opens at its first read.
///
/// # Safety
/// `f` is null or a handle from [`cairn_open`].
pub(crate) unsafe fn reader<'a>(f: *mut CairnFile) -> Result<&'a Arc<Reader>, Error> {
    // SAFETY: per this function's contract.
    match unsafe { f.as_ref() } {
        Some(CairnFile::R(r)) => Ok(r),
        Some(CairnFile::W(_, _, later)) => later.get(),
        None => Err(invalid("file handle is NULL")),
    }
}

/// Where a writer resumes, into `*step`: the step after the last one committed when the handle
/// was opened (0 for a new dataset). A restart reads its state at `*step - 1`.
///
/// # Safety
/// `f` is a write handle; `step` points to a `uint64_t`.
#[no_mangle]
pub unsafe extern "C" fn cairn_next_step(f: *mut CairnFile, step: *mut u64) -> Status {
    guard(|| {
        // SAFETY: per this function's contract.
        let w = unsafe { writer(f)? };
        if step.is_null() {
            return Err(invalid("step is NULL"));
        }
        // SAFETY: checked non-null; valid for a write per the contract.
        unsafe { *step = w.next_step() };
        Ok(())
    })
}

/// Sets the dataset's attributes (a JSON object, e.g. `{"title": "run 1"}`), published with every
/// step this writer ends from now on.
///
/// # Safety
/// `f` is a write handle; `attrs_json` is NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn cairn_set_attrs(f: *mut CairnFile, attrs_json: *const c_char) -> Status {
    guard(|| {
        // SAFETY: per this function's contract.
        let w = unsafe { writer(f)? };
        w.set_attrs(cairn_core::attrs::parse(unsafe { text(attrs_json, "attrs_json")? }, "the dataset")?)
    })
}

/// Sets one attribute, `key` = `value_json` (a JSON value: `"\"K\""`, `"273.15"`, `"[1, 2]"`),
/// of variable `var` (defined, before its first committed step) or of the dataset (`var` NULL or
/// `""`). What Fortran's `cairn_set_attr` calls.
///
/// # Safety
/// `f` is a write handle; `var` is NULL or NUL-terminated; `key` and `value_json` are NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn cairn_set_attr(f: *mut CairnFile, var: *const c_char, key: *const c_char, value_json: *const c_char) -> Status {
    guard(|| {
        // SAFETY: per this function's contract.
        let w = unsafe { writer(f)? };
        let var = if var.is_null() { "" } else { unsafe { text(var, "var")? } };
        let (key, value) = unsafe { (text(key, "key")?, text(value_json, "value_json")?) };
        if key.is_empty() {
            return Err(invalid("attribute key is empty; give its name, e.g. \"units\""));
        }
        let value: serde_json::Value = serde_json::from_str(value)
            .map_err(|e| invalid(&format!("value of attribute '{key}' is not JSON ({e}): {value:?}; quote text, e.g. \"\\\"K\\\"\"")))?;
        w.set_attr((!var.is_empty()).then_some(var), key, value)
    })
}

/// The committed steps, sorted: the first `cap` of them into `steps` (NULL with `cap` 0 to count),
/// and how many there are into `*n`.
///
/// # Safety
/// `f` is an open handle (a write handle reads through a reader of its own); `steps` has room for `cap` values; `n` points to a `size_t`.
#[no_mangle]
pub unsafe extern "C" fn cairn_steps(f: *mut CairnFile, steps: *mut u64, cap: usize, n: *mut usize) -> Status {
    guard(|| {
        // SAFETY: per this function's contract.
        let r = unsafe { reader(f)? };
        if n.is_null() || (steps.is_null() && cap > 0) {
            return Err(invalid("n is NULL, or steps is NULL with cap > 0"));
        }
        let all = r.steps()?;
        for (i, s) in all.iter().take(cap).enumerate() {
            // SAFETY: `steps` has room for `cap` values.
            unsafe { *steps.add(i) = *s };
        }
        // SAFETY: checked non-null.
        unsafe { *n = all.len() };
        Ok(())
    })
}

/// Waits until `step` is committed or `timeout_s` seconds pass; `*committed` says which.
///
/// # Safety
/// `f` is an open handle (a write handle reads through a reader of its own); `committed` points to an `int`.
#[no_mangle]
pub unsafe extern "C" fn cairn_wait_step(f: *mut CairnFile, step: u64, timeout_s: f64, committed: *mut c_int) -> Status {
    guard(|| {
        // SAFETY: per this function's contract.
        let r = unsafe { reader(f)? };
        if committed.is_null() {
            return Err(invalid("committed is NULL"));
        }
        let t = std::time::Duration::try_from_secs_f64(timeout_s).map_err(|_| invalid("timeout_s must be a finite number >= 0"))?;
        let done = r.wait_step(step, t)?;
        // SAFETY: checked non-null.
        unsafe { *committed = c_int::from(done) };
        Ok(())
    })
}

/// A variable at committed `step`: its element type (NUL-terminated, into `dtype`, 8 bytes),
/// dimensions (`*ndim`, -1 for a local variable; extents into `shape`, room for
/// [`CAIRN_MAX_DIMS`]), and whether it is constant (`*constant`).
///
/// # Safety
/// `f` is an open handle (a write handle reads through a reader of its own); `var` is NUL-terminated; `dtype` has 8 bytes, `shape` room for
/// [`CAIRN_MAX_DIMS`] values;
/// `ndim` and `constant` point to `int`s.
#[no_mangle]
pub unsafe extern "C" fn cairn_var_info(
    f: *mut CairnFile,
    var: *const c_char,
    step: u64,
    dtype: *mut c_char,
    ndim: *mut c_int,
    shape: *mut u64,
    constant: *mut c_int,
) -> Status {
    guard(|| {
        // SAFETY: per this function's contract.
        let r = unsafe { reader(f)? };
        if dtype.is_null() || ndim.is_null() || shape.is_null() || constant.is_null() {
            return Err(invalid("dtype, ndim, shape and constant must not be NULL"));
        }
        let def = r.var(unsafe { text(var, "var")? }, step)?;
        let name = def.dtype.name().as_bytes();
        // SAFETY: the buffers have the sizes the contract gives (dtype names are at most 5 bytes).
        unsafe {
            std::ptr::copy_nonoverlapping(name.as_ptr().cast::<c_char>(), dtype, name.len().min(7));
            *dtype.add(name.len().min(7)) = 0;
            *ndim = def.shape.as_ref().map_or(-1, |s| s.len() as c_int);
            for (i, e) in def.shape.iter().flatten().take(CAIRN_MAX_DIMS).enumerate() {
                *shape.add(i) = *e;
            }
            *constant = c_int::from(def.constant);
        }
        Ok(())
    })
}

/// Reads the block writer `writer` put for local variable `var` at `step` into `out` (room for
/// `out_bytes` bytes, exactly the block's size).
///
/// # Safety
/// `f` is an open handle (a write handle reads through a reader of its own); `var` is NUL-terminated; `out` has room for `out_bytes` bytes.
#[no_mangle]
pub unsafe extern "C" fn cairn_get_local(
    f: *mut CairnFile,
    var: *const c_char,
    step: u64,
    writer: u32,
    out: *mut c_void,
    out_bytes: usize,
) -> Status {
    guard(|| {
        // SAFETY: per this function's contract.
        let r = unsafe { reader(f)? };
        if out.is_null() && out_bytes > 0 {
            return Err(invalid("out is NULL"));
        }
        let out = if out_bytes == 0 { &mut [][..] } else { unsafe { std::slice::from_raw_parts_mut(out as *mut u8, out_bytes) } };
        r.get_local(unsafe { text(var, "var")? }, step, writer, out)
    })
}

/// Most dimensions of a variable (the extent arrays of [`CairnBlock`]).
pub const CAIRN_MAX_DIMS: usize = 8;

/// One block a writer put: its box and statistics (NaN where undefined).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct CairnBlock {
    /// The writer rank that put it.
    pub writer: u32,
    /// Dimensions (`offset` and `count` hold this many).
    pub ndim: c_int,
    /// Where the block starts in the global array.
    pub offset: [u64; CAIRN_MAX_DIMS],
    /// Its extents.
    pub count: [u64; CAIRN_MAX_DIMS],
    /// Smallest, largest and mean value.
    pub min: f64,
    /// See `min`.
    pub max: f64,
    /// See `min`.
    pub mean: f64,
}

/// The blocks of `var` at committed `step`, sorted by writer then offset: the first `cap` into
/// `out` (NULL with `cap` 0 to count), how many there are into `*n`.
///
/// # Safety
/// `f` is an open handle (a write handle reads through a reader of its own); `var` is NUL-terminated; `out` has room for `cap` blocks; `n` points to a
/// `size_t`.
#[no_mangle]
pub unsafe extern "C" fn cairn_blocks(
    f: *mut CairnFile,
    var: *const c_char,
    step: u64,
    out: *mut CairnBlock,
    cap: usize,
    n: *mut usize,
) -> Status {
    guard(|| {
        // SAFETY: per this function's contract.
        let r = unsafe { reader(f)? };
        if n.is_null() || (out.is_null() && cap > 0) {
            return Err(invalid("n is NULL, or out is NULL with cap > 0"));
        }
        let blocks = r.blocks(unsafe { text(var, "var")? }, step)?;
        for (i, b) in blocks.iter().take(cap).enumerate() {
            let mut c = CairnBlock {
                writer: b.writer,
                ndim: b.region.offset.len() as c_int,
                offset: [0; CAIRN_MAX_DIMS],
                count: [0; CAIRN_MAX_DIMS],
                min: b.stats.min.unwrap_or(f64::NAN),
                max: b.stats.max.unwrap_or(f64::NAN),
                mean: b.stats.mean.unwrap_or(f64::NAN),
            };
            c.offset[..b.region.offset.len()].copy_from_slice(&b.region.offset);
            c.count[..b.region.count.len()].copy_from_slice(&b.region.count);
            // SAFETY: `out` has room for `cap` blocks.
            unsafe { *out.add(i) = c };
        }
        // SAFETY: checked non-null.
        unsafe { *n = blocks.len() };
        Ok(())
    })
}

/// Attributes as a JSON object: the dataset's (`var` NULL; as of the last committed step) or
/// variable `var`'s at committed `step`. The text (NUL-terminated) goes into `buf` when it fits
/// in `cap` bytes; `*len` is its length without the NUL either way, so a call with `cap` 0 sizes
/// the buffer.
///
/// # Safety
/// `f` is an open handle (a write handle reads through a reader of its own); `var` is NULL or NUL-terminated; `buf` has room for `cap` bytes; `len`
/// points to a `size_t`.
#[no_mangle]
pub unsafe extern "C" fn cairn_attrs(
    f: *mut CairnFile,
    var: *const c_char,
    step: u64,
    buf: *mut c_char,
    cap: usize,
    len: *mut usize,
) -> Status {
    guard(|| {
        // SAFETY: per this function's contract.
        let r = unsafe { reader(f)? };
        if len.is_null() || (buf.is_null() && cap > 0) {
            return Err(invalid("len is NULL, or buf is NULL with cap > 0"));
        }
        let attrs = if var.is_null() { r.attrs()? } else { r.var(unsafe { text(var, "var")? }, step)?.attrs };
        let json = serde_json::to_string(&attrs).map_err(|e| Error::Corrupt(format!("attributes do not serialize: {e}")))?;
        // SAFETY: checked non-null; `buf` has room for `cap` bytes.
        unsafe {
            *len = json.len();
            if json.len() < cap {
                std::ptr::copy_nonoverlapping(json.as_ptr().cast::<c_char>(), buf, json.len());
                *buf.add(json.len()) = 0;
            }
        }
        Ok(())
    })
}

/// Frees committed step `step` for every reader (its data is gone; later reads of it fail).
///
/// # Safety
/// `f` is an open handle (a write handle reads through a reader of its own).
#[no_mangle]
pub unsafe extern "C" fn cairn_release(f: *mut CairnFile, step: u64) -> Status {
    // SAFETY: per this function's contract.
    guard(|| unsafe { reader(f) }?.release(step))
}

/// Begins step `step`; it commits when every rank has called [`cairn_end_step`] for it.
///
/// # Safety
/// `f` is a write handle.
#[no_mangle]
pub unsafe extern "C" fn cairn_begin_step(f: *mut CairnFile, step: u64) -> Status {
    // SAFETY: per this function's contract.
    guard(|| unsafe { writer(f) }?.begin_step(step))
}

/// Puts a block of variable `var` (C order, the variable's element type): `ndim` extents in
/// `count`, at `offset` in the global array, or `offset` NULL for a local variable's block.
///
/// # Safety
/// `f` is a write handle; `data` holds the block; `offset` (unless NULL) and `count` hold `ndim` values.
#[no_mangle]
pub unsafe extern "C" fn cairn_put(
    f: *mut CairnFile,
    var: *const c_char,
    data: *const c_void,
    ndim: c_int,
    offset: *const u64,
    count: *const u64,
) -> Status {
    guard(|| {
        // SAFETY: per this function's contract.
        let w = unsafe { writer(f)? };
        let var = unsafe { text(var, "var")? };
        let count = unsafe { dims(count, ndim, "count")? };
        let offset = if offset.is_null() { None } else { Some(unsafe { dims(offset, ndim, "offset")? }) };
        let dtype = w.dtype_of(var)?;
        let len = count
            .iter()
            .try_fold(dtype.size() as u64, |n, &c| n.checked_mul(c))
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| invalid("count overflows the address space"))?;
        if data.is_null() && len > 0 {
            return Err(invalid("data is NULL"));
        }
        let bytes = if len == 0 { &[][..] } else { unsafe { std::slice::from_raw_parts(data as *const u8, len) } };
        w.put(var, dtype, bytes, offset, count)
    })
}

/// Appends trace records of `var` to the open step: `count[0]` records of extents
/// `count[1..ndim]`, element type `dtype` (`"f8"`, `"i4"` ...), any number per rank and step.
/// They are buffered and written every `trace_flush` steps (cairn.toml) as one write; a step
/// with buffered records commits at that flush, at the latest at [`cairn_close`]. The first
/// trace of `var` defines it as a local variable.
///
/// # Safety
/// `f` is a write handle; `var` and `dtype` are NUL-terminated; `count` holds `ndim` values and
/// `data` the records.
#[no_mangle]
pub unsafe extern "C" fn cairn_trace(
    f: *mut CairnFile,
    var: *const c_char,
    dtype: *const c_char,
    data: *const c_void,
    ndim: c_int,
    count: *const u64,
) -> Status {
    guard(|| {
        // SAFETY: per this function's contract.
        let w = unsafe { writer(f)? };
        let (var, dtype) = unsafe { (text(var, "var")?, DType::parse(text(dtype, "dtype")?)?) };
        let count = unsafe { dims(count, ndim, "count")? };
        let len = count
            .iter()
            .try_fold(dtype.size() as u64, |n, &c| n.checked_mul(c))
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| invalid("count overflows the address space"))?;
        if data.is_null() && len > 0 {
            return Err(invalid("data is NULL"));
        }
        let bytes = if len == 0 { &[][..] } else { unsafe { std::slice::from_raw_parts(data as *const u8, len) } };
        w.trace(var, dtype, bytes, count)
    })
}

/// Writes buffered trace records now and commits the steps that waited for them.
///
/// # Safety
/// `f` is a write handle.
#[no_mangle]
pub unsafe extern "C" fn cairn_flush_traces(f: *mut CairnFile) -> Status {
    // SAFETY: per this function's contract.
    guard(|| unsafe { writer(f) }?.flush_traces())
}

/// Ends the open step. Refused with `CAIRN_ERR_CONFLICT` while a put of the step could not be
/// stored (its own call returned the error) and was not put again: put those blocks again and end
/// the step, or drop it with [`cairn_abort_step`]. The step stays invisible meanwhile.
///
/// # Safety
/// `f` is a write handle.
#[no_mangle]
pub unsafe extern "C" fn cairn_end_step(f: *mut CairnFile) -> Status {
    // SAFETY: per this function's contract.
    guard(|| unsafe { writer(f) }?.end_step().map(|_| ()))
}

/// Drops the open step and everything put in it; nothing of it becomes visible.
///
/// # Safety
/// `f` is a write handle.
#[no_mangle]
pub unsafe extern "C" fn cairn_abort_step(f: *mut CairnFile) -> Status {
    // SAFETY: per this function's contract.
    guard(|| unsafe { writer(f) }?.abort_step())
}

/// Reads the box `offset + count` (`ndim` values each) of `var` at committed `step` into `out`,
/// which has room for `out_bytes` bytes (the box's element count × element size).
///
/// # Safety
/// `f` is an open handle (a write handle reads through a reader of its own); `offset` and `count` hold `ndim` values; `out` holds `out_bytes` bytes.
#[no_mangle]
pub unsafe extern "C" fn cairn_get(
    f: *mut CairnFile,
    var: *const c_char,
    step: u64,
    ndim: c_int,
    offset: *const u64,
    count: *const u64,
    out: *mut c_void,
    out_bytes: usize,
) -> Status {
    guard(|| {
        // SAFETY: per this function's contract.
        let r = unsafe { reader(f)? };
        let var = unsafe { text(var, "var")? };
        let (offset, count) = unsafe { (dims(offset, ndim, "offset")?, dims(count, ndim, "count")?) };
        if out.is_null() && out_bytes > 0 {
            return Err(invalid("out is NULL"));
        }
        let out = if out_bytes == 0 { &mut [][..] } else { unsafe { std::slice::from_raw_parts_mut(out as *mut u8, out_bytes) } };
        r.get(var, step, offset, count, out)
    })
}

/// Closes the handle and frees it. A writer's open step is abandoned (and reported).
///
/// # Safety
/// `f` is NULL or a handle from [`cairn_open`], not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn cairn_close(f: *mut CairnFile) -> Status {
    if f.is_null() {
        return Status::CairnOk;
    }
    // SAFETY: per this function's contract, `f` came from Box::into_raw in cairn_open.
    let file = unsafe { Box::from_raw(f) };
    guard(move || match *file {
        CairnFile::W(w, None, _) => w.close(),
        CairnFile::W(w, Some(comm), _) => {
            // Every rank reaches the barrier, so one rank's error (or a panic, caught here: an
            // unwind would free the communicator while the others wait in the barrier) never
            // leaves the others waiting; then every step any rank ended is committed. The writer
            // (holding the exchange) goes before the communicator's last holder frees it.
            let closed = catch_unwind(AssertUnwindSafe(|| w.close()))
                .unwrap_or_else(|_| Err(Error::Corrupt("internal error (panic) in Cairn while closing; please report it".into())));
            let met = comm.barrier();
            closed.and(met)
        }
        CairnFile::R(_) => Ok(()),
    })
}

/// Starts a local staging cluster of `servers` server processes (the `cairn-server` binary:
/// `$CAIRN_SERVER`, else beside the program, else on `PATH`) with `memory` each (e.g. "4GiB"),
/// writing its cluster file to `file`; returns once every server answers. Name `file` as
/// `[staging] cluster` (or the `cluster` override) to use it; stop it with [`cairn_cluster_stop`].
///
/// # Safety
/// `file` and `memory` are NUL-terminated strings.
#[no_mangle]
pub unsafe extern "C" fn cairn_cluster_start(file: *const c_char, servers: u32, memory: *const c_char) -> Status {
    guard(|| {
        // SAFETY: the caller passes NUL-terminated strings.
        let (file, memory) = unsafe { (text(file, "file")?, text(memory, "memory")?) };
        let memory = cairn_proto::cluster::parse_size(memory)?;
        cairn_client::staging::local::LocalCluster::start(&cairn_client::staging::local::LaunchOptions::new(
            std::path::Path::new(file),
            servers,
            memory,
        ))
        .map(drop)
    })
}

/// Stops the staging cluster whose cluster file is `file` (servers that do not answer are killed)
/// and removes the file.
///
/// # Safety
/// `file` is a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn cairn_cluster_stop(file: *const c_char) -> Status {
    guard(|| {
        // SAFETY: the caller passes a NUL-terminated string.
        let file = unsafe { text(file, "file")? };
        cairn_client::staging::local::LocalCluster::stop(std::path::Path::new(file), std::time::Duration::from_secs(10)).map(|_| ())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn code() -> String {
        // SAFETY: a NUL-terminated string that lives until the next call on this thread.
        unsafe { CStr::from_ptr(cairn_last_error_code()) }.to_string_lossy().into_owned()
    }

    #[test]
    fn the_last_errors_typed_reason_is_its_code_and_empty_without_one() {
        assert_eq!(status(Err(Error::ForeignDrain("another run's step".into()))), Status::CairnErrAlreadyExists);
        assert_eq!(code(), "foreign_drain");
        assert_eq!(status(Err(Error::Released("gone".into()))), Status::CairnErrNotFound);
        assert_eq!(code(), cairn_core::Reason::Released.code());
        assert_eq!(status(Err(Error::NotFound("no such variable".into()))), Status::CairnErrNotFound);
        assert_eq!(code(), "");
    }
}
