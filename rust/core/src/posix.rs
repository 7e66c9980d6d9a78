//! The raw pread/pwrite loops: retry on EINTR, continue after partial transfers, stop at EOF.

use std::io;
use std::os::fd::RawFd;

use crate::memory::HostSpan;
use crate::tasks::align_down;

/// Read into `span` from `fd` at `offset` until the span is full or the file ends.
/// Returns the bytes read (less than `span.len()` only at end of file).
pub fn pread_full(fd: RawFd, span: HostSpan, offset: u64) -> io::Result<usize> {
    let mut done = 0usize;
    while done < span.len() {
        let rest = span.sub(done, span.len() - done);
        let at = libc::off_t::try_from(offset + done as u64)
            .map_err(|_| io::Error::from_raw_os_error(libc::EOVERFLOW))?;
        // SAFETY: `rest` is valid writable memory for its length (HostSpan's contract), and
        // the kernel writes at most `rest.len()` bytes into it.
        let n = unsafe { libc::pread(fd, rest.as_ptr().cast(), rest.len(), at) };
        if n < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        if n == 0 {
            break; // end of file
        }
        done += n as usize;
    }
    Ok(done)
}

/// Write all of `span` to `fd` at `offset`. A write that makes no progress is an error
/// (`WriteZero`), never a silent short count.
pub fn pwrite_full(fd: RawFd, span: HostSpan, offset: u64) -> io::Result<usize> {
    let mut done = 0usize;
    while done < span.len() {
        let rest = span.sub(done, span.len() - done);
        let at = libc::off_t::try_from(offset + done as u64)
            .map_err(|_| io::Error::from_raw_os_error(libc::EOVERFLOW))?;
        // SAFETY: `rest` is valid readable memory for its length (HostSpan's contract).
        let n = unsafe { libc::pwrite(fd, rest.as_ptr().cast_const().cast(), rest.len(), at) };
        if n < 0 {
            let err = io::Error::last_os_error();
            if err.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                format!("pwrite wrote 0 of {} bytes", rest.len()),
            ));
        }
        done += n as usize;
    }
    Ok(done)
}

/// Read through an O_DIRECT descriptor: like [`pread_full`], but a transfer that ends off
/// the alignment grid means end of file (another O_DIRECT read from an unaligned offset
/// would fail with EINVAL rather than return 0).
pub fn pread_direct(fd: RawFd, span: HostSpan, offset: u64, align: usize) -> io::Result<usize> {
    let mut done = 0usize;
    while done < span.len() {
        let n = pread_full(fd, span.sub(done, span.len() - done), offset + done as u64)?;
        done += n;
        if n == 0 || n % align != 0 {
            break;
        }
    }
    Ok(done)
}

/// The system page size (cached; 4 KiB on the machines measured).
pub fn page_size() -> usize {
    static PAGE: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *PAGE.get_or_init(|| {
        // SAFETY: sysconf has no memory preconditions.
        let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if n > 0 {
            n as usize
        } else {
            4096
        }
    })
}

/// A read-only shared mapping of part of a file, unmapped on drop. The engine never
/// dereferences it: it only asks which pages are resident and hands the pages to the DMA
/// engine, so a file truncated meanwhile cannot raise SIGBUS in this process.
#[derive(Debug)]
pub struct FileMapping {
    base: *mut libc::c_void,
    len: usize,
    head: usize,
}

impl FileMapping {
    /// Map the bytes `offset..offset+len` of `fd` (any alignment: the mapping starts at
    /// the page holding `offset`). `None` when the kernel refuses (a pipe, a file system
    /// without mmap, address space exhausted): callers then read the ordinary way.
    pub fn map(fd: RawFd, offset: u64, len: usize) -> Option<Self> {
        let start = align_down(offset, page_size());
        let head = (offset - start) as usize;
        let map_len = head.checked_add(len)?;
        let at = libc::off_t::try_from(start).ok()?;
        if len == 0 {
            return None;
        }
        // SAFETY: a fresh mapping at an address of the kernel's choosing; nothing else
        // is affected. Failure is reported as MAP_FAILED.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                fd,
                at,
            )
        };
        (base != libc::MAP_FAILED).then_some(Self {
            base,
            len: map_len,
            head,
        })
    }

    /// Address of the page-aligned start of the mapping.
    pub fn base(&self) -> *const u8 {
        self.base.cast_const().cast()
    }

    /// Bytes from [`Self::base`] to the first byte asked for.
    pub fn head(&self) -> usize {
        self.head
    }

    /// Length of the mapping from [`Self::base`].
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the mapping is empty (never: `map` refuses empty ranges).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Whether every page of the mapping is in the page cache right now (`mincore`).
    pub fn resident(&self) -> bool {
        let pages = self.len.div_ceil(page_size());
        let mut vec = vec![0u8; pages];
        // SAFETY: `base..base+len` is our live mapping and `vec` has one byte per page.
        let rc = unsafe { libc::mincore(self.base, self.len, vec.as_mut_ptr()) };
        rc == 0 && vec.iter().all(|&b| b & 1 == 1)
    }
}

impl Drop for FileMapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping created in `map`, once.
        unsafe { libc::munmap(self.base, self.len) };
    }
}
