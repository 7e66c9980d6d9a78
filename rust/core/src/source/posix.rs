//! The POSIX source: a local file read and written with `pread`/`pwrite` through the page
//! cache, the aligned middle of each transfer through a second, O_DIRECT descriptor when
//! the settings ask for it (for reads by default where the range is not cached, see
//! [`super::residency`]), and device reads of cached pages by DMA.

use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};

use super::mapping::page_size;
use super::page_cache_dma::read_resident;
pub use super::posix_io::{pread_direct, pread_full};
use super::posix_io::{transfer_direct, transfer_full};
use super::residency::{self, Method, Prober, Run, MIN_PROBED};
use super::{Direct, Source, Target};
use crate::bounce::host_pool;
use crate::cuda::Lane;
use crate::error::{Error, Result};
use crate::settings::{DirectIoRead, Settings};
use crate::span::{DeviceSpan, HostSpan};
use crate::tasks::{align_down, aligned_split, AlignedSplit, DIRECT_IO_ALIGNMENT};
use crate::vocab::Direction;
use crate::vocab::OpenFlags;

/// Bytes this process has read by O_DIRECT (tests and diagnostics use it to tell which
/// path a read took).
static DIRECT_READ_BYTES: AtomicU64 = AtomicU64::new(0);

/// Bytes read by O_DIRECT since the process started.
pub fn direct_read_bytes() -> u64 {
    DIRECT_READ_BYTES.load(Ordering::Relaxed)
}

/// The POSIX source takes every path (it is the last of [`super::OPENERS`]).
pub fn open(target: &Target<'_>) -> Option<Result<Arc<dyn Source>>> {
    Some(PosixFile::open(target.path, target.flags).map(|f| Arc::new(f) as Arc<dyn Source>))
}

/// The descriptors of one open local file.
#[derive(Debug)]
pub struct PosixFile {
    path: PathBuf,
    flags: OpenFlags,
    buffered: OwnedFd,
    /// Opened on first use: most files never need it, and an `open` per file is a
    /// measurable share of reading many small files.
    direct: OnceLock<Option<OwnedFd>>,
}

fn c_path(path: &Path) -> Result<CString> {
    CString::new(path.as_os_str().as_bytes()).map_err(|_| {
        Error::InvalidArgument(format!("path {:?} contains a NUL byte", path.display()))
    })
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

fn access_flags(flags: OpenFlags) -> libc::c_int {
    let access = match (flags.readable, flags.writable) {
        (true, true) => libc::O_RDWR,
        (false, true) => libc::O_WRONLY,
        _ => libc::O_RDONLY,
    };
    access | libc::O_CLOEXEC
}

fn fstat(fd: RawFd, path: &Path) -> Result<libc::stat> {
    let mut st = std::mem::MaybeUninit::<libc::stat>::uninit();
    // SAFETY: the descriptor is open; `st` is a valid out-pointer.
    if unsafe { libc::fstat(fd, st.as_mut_ptr()) } != 0 {
        return Err(Error::last_os("fstat", path));
    }
    // SAFETY: fstat succeeded, so it initialised `st`.
    Ok(unsafe { st.assume_init() })
}

impl PosixFile {
    /// Open `path` with `flags` (one `open(2)`, creating or truncating as the mode asks).
    /// Directories are refused (O_RDONLY opens them fine), as Python's `open()` does.
    pub fn open(path: &Path, flags: OpenFlags) -> Result<Self> {
        let cpath = c_path(path)?;
        let mut base = access_flags(flags);
        if flags.create {
            base |= libc::O_CREAT;
        }
        if flags.truncate {
            base |= libc::O_TRUNC;
        }
        let buffered = open_fd(path, &cpath, base)?;
        if let Ok(st) = fstat(buffered.as_raw_fd(), path) {
            if st.st_mode & libc::S_IFMT == libc::S_IFDIR {
                let err = io::Error::from_raw_os_error(libc::EISDIR);
                return Err(Error::os("open", path, err));
            }
        }
        Ok(Self {
            path: path.to_path_buf(),
            flags,
            buffered,
            direct: OnceLock::new(),
        })
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
                let flags = access_flags(self.flags) | libc::O_DIRECT;
                let by_fd = CString::new(format!("/proc/self/fd/{}", self.buffered_fd())).ok()?;
                open_fd(&self.path, &by_fd, flags)
                    .or_else(|_| open_fd(&self.path, &c_path(&self.path)?, flags))
                    .ok()
            })
            .as_ref()
            .map(|fd| fd.as_raw_fd())
    }

    fn os(&self, op: &'static str, e: io::Error) -> Error {
        Error::os(op, &self.path, e)
    }

    fn buffered(&self, direction: Direction, span: HostSpan, offset: u64) -> Result<usize> {
        transfer_full(self.buffered_fd(), direction, span, offset).map_err(|e| {
            self.os(
                match direction {
                    Direction::Read => "pread",
                    Direction::Write => "pwrite",
                },
                e,
            )
        })
    }

    /// One host transfer: the whole span through the page cache, or, when direct I/O is
    /// enabled for this direction and the file has an O_DIRECT descriptor, the unaligned
    /// edges through the page cache and the aligned middle through O_DIRECT.
    fn transfer(
        &self,
        direction: Direction,
        span: HostSpan,
        offset: u64,
        settings: &Settings,
    ) -> Result<usize> {
        let wants_direct = match direction {
            Direction::Read => match settings.auto_direct_io_read {
                DirectIoRead::Direct => true,
                DirectIoRead::Buffered => false,
                DirectIoRead::ByResidency => {
                    return self.read_by_residency(span, offset, settings);
                }
            },
            Direction::Write => settings.auto_direct_io_write,
        };
        let mut split = aligned_split(offset, span.len(), DIRECT_IO_ALIGNMENT);
        // Only asked for when wanted: the O_DIRECT descriptor is opened on first use.
        let direct_fd = (wants_direct && split.middle > 0)
            .then(|| self.direct_fd())
            .flatten();
        let Some(direct_fd) = direct_fd else {
            return self.buffered(direction, span, offset);
        };
        if direction == Direction::Read {
            self.whole_blocks_only(&mut split, offset)?;
            if split.middle == 0 {
                return self.buffered(direction, span, offset);
            }
        }
        split.move_in_order(|at, len, direct| {
            let part = span.sub(at, len);
            let part_offset = offset + at as u64;
            if direct {
                self.direct_part(direct_fd, direction, part, part_offset, settings)
            } else {
                self.buffered(direction, part, part_offset)
            }
        })
    }

    /// Shrink the middle of a read's `split` (of a transfer at `offset`) to the blocks
    /// wholly inside the file, the rest going to the tail. An O_DIRECT read moves whole
    /// blocks: at the end of the file it may write the block's zeros past the bytes it
    /// reports into the destination, which must stay untouched past EOF. So only blocks
    /// wholly inside the file go through O_DIRECT; the rest is read through the page
    /// cache, which stops exactly at EOF.
    fn whole_blocks_only(&self, split: &mut AlignedSplit, offset: u64) -> Result<()> {
        let whole_blocks_end = align_down(self.size()?, DIRECT_IO_ALIGNMENT);
        let middle_start = offset + split.head as u64;
        let inside = whole_blocks_end.saturating_sub(middle_start) as usize;
        if inside < split.middle {
            split.tail += split.middle - inside;
            split.middle = inside;
        }
        Ok(())
    }

    /// A read by residency (`auto_direct_io_read="auto"`): a task whose aligned middle is
    /// shorter than [`MIN_PROBED`] reads through the page cache with no probe; otherwise
    /// the middle's resident runs go through the page cache and the others by O_DIRECT,
    /// as [`residency::plan`] decides, and the unaligned edges through the page cache.
    fn read_by_residency(&self, span: HostSpan, offset: u64, settings: &Settings) -> Result<usize> {
        let mut split = aligned_split(offset, span.len(), DIRECT_IO_ALIGNMENT);
        if split.middle < MIN_PROBED {
            return self.buffered(Direction::Read, span, offset);
        }
        self.whole_blocks_only(&mut split, offset)?;
        if split.middle < MIN_PROBED {
            return self.buffered(Direction::Read, span, offset);
        }
        // The middle first: reading the head through the page cache would start readahead
        // into the middle before it is probed.
        let middle_start = offset + split.head as u64;
        let mut middle_done = 0usize;
        let mut prober = Prober::new(self.buffered_fd(), middle_start, split.middle, Method::Best);
        residency::plan(
            middle_start,
            split.middle,
            page_size(),
            |at, len| prober.resident(at, len),
            |run: Run| {
                let part = span.sub((run.offset - offset) as usize, run.len);
                // The O_DIRECT descriptor is opened only once a run needs it.
                let n = match run.direct.then(|| self.direct_fd()).flatten() {
                    Some(fd) => {
                        self.direct_part(fd, Direction::Read, part, run.offset, settings)?
                    }
                    None => self.buffered(Direction::Read, part, run.offset)?,
                };
                middle_done += n;
                Ok::<bool, Error>(n == run.len)
            },
        )?;
        drop(prober);
        if split.head > 0 {
            let n = self.buffered(Direction::Read, span.sub(0, split.head), offset)?;
            if n < split.head {
                return Ok(n); // end of file
            }
        }
        let mut done = split.head + middle_done;
        if middle_done == split.middle && split.tail > 0 {
            let at = split.head + split.middle;
            done += self.buffered(
                Direction::Read,
                span.sub(at, split.tail),
                offset + at as u64,
            )?;
        }
        Ok(done)
    }

    /// The aligned middle of a transfer through O_DIRECT: straight into the user's memory
    /// when it is aligned too, else staged through a pooled aligned bounce buffer. A
    /// filesystem that opens O_DIRECT but rejects the transfer (EINVAL) falls back to the
    /// page cache.
    fn direct_part(
        &self,
        fd: RawFd,
        direction: Direction,
        span: HostSpan,
        offset: u64,
        settings: &Settings,
    ) -> Result<usize> {
        let attempt = if span.as_ptr() as usize % DIRECT_IO_ALIGNMENT == 0 {
            transfer_direct(fd, direction, span, offset, DIRECT_IO_ALIGNMENT)
        } else {
            staged(fd, direction, span, offset, settings)?
        };
        match attempt {
            Ok(n) => {
                if direction == Direction::Read {
                    DIRECT_READ_BYTES.fetch_add(n as u64, Ordering::Relaxed);
                }
                Ok(n)
            }
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                self.buffered(direction, span, offset)
            }
            Err(e) => Err(self.os(
                match direction {
                    Direction::Read => "pread (O_DIRECT)",
                    Direction::Write => "pwrite (O_DIRECT)",
                },
                e,
            )),
        }
    }
}

impl Source for PosixFile {
    fn name(&self) -> &'static str {
        "posix"
    }

    fn path(&self) -> &Path {
        &self.path
    }

    fn flags(&self) -> OpenFlags {
        self.flags
    }

    fn size(&self) -> Result<u64> {
        Ok(fstat(self.buffered_fd(), &self.path)?.st_size as u64)
    }

    fn zero_size_is_empty(&self) -> bool {
        false
    }

    fn special_kind(&self) -> Result<Option<&'static str>> {
        Ok(
            match fstat(self.buffered_fd(), &self.path)?.st_mode & libc::S_IFMT {
                libc::S_IFCHR => Some("a character device"),
                libc::S_IFBLK => Some("a block device"),
                libc::S_IFIFO => Some("a pipe (FIFO)"),
                libc::S_IFSOCK => Some("a socket"),
                _ => None,
            },
        )
    }

    fn read_host(&self, span: HostSpan, offset: u64, settings: &Settings) -> Result<usize> {
        self.transfer(Direction::Read, span, offset, settings)
    }

    fn write_host(&self, span: HostSpan, offset: u64, settings: &Settings) -> Result<usize> {
        self.transfer(Direction::Write, span, offset, settings)
    }

    fn descriptor(&self) -> Option<RawFd> {
        Some(self.buffered_fd())
    }

    fn status_flags(&self) -> Result<i32> {
        // SAFETY: F_GETFL on an open descriptor has no memory preconditions.
        let rc = unsafe { libc::fcntl(self.buffered_fd(), libc::F_GETFL) };
        if rc < 0 {
            return Err(Error::last_os("fcntl", &self.path));
        }
        Ok(rc)
    }

    fn direct_io_supported(&self) -> bool {
        self.direct_fd().is_some()
    }

    /// With `write_preallocate`, a write through O_DIRECT that extends the file first has
    /// its range allocated (`fallocate`, which also sets the file's size): its tasks then
    /// overwrite allocated blocks inside the file, which ext4 and XFS run in parallel,
    /// where extending direct writes take the inode's lock exclusively one after another.
    /// A filesystem without `fallocate` leaves the write as it was.
    fn prepare_write(&self, offset: u64, len: u64, settings: &Settings) {
        if !settings.write_preallocate || !settings.auto_direct_io_write {
            return;
        }
        let (Ok(start), Ok(count)) = (i64::try_from(offset), i64::try_from(len)) else {
            return;
        };
        let extends = self
            .size()
            .is_ok_and(|size| offset.saturating_add(len) > size);
        if extends && start.checked_add(count).is_some() && self.direct_fd().is_some() {
            // SAFETY: fallocate on an open descriptor has no memory preconditions; its
            // result is ignored (best effort: the write reports any real error).
            let _ = unsafe { libc::fallocate(self.buffered_fd(), 0, start, count) };
        }
    }

    fn device_direct(
        &self,
        direction: Direction,
        span: DeviceSpan,
        offset: u64,
        settings: &Settings,
        lane: Lane<'_>,
    ) -> Result<Direct> {
        match direction {
            Direction::Read => read_resident(
                self.buffered_fd(),
                || self.size(),
                span,
                offset,
                settings,
                lane,
            ),
            Direction::Write => Ok(Direct::NotUsed),
        }
    }
}

/// O_DIRECT through a host bounce buffer, one buffer-full at a time. The outer `Result`
/// is the engine's (no buffer could be had); the inner one is the system call's.
fn staged(
    fd: RawFd,
    direction: Direction,
    span: HostSpan,
    offset: u64,
    settings: &Settings,
) -> Result<io::Result<usize>> {
    // Always the configured size (the pool keeps one size, so varying it would free and
    // reallocate buffers on every call); a checkpoint load's buffer fits its staging
    // budget (a smaller one, freeing the pool's others, only for a budget below one
    // `bounce_buffer_size`).
    let buffer_size = match settings.staging.budget() {
        Some(budget) => settings.bounce_capacity().min(budget.slot_bytes(1, 0)),
        None => settings.bounce_capacity(),
    };
    let chunk_size = buffer_size.min(span.len());
    // A checkpoint load's task reserves its buffer from the load's staging budget first
    // (its only reservation; see `crate::staging`); other reads never wait.
    let reserved = settings.staging.reserve(buffer_size)?;
    let mut bounce = host_pool().acquire(buffer_size, settings.bounce_buffer_size)?;
    bounce.hold(reserved);
    let staging = HostSpan::from_slice(bounce.as_mut_slice());
    let mut done = 0usize;
    while done < span.len() {
        let len = chunk_size.min(span.len() - done);
        let user = span.sub(done, len);
        let stage = staging.sub(0, len);
        let at = offset + done as u64;
        if direction == Direction::Write {
            copy(user, stage, len);
        }
        let n = match transfer_direct(fd, direction, stage, at, DIRECT_IO_ALIGNMENT) {
            Ok(n) => n,
            Err(e) => return Ok(Err(e)),
        };
        if direction == Direction::Read {
            copy(stage, user, n);
        }
        done += n;
        if n < len {
            break;
        }
    }
    Ok(Ok(done))
}

fn copy(from: HostSpan, to: HostSpan, len: usize) {
    assert!(len <= from.len() && len <= to.len());
    // SAFETY: both spans are valid for `len` bytes (checked above) and never overlap: one
    // is a pool-owned bounce buffer, the other user memory.
    unsafe { std::ptr::copy_nonoverlapping(from.as_ptr(), to.as_ptr(), len) }
}
