//! Directories and files below a drain folder, reached only from the folder's descriptor: each
//! component is one `openat2(RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS)` (a symlink anywhere below
//! the folder fails it) and must be owned by this process's uid. A server, possibly root, that
//! wrote by path under a folder others can write to would write wherever a planted symlink or
//! directory sends it (docs/protocol.md, *Threat model*).

use cairn_core::{Error, Result};
use std::ffi::{CStr, CString};
use std::fs::File;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

/// An open directory below (or at) a drain folder.
#[derive(Debug)]
pub struct Dir {
    fd: OwnedFd,
    path: PathBuf,
    /// The drain folder this is (in), for messages.
    folder: PathBuf,
}

impl Dir {
    /// The drain folder itself, made if missing. It is the operator's configuration, so a
    /// symlink in its own path is followed; nothing below it is.
    pub fn root(path: &Path) -> Result<Dir> {
        std::fs::create_dir_all(path).map_err(|e| Error::io(format!("creating the drain folder {}", path.display()), e))?;
        let c = cstring(path.as_os_str().as_bytes(), path)?;
        // SAFETY: a NUL-terminated path that lives across the call.
        let fd = unsafe { libc::open(c.as_ptr(), libc::O_RDONLY | libc::O_DIRECTORY | libc::O_CLOEXEC) };
        if fd < 0 {
            return Err(Error::io(format!("opening the drain folder {}", path.display()), std::io::Error::last_os_error()));
        }
        // SAFETY: a descriptor just opened and owned by nothing else.
        Ok(Dir { fd: unsafe { OwnedFd::from_raw_fd(fd) }, path: path.to_path_buf(), folder: path.to_path_buf() })
    }

    /// Directory `name` (one component) in this one, made first if `create`; None if it is
    /// missing and not made. A symlink, or a directory of another uid, is an unsafe-path error.
    pub fn sub(&self, name: &str, create: bool) -> Result<Option<Dir>> {
        let c = self.component(name)?;
        if create {
            // SAFETY: a valid descriptor and a NUL-terminated name that live across the call.
            if unsafe { libc::mkdirat(self.fd.as_raw_fd(), c.as_ptr(), 0o777) } != 0 {
                let e = std::io::Error::last_os_error();
                if e.raw_os_error() != Some(libc::EEXIST) {
                    return Err(Error::io(format!("creating {}", self.path(name).display()), e));
                }
            }
        }
        match self.open(name, &c, libc::O_RDONLY | libc::O_DIRECTORY, 0) {
            Ok(fd) => Ok(Some(Dir { fd, path: self.path(name), folder: self.folder.clone() })),
            Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Creates file `name`, which must not exist, for writing.
    pub fn create_new(&self, name: &str) -> Result<File> {
        let c = self.component(name)?;
        self.open(name, &c, libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL, 0o666).map(File::from)
    }

    /// The bytes of file `name`; None if there is none.
    pub fn read(&self, name: &str) -> Result<Option<Vec<u8>>> {
        let c = self.component(name)?;
        let mut f = match self.open(name, &c, libc::O_RDONLY, 0) {
            Ok(fd) => File::from(fd),
            Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) => return Err(e),
        };
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut f, &mut bytes).map_err(|e| Error::io(format!("reading {}", self.path(name).display()), e))?;
        Ok(Some(bytes))
    }

    /// Whether `name` exists (not followed if a symlink: that is an unsafe-path error).
    pub fn exists(&self, name: &str) -> Result<bool> {
        let c = self.component(name)?;
        // SAFETY: an all-zero stat is a valid value for the kernel to fill.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: a valid descriptor, a NUL-terminated name and a stat buffer that live across the call.
        if unsafe { libc::fstatat(self.fd.as_raw_fd(), c.as_ptr(), &mut st, libc::AT_SYMLINK_NOFOLLOW) } != 0 {
            let e = std::io::Error::last_os_error();
            return if e.kind() == std::io::ErrorKind::NotFound {
                Ok(false)
            } else {
                Err(Error::io(format!("looking at {}", self.path(name).display()), e))
            };
        }
        if st.st_mode & libc::S_IFMT == libc::S_IFLNK {
            return Err(self.unsafe_path(name, "is a symlink"));
        }
        Ok(true)
    }

    /// Renames `from` to `to` in this directory unless `to` exists; returns whether it did
    /// (a rename never follows a symlink in its last component).
    pub fn rename_new(&self, from: &str, to: &str) -> Result<bool> {
        let (f, t) = (self.component(from)?, self.component(to)?);
        rename_noreplace(self.fd.as_raw_fd(), &f, &t, &self.path(to))
    }

    /// Renames `from` over `to` in this directory (neither followed if a symlink).
    pub fn rename_over(&self, from: &str, to: &str) -> Result<()> {
        let (f, t) = (self.component(from)?, self.component(to)?);
        let fd = self.fd.as_raw_fd();
        // SAFETY: a valid descriptor and NUL-terminated names that live across the call.
        if unsafe { libc::renameat(fd, f.as_ptr(), fd, t.as_ptr()) } != 0 {
            return Err(Error::io(format!("renaming {} to {}", self.path(from).display(), to), std::io::Error::last_os_error()));
        }
        Ok(())
    }

    /// Removes file `name` (a symlink itself, never its target); best effort.
    pub fn remove(&self, name: &str) {
        if let Ok(c) = self.component(name) {
            // SAFETY: a valid descriptor and a NUL-terminated name that live across the call.
            unsafe { libc::unlinkat(self.fd.as_raw_fd(), c.as_ptr(), 0) };
        }
    }

    /// Flushes the directory's entries to the device.
    pub fn sync(&self) -> Result<()> {
        // SAFETY: a valid descriptor.
        if unsafe { libc::fsync(self.fd.as_raw_fd()) } != 0 {
            return Err(Error::io(format!("flushing directory {}", self.path.display()), std::io::Error::last_os_error()));
        }
        Ok(())
    }

    /// The path of `name` in this directory (for messages).
    pub fn path(&self, name: &str) -> PathBuf {
        self.path.join(name)
    }

    fn component(&self, name: &str) -> Result<CString> {
        if name.is_empty() || name == "." || name == ".." || name.contains('/') {
            return Err(Error::InvalidArgument(format!("{name:?} is not one name in {}", self.path.display())));
        }
        cstring(name.as_bytes(), &self.path(name))
    }

    /// Opens `name` beneath this directory with no symlink on the way, and checks its owner.
    fn open(&self, name: &str, c: &CString, flags: i32, mode: u32) -> Result<OwnedFd> {
        let fd = openat2(&self.fd, c, flags, mode).map_err(|e| match e.raw_os_error() {
            Some(libc::ELOOP) => self.unsafe_path(name, "is a symlink"),
            Some(libc::EXDEV) => self.unsafe_path(name, "leads out of the drain folder"),
            _ => Error::io(format!("opening {}", self.path(name).display()), e),
        })?;
        // SAFETY: an all-zero stat is a valid value for the kernel to fill.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: a valid descriptor and a stat buffer that live across the call.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
            return Err(Error::io(format!("looking at {}", self.path(name).display()), std::io::Error::last_os_error()));
        }
        // SAFETY: geteuid cannot fail.
        let me = unsafe { libc::geteuid() };
        if st.st_uid != me {
            return Err(self.unsafe_path(name, &format!("is owned by uid {}, not by this server's uid {me}", st.st_uid)));
        }
        Ok(fd)
    }

    fn unsafe_path(&self, name: &str, what: &str) -> Error {
        Error::UnsafePath(format!(
            "{} {what}: a drain writes only into directories and files of its own server's user, with no symlink below the \
             drain folder {}, so that no other user can redirect it; remove or fix that entry (or drain to another folder)",
            self.path(name).display(),
            self.folder.display()
        ))
    }
}

/// Renames `from` to `to` (both relative to `dir`, or `AT_FDCWD` for paths) unless `to` exists;
/// returns whether it did. One `renameat2(RENAME_NOREPLACE)` where the file system has it (a
/// step's commit is then a create and a rename), else a hard link (which never replaces a file)
/// and an unlink. `dest` names `to` in errors.
pub fn rename_noreplace(dir: RawFd, from: &CStr, to: &CStr, dest: &Path) -> Result<bool> {
    // SAFETY: NUL-terminated names that live across the calls; `dir` is valid or AT_FDCWD.
    if unsafe { libc::renameat2(dir, from.as_ptr(), dir, to.as_ptr(), libc::RENAME_NOREPLACE) } == 0 {
        return Ok(true);
    }
    let e = std::io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EEXIST) => return Ok(false),
        Some(libc::EINVAL | libc::ENOSYS | libc::EOPNOTSUPP) => {}
        _ => return Err(Error::io(format!("publishing {}", dest.display()), e)),
    }
    // SAFETY: as above; flags 0 link `from` itself, never a symlink's target.
    let linked = if unsafe { libc::linkat(dir, from.as_ptr(), dir, to.as_ptr(), 0) } == 0 {
        true
    } else {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EEXIST) {
            return Err(Error::io(format!("publishing {} (Cairn needs a POSIX file system with hard links)", dest.display()), e));
        }
        false
    };
    // SAFETY: as above.
    unsafe { libc::unlinkat(dir, from.as_ptr(), 0) };
    Ok(linked)
}

fn cstring(bytes: &[u8], path: &Path) -> Result<CString> {
    CString::new(bytes).map_err(|_| Error::InvalidArgument(format!("{} holds a NUL byte", path.display())))
}

/// `openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS` (Linux 5.6 on); on an older kernel
/// `openat` with `O_NOFOLLOW`, the same for one component that is neither `..` nor has a `/`.
fn openat2(dir: &OwnedFd, name: &CString, flags: i32, mode: u32) -> std::io::Result<OwnedFd> {
    let flags = flags | libc::O_CLOEXEC;
    // SAFETY: an all-zero open_how is valid (no flags, no resolve rules); fields set below.
    let mut how: libc::open_how = unsafe { std::mem::zeroed() };
    how.flags = flags as u64;
    how.mode = if flags & libc::O_CREAT != 0 { u64::from(mode) } else { 0 };
    how.resolve = libc::RESOLVE_BENEATH | libc::RESOLVE_NO_SYMLINKS;
    // SAFETY: a valid descriptor, a NUL-terminated name and an open_how of the size passed.
    let r = unsafe {
        libc::syscall(
            libc::SYS_openat2,
            dir.as_raw_fd(),
            name.as_ptr(),
            &how as *const libc::open_how,
            std::mem::size_of::<libc::open_how>(),
        )
    };
    let fd = if r >= 0 {
        r as i32
    } else {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::ENOSYS) {
            return Err(e);
        }
        // SAFETY: as above.
        let fd = unsafe { libc::openat(dir.as_raw_fd(), name.as_ptr(), flags | libc::O_NOFOLLOW, mode) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        fd
    };
    // SAFETY: a descriptor just opened and owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn err(r: Result<impl std::fmt::Debug>) -> Error {
        r.expect_err("refused")
    }

    #[test]
    fn files_are_made_read_renamed_and_removed_beneath_the_folder() {
        let t = tempfile::tempdir().unwrap();
        let root = Dir::root(&t.path().join("drain")).unwrap();
        let ds = root.sub("d", true).unwrap().unwrap();
        assert!(root.sub("missing", false).unwrap().is_none());
        std::io::Write::write_all(&mut ds.create_new("a").unwrap(), b"bytes").unwrap();
        assert!(ds.create_new("a").is_err(), "create_new never opens an existing file");
        assert!(ds.rename_new("a", "b").unwrap());
        std::io::Write::write_all(&mut ds.create_new("a").unwrap(), b"other").unwrap();
        assert!(!ds.rename_new("a", "b").unwrap(), "never replaces");
        assert_eq!(ds.read("b").unwrap().unwrap(), b"bytes");
        assert!(ds.exists("b").unwrap() && !ds.exists("c").unwrap());
        ds.remove("b");
        assert_eq!(ds.read("b").unwrap(), None);
        ds.sync().unwrap();
        for bad in ["", ".", "..", "x/y"] {
            assert_eq!(err(ds.read(bad)).kind(), cairn_core::ErrorKind::InvalidArgument);
        }
    }

    #[test]
    fn a_symlink_below_the_folder_is_refused_and_never_followed() {
        let t = tempfile::tempdir().unwrap();
        let elsewhere = t.path().join("elsewhere");
        std::fs::create_dir(&elsewhere).unwrap();
        std::fs::write(elsewhere.join("secret"), b"x").unwrap();
        let root = Dir::root(&t.path().join("drain")).unwrap();
        std::os::unix::fs::symlink(&elsewhere, t.path().join("drain/d")).unwrap();
        let e = err(root.sub("d", true));
        assert_eq!(e.reason(), Some(cairn_core::Reason::UnsafePath), "{e}");
        assert!(e.to_string().contains("d is a symlink"), "{e}");
        let ds = root.sub("e", true).unwrap().unwrap();
        std::os::unix::fs::symlink(elsewhere.join("secret"), t.path().join("drain/e/s")).unwrap();
        assert_eq!(err(ds.read("s")).reason(), Some(cairn_core::Reason::UnsafePath));
        assert_eq!(err(ds.exists("s")).reason(), Some(cairn_core::Reason::UnsafePath));
        assert!(ds.create_new("s").is_err(), "O_EXCL never creates through a symlink");
        ds.remove("s");
        assert!(elsewhere.join("secret").exists(), "the link went, not its target");
        // Symlinks in the folder's own path are the operator's: followed.
        std::os::unix::fs::symlink(t.path().join("drain"), t.path().join("alias")).unwrap();
        assert!(Dir::root(&t.path().join("alias")).unwrap().sub("e", false).unwrap().is_some());
    }

    #[test]
    fn a_directory_of_another_uid_is_refused() {
        // SAFETY: geteuid cannot fail.
        if unsafe { libc::geteuid() } != 0 {
            eprintln!("skipped: needs root to chown a directory to another uid");
            return;
        }
        let t = tempfile::tempdir().unwrap();
        let root = Dir::root(t.path()).unwrap();
        std::fs::create_dir(t.path().join("d")).unwrap();
        std::os::unix::fs::chown(t.path().join("d"), Some(65534), Some(65534)).unwrap();
        let e = err(root.sub("d", true));
        assert_eq!((e.kind(), e.reason()), (cairn_core::ErrorKind::Config, Some(cairn_core::Reason::UnsafePath)), "{e}");
        assert!(e.to_string().contains("owned by uid 65534"), "{e}");
    }
}
