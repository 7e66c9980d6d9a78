//! Files replaced whole or not at all: a writer writes a new file under a temporary name
//! in the target's directory, and [`Replacement::commit`] renames it over the target only
//! once every byte is written (after syncing it, when asked); dropped uncommitted (an
//! error, an interrupt, a panic), the temporary file is removed and the target is exactly
//! as it was.

use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::{Error, Result};

/// Distinguishes the temporary names of one process.
static NEXT: AtomicU64 = AtomicU64::new(0);

/// A new version of a file being written beside it (see the module documentation).
#[derive(Debug)]
pub struct Replacement {
    target: PathBuf,
    temp: PathBuf,
    done: bool,
}

/// What a replacement starts from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// An empty file: the writer writes all of the new contents.
    Empty,
    /// A copy of the target's current bytes (an empty file where there is no target): the
    /// writer overwrites a part and the rest is kept.
    Copy,
}

impl Replacement {
    /// A temporary file beside `target`, empty or holding a copy of `target` (see
    /// [`Start`]), with `target`'s permissions where it exists.
    pub fn new(target: &Path, start: Start) -> Result<Self> {
        let os = |op: &'static str, path: &Path, e: io::Error| Error::os(op, path, e);
        // A symbolic link is written through: the file it names is replaced, not the link.
        let resolved;
        let target = match std::fs::symlink_metadata(target) {
            Ok(m) if m.file_type().is_symlink() => match std::fs::canonicalize(target) {
                Ok(real) => {
                    resolved = real;
                    resolved.as_path()
                }
                Err(_) => target, // a dangling link: replaced like a missing file
            },
            _ => target,
        };
        let dir = match target.parent() {
            Some(d) if !d.as_os_str().is_empty() => d.to_path_buf(),
            _ => PathBuf::from("."),
        };
        let name = target.file_name().ok_or_else(|| {
            Error::InvalidArgument(format!(
                "'{}' names no file to write (a directory or an empty path)",
                target.display()
            ))
        })?;
        let existing = match std::fs::metadata(target) {
            Ok(m) if m.is_file() => Some(m),
            Ok(m) if m.is_dir() => {
                return Err(os(
                    "open",
                    target,
                    io::Error::from_raw_os_error(libc::EISDIR),
                ))
            }
            // A device, a pipe: written in place (a rename would replace the node).
            Ok(_) => {
                return Err(Error::InvalidArgument(format!(
                    "'{}' is not a regular file; write it with CuFile",
                    target.display()
                )))
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(os("stat", target, e)),
        };
        let mut temp_name = OsString::from(".");
        temp_name.push(name);
        temp_name.push(format!(
            ".kvikpy-{}-{}.tmp",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        ));
        let temp = dir.join(temp_name);
        let mode = existing
            .as_ref()
            .map_or(0o666, |m| m.permissions().mode() & 0o7777);
        OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .open(&temp)
            .map_err(|e| os("open", &temp, e))?;
        let made = Self {
            target: target.to_path_buf(),
            temp,
            done: false,
        };
        if let (Start::Copy, Some(_)) = (start, &existing) {
            // Dropped on failure: the temporary file goes.
            std::fs::copy(&made.target, &made.temp).map_err(|e| os("copy", &made.target, e))?;
        }
        if existing.is_some() {
            // The umask may have narrowed the mode at creation: give the target's exactly.
            let perms = std::fs::Permissions::from_mode(mode);
            std::fs::set_permissions(&made.temp, perms).map_err(|e| os("chmod", &made.temp, e))?;
        }
        Ok(made)
    }

    /// The temporary file to write.
    pub fn path(&self) -> &Path {
        &self.temp
    }

    /// The written file's bytes reach the disk (`fsync` of the temporary file), before
    /// it takes the target's place. Writers of several files sync them all first, then
    /// commit each without `sync` and [`sync_directory`] once.
    pub fn sync(&self) -> Result<()> {
        File::open(&self.temp)
            .and_then(|f| f.sync_all())
            .map_err(|e| Error::os("fsync", &self.temp, e))
    }

    /// The directory the target is in (`.` for a bare name).
    pub fn directory(&self) -> &Path {
        match self.target.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => Path::new("."),
        }
    }

    /// Put the written file in the target's place: with `sync`, its bytes and the rename
    /// reach the disk first ([`Replacement::sync`], then [`sync_directory`]).
    pub fn commit(mut self, sync: bool) -> Result<()> {
        if sync {
            self.sync()?;
        }
        std::fs::rename(&self.temp, &self.target)
            .map_err(|e| Error::os("rename", &self.temp, e))?;
        self.done = true;
        if sync {
            sync_directory(self.directory())?;
        }
        Ok(())
    }
}

/// The names directory `dir` holds reach the disk (`fsync` of the directory): after
/// renames into it, or removals from it.
pub fn sync_directory(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| Error::os("fsync", dir, e))
}

impl Drop for Replacement {
    fn drop(&mut self) {
        if !self.done {
            let _ = std::fs::remove_file(&self.temp);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn leftovers(dir: &Path) -> Vec<String> {
        std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n.contains(".kvikpy-"))
            .collect()
    }

    #[test]
    fn a_committed_file_replaces_the_target_and_an_abandoned_one_leaves_it() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("t.bin");
        std::fs::write(&target, b"old contents").unwrap();
        std::fs::set_permissions(&target, std::fs::Permissions::from_mode(0o640)).unwrap();
        let r = Replacement::new(&target, Start::Empty).unwrap();
        std::fs::write(r.path(), b"new").unwrap();
        drop(r); // an error on the way: nothing changes, nothing is left
        assert_eq!(std::fs::read(&target).unwrap(), b"old contents");
        assert!(leftovers(dir.path()).is_empty());
        let r = Replacement::new(&target, Start::Copy).unwrap();
        assert_eq!(std::fs::read(r.path()).unwrap(), b"old contents");
        std::fs::write(r.path(), b"new").unwrap();
        r.commit(true).unwrap();
        assert_eq!(std::fs::read(&target).unwrap(), b"new");
        let mode = std::fs::metadata(&target).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o640, "the target's permissions are kept");
        assert!(leftovers(dir.path()).is_empty());
        // A new file; a directory is refused before anything is made.
        let fresh = dir.path().join("new.bin");
        let r = Replacement::new(&fresh, Start::Copy).unwrap();
        assert_eq!(std::fs::read(r.path()).unwrap(), b"");
        r.commit(false).unwrap();
        assert!(fresh.exists());
        assert!(Replacement::new(dir.path(), Start::Empty).is_err());
        assert!(leftovers(dir.path()).is_empty());
        // Through a symbolic link: the file it names is replaced, the link stays.
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&target, &link).unwrap();
        let r = Replacement::new(&link, Start::Empty).unwrap();
        std::fs::write(r.path(), b"via link").unwrap();
        r.commit(false).unwrap();
        assert!(std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(std::fs::read(&target).unwrap(), b"via link");
    }
}
