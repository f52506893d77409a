//! `cairn_open_mpi`'s communicator. libcairn links no MPI: the program's MPI (Open MPI or MPICH,
//! told apart by `MPI_Get_library_version`) is reached through a small shim compiled against
//! each (`mpi/cairn_mpi.c`, `libcairn_mpi_<flavour>.so` beside libcairn.so, or
//! `$CAIRN_MPI_SHIM`), loaded on first use. Over it: each rank's node, a broadcast of the
//! session, and the [`Exchange`] of the file engine's N→M aggregation (as mpi4py is in Python).

use cairn_client::file::{Exchange, Received};
use cairn_client::{Error, Result};
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::{Arc, OnceLock};

type Handle = *mut c_void;

/// The shim's functions (see `mpi/cairn_mpi.c`); each returns an MPI error code.
struct Shim {
    attach: unsafe extern "C" fn(i64, *mut Handle, *mut c_int, *mut c_int) -> c_int,
    nodes: unsafe extern "C" fn(Handle, *mut u32, *mut c_int) -> c_int,
    bcast: unsafe extern "C" fn(Handle, *mut c_char, *mut i64, i64) -> c_int,
    all: unsafe extern "C" fn(Handle, c_int, *mut c_int) -> c_int,
    send: unsafe extern "C" fn(Handle, u32, *const c_void, c_int) -> c_int,
    probe: unsafe extern "C" fn(Handle, u32, c_int, *mut c_int) -> c_int,
    recv: unsafe extern "C" fn(Handle, u32, *mut c_void, c_int) -> c_int,
    start: unsafe extern "C" fn(Handle, u64, c_int, *mut c_int) -> c_int,
    reserve: unsafe extern "C" fn(Handle, u32, u64, *mut u64) -> c_int,
    barrier: unsafe extern "C" fn(Handle) -> c_int,
    error: unsafe extern "C" fn(c_int, *mut c_char, c_int),
    free: unsafe extern "C" fn(Handle),
}

fn dl_error() -> String {
    // SAFETY: dlerror returns NULL or a NUL-terminated string.
    let e = unsafe { libc::dlerror() };
    if e.is_null() {
        "unknown error".into()
    } else {
        unsafe { CStr::from_ptr(e) }.to_string_lossy().into_owned()
    }
}

/// The MPI in this process, from its version text: "openmpi" or "mpich" (MVAPICH and Intel MPI
/// share MPICH's ABI).
fn flavour() -> std::result::Result<&'static str, String> {
    // SAFETY: a lookup in the process's global symbols; the signature is MPI's, the same in both.
    let sym = unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"MPI_Get_library_version".as_ptr()) };
    if sym.is_null() {
        return Err("no MPI library in this process: link the program with MPI (mpicc/mpifort) and call MPI_Init first".into());
    }
    let version: unsafe extern "C" fn(*mut c_char, *mut c_int) -> c_int = unsafe { std::mem::transmute(sym) };
    let mut text = vec![0 as c_char; 8192]; // MPI_MAX_LIBRARY_VERSION_STRING is 256 (Open MPI) to 8192 (MPICH)
    let mut len: c_int = 0;
    // SAFETY: `text` holds the largest version text either MPI writes.
    unsafe { version(text.as_mut_ptr(), &mut len) };
    let text = unsafe { CStr::from_ptr(text.as_ptr()) }.to_string_lossy().into_owned();
    if text.contains("Open MPI") {
        Ok("openmpi")
    } else if ["MPICH", "MVAPICH", "Intel"].iter().any(|m| text.contains(m)) {
        Ok("mpich")
    } else {
        Err(format!("unsupported MPI '{}': Cairn's C/Fortran comm support knows Open MPI and MPICH", text.lines().next().unwrap_or("")))
    }
}

/// The directory libcairn was loaded from (the program's, when linked statically).
fn library_dir() -> Option<std::path::PathBuf> {
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr only reads the address of one of this library's functions.
    if unsafe { libc::dladdr(crate::cairn_open_mpi as *const c_void, &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    let file = unsafe { CStr::from_ptr(info.dli_fname) }.to_str().ok()?;
    let file = std::fs::canonicalize(file).ok()?;
    file.parent().map(|p| p.to_path_buf())
}

// Each `sym!` transmutes to the type of the `Shim` field it fills.
#[allow(clippy::missing_transmute_annotations)]
fn load() -> std::result::Result<Shim, String> {
    let flavour = flavour()?;
    let path = match std::env::var_os("CAIRN_MPI_SHIM") {
        Some(p) => std::path::PathBuf::from(p),
        None => library_dir()
            .ok_or("cannot tell where libcairn was loaded from; set $CAIRN_MPI_SHIM")?
            .join(format!("libcairn_mpi_{flavour}.so")),
    };
    let c = CString::new(path.to_string_lossy().as_bytes()).map_err(|_| "the shim's path holds NUL".to_string())?;
    // SAFETY: loading a library Cairn built; its initialisers only set up the C runtime.
    let lib = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if lib.is_null() {
        return Err(format!(
            "cannot load {} ({}): it is built with {flavour}'s mpicc by `make build` (scripts/build_mpi.sh) and installed beside libcairn.so",
            path.display(),
            dl_error()
        ));
    }
    macro_rules! sym {
        ($name:literal) => {{
            // SAFETY: the shim defines each symbol with the signature of its field in `Shim`.
            let p = unsafe { libc::dlsym(lib, concat!($name, "\0").as_ptr() as *const c_char) };
            if p.is_null() {
                return Err(format!("{} lacks {}: rebuild it (scripts/build_mpi.sh)", path.display(), $name));
            }
            unsafe { std::mem::transmute::<*mut c_void, _>(p) }
        }};
    }
    // The library stays loaded for the life of the process (never dlclose'd).
    Ok(Shim {
        attach: sym!("cairn_mpi_attach"),
        nodes: sym!("cairn_mpi_nodes"),
        bcast: sym!("cairn_mpi_bcast"),
        all: sym!("cairn_mpi_all"),
        send: sym!("cairn_mpi_send"),
        probe: sym!("cairn_mpi_probe"),
        recv: sym!("cairn_mpi_recv"),
        start: sym!("cairn_mpi_start"),
        reserve: sym!("cairn_mpi_reserve"),
        barrier: sym!("cairn_mpi_barrier"),
        error: sym!("cairn_mpi_error"),
        free: sym!("cairn_mpi_free"),
    })
}

fn shim() -> Result<&'static Shim> {
    static SHIM: OnceLock<std::result::Result<Shim, String>> = OnceLock::new();
    SHIM.get_or_init(load).as_ref().map_err(|e| Error::Config(format!("cairn_open_mpi: {e}")))
}

/// A duplicate of the program's communicator (freed, collectively, when the last holder drops).
pub struct Comm {
    shim: &'static Shim,
    h: Handle,
    /// This rank and the communicator's size.
    pub rank: u32,
    /// Number of ranks.
    pub size: u32,
}

// SAFETY: the handle is used by one thread at a time: the one calling the C API on this file
// (MPI's THREAD_SINGLE and FUNNELED need no more when that is the main thread).
unsafe impl Send for Comm {}
unsafe impl Sync for Comm {}

/// Messages of more bytes than this go in pieces (MPI counts are `int`); a piece shorter than
/// it ends a message.
const PIECE: usize = 1 << 30;

impl Comm {
    /// Duplicates the communicator whose Fortran handle is `fcomm` (collective).
    pub(crate) fn attach(fcomm: i64) -> Result<Arc<Comm>> {
        let shim = shim()?;
        let (mut h, mut rank, mut size) = (std::ptr::null_mut(), 0, 0);
        // SAFETY: out-pointers to locals.
        let rc = unsafe { (shim.attach)(fcomm, &mut h, &mut rank, &mut size) };
        if rc != 0 {
            return Err(Error::InvalidArgument(format!(
                "comm {fcomm}: {} (pass MPI_Comm_c2f(comm), or MPI_COMM_WORLD from Fortran, after MPI_Init)",
                error_text(shim, rc)
            )));
        }
        Ok(Arc::new(Comm { shim, h, rank: rank as u32, size: size as u32 }))
    }

    fn check(&self, rc: c_int, what: impl FnOnce() -> String) -> Result<()> {
        if rc == 0 {
            return Ok(());
        }
        Err(Error::Unavailable(format!("{}: {} (an MPI rank of this job failed?)", what(), error_text(self.shim, rc))))
    }

    /// Each rank's node id, and whether this node has more ranks than cores.
    pub(crate) fn nodes(&self) -> Result<(Vec<u32>, bool)> {
        let mut nodes = vec![0u32; self.size as usize];
        let mut over = 0;
        // SAFETY: `nodes` holds one entry per rank.
        self.check(unsafe { (self.shim.nodes)(self.h, nodes.as_mut_ptr(), &mut over) }, || "finding each rank's node".into())?;
        Ok((nodes, over != 0))
    }

    /// Rank 0's `text` on every rank (others pass anything).
    pub(crate) fn bcast(&self, text: &str) -> Result<String> {
        const CAP: usize = 4096;
        let mut buf = vec![0u8; CAP];
        let mut len = text.len().min(CAP) as i64;
        buf[..len as usize].copy_from_slice(&text.as_bytes()[..len as usize]);
        // SAFETY: `buf` holds CAP bytes.
        self.check(unsafe { (self.shim.bcast)(self.h, buf.as_mut_ptr() as *mut c_char, &mut len, CAP as i64) }, || {
            "broadcasting the session".into()
        })?;
        buf.truncate(len as usize);
        String::from_utf8(buf).map_err(|_| Error::Corrupt("rank 0 broadcast a session that is not UTF-8".into()))
    }

    /// Whether every rank passed `ok` (collective).
    pub(crate) fn all(&self, ok: bool) -> Result<bool> {
        let mut all = 0;
        self.check(unsafe { (self.shim.all)(self.h, ok as c_int, &mut all) }, || "agreeing with the other ranks".into())?;
        Ok(all != 0)
    }

    /// Waits for every rank.
    pub(crate) fn barrier(&self) -> Result<()> {
        self.check(unsafe { (self.shim.barrier)(self.h) }, || "waiting for the other ranks".into())
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        // SAFETY: the handle came from attach and is freed once.
        unsafe { (self.shim.free)(self.h) }
    }
}

fn error_text(shim: &Shim, rc: c_int) -> String {
    let mut buf = [0 as c_char; 512];
    // SAFETY: the shim writes at most `buf.len()` bytes, NUL included.
    unsafe { (shim.error)(rc, buf.as_mut_ptr(), buf.len() as c_int) };
    let text = unsafe { CStr::from_ptr(buf.as_ptr()) }.to_string_lossy().into_owned();
    if text.is_empty() {
        format!("MPI error {rc}")
    } else {
        text
    }
}

/// The file engine's messages over [`Comm`].
pub(crate) struct MpiExchange {
    /// The communicator (shared with the file handle, which frees it last).
    pub(crate) comm: Arc<Comm>,
    /// Poll while receiving (more ranks than cores on this node).
    pub(crate) poll: bool,
}

impl MpiExchange {
    fn probe(&self, src: u32) -> Result<usize> {
        let mut len: c_int = 0;
        let c = &self.comm;
        c.check(unsafe { (c.shim.probe)(c.h, src, self.poll as c_int, &mut len) }, || format!("receiving from rank {src}"))?;
        Ok(len.max(0) as usize)
    }
}

impl Exchange for MpiExchange {
    fn send(&self, dest: u32, data: &[u8]) -> Result<()> {
        let c = &self.comm;
        let mut rest = data;
        loop {
            let piece = &rest[..rest.len().min(PIECE)];
            // SAFETY: `piece` is readable for its length, which fits an int.
            let rc = unsafe { (c.shim.send)(c.h, dest, piece.as_ptr() as *const c_void, piece.len() as c_int) };
            c.check(rc, || format!("sending {} bytes to rank {dest}", data.len()))?;
            rest = &rest[piece.len()..];
            if piece.len() < PIECE {
                return Ok(());
            }
        }
    }

    fn recv(&self, src: u32) -> Result<Received> {
        let c = &self.comm;
        let mut out: Vec<u8> = Vec::new();
        loop {
            let len = self.probe(src)?;
            out.try_reserve_exact(len).map_err(|_| Error::Capacity(format!("no memory for a {len}-byte message from rank {src}")))?;
            let at = out.len();
            // SAFETY: `len` bytes of spare capacity; MPI writes all of them before set_len.
            let rc = unsafe { (c.shim.recv)(c.h, src, out.as_mut_ptr().add(at) as *mut c_void, len as c_int) };
            c.check(rc, || format!("receiving {len} bytes from rank {src}"))?;
            unsafe { out.set_len(at + len) };
            if len < PIECE {
                return Ok(Box::new(out));
            }
        }
    }

    fn start(&self, at: u64, ok: bool) -> Result<bool> {
        let c = &self.comm;
        let mut all = 0;
        c.check(unsafe { (c.shim.start)(c.h, at, ok as c_int, &mut all) }, || "starting the group's offsets".into())?;
        Ok(all != 0)
    }

    fn reserve(&self, owner: u32, len: u64) -> Result<u64> {
        let c = &self.comm;
        let mut before = 0;
        c.check(unsafe { (c.shim.reserve)(c.h, owner, len, &mut before) }, || format!("reserving {len} bytes at rank {owner}"))?;
        Ok(before)
    }
}
