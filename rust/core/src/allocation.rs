//! Memory kvikpy allocates for its own buffers: where it lives ([`Placement`]), page-aligned
//! host memory with the huge-page policy ([`AlignedHost`]), the owner of host, pinned host or
//! device memory ([`Allocation`]), and when its bytes are ready ([`Readiness`]).

use std::alloc::Layout;
use std::ptr::NonNull;
use std::sync::Mutex;

use crate::cuda::{self, DeviceAllocation, PinnedHostAllocation, Stream, StreamEvent};
use crate::error::{Error, Result};
use crate::span::{DeviceSpan, HostSpan, Span};

/// Where an allocation's bytes live: host memory or the memory of one GPU.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Placement {
    /// Host memory (ordinary or pinned).
    Host,
    /// The memory of the CUDA device with this ordinal.
    Device(usize),
}

impl Placement {
    /// The placement of a device argument: `None` for host memory, `Some(n)` for GPU `n`.
    pub fn from_ordinal(ordinal: Option<usize>) -> Self {
        ordinal.map_or(Self::Host, Self::Device)
    }

    /// The GPU's ordinal, or `None` for host memory.
    pub fn ordinal(self) -> Option<usize> {
        match self {
            Self::Host => None,
            Self::Device(ordinal) => Some(ordinal),
        }
    }
}

/// The alignment of every host allocation: a page, so O_DIRECT reads land in it directly.
pub(crate) const HOST_ALIGNMENT: usize = 4096;

/// From twice this size on, host allocations are aligned to and advised for 2 MiB
/// transparent huge pages: a fresh buffer is first touched by the read filling it, and
/// 4 KiB pages would cost a page fault each (32,768 for 128 MiB). numpy does the same for
/// its arrays.
pub(crate) const HUGE_PAGE: usize = 2 << 20;

/// The layout of a host allocation of `size` bytes (at least 1): page-aligned, or
/// huge-page-aligned from `2 * HUGE_PAGE` bytes on. `InvalidArgument` for a size no
/// layout can have (over `isize::MAX` once rounded up to the alignment).
pub(crate) fn host_layout(size: usize) -> Result<Layout> {
    let align = if size >= 2 * HUGE_PAGE {
        HUGE_PAGE
    } else {
        HOST_ALIGNMENT
    };
    Layout::from_size_align(size.max(1), align).map_err(|e| Error::InvalidArgument(e.to_string()))
}

/// Page-aligned ordinary host memory (when no CUDA driver can pin it), freed on drop.
#[derive(Debug)]
pub(crate) struct AlignedHost {
    ptr: NonNull<u8>,
    /// The layout it was allocated with, which freeing must repeat.
    layout: Layout,
    /// The size asked for (tests check it).
    #[cfg(test)]
    size: usize,
}

// SAFETY: plain memory exclusively owned by this value.
unsafe impl Send for AlignedHost {}
// SAFETY: shared access only exposes the address.
unsafe impl Sync for AlignedHost {}

impl AlignedHost {
    /// Allocate `size` bytes (see [`host_layout`]), advised for huge pages when aligned to
    /// them. `OutOfMemory` when the allocator refuses.
    pub fn new(size: usize) -> Result<Self> {
        let layout = host_layout(size)?;
        // SAFETY: the layout's size is at least 1.
        let ptr = unsafe { std::alloc::alloc(layout) };
        let ptr = NonNull::new(ptr)
            .ok_or_else(|| Error::OutOfMemory(format!("could not allocate {size} bytes")))?;
        if layout.align() == HUGE_PAGE {
            // SAFETY: advice on memory we own; failure (THP off) changes nothing.
            unsafe { libc::madvise(ptr.as_ptr().cast(), size, libc::MADV_HUGEPAGE) };
        }
        Ok(Self {
            ptr,
            layout,
            #[cfg(test)]
            size,
        })
    }

    /// Address of the first byte.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Size in bytes, as asked for (the layout may be one byte larger for 0).
    #[cfg(test)]
    pub fn size(&self) -> usize {
        self.size
    }

    /// The alignment the memory has.
    #[cfg(test)]
    pub fn align(&self) -> usize {
        self.layout.align()
    }
}

impl Drop for AlignedHost {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with `self.layout`, freed once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

/// The memory an [`Allocation`] owns.
#[derive(Debug)]
enum Memory {
    Device(DeviceAllocation),
    Pinned(PinnedHostAllocation),
    Host(AlignedHost),
}

/// Memory kvikpy allocated for a buffer (GPU, pinned host or ordinary host), and when its
/// bytes are ready for consumers ([`Readiness`]).
#[derive(Debug)]
pub struct Allocation {
    memory: Memory,
    size: usize,
    ready: Readiness,
}

impl Allocation {
    /// Allocate `size` bytes at `placement`. With `pinned`, page-locked host memory for
    /// device `placement` (the calling thread's current device for [`Placement::Host`]),
    /// allocated and freed under that device's context.
    pub fn new(placement: Placement, size: usize, pinned: bool) -> Result<Self> {
        let memory = match (pinned, placement) {
            (true, placement) => {
                let serving = match placement {
                    Placement::Device(ordinal) => ordinal,
                    Placement::Host => cuda::current_device()?,
                };
                Memory::Pinned(PinnedHostAllocation::new(serving, size)?)
            }
            (false, Placement::Device(ordinal)) => {
                Memory::Device(DeviceAllocation::new(ordinal, size)?)
            }
            (false, Placement::Host) => Memory::Host(AlignedHost::new(size)?),
        };
        Ok(Self {
            memory,
            size,
            ready: Readiness::default(),
        })
    }

    /// New memory at `placement` (not pinned) holding a copy of `bytes`.
    pub fn with_bytes(placement: Placement, bytes: &[u8]) -> Result<Self> {
        let mut made = Self::new(placement, bytes.len(), false)?;
        match (placement, made.host_bytes_mut()) {
            (_, Some(host)) => host.copy_from_slice(bytes),
            (Placement::Device(ordinal), None) if !bytes.is_empty() => {
                // SAFETY: `made` holds `bytes.len()` bytes on GPU `ordinal`, new and used
                // by nothing else; `bytes` is live host memory of that length, and the
                // copy has finished when the call returns.
                unsafe {
                    cuda::copy_host_to_device(ordinal, made.base(), bytes.as_ptr(), bytes.len())?
                }
            }
            _ => {}
        }
        Ok(made)
    }

    /// Address of the first byte (a device address for GPU memory).
    pub fn base(&self) -> u64 {
        match &self.memory {
            Memory::Device(d) => d.ptr(),
            Memory::Pinned(p) => p.as_ptr() as u64,
            Memory::Host(h) => h.as_ptr() as u64,
        }
    }

    /// Size in bytes.
    pub fn size(&self) -> usize {
        self.size
    }

    /// Where the bytes live (pinned memory is host memory).
    pub fn placement(&self) -> Placement {
        match &self.memory {
            Memory::Device(d) => Placement::Device(d.ordinal()),
            Memory::Pinned(_) | Memory::Host(_) => Placement::Host,
        }
    }

    /// Whether this is page-locked (pinned) host memory.
    pub fn is_pinned(&self) -> bool {
        matches!(self.memory, Memory::Pinned(_))
    }

    /// The whole allocation as an engine span (narrow it with [`Span::sub`]).
    ///
    /// The span is an address range: it stays valid only while this allocation lives, so
    /// whoever hands it to an operation keeps the allocation alive (an `Arc` in the
    /// operation's keepalive) until the operation has finished.
    pub fn span(&self) -> Span {
        let (ptr, len) = (self.base(), self.size);
        match self.placement() {
            Placement::Device(ordinal) => Span::Device(DeviceSpan { ptr, len, ordinal }),
            // SAFETY: `ptr..ptr + len` is this host allocation, which the caller keeps
            // alive for as long as the span is used (see above).
            Placement::Host => Span::Host(unsafe { HostSpan::new(ptr as *mut u8, len) }),
        }
    }

    /// The bytes of host memory (pinned or not) to write, `None` for GPU memory. Spans
    /// taken with [`span`](Self::span) must not be in use meanwhile.
    pub(crate) fn host_bytes_mut(&mut self) -> Option<&mut [u8]> {
        let ptr = match &self.memory {
            Memory::Device(_) => return None,
            Memory::Pinned(p) => p.as_ptr(),
            Memory::Host(h) => h.as_ptr(),
        };
        // SAFETY: `size` bytes of host memory this allocation owns and keeps until it is
        // dropped; `&mut self` makes this the only reference made through it, and no span
        // of it is in use (above).
        Some(unsafe { std::slice::from_raw_parts_mut(ptr, self.size) })
    }

    /// When the bytes are ready for consumers.
    pub fn readiness(&self) -> &Readiness {
        &self.ready
    }
}

/// Whether an allocation's bytes have landed: always, unless they were written in a
/// stream's order, in which case consumers wait for the event recorded after the transfer.
#[derive(Debug, Default)]
pub struct Readiness {
    /// The event after the last stream-ordered transfer, and that stream's raw handle.
    ready: Mutex<Option<(StreamEvent, usize)>>,
}

impl Readiness {
    /// Record that the bytes land when `stream` (a raw `CUstream`) reaches `event`.
    pub(crate) fn set(&self, event: StreamEvent, stream: usize) {
        *self.ready.lock().unwrap_or_else(|e| e.into_inner()) = Some((event, stream));
    }

    /// Record an event now on `stream` of device `ordinal`: the bytes land when the stream
    /// reaches it (after the transfer queued on it last).
    pub fn mark(&self, ordinal: usize, stream: usize) -> Result<()> {
        self.set(
            StreamEvent::record(ordinal, Stream::from_raw(stream))?,
            stream,
        );
        Ok(())
    }

    /// The stream whose order the bytes last landed in, if any.
    pub fn ordered_stream(&self) -> Option<usize> {
        self.ready
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|(_, stream)| *stream)
    }

    /// Make `stream` wait (on the GPU) until the bytes have landed, or, for `None`, block
    /// the calling thread until they have. Nothing to do when they landed synchronously.
    pub fn wait_on(&self, stream: Option<usize>) -> Result<()> {
        let guard = self.ready.lock().unwrap_or_else(|e| e.into_inner());
        match (guard.as_ref(), stream) {
            (None, _) => Ok(()),
            (Some((event, _)), Some(s)) => event.make_wait(Stream::from_raw(s)),
            (Some((event, _)), None) => event.synchronize(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn placement_round_trips_through_an_ordinal() {
        assert_eq!(Placement::from_ordinal(None), Placement::Host);
        assert_eq!(Placement::from_ordinal(Some(3)), Placement::Device(3));
        assert_eq!(Placement::Host.ordinal(), None);
        assert_eq!(Placement::Device(0).ordinal(), Some(0));
    }

    #[test]
    fn small_host_allocations_are_page_aligned_and_large_ones_huge_page_aligned() {
        assert_eq!(
            host_layout(0).map(|l| (l.size(), l.align())).ok(),
            Some((1, 4096))
        );
        assert_eq!(
            host_layout(2 * HUGE_PAGE - 1).map(|l| l.align()).ok(),
            Some(4096)
        );
        assert_eq!(
            host_layout(2 * HUGE_PAGE).map(|l| l.align()).ok(),
            Some(HUGE_PAGE)
        );
        for size in [0, 1, 4095, 4097, 2 * HUGE_PAGE] {
            let host = AlignedHost::new(size).unwrap();
            assert_eq!(host.as_ptr() as usize % host.align(), 0, "size {size}");
            assert_eq!(host.size(), size);
        }
    }

    #[test]
    fn an_impossible_host_size_is_an_error_not_a_panic() {
        assert!(matches!(
            host_layout(usize::MAX),
            Err(Error::InvalidArgument(_))
        ));
        assert!(matches!(
            AlignedHost::new(isize::MAX as usize - HUGE_PAGE),
            Err(Error::OutOfMemory(m)) if m.contains("could not allocate")
        ));
    }

    #[test]
    fn a_host_allocation_spans_its_memory() {
        let a = Allocation::new(Placement::Host, 10_000, false).unwrap();
        assert_eq!(a.placement(), Placement::Host);
        assert!(!a.is_pinned());
        assert_eq!(a.size(), 10_000);
        let Span::Host(whole) = a.span() else {
            panic!("host memory gives a host span")
        };
        assert_eq!((whole.as_ptr() as u64, whole.len()), (a.base(), 10_000));
        // The memory is the allocation's to write, to its last byte.
        // SAFETY: `whole` is `a`'s memory, alive for this block, and nothing else uses it.
        let bytes = unsafe { std::slice::from_raw_parts_mut(whole.as_ptr(), whole.len()) };
        bytes.fill(7);
        assert_eq!(bytes[9_999], 7);
        let empty = Allocation::new(Placement::Host, 0, false).unwrap();
        assert!(empty.span().is_empty());
    }

    #[test]
    fn bytes_written_synchronously_are_ready_at_once() {
        let a = Allocation::new(Placement::Host, 1, false).unwrap();
        assert_eq!(a.readiness().ordered_stream(), None);
        assert!(a.readiness().wait_on(None).is_ok());
        assert!(a.readiness().wait_on(Some(1)).is_ok());
    }

    #[test]
    fn without_cuda_device_and_pinned_allocations_say_so() {
        if cuda::available() {
            return; // the GPU suite covers these
        }
        for (placement, pinned) in [
            (Placement::Device(0), false),
            (Placement::Device(0), true),
            (Placement::Host, true),
        ] {
            assert!(
                matches!(
                    Allocation::new(placement, 4096, pinned),
                    Err(Error::CudaUnavailable(_))
                ),
                "{placement:?} pinned={pinned}"
            );
        }
    }
}
