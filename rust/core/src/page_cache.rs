//! The page cache as kvikio's utilities see it: which pages of a file are resident
//! (`mincore` over a read-only mapping), dropping one file's pages (`fdatasync`, then
//! `posix_fadvise(POSIX_FADV_DONTNEED)`), and dropping the whole system's cache
//! (`/proc/sys/vm/drop_caches`, where permitted).

use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, RawFd};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::error::{Error, Result};

/// The file a page-cache call is about: a path kvikpy opens read-only for the call, or a
/// descriptor the caller keeps open.
#[derive(Debug, Clone, Copy)]
pub enum FileRef<'a> {
    /// A path, opened read-only for the duration of the call.
    Path(&'a Path),
    /// An open descriptor, borrowed (never closed here).
    Fd(RawFd),
}

/// The most bytes mapped at once by [`residency`]: `mincore`'s answer takes one byte per
/// page, so a window bounds that vector (256 KiB of answer per GiB) for any file size.
const WINDOW: u64 = 1 << 30;

/// Run `work` on `file`'s descriptor and a path naming it in errors: a path is opened
/// read-only (a directory is refused as `open(2)` refuses it for writing, with EISDIR),
/// a descriptor is used as it is.
fn with_fd<T>(file: FileRef<'_>, work: impl FnOnce(RawFd, &Path) -> Result<T>) -> Result<T> {
    match file {
        FileRef::Path(path) => {
            let opened = File::open(path).map_err(|e| Error::os("open", path, e))?;
            let is_dir = opened
                .metadata()
                .map_err(|e| Error::os("fstat", path, e))?
                .is_dir();
            if is_dir {
                return Err(Error::os(
                    "open",
                    path,
                    io::Error::from_raw_os_error(libc::EISDIR),
                ));
            }
            work(opened.as_raw_fd(), path)
        }
        FileRef::Fd(fd) => work(fd, &fd_label(fd)),
    }
}

/// What a descriptor is open on, for messages: its `/proc/self/fd` target, else `fd N`.
fn fd_label(fd: RawFd) -> PathBuf {
    std::fs::read_link(format!("/proc/self/fd/{fd}")).unwrap_or_else(|_| format!("fd {fd}").into())
}

fn file_size(fd: RawFd, path: &Path) -> Result<u64> {
    // SAFETY: an all-zero `stat` is a valid value of this plain C struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a valid, writable `stat`; an invalid `fd` makes fstat fail with EBADF.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(Error::last_os("fstat", path));
    }
    Ok(u64::try_from(st.st_size).unwrap_or(0))
}

fn file_offset(value: u64, what: &str) -> Result<libc::off_t> {
    libc::off_t::try_from(value).map_err(|_| {
        Error::InvalidArgument(format!(
            "{what} {value} is beyond the largest file offset ({})",
            libc::off_t::MAX
        ))
    })
}

/// `(resident pages, total pages)` of `length` bytes of `file` from `offset` (0 = to the
/// end of the file), in whole pages: a range that does not start or end on a page
/// boundary counts the pages it touches. A range that starts at or past the end of the
/// file is `(0, 0)`; one that runs past it is cut at the end, as kvikio does.
pub fn residency(file: FileRef<'_>, offset: u64, length: u64) -> Result<(u64, u64)> {
    with_fd(file, |fd, path| {
        let size = file_size(fd, path)?;
        if offset >= size {
            return Ok((0, 0));
        }
        let page = crate::source::page_size() as u64;
        let start = offset - offset % page;
        let end = if length == 0 {
            size
        } else {
            size.min(offset.saturating_add(length))
        };
        let mut resident = 0u64;
        let mut at = start;
        while at < end {
            let len = (end - at).min(WINDOW);
            resident += resident_in_window(fd, path, at, len, page)?;
            at += len;
        }
        Ok((resident, (end - start).div_ceil(page)))
    })
}

/// Resident pages among the `len` bytes of `fd` from the page-aligned `offset`.
fn resident_in_window(fd: RawFd, path: &Path, offset: u64, len: u64, page: u64) -> Result<u64> {
    let map_len = usize::try_from(len)
        .map_err(|_| Error::InvalidArgument(format!("a {len}-byte window does not fit memory")))?;
    let pages = usize::try_from(len.div_ceil(page)).unwrap_or(usize::MAX);
    let file_offset = file_offset(offset, "offset")?;
    // SAFETY: a fresh read-only shared mapping chosen by the kernel: no existing memory is
    // touched, and the pages are never read through it (mincore only asks about them).
    let addr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            map_len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            fd,
            file_offset,
        )
    };
    if addr == libc::MAP_FAILED {
        return Err(Error::last_os("mmap", path));
    }
    let mut answer = vec![0u8; pages];
    // SAFETY: `addr..addr+map_len` is the mapping made above, and `answer` has one byte per
    // page of it, as mincore writes.
    let status = unsafe { libc::mincore(addr, map_len, answer.as_mut_ptr()) };
    let mincore_error = (status != 0).then(io::Error::last_os_error);
    // SAFETY: unmaps exactly the mapping made above, which nothing else refers to.
    unsafe { libc::munmap(addr, map_len) };
    if let Some(e) = mincore_error {
        return Err(Error::os("mincore", path, e));
    }
    // Only the lowest bit says "resident"; the others are unspecified.
    Ok(answer.iter().filter(|&&b| b & 1 == 1).count() as u64)
}

/// Ask the kernel to evict `length` bytes of `file` from `offset` (0 = to the end) from
/// the page cache (`POSIX_FADV_DONTNEED`), after `fdatasync` when `sync_first` (dirty
/// pages are not evicted). Only pages wholly inside the range go; filesystems without a
/// page cache of their own (tmpfs) keep theirs.
pub fn drop_file(file: FileRef<'_>, offset: u64, length: u64, sync_first: bool) -> Result<()> {
    with_fd(file, |fd, path| {
        let start = file_offset(offset, "offset")?;
        let len = file_offset(length, "length")?;
        // SAFETY: fdatasync takes a descriptor; an invalid one fails with EBADF.
        if sync_first && unsafe { libc::fdatasync(fd) } != 0 {
            return Err(Error::last_os("fdatasync", path));
        }
        // SAFETY: posix_fadvise takes a descriptor and plain integers.
        let status = unsafe { libc::posix_fadvise(fd, start, len, libc::POSIX_FADV_DONTNEED) };
        if status != 0 {
            return Err(Error::os(
                "posix_fadvise",
                path,
                io::Error::from_raw_os_error(status),
            ));
        }
        Ok(())
    })
}

/// The kernel's switch for dropping caches: `1` drops the page cache, `3` also the
/// reclaimable slab objects (dentries and inodes).
const DROP_CACHES: &str = "/proc/sys/vm/drop_caches";

/// Drop the system's page cache (and, with `reclaim_dentries_and_inodes`, dentries and
/// inodes), after `sync` when `sync_first`; whether it was dropped.
///
/// Tried in kvikio's order, each where the previous was refused: writing
/// `/proc/sys/vm/drop_caches` directly (root, `CAP_SYS_ADMIN`), `sysctl
/// vm.drop_caches=N` (a `sysctl` given the capability), then `sudo -n sysctl ...` (a
/// sudoers rule for `sysctl`). kvikio runs `sudo` without `-n`; kvikpy never waits for a
/// password, so a rule needs `NOPASSWD`.
pub fn drop_system(reclaim_dentries_and_inodes: bool, sync_first: bool) -> bool {
    if sync_first {
        // SAFETY: sync takes no arguments and cannot fail.
        unsafe { libc::sync() };
    }
    let level = if reclaim_dentries_and_inodes {
        "3"
    } else {
        "1"
    };
    if std::fs::write(DROP_CACHES, level).is_ok() {
        return true;
    }
    let sysctl = ["/sbin/sysctl", "/usr/sbin/sysctl"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .unwrap_or("sysctl");
    let setting = format!("vm.drop_caches={level}");
    [
        vec![sysctl, setting.as_str()],
        vec!["sudo", "-n", sysctl, setting.as_str()],
    ]
    .iter()
    .any(|argv| quietly_succeeds(argv))
}

/// Whether `argv` runs, exits 0 and writes nothing to stderr (kvikio's test of success:
/// `sysctl` reports a refused key on stderr).
fn quietly_succeeds(argv: &[&str]) -> bool {
    let Some((program, args)) = argv.split_first() else {
        return false;
    };
    Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .is_ok_and(|out| out.status.success() && out.stderr.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Write;

    fn file_of(len: usize) -> tempfile::NamedTempFile {
        let mut f = tempfile::NamedTempFile::new().expect("temp file");
        f.write_all(&vec![7u8; len]).expect("write");
        f.flush().expect("flush");
        f
    }

    #[test]
    fn counts_whole_pages_of_the_range() {
        let page = crate::source::page_size() as u64;
        let f = file_of((3 * page + 10) as usize);
        let path = FileRef::Path(f.path());
        assert_eq!(residency(path, 0, 0).expect("info").1, 4);
        assert_eq!(residency(path, 1, 1).expect("info").1, 1);
        assert_eq!(residency(path, page - 1, 2).expect("info").1, 2);
        assert_eq!(residency(path, 2 * page, 0).expect("info").1, 2);
        assert_eq!(residency(path, 0, 100 * page).expect("info").1, 4);
        assert_eq!(residency(path, 3 * page + 10, 0).expect("info"), (0, 0));
        let (resident, total) = residency(FileRef::Fd(f.as_file().as_raw_fd()), 0, 0).expect("fd");
        assert!(resident <= total && total == 4);
    }

    #[test]
    fn an_empty_file_has_no_pages() {
        let f = file_of(0);
        assert_eq!(
            residency(FileRef::Path(f.path()), 0, 0).expect("info"),
            (0, 0)
        );
    }

    #[test]
    fn missing_files_and_bad_descriptors_are_os_errors() {
        let missing = Path::new("/nonexistent/kvikpy-page-cache");
        for err in [
            residency(FileRef::Path(missing), 0, 0).expect_err("missing"),
            drop_file(FileRef::Path(missing), 0, 0, true).expect_err("missing"),
        ] {
            assert!(
                matches!(&err, Error::Os { op: "open", source, .. } if source.raw_os_error() == Some(libc::ENOENT)),
                "{err:?}"
            );
        }
        let err = residency(FileRef::Fd(-1), 0, 0).expect_err("bad fd");
        assert!(
            matches!(&err, Error::Os { source, .. } if source.raw_os_error() == Some(libc::EBADF)),
            "{err:?}"
        );
        let dir = tempfile::tempdir().expect("dir");
        let err = residency(FileRef::Path(dir.path()), 0, 0).expect_err("directory");
        assert!(
            matches!(&err, Error::Os { source, .. } if source.raw_os_error() == Some(libc::EISDIR)),
            "{err:?}"
        );
    }

    #[test]
    fn dropping_a_file_succeeds_on_paths_and_descriptors() {
        let f = file_of(10_000);
        drop_file(FileRef::Path(f.path()), 0, 0, true).expect("path");
        drop_file(FileRef::Fd(f.as_file().as_raw_fd()), 4096, 10, false).expect("fd");
    }
}
