//! Raw memory spans handed to the engine by the binding, and the rules for sharing them
//! across pool threads.

/// Panic unless `[offset, offset + len)` lies inside a span of `total` bytes: a sub-span
/// that does not fit is a bug in the engine, never the user's input (checked at intake).
fn assert_fits(offset: usize, len: usize, total: usize) {
    assert!(
        offset.checked_add(len).is_some_and(|end| end <= total),
        "sub-span {offset}+{len} out of a span of {total}"
    );
}

/// `len` bytes of host memory at `ptr`, owned by someone else (a Python buffer export).
///
/// The creator of a `HostSpan` promises, through [`HostSpan::new`], that the memory stays
/// valid (and, for reads into it, writable) until every operation using it has completed;
/// the binding keeps the exporting object alive inside the operation's future for that.
/// Tasks write disjoint sub-spans, so handing copies to several threads is sound.
#[derive(Debug, Clone, Copy)]
pub struct HostSpan {
    ptr: *mut u8,
    len: usize,
}

// SAFETY: a HostSpan is an address range, not an owner; the creator guarantees validity for
// the whole operation (see `HostSpan::new`), and concurrent tasks touch disjoint sub-spans.
unsafe impl Send for HostSpan {}
// SAFETY: as above; shared references only read the address and length.
unsafe impl Sync for HostSpan {}

impl HostSpan {
    /// A span over `len` bytes at `ptr`.
    ///
    /// # Safety
    /// `ptr..ptr+len` must be valid host memory for the lifetime of every operation that
    /// uses this span (and its sub-spans), writable if the span is read into, and not
    /// accessed by anyone else while kvikpy writes to it.
    pub unsafe fn new(ptr: *mut u8, len: usize) -> Self {
        Self { ptr, len }
    }

    /// A span over a mutable slice (for tests and engine-owned memory).
    pub fn from_slice(slice: &mut [u8]) -> Self {
        Self {
            ptr: slice.as_mut_ptr(),
            len: slice.len(),
        }
    }

    /// The first byte's address.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the span is empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Write `bytes` at the start of the span; panics if they do not fit (a bug in the
    /// caller).
    pub fn copy_from(&self, bytes: &[u8]) {
        assert_fits(0, bytes.len(), self.len);
        // SAFETY: the span is writable memory valid for its length (the creator's promise
        // in `new`), at least `bytes.len()` long (checked above); `bytes` is a Rust slice
        // the caller holds, so it is no memory kvikpy writes and the two cannot overlap.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.ptr, bytes.len()) }
    }

    /// The sub-span `[offset, offset + len)`; panics if it does not fit (a bug in the caller).
    pub fn sub(&self, offset: usize, len: usize) -> Self {
        assert_fits(offset, len, self.len);
        Self {
            // SAFETY: offset + len <= self.len, so the result stays inside the original span.
            ptr: unsafe { self.ptr.add(offset) },
            len,
        }
    }
}

/// `len` bytes of device memory at `ptr` on GPU `ordinal` (or managed memory, which the
/// driver copies to and from the same way).
///
/// Like [`HostSpan`], an address range whose owner is kept alive by the operation's future.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceSpan {
    /// The device address of the first byte.
    pub ptr: u64,
    /// The span's length in bytes.
    pub len: usize,
    /// The CUDA device ordinal of the GPU the memory belongs to.
    pub ordinal: usize,
}

impl DeviceSpan {
    /// The sub-span `[offset, offset + len)`; panics if it does not fit (a bug in the caller).
    pub fn sub(&self, offset: usize, len: usize) -> Self {
        assert_fits(offset, len, self.len);
        Self {
            ptr: self.ptr + offset as u64,
            len,
            ordinal: self.ordinal,
        }
    }
}

/// Memory an operation reads into or writes from.
#[derive(Debug, Clone, Copy)]
pub enum Span {
    /// Host memory, reached with pread/pwrite directly.
    Host(HostSpan),
    /// GPU memory, reached through pinned bounce buffers and DMA.
    Device(DeviceSpan),
}

impl Span {
    /// The GPU the span lies on (`None` for host memory).
    pub fn ordinal(&self) -> Option<usize> {
        match self {
            Self::Host(_) => None,
            Self::Device(d) => Some(d.ordinal),
        }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        match self {
            Self::Host(h) => h.len(),
            Self::Device(d) => d.len,
        }
    }

    /// Whether the span is empty.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The sub-span `[offset, offset + len)`.
    pub fn sub(&self, offset: usize, len: usize) -> Self {
        match self {
            Self::Host(h) => Self::Host(h.sub(offset, len)),
            Self::Device(d) => Self::Device(d.sub(offset, len)),
        }
    }
}
