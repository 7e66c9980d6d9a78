//! Read-only shared mappings of file ranges (the page-cache DMA reads from them) and the
//! page size.

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
