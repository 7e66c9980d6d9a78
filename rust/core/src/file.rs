//! Open files: mode parsing, and the handle that owns a file's source until it is closed.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};
use crate::settings::Settings;
use crate::source::Source;
pub use crate::vocab::OpenFlags;

/// Mode parsing, here beside the handle that opens files (the type itself is shared
/// vocabulary, in [`crate::vocab`]).
impl OpenFlags {
    /// Parse a mode string; anything but `r`, `r+`, `w`, `w+` (with at most one `b`),
    /// or [`OpenFlags::CREATE_KEEP`] is an [`Error::InvalidArgument`] that lists kvikio's modes.
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
}

/// A file opened by kvikpy; `close()` is idempotent and safe while I/O is in flight.
#[derive(Debug)]
pub struct FileHandle {
    path: PathBuf,
    open: Mutex<Option<Arc<dyn Source>>>,
    /// Which source reads the file, and why it was chosen.
    backend: (&'static str, String),
}

impl FileHandle {
    /// Open `path` with `mode` (see [`OpenFlags::parse`]) through the source
    /// [`crate::source::open`] chooses for it under the current settings.
    pub fn open(path: impl AsRef<Path>, mode: &str) -> Result<Self> {
        Self::open_with(path, mode, &crate::settings::current()?)
    }

    /// [`FileHandle::open`] under an explicit settings snapshot.
    pub fn open_with(path: impl AsRef<Path>, mode: &str, settings: &Settings) -> Result<Self> {
        let path = path.as_ref().to_path_buf();
        let flags = OpenFlags::parse(mode)?;
        let opened = crate::source::open(&path, flags, settings)?;
        Ok(Self {
            path,
            backend: (opened.source.name(), opened.reason),
            open: Mutex::new(Some(opened.source)),
        })
    }

    /// A handle over a source opened explicitly rather than chosen by
    /// [`crate::source::open`] (the mmap source); `reason` says why it reads the file.
    pub fn from_source(source: Arc<dyn Source>, reason: String) -> Self {
        Self {
            path: source.path().to_path_buf(),
            backend: (source.name(), reason),
            open: Mutex::new(Some(source)),
        }
    }

    /// The name of the source that reads the file (`"posix"`, `"cufile"`) and why it was
    /// chosen at open; kept after close.
    pub fn backend(&self) -> (&'static str, &str) {
        (self.backend.0, &self.backend.1)
    }

    /// The open source, or [`Error::Closed`].
    pub fn get(&self) -> Result<Arc<dyn Source>> {
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

    /// Ready a new file for many writes, started at once, that fill its first `size`
    /// bytes (a checkpoint's tensors): with the `write_preallocate` setting, a file
    /// written with O_DIRECT is allocated up to `size` now, with one `fallocate`, where
    /// each write that extends it would otherwise take one of its own (which waits for
    /// the direct writes already running). Best effort: nothing changes on a filesystem
    /// without `fallocate`, or where the file is already that large.
    pub fn reserve(&self, size: u64, settings: &Settings) -> Result<()> {
        self.get()?.prepare_write(0, size, settings);
        Ok(())
    }
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
        assert!(keep.check_access(crate::vocab::Direction::Read).is_err());
        assert!(keep.check_access(crate::vocab::Direction::Write).is_ok());
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
        assert!(
            open.check_access(crate::vocab::Direction::Read).is_ok()
                && open.check_access(crate::vocab::Direction::Write).is_ok()
        );
        h.close();
        assert_eq!(std::fs::read(&p).unwrap(), b"0123456789");
    }
}
