//! Open files: mode parsing, the buffered and O_DIRECT descriptors, size and closing.

use std::ffi::CString;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use crate::error::{Error, Result};

/// An open mode in kvikio's (and Python's) spelling: `r`, `r+`, `w`, `w+`, each with an
/// optional `b`; or kvikpy's own [`OpenFlags::CREATE_KEEP`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenFlags {
    /// The mode allows reading (`r`, `r+`, `w+`).
    pub readable: bool,
    /// The mode allows writing (`r+`, `w`, `w+`).
    pub writable: bool,
    /// Create the file if it is missing (O_CREAT): `w` modes and [`OpenFlags::CREATE_KEEP`].
    pub create: bool,
    /// Truncate the file (O_TRUNC): `w` modes.
    pub truncate: bool,
}

impl OpenFlags {
    /// kvikpy's own mode, not one of kvikio's: read and write, the file created if missing
    /// and never truncated (O_CREAT without O_TRUNC), in one `open(2)` so that no other
    /// process can create or remove the file between a check and the open.
    pub const CREATE_KEEP: &'static str = "r+:create";

    /// Parse a mode string; anything but `r`, `r+`, `w`, `w+` (with at most one `b`) or
    /// [`OpenFlags::CREATE_KEEP`] is an [`Error::InvalidArgument`] that lists kvikio's modes.
    pub fn parse(mode: &str) -> Result<Self> {
        if mode == Self::CREATE_KEEP {
            return Ok(Self {
                readable: true,
                writable: true,
                create: true,
                truncate: false,
            });
        }
        let invalid = |why: &str| {
            Error::InvalidArgument(format!(
                "invalid open mode {mode:?}: {why}; use 'r', 'r+', 'w' or 'w+' (optionally with 'b')"
            ))
        };
        let mut chars = mode.chars();
        let kind = chars.next().ok_or_else(|| invalid("it is empty"))?;
        let (mut plus, mut binary) = (false, false);
        for c in chars {
            match c {
                '+' if !plus => plus = true,
                'b' if !binary => binary = true,
                _ => return Err(invalid(&format!("unexpected {c:?}"))),
            }
        }
        match kind {
            'r' => Ok(Self {
                readable: true,
                writable: plus,
                create: false,
                truncate: false,
            }),
            'w' => Ok(Self {
                readable: plus,
                writable: true,
                create: true,
                truncate: true,
            }),
            'a' => Err(invalid(
                "append mode is not supported (pwrite takes explicit offsets)",
            )),
            'x' => Err(invalid("exclusive creation is not supported")),
            c => Err(invalid(&format!("unknown mode letter {c:?}"))),
        }
    }

    fn libc_flags(&self) -> libc::c_int {
        let access = match (self.readable, self.writable) {
            (true, true) => libc::O_RDWR,
            (false, true) => libc::O_WRONLY,
            _ => libc::O_RDONLY,
        };
        access | libc::O_CLOEXEC
    }
}

/// The descriptors of one open file. Shared (`Arc`) by the handle and every task in
/// flight, so closing the handle never pulls a descriptor from under a running read.
#[derive(Debug)]
pub struct OpenFile {
    path: PathBuf,
    flags: OpenFlags,
    buffered: OwnedFd,
    /// Opened on first use: most files never need it, and an `open` per file is a
    /// measurable share of reading many small files.
    direct: OnceLock<Option<OwnedFd>>,
}

impl OpenFile {
    /// The path the file was opened with.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The mode the file was opened with.
    pub fn flags(&self) -> OpenFlags {
        self.flags
    }

    /// The ordinary (page-cached) descriptor.
    pub fn buffered_fd(&self) -> RawFd {
        self.buffered.as_raw_fd()
    }

    /// The O_DIRECT descriptor, if the filesystem supports O_DIRECT (opened on first use;
    /// the file exists by then, so it neither creates nor truncates). It is reopened through
    /// `/proc/self/fd`, so it is the same inode as the buffered descriptor even if the path
    /// has since been renamed or replaced; the path is the fallback where /proc is absent.
    pub fn direct_fd(&self) -> Option<RawFd> {
        self.direct
            .get_or_init(|| {
                let flags = self.flags.libc_flags() | libc::O_DIRECT;
                let by_fd = format!("/proc/self/fd/{}", self.buffered_fd());
                let by_fd = CString::new(by_fd).ok()?;
                open_fd(&self.path, &by_fd, flags)
                    .or_else(|_| {
                        let cpath = CString::new(self.path.as_os_str().as_bytes())
                            .map_err(|_| Error::InvalidArgument("NUL in path".into()))?;
                        open_fd(&self.path, &cpath, flags)
                    })
                    .ok()
            })
            .as_ref()
            .map(|fd| fd.as_raw_fd())
    }

    /// The file's current size in bytes.
    pub fn size(&self) -> Result<u64> {
        let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
        // SAFETY: the descriptor is open for the life of `self`; `st` is a valid out-pointer.
        let rc = unsafe { libc::fstat(self.buffered_fd(), st.as_mut_ptr()) };
        if rc != 0 {
            return Err(Error::last_os("fstat", &self.path));
        }
        // SAFETY: fstat succeeded, so it initialised `st`.
        Ok(unsafe { st.assume_init() }.st_size as u64)
    }

    /// The size, for sizing `what` (a read of whole ranges): as [`OpenFile::size`], except
    /// that a file reporting 0 bytes but yielding bytes (a `/proc` or `/sys` pseudo-file)
    /// is an error rather than an empty read.
    pub fn size_for(&self, what: &str) -> Result<u64> {
        let size = self.size()?;
        if size == 0 && self.flags.readable {
            let mut byte = 0u8;
            // SAFETY: `byte` is one writable byte; the descriptor is open.
            let got =
                unsafe { libc::pread(self.buffered_fd(), (&mut byte as *mut u8).cast(), 1, 0) };
            if got > 0 {
                return Err(unsized_file(&self.path, what));
            }
        }
        Ok(size)
    }

    /// The descriptor's status flags, as `fcntl(F_GETFL)` reports them.
    pub fn status_flags(&self) -> Result<i32> {
        // SAFETY: F_GETFL on an open descriptor has no memory preconditions.
        let rc = unsafe { libc::fcntl(self.buffered_fd(), libc::F_GETFL) };
        if rc < 0 {
            return Err(Error::last_os("fcntl", &self.path));
        }
        Ok(rc)
    }

    /// Fail with `UnsupportedOperation` unless the file was opened for reading.
    pub fn check_readable(&self) -> Result<()> {
        if self.flags.readable {
            Ok(())
        } else {
            Err(Error::UnsupportedOperation(format!(
                "'{}' was opened write-only; open it with 'r', 'r+' or 'w+' to read",
                self.path.display()
            )))
        }
    }

    /// Fail with `UnsupportedOperation` unless the file was opened for writing.
    pub fn check_writable(&self) -> Result<()> {
        if self.flags.writable {
            Ok(())
        } else {
            Err(Error::UnsupportedOperation(format!(
                "'{}' was opened read-only; open it with 'r+', 'w' or 'w+' to write",
                self.path.display()
            )))
        }
    }
}

fn open_fd(path: &Path, cpath: &CString, flags: libc::c_int) -> Result<OwnedFd> {
    // SAFETY: `cpath` is NUL-terminated; the mode argument is read only with O_CREAT.
    let fd = unsafe { libc::open(cpath.as_ptr(), flags, 0o644 as libc::c_uint) };
    if fd < 0 {
        return Err(Error::last_os("open", path));
    }
    // SAFETY: `fd` is a freshly opened descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A file opened by kvikpy; `close()` is idempotent and safe while I/O is in flight.
#[derive(Debug)]
pub struct FileHandle {
    path: PathBuf,
    open: Mutex<Option<Arc<OpenFile>>>,
}

impl FileHandle {
    /// Open `path` with `mode` (see [`OpenFlags::parse`]). A second descriptor with
    /// O_DIRECT is opened when first needed, if the filesystem allows it; where it does
    /// not, direct I/O is silently unavailable.
    pub fn open(path: impl AsRef<Path>, mode: &str) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let flags = OpenFlags::parse(mode)?;
        let cpath = CString::new(path.as_os_str().as_bytes()).map_err(|_| {
            Error::InvalidArgument(format!("path {:?} contains a NUL byte", path.display()))
        })?;
        let mut base = flags.libc_flags();
        if flags.create {
            base |= libc::O_CREAT;
        }
        if flags.truncate {
            base |= libc::O_TRUNC;
        }
        let buffered = open_fd(&path, &cpath, base)?;
        // Reject directories up front (O_RDONLY opens them fine), as Python's open() does.
        let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
        // SAFETY: `buffered` is open; `st` is a valid out-pointer.
        if unsafe { libc::fstat(buffered.as_raw_fd(), st.as_mut_ptr()) } == 0 {
            // SAFETY: fstat succeeded, so it initialised `st`.
            let st = unsafe { st.assume_init() };
            if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
                return Err(Error::os(
                    "open",
                    &path,
                    std::io::Error::from_raw_os_error(libc::EISDIR),
                ));
            }
        }
        Ok(Self {
            path: path.clone(),
            open: Mutex::new(Some(Arc::new(OpenFile {
                path,
                flags,
                buffered,
                direct: OnceLock::new(),
            }))),
        })
    }

    /// The open file, or [`Error::Closed`].
    pub fn get(&self) -> Result<Arc<OpenFile>> {
        self.open
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
            .ok_or(Error::Closed)
    }

    /// Close the file. Idempotent; I/O already in flight finishes on its own reference.
    pub fn close(&self) {
        self.open.lock().unwrap_or_else(|e| e.into_inner()).take();
    }

    /// Whether [`FileHandle::close`] was called.
    pub fn is_closed(&self) -> bool {
        self.open
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .is_none()
    }

    /// The path given to [`FileHandle::open`].
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The error for `what` (a kind of read) of a file that reports 0 bytes but has content.
pub fn unsized_file(path: &Path, what: &str) -> Error {
    Error::InvalidArgument(format!(
        "'{}' reports a size of 0 bytes but has content (a pseudo-file such as those in \
         /proc or /sys), so {what} cannot be sized from it; read it into host memory with \
         kvikpy.read(path, device='cpu'), which reads such files to their end, or with \
         open(path, 'rb').read()",
        path.display()
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes() {
        for (mode, r, w, c, t) in [
            ("r", true, false, false, false),
            ("rb", true, false, false, false),
            ("r+", true, true, false, false),
            ("r+b", true, true, false, false),
            ("rb+", true, true, false, false),
            ("w", false, true, true, true),
            ("wb", false, true, true, true),
            ("w+", true, true, true, true),
            ("w+b", true, true, true, true),
            (OpenFlags::CREATE_KEEP, true, true, true, false),
        ] {
            let f = OpenFlags::parse(mode).unwrap();
            assert_eq!(
                (f.readable, f.writable, f.create, f.truncate),
                (r, w, c, t),
                "{mode}"
            );
        }
        for bad in [
            "", "a", "a+", "x", "rw", "r++", "rbb", "q", "R", "r+:", "r+:c", "r:create",
        ] {
            assert!(OpenFlags::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn open_close_and_errors() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        let h = FileHandle::open(&p, "w").unwrap();
        assert_eq!(h.get().unwrap().size().unwrap(), 0);
        let keep = h.get().unwrap();
        h.close();
        h.close();
        assert!(h.is_closed());
        assert!(matches!(h.get(), Err(Error::Closed)));
        assert!(keep.check_readable().is_err());
        assert!(keep.check_writable().is_ok());
        match FileHandle::open(dir.path().join("missing"), "r") {
            Err(Error::Os { source, .. }) => {
                assert_eq!(source.kind(), std::io::ErrorKind::NotFound)
            }
            other => panic!("{other:?}"),
        }
        match FileHandle::open(dir.path(), "r") {
            Err(Error::Os { source, .. }) => assert_eq!(source.raw_os_error(), Some(libc::EISDIR)),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn create_keep_creates_a_missing_file_and_keeps_an_existing_one() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        let h = FileHandle::open(&p, OpenFlags::CREATE_KEEP).unwrap();
        assert_eq!(h.get().unwrap().size().unwrap(), 0);
        h.close();
        std::fs::write(&p, b"0123456789").unwrap();
        let h = FileHandle::open(&p, OpenFlags::CREATE_KEEP).unwrap();
        let open = h.get().unwrap();
        assert_eq!(open.size().unwrap(), 10);
        assert!(open.check_readable().is_ok() && open.check_writable().is_ok());
        h.close();
        assert_eq!(std::fs::read(&p).unwrap(), b"0123456789");
    }
}
