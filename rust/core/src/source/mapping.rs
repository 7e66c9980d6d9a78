//! Read-only mappings of file ranges (the page-cache DMA reads from them, the mmap source
//! copies out of them) and the page size.

use std::io;
use std::os::fd::RawFd;

use crate::tasks::align_down;

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

/// A read-only mapping of part of a file, unmapped on drop. The engine never dereferences
/// it: it asks which pages are resident, hands pages to the DMA engine, or has the kernel
/// copy out of it (`process_vm_readv`, which reports a page past the end of a file
/// truncated meanwhile as `EFAULT`), so such a file cannot raise SIGBUS in this process.
#[derive(Debug)]
pub struct FileMapping {
    base: *mut libc::c_void,
    len: usize,
    head: usize,
}

// SAFETY: the mapping is an address range owned by this value alone and unmapped only on
// drop; it is mapped PROT_READ, so threads sharing it only read through the kernel or DMA.
unsafe impl Send for FileMapping {}
// SAFETY: as above: `&FileMapping` exposes the addresses and read-only queries only.
unsafe impl Sync for FileMapping {}

impl FileMapping {
    /// Map the bytes `offset..offset+len` of `fd` shared (any alignment: the mapping starts
    /// at the page holding `offset`). `None` when the kernel refuses (a pipe, a file system
    /// without mmap, address space exhausted): callers then read the ordinary way.
    pub fn map(fd: RawFd, offset: u64, len: usize) -> Option<Self> {
        Self::map_with(fd, offset, len, libc::MAP_SHARED).ok()
    }

    /// [`FileMapping::map`] with the caller's `mmap(2)` flags (`MAP_PRIVATE`,
    /// `MAP_POPULATE`...), always `PROT_READ`; the kernel's error when it refuses (`EINVAL`
    /// for an empty range or an offset past what `off_t` holds).
    pub(crate) fn map_with(
        fd: RawFd,
        offset: u64,
        len: usize,
        flags: libc::c_int,
    ) -> io::Result<Self> {
        let invalid = || io::Error::from_raw_os_error(libc::EINVAL);
        let start = align_down(offset, page_size());
        let head = (offset - start) as usize;
        let map_len = head.checked_add(len).ok_or_else(invalid)?;
        let at = libc::off_t::try_from(start).map_err(|_| invalid())?;
        if len == 0 {
            return Err(invalid());
        }
        // SAFETY: a fresh mapping at an address of the kernel's choosing (callers never
        // pass MAP_FIXED); nothing else is affected. Failure is reported as MAP_FAILED.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                map_len,
                libc::PROT_READ,
                flags,
                fd,
                at,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Self {
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
        self.resident_range(0, self.len)
    }

    /// Whether every page of `from..from+len` (bytes from [`Self::base`], `from`
    /// page-aligned) is in the page cache right now; false for a range outside the mapping.
    pub(crate) fn resident_range(&self, from: usize, len: usize) -> bool {
        if from % page_size() != 0 || from.checked_add(len).is_none_or(|end| end > self.len) {
            return false;
        }
        let pages = len.div_ceil(page_size());
        let mut vec = vec![0u8; pages];
        // SAFETY: `from < len <= self.len` (checked above), so the address stays inside
        // our live mapping.
        let start = unsafe { self.base.cast::<u8>().add(from) };
        // SAFETY: `start..start+len` lies inside our live mapping (checked above), starts
        // on a page, and `vec` has one byte per page.
        let rc = unsafe { libc::mincore(start.cast(), len, vec.as_mut_ptr()) };
        rc == 0 && vec.iter().all(|&b| b & 1 == 1)
    }

    /// How many of the pages that `from..from+len` (bytes from [`Self::base`]) touches are
    /// in the page cache right now (`mincore`, a window of 1024 pages at a time on the
    /// stack: nothing is allocated); `None` for a range outside the mapping or a refusal.
    pub fn resident_pages(&self, from: usize, len: usize) -> Option<u64> {
        const WINDOW_PAGES: usize = 1024;
        let page = page_size();
        let end = from.checked_add(len).filter(|&end| end <= self.len)?;
        let mut at = from - from % page;
        let mut resident = 0u64;
        let mut answer = [0u8; WINDOW_PAGES];
        while at < end {
            let window = (end - at).min(WINDOW_PAGES * page);
            let pages = window.div_ceil(page);
            // SAFETY: `at < end <= self.len`, so the address stays inside our mapping.
            let start = unsafe { self.base.cast::<u8>().add(at) };
            // SAFETY: `start..start+window` lies inside our live mapping and starts on a
            // page; `answer` has room for the `pages <= WINDOW_PAGES` bytes mincore writes.
            let rc = unsafe { libc::mincore(start.cast(), window, answer.as_mut_ptr()) };
            if rc != 0 {
                return None;
            }
            resident += answer[..pages].iter().filter(|&&b| b & 1 == 1).count() as u64;
            at += window;
        }
        Some(resident)
    }
}

impl Drop for FileMapping {
    fn drop(&mut self) {
        // SAFETY: unmaps exactly the mapping created in `map`, once.
        unsafe { libc::munmap(self.base, self.len) };
    }
}
