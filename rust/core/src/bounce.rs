//! A pool of page-aligned bounce buffers, reused across calls and threads.
//!
//! O_DIRECT needs aligned memory, and user buffers rarely are: their aligned parts are
//! staged through these buffers. The allocator is pluggable so the GPU path can pool
//! pinned (page-locked) buffers the same way. Buffers are never allocated per call: a
//! task takes one from the pool and gives it back when dropped, so the pool holds at
//! most as many buffers as tasks ever ran at once.
//!
//! Each buffer also records the `bounce_buffer_size` it serves, which can be smaller than
//! its allocation (rounded up to whole pages, plus a page of alignment room for pinned
//! ones): [`BouncePool::free_idle`] reports freed buffers in those units, as kvikio's
//! `bounce_buffer_free` counts its buffers of exactly `bounce_buffer_size` bytes.

use std::alloc::{self, Layout};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};
use crate::staging::Reservation;
use crate::tasks::DIRECT_IO_ALIGNMENT;

/// How a [`BouncePool`] gets and returns memory.
pub trait BounceAllocator: Send + Sync + 'static {
    /// Allocate `size` bytes aligned to [`DIRECT_IO_ALIGNMENT`].
    fn allocate(&self, size: usize) -> Result<NonNull<u8>>;
    /// Free memory from [`BounceAllocator::allocate`] with the same `size`.
    ///
    /// # Safety
    /// `ptr` must come from `allocate(size)` of this allocator and not be used afterwards.
    unsafe fn deallocate(&self, ptr: NonNull<u8>, size: usize);
}

/// Ordinary page-aligned host memory.
#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct PageAlignedAllocator;

impl BounceAllocator for PageAlignedAllocator {
    fn allocate(&self, size: usize) -> Result<NonNull<u8>> {
        let layout = Layout::from_size_align(size.max(1), DIRECT_IO_ALIGNMENT)
            .map_err(|e| Error::InvalidArgument(format!("bounce buffer of {size} bytes: {e}")))?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { alloc::alloc(layout) };
        NonNull::new(ptr).ok_or_else(|| {
            Error::OutOfMemory(format!(
                "could not allocate a {size}-byte bounce buffer; lower bounce_buffer_size"
            ))
        })
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, size: usize) {
        // The same layout was valid at allocation, so this cannot fail; were it to, leaking
        // the buffer is the only answer that neither panics nor frees with a wrong layout.
        let Ok(layout) = Layout::from_size_align(size.max(1), DIRECT_IO_ALIGNMENT) else {
            return;
        };
        // SAFETY: per the trait contract, `ptr` came from `allocate(size)` with this layout.
        unsafe { alloc::dealloc(ptr.as_ptr(), layout) }
    }
}

struct Idle {
    ptr: NonNull<u8>,
    size: usize,
    serves: usize,
}

// SAFETY: an idle buffer is plain memory owned by the pool; no thread holds a reference.
unsafe impl Send for Idle {}

/// A pool of aligned buffers, each at most one full bounce buffer in size.
pub struct BouncePool {
    allocator: Box<dyn BounceAllocator>,
    idle: Mutex<Vec<Idle>>,
    /// Bytes allocated and not yet freed (idle or in use), and the most there were.
    held: Gauge,
    /// Bytes of buffers tasks hold now, and the most there were.
    in_use: Gauge,
}

/// A byte count and the highest it has been since the last [`Gauge::reset_peak`].
#[derive(Debug, Default)]
struct Gauge {
    now: AtomicUsize,
    peak: AtomicUsize,
}

impl Gauge {
    fn add(&self, n: usize) {
        let now = self.now.fetch_add(n, Ordering::Relaxed) + n;
        self.peak.fetch_max(now, Ordering::Relaxed);
    }

    fn sub(&self, n: usize) {
        self.now.fetch_sub(n, Ordering::Relaxed);
    }

    fn reset_peak(&self) {
        self.peak
            .store(self.now.load(Ordering::Relaxed), Ordering::Relaxed);
    }
}

/// What a [`BouncePool`] holds, in bytes of allocations.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PoolMemory {
    /// Allocated now, idle or in use.
    pub held: usize,
    /// The most allocated at once since the peaks were last reset.
    pub peak_held: usize,
    /// Held by tasks now.
    pub in_use: usize,
    /// The most held by tasks at once since the peaks were last reset.
    pub peak_in_use: usize,
}

impl std::ops::Add for PoolMemory {
    type Output = Self;

    /// Two pools' counts added (peaks added: at most what both held at once).
    fn add(self, other: Self) -> Self {
        Self {
            held: self.held + other.held,
            peak_held: self.peak_held + other.peak_held,
            in_use: self.in_use + other.in_use,
            peak_in_use: self.peak_in_use + other.peak_in_use,
        }
    }
}

impl std::fmt::Debug for BouncePool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BouncePool")
            .field("idle", &self.idle_count())
            .finish_non_exhaustive()
    }
}

impl BouncePool {
    /// An empty pool drawing on `allocator`.
    pub fn new(allocator: impl BounceAllocator) -> Arc<Self> {
        Arc::new(Self {
            allocator: Box::new(allocator),
            idle: Mutex::new(Vec::new()),
            held: Gauge::default(),
            in_use: Gauge::default(),
        })
    }

    /// What the pool holds now and the most it has held (see [`PoolMemory`]).
    pub fn memory(&self) -> PoolMemory {
        let load = |a: &AtomicUsize| a.load(Ordering::Relaxed);
        PoolMemory {
            held: load(&self.held.now),
            peak_held: load(&self.held.peak),
            in_use: load(&self.in_use.now),
            peak_in_use: load(&self.in_use.peak),
        }
    }

    /// Start the peaks again from what the pool holds now.
    pub fn reset_peaks(&self) {
        self.held.reset_peak();
        self.in_use.reset_peak();
    }

    /// `allocator.deallocate`, counted.
    ///
    /// # Safety
    /// As [`BounceAllocator::deallocate`]: `ptr` came from this pool's allocator with
    /// `size` bytes and is not used afterwards.
    unsafe fn release(&self, ptr: NonNull<u8>, size: usize) {
        // SAFETY: the caller's contract is the allocator's.
        unsafe { self.allocator.deallocate(ptr, size) };
        self.held.sub(size);
    }

    /// A buffer of exactly `size` bytes serving a `bounce_buffer_size` of `serves` bytes:
    /// an idle one if there is one, else a new one ([`BouncePool::acquire_at_least`] with
    /// `size` as both bounds).
    pub(crate) fn acquire(self: &Arc<Self>, size: usize, serves: usize) -> Result<BounceBuffer> {
        self.acquire_at_least(size, size, serves)
    }

    /// A buffer of at least `need` and at most `limit` bytes (the size a full buffer has
    /// under the current `bounce_buffer_size`) serving a `bounce_buffer_size` of `serves`
    /// bytes: an idle one that is large enough if there is one, else a new one of `need`
    /// bytes. So a process whose transfers are small pins small buffers (pinning is slow:
    /// a 16 MiB buffer cost 8 ms on the H100 machine, most of a first 1 MiB read).
    ///
    /// Idle buffers larger than `limit` (left from a larger `bounce_buffer_size`) are
    /// freed; when a new buffer is made, one idle buffer too small to serve is freed in
    /// its place, so the pool still holds at most as many buffers as tasks ran at once.
    pub(crate) fn acquire_at_least(
        self: &Arc<Self>,
        need: usize,
        limit: usize,
        serves: usize,
    ) -> Result<BounceBuffer> {
        self.acquire_within(need, limit, limit, serves)
    }

    /// [`BouncePool::acquire_at_least`] that reuses only an idle buffer of at most `most`
    /// bytes (at least `need`), leaving larger idle ones in the pool: a transfer whose
    /// bytes are reserved from a staging budget takes a buffer of exactly the size it
    /// reserved (`most` = `need`), so that the bytes in use stay within the budget.
    pub(crate) fn acquire_within(
        self: &Arc<Self>,
        need: usize,
        most: usize,
        limit: usize,
        serves: usize,
    ) -> Result<BounceBuffer> {
        self.take(need, most, limit, serves, true)
    }

    /// [`BouncePool::acquire`] that frees nothing: for a call that must return before
    /// the GPU work it is ordered after has run (`raw_read_async`). Freeing pinned memory
    /// waits for the device's queued work (`cuMemFreeHost` synchronises), so the idle
    /// buffers this call would free stay in the pool for the next transfer to free.
    pub(crate) fn acquire_keeping(
        self: &Arc<Self>,
        size: usize,
        serves: usize,
    ) -> Result<BounceBuffer> {
        self.take(size, size, size, serves, false)
    }

    fn take(
        self: &Arc<Self>,
        need: usize,
        most: usize,
        limit: usize,
        serves: usize,
        free: bool,
    ) -> Result<BounceBuffer> {
        let need = need.min(limit);
        let most = most.clamp(need, limit);
        let reused = {
            let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
            // `retain` works in place: no allocation on the hot path.
            idle.retain(|b| {
                if b.size <= limit || !free {
                    return true;
                }
                // SAFETY: idle buffers came from this allocator with their size, and this
                // one leaves the list here, so it is freed once.
                unsafe { self.release(b.ptr, b.size) };
                false
            });
            match idle.iter().rposition(|b| b.size >= need && b.size <= most) {
                Some(i) => Some(idle.swap_remove(i)),
                None if !free => None,
                None => {
                    if let Some(i) = idle.iter().rposition(|b| b.size < need) {
                        let small = idle.swap_remove(i);
                        // SAFETY: as above; `small` has left the list.
                        unsafe { self.release(small.ptr, small.size) };
                    }
                    None
                }
            }
        };
        let (ptr, size) = match reused {
            Some(b) => (b.ptr, b.size),
            None => {
                let ptr = self.allocator.allocate(need)?;
                self.held.add(need);
                (ptr, need)
            }
        };
        self.in_use.add(size);
        Ok(BounceBuffer {
            pool: Arc::clone(self),
            reservation: Reservation::default(),
            ptr,
            size,
            serves,
        })
    }

    /// Free every idle buffer; returns the sum of the `bounce_buffer_size` each served
    /// (kvikio's count; the memory released is each buffer's allocation, at least that).
    /// Buffers in use stay valid and return to the pool when their task finishes.
    pub fn free_idle(&self) -> usize {
        let drained: Vec<Idle> = {
            let mut idle = self.idle.lock().unwrap_or_else(|e| e.into_inner());
            idle.drain(..).collect()
        };
        let mut freed = 0;
        for b in drained {
            freed += b.serves;
            // SAFETY: idle buffers came from this allocator with their recorded size.
            unsafe { self.release(b.ptr, b.size) };
        }
        freed
    }

    /// Number of idle buffers (for tests and diagnostics).
    pub(crate) fn idle_count(&self) -> usize {
        self.idle.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

impl Drop for BouncePool {
    fn drop(&mut self) {
        self.free_idle();
    }
}

/// A buffer borrowed from a [`BouncePool`]; goes back to the pool when dropped.
pub(crate) struct BounceBuffer {
    pool: Arc<BouncePool>,
    /// The staging-budget bytes this buffer holds, given back (as a field, dropped after
    /// [`BounceBuffer::drop`]) once the buffer is back in its pool.
    reservation: Reservation,
    ptr: NonNull<u8>,
    size: usize,
    serves: usize,
}

// SAFETY: the buffer is exclusively owned by whoever holds the BounceBuffer.
unsafe impl Send for BounceBuffer {}

impl BounceBuffer {
    /// The buffer as a mutable byte slice.
    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: ptr..ptr+size is an allocation owned exclusively by this BounceBuffer.
        unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.size) }
    }

    /// The buffer's size in bytes.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.size
    }

    /// Hold `reservation` until the buffer returns to its pool.
    pub(crate) fn hold(&mut self, reservation: Reservation) {
        self.reservation = reservation;
    }
}

impl Drop for BounceBuffer {
    fn drop(&mut self) {
        self.pool.in_use.sub(self.size);
        let mut idle = self.pool.idle.lock().unwrap_or_else(|e| e.into_inner());
        idle.push(Idle {
            ptr: self.ptr,
            size: self.size,
            serves: self.serves,
        });
    }
}

static HOST_POOL: crate::fork::ForkLocal<Arc<BouncePool>> =
    crate::fork::ForkLocal::new(|| BouncePool::new(PageAlignedAllocator));

/// The process-wide pool of host bounce buffers used by O_DIRECT host I/O.
pub fn host_pool() -> &'static Arc<BouncePool> {
    HOST_POOL.get()
}

/// In a forked child: forget the parent's host pool (its lock may be held by a thread
/// that does not exist here, and buffers the parent's tasks hold never come back); the
/// child's first O_DIRECT read makes a fresh one. Async-signal-safe.
pub(crate) fn forget_in_child() {
    HOST_POOL.forget();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn acquire_keeping_frees_no_idle_buffer() {
        // A stream-ordered call's buffers: a smaller idle buffer and one left from a
        // larger setting both stay in the pool; a plain acquire then frees them.
        let pool = BouncePool::new(PageAlignedAllocator);
        let large = pool.acquire(16384, 16384).unwrap();
        let small = pool.acquire(4096, 4096).unwrap();
        drop((large, small));
        assert_eq!(pool.memory().held, 4096 + 16384);
        let kept = pool.acquire_keeping(8192, 8192).unwrap();
        assert_eq!(kept.len(), 8192);
        assert_eq!(pool.memory().held, 4096 + 8192 + 16384, "nothing freed");
        drop(kept);
        let plain = pool.acquire_at_least(8192, 8192, 8192).unwrap();
        assert_eq!(plain.len(), 8192, "the idle buffer of the size is reused");
        assert_eq!(pool.memory().held, 4096 + 8192, "the larger one is freed");
        drop(plain);
        drop(pool.acquire_at_least(12288, 12288, 12288).unwrap());
        let held = pool.memory().held;
        assert!(
            held < 4096 + 8192 + 12288,
            "a smaller one is freed in its place: {held}"
        );
    }

    #[test]
    fn the_pool_counts_what_it_holds_and_its_peaks() {
        let pool = BouncePool::new(PageAlignedAllocator);
        assert_eq!(pool.memory(), PoolMemory::default());
        let a = pool.acquire(8192, 8192).unwrap();
        let b = pool.acquire(8192, 8192).unwrap();
        let both = PoolMemory {
            held: 16384,
            peak_held: 16384,
            in_use: 16384,
            peak_in_use: 16384,
        };
        assert_eq!(pool.memory(), both);
        drop(a);
        drop(b);
        // Idle buffers are still held; none is in use; the peaks stay.
        assert_eq!(pool.memory(), PoolMemory { in_use: 0, ..both });
        // Reuse allocates nothing.
        let c = pool.acquire(8192, 8192).unwrap();
        assert_eq!((pool.memory().held, pool.memory().in_use), (16384, 8192));
        pool.reset_peaks();
        assert_eq!(pool.memory().peak_in_use, 8192);
        drop(c);
        // A size change frees the stale buffers: held falls with them.
        let d = pool.acquire(4096, 4096).unwrap();
        assert_eq!((pool.memory().held, pool.memory().in_use), (4096, 4096));
        drop(d);
        pool.free_idle();
        assert_eq!((pool.memory().held, pool.memory().in_use), (0, 0));
        assert_eq!(pool.memory().peak_held, 16384, "the peak since the reset");
        assert_eq!(
            pool.memory() + pool.memory(),
            PoolMemory {
                held: 0,
                peak_held: 32768,
                in_use: 0,
                peak_in_use: 16384,
            }
        );
    }

    #[test]
    fn a_budgeted_buffer_is_its_reserved_size_and_gives_the_bytes_back_in_the_pool() {
        let pool = BouncePool::new(PageAlignedAllocator);
        drop(pool.acquire(16384, 16384).unwrap());
        // A larger idle buffer is not reused for a reservation of 8 KiB, nor freed.
        let budget = crate::staging::StagingBudget::new(1 << 20);
        let mut b = pool.acquire_within(8192, 8192, 16384, 8192).unwrap();
        b.hold(budget.take(8192).unwrap());
        assert_eq!(b.len(), 8192);
        assert_eq!(
            (pool.memory().held, pool.memory().in_use),
            (16384 + 8192, 8192)
        );
        assert_eq!(budget.usage().in_use, 8192);
        drop(b);
        assert_eq!(
            budget.usage().in_use,
            0,
            "the bytes come back with the buffer"
        );
        // Reused exactly; the larger one still serves unbudgeted transfers.
        let again = pool.acquire_within(8192, 8192, 16384, 8192).unwrap();
        let large = pool.acquire_at_least(8192, 16384, 8192).unwrap();
        assert_eq!((again.len(), large.len()), (8192, 16384));
        assert_eq!(pool.memory().held, 16384 + 8192);
    }

    #[test]
    fn buffers_are_aligned_reused_and_freed() {
        let pool = BouncePool::new(PageAlignedAllocator);
        let mut a = pool.acquire(8192, 8192).unwrap();
        assert_eq!(a.as_mut_slice().as_ptr() as usize % DIRECT_IO_ALIGNMENT, 0);
        let addr = a.as_mut_slice().as_ptr() as usize;
        drop(a);
        assert_eq!(pool.idle_count(), 1);
        let mut b = pool.acquire(8192, 8192).unwrap();
        assert_eq!(
            b.as_mut_slice().as_ptr() as usize,
            addr,
            "idle buffer is reused"
        );
        let c = pool.acquire(8192, 8192).unwrap();
        drop(b);
        drop(c);
        assert_eq!(pool.idle_count(), 2);
        // A size change frees the stale buffers instead of keeping them forever.
        let d = pool.acquire(4096, 4096).unwrap();
        assert_eq!(pool.idle_count(), 0);
        drop(d);
        assert_eq!(pool.free_idle(), 4096);
        assert_eq!(pool.idle_count(), 0);
    }

    #[test]
    fn short_transfers_get_small_buffers_and_the_pool_stays_one_per_task() {
        let pool = BouncePool::new(PageAlignedAllocator);
        let full = 16 * 4096;
        let small = pool.acquire_at_least(4096, full, full).unwrap();
        assert_eq!(small.len(), 4096, "sized for the need, not the setting");
        drop(small);
        // A large need replaces the idle small buffer rather than adding to it.
        let large = pool.acquire_at_least(full, full, full).unwrap();
        assert_eq!(large.len(), full);
        assert_eq!(pool.idle_count(), 0);
        drop(large);
        // A small need reuses the idle large buffer.
        let reused = pool.acquire_at_least(4096, full, full).unwrap();
        assert_eq!(reused.len(), full);
        assert_eq!(pool.idle_count(), 0);
        drop(reused);
        // Needs above the limit are capped at it; idle buffers above a lower limit go.
        assert_eq!(
            pool.acquire_at_least(full * 2, full, full).unwrap().len(),
            full
        );
        let capped = pool.acquire_at_least(4096, 8192, 8192).unwrap();
        assert_eq!(capped.len(), 4096);
        assert_eq!(pool.idle_count(), 0);
        drop(capped);
        assert_eq!(pool.free_idle(), 8192, "counted as the setting it served");
    }

    #[test]
    fn freed_bytes_count_the_size_each_buffer_last_served() {
        let pool = BouncePool::new(PageAlignedAllocator);
        drop(pool.acquire(8192, 1024).unwrap());
        assert_eq!(
            pool.free_idle(),
            1024,
            "the setting served, not the 8 KiB allocation"
        );
        assert_eq!(pool.free_idle(), 0);
        drop(pool.acquire(8192, 1024).unwrap());
        // Same allocation size, another setting: the idle buffer is reused and now serves 2048.
        drop(pool.acquire(8192, 2048).unwrap());
        assert_eq!(pool.idle_count(), 1);
        assert_eq!(pool.free_idle(), 2048);
    }
}
