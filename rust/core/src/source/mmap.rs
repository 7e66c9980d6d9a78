//! The memory-mapped source (`kvikpy.Mmap`, kvikio's `MmapHandle`): a file region mapped
//! once when the handle is made, whose reads copy out of the mapping.
//!
//! Unlike the other sources it is never chosen by [`super::open`]: the caller asks for it
//! by name ([`MappedFile::map`], which `crate::mmap_handle` calls), and the region it may read is fixed at that moment
//! (kvikio's `initial_map_offset` and `initial_map_size`). Reads go through the one request
//! path like any other source's, so host reads are split over the pool, device reads go
//! through the bounce ring (the host copy lands in pinned memory) or, for resident pages,
//! by DMA straight from the mapping.
//!
//! Copies out of the mapping are done by the kernel (`process_vm_readv` on this process)
//! rather than by loads: a page that no longer exists because another process truncated
//! the file then comes back as `EFAULT` and a short count (an [`Error::Truncated`] for the
//! caller) instead of a SIGBUS that would kill Python. Where the kernel refuses that call
//! (a seccomp filter), the same bytes are read with `pread` on the mapped descriptor.

use std::io;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};

use super::mapping::FileMapping;
use super::posix::{pread_full, PosixFile};
use super::Source;
use crate::error::{Error, Result};
use crate::settings::Settings;
use crate::span::HostSpan;
use crate::vocab::OpenFlags;

/// The `mmap(2)` flags a caller may pass: one sharing type (`MAP_SHARED`, `MAP_PRIVATE` or
/// `MAP_SHARED_VALIDATE`) and any of these. The rest are refused: `MAP_FIXED` would
/// replace memory of this process, `MAP_ANONYMOUS` would map zeros instead of the file,
/// and the others change what the mapping is rather than how it is filled.
const OPTIONAL_MAP_FLAGS: libc::c_int =
    libc::MAP_POPULATE | libc::MAP_NORESERVE | libc::MAP_LOCKED | libc::MAP_NONBLOCK;
/// The bits of the sharing type.
const SHARING: libc::c_int = libc::MAP_SHARED | libc::MAP_PRIVATE;

/// What [`MappedFile::map`] maps besides the path.
#[derive(Debug, Clone, Copy, Default)]
pub struct MmapOptions {
    /// Bytes to map; `None` maps from `initial_map_offset` to the end of the file.
    pub initial_map_size: Option<u64>,
    /// Where in the file the mapped region starts.
    pub initial_map_offset: u64,
    /// `mmap(2)` flags; `None` for `MAP_PRIVATE` (kvikio's default).
    pub map_flags: Option<i64>,
}

/// The file bytes a handle may read: `offset..offset + size`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Region {
    /// Where the region starts in the file.
    pub offset: u64,
    /// Its length in bytes.
    pub size: u64,
}

impl Region {
    /// The file offset just past the region.
    pub fn end(self) -> u64 {
        self.offset + self.size
    }
}

/// A file with one region mapped read-only: the [`Source`] behind `kvikpy.Mmap`.
#[derive(Debug)]
pub struct MappedFile {
    file: PosixFile,
    region: Region,
    /// `None` for an empty region (an empty file): there is nothing to map.
    mapping: Option<FileMapping>,
}

/// Whether `process_vm_readv` was refused once (then every copy uses `pread`).
static VM_READ_REFUSED: AtomicBool = AtomicBool::new(false);

impl MappedFile {
    /// Bytes from the mapping's base to file offset `offset` (inside the region).
    fn offset_in_mapping(&self, mapping: &FileMapping, offset: u64) -> usize {
        mapping.head() + (offset - self.region.offset) as usize
    }

    /// The bytes of a read of `len` at `offset` that the region holds; an offset outside
    /// the region is an engine bug (the handle checks reads first).
    fn in_region(&self, offset: u64, len: usize) -> Result<usize> {
        if offset < self.region.offset || offset > self.region.end() {
            return Err(Error::OutOfRange(format!(
                "offset {offset} is outside the mapped region {}..{} of '{}'",
                self.region.offset,
                self.region.end(),
                self.file.path().display()
            )));
        }
        Ok((len as u64).min(self.region.end() - offset) as usize)
    }

    /// Copy `span.len()` mapped bytes from file offset `offset` into `span`; the count is
    /// short where the file no longer has them (it shrank after it was mapped).
    fn copy_out(&self, mapping: &FileMapping, span: HostSpan, offset: u64) -> Result<usize> {
        // SAFETY: the caller clamps the read to the region, which the mapping covers, so
        // the address stays inside the mapping.
        let source = unsafe { mapping.base().add(self.offset_in_mapping(mapping, offset)) };
        let pid = std::process::id() as libc::pid_t; // read again after a fork
        let mut done = 0usize;
        while done < span.len() {
            let rest = span.sub(done, span.len() - done);
            if VM_READ_REFUSED.load(Ordering::Relaxed) {
                let n = pread_full(self.file.buffered_fd(), rest, offset + done as u64)
                    .map_err(|e| Error::os("pread", self.file.path(), e))?;
                return Ok(done + n);
            }
            let local = libc::iovec {
                iov_base: rest.as_ptr().cast(),
                iov_len: rest.len(),
            };
            let remote = libc::iovec {
                // SAFETY: `done < span.len()`, so the address stays inside the mapping.
                iov_base: unsafe { source.add(done) }.cast_mut().cast(),
                iov_len: rest.len(),
            };
            // SAFETY: `local` is writable memory of its length (HostSpan's contract) and
            // `remote` lies inside our live mapping; the kernel copies between them and
            // reports a page it cannot fault in as EFAULT instead of raising SIGBUS.
            let n = unsafe { libc::process_vm_readv(pid, &local, 1, &remote, 1, 0) };
            if n > 0 {
                done += n as usize;
                continue;
            }
            if n == 0 {
                break;
            }
            let err = io::Error::last_os_error();
            match err.raw_os_error() {
                Some(libc::EINTR) => continue,
                Some(libc::EFAULT) => break, // past the end of a file that shrank
                Some(libc::EPERM | libc::ENOSYS | libc::EACCES) => {
                    VM_READ_REFUSED.store(true, Ordering::Relaxed);
                }
                _ => return Err(Error::os("process_vm_readv", self.file.path(), err)),
            }
        }
        Ok(done)
    }
}

impl Source for MappedFile {
    fn name(&self) -> &'static str {
        "mmap"
    }

    fn path(&self) -> &Path {
        self.file.path()
    }

    fn flags(&self) -> OpenFlags {
        OpenFlags::READ_ONLY
    }

    fn size(&self) -> Result<u64> {
        self.file.size()
    }

    fn read_host(&self, span: HostSpan, offset: u64, _settings: &Settings) -> Result<usize> {
        let len = self.in_region(offset, span.len())?;
        match &self.mapping {
            Some(mapping) if len > 0 => self.copy_out(mapping, span.sub(0, len), offset),
            _ => Ok(0),
        }
    }

    fn write_host(&self, _span: HostSpan, _offset: u64, _settings: &Settings) -> Result<usize> {
        Err(Error::UnsupportedOperation(format!(
            "'{}' is mapped read-only; write with kvikpy.CuFile(path, 'r+')",
            self.path().display()
        )))
    }

    fn descriptor(&self) -> Option<std::os::fd::RawFd> {
        Some(self.file.buffered_fd())
    }

    fn status_flags(&self) -> Result<i32> {
        self.file.status_flags()
    }
}

/// Check `flags` (kvikio's: only reading is supported).
fn check_open_flags(flags: &str) -> Result<()> {
    match flags {
        "r" | "rb" => Ok(()),
        f if f.starts_with(['w', 'a']) || f.contains('+') => Err(Error::InvalidArgument(format!(
            "File-backed mmap write is not supported yet: flags {f:?} ask for writing; \
                 open with 'r', or write with kvikpy.CuFile"
        ))),
        f => Err(Error::InvalidArgument(format!(
            "Unknown file open flag {f:?}: kvikpy.Mmap opens files with 'r' (reading)"
        ))),
    }
}

/// Check `map_flags` (see [`OPTIONAL_MAP_FLAGS`]); `None` is `MAP_PRIVATE`.
fn check_map_flags(map_flags: Option<i64>) -> Result<libc::c_int> {
    let Some(given) = map_flags else {
        return Ok(libc::MAP_PRIVATE);
    };
    let usage = "pass MAP_SHARED or MAP_PRIVATE (mmap.MAP_SHARED, mmap.MAP_PRIVATE), \
                 optionally with MAP_POPULATE, MAP_NORESERVE, MAP_LOCKED or MAP_NONBLOCK";
    let flags = libc::c_int::try_from(given).map_err(|_| {
        Error::InvalidArgument(format!(
            "map_flags {given} is not a valid set of mmap flags; {usage}"
        ))
    })?;
    let unknown = flags & !(SHARING | OPTIONAL_MAP_FLAGS);
    if unknown != 0 {
        return Err(Error::InvalidArgument(format!(
            "map_flags {flags:#x} has flags {unknown:#x} that kvikpy.Mmap does not pass to \
             mmap (MAP_FIXED would replace memory of this process, MAP_ANONYMOUS would map \
             zeros instead of the file); {usage}"
        )));
    }
    if flags & SHARING == 0 {
        return Err(Error::InvalidArgument(format!(
            "map_flags {flags:#x} has no sharing type; {usage}"
        )));
    }
    Ok(flags)
}

/// The region to map, by kvikio's rules (its messages' first words kept, so code that
/// matches them keeps working), for a file of `size` bytes.
fn region_for(size: u64, options: &MmapOptions) -> Result<Region> {
    let offset = options.initial_map_offset;
    if size == 0 {
        // kvikio maps nothing and checks nothing for an empty file; kvikpy still refuses
        // a region that cannot lie inside it.
        return match options.initial_map_size {
            None | Some(0) if offset == 0 => Ok(Region { offset, size: 0 }),
            _ => Err(Error::OutOfRange(format!(
                "Mapped region is past the end of file: the file is empty, and \
                 initial_map_offset {offset} with initial_map_size {} asks for bytes in \
                 it; pass initial_map_offset=0 and initial_map_size=None",
                options
                    .initial_map_size
                    .map_or("None".to_string(), |s| s.to_string()),
            ))),
        };
    }
    if offset >= size {
        return Err(Error::OutOfRange(format!(
            "Offset must be less than the file size: initial_map_offset {offset}, file size \
             {size}; pass an initial_map_offset below {size}"
        )));
    }
    let map_size = options.initial_map_size.unwrap_or(size - offset);
    if map_size == 0 {
        return Err(Error::InvalidArgument(
            "Mapped region should not be zero byte: initial_map_size is 0; pass a positive \
             size, or None to map to the end of the file"
                .into(),
        ));
    }
    if offset.checked_add(map_size).is_none_or(|end| end > size) {
        return Err(Error::OutOfRange(format!(
            "Mapped region is past the end of file: initial_map_offset {offset} + \
             initial_map_size {map_size} > file size {size}; pass an initial_map_size of \
             at most {}, or None to map to the end of the file",
            size - offset
        )));
    }
    Ok(Region {
        offset,
        size: map_size,
    })
}

impl MappedFile {
    /// Open `path` read-only (`flags` `"r"` or `"rb"`) and map the region `options` asks
    /// for; also the file's size when it was mapped. [`Error::Os`] (`open`) when the file
    /// cannot be opened, [`Error::OutOfRange`] or [`Error::InvalidArgument`] (kvikio's
    /// `out_of_range` and `invalid_argument`) for a region the file does not hold,
    /// [`Error::Os`] when `mmap` fails.
    pub fn map(path: &Path, flags: &str, options: MmapOptions) -> Result<(Self, u64)> {
        check_open_flags(flags)?;
        let map_flags = check_map_flags(options.map_flags)?;
        let file = PosixFile::open(path, OpenFlags::parse("r")?)?;
        let size_at_open = file.size()?;
        let region = region_for(size_at_open, &options)?;
        let mapping = match usize::try_from(region.size) {
            Ok(0) => None,
            Ok(len) => Some(
                FileMapping::map_with(file.buffered_fd(), region.offset, len, map_flags)
                    .map_err(|e| Error::os("mmap", path, e))?,
            ),
            Err(_) => {
                return Err(Error::InvalidArgument(format!(
                    "initial_map_size {} does not fit this machine's address space",
                    region.size
                )))
            }
        };
        let source = MappedFile {
            file,
            region,
            mapping,
        };
        Ok((source, size_at_open))
    }

    /// The mapped region of the file.
    pub fn region(&self) -> Region {
        self.region
    }
}
