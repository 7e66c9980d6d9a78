//! Streams, events and copies: one non-blocking stream and two events per (thread, device),
//! events on users' streams, and host flags that hold a user's stream until kvikpy's
//! worker has finished (`cuStreamWaitValue32`).

use std::cell::RefCell;
use std::sync::atomic::{fence, Ordering};
use std::sync::Mutex;

use cudarc::driver::sys;

use super::driver::{bind, check};
use super::memory::PinnedHostAllocation;
use crate::error::Result;

/// A thread's stream and two events on device `ordinal`.
struct ThreadCuda {
    ordinal: usize,
    stream: sys::CUstream,
    events: [sys::CUevent; 2],
}

impl Drop for ThreadCuda {
    fn drop(&mut self) {
        let _ = std::panic::catch_unwind(|| {
            if bind(self.ordinal).is_ok() {
                // SAFETY: these handles were created on this device's context by this
                // thread and are destroyed exactly once, here.
                unsafe {
                    for e in self.events {
                        let _ = sys::cuEventDestroy_v2(e);
                    }
                    let _ = sys::cuStreamDestroy_v2(self.stream);
                }
            }
        });
    }
}

thread_local! {
    static THREAD_CUDA: RefCell<Vec<ThreadCuda>> = const { RefCell::new(Vec::new()) };
}

/// A stream handle as an opaque integer (0 is the legacy default stream).
pub type StreamHandle = usize;

/// Events owned by the calling thread (opaque handles), used to pace double buffering.
#[derive(Debug, Clone, Copy)]
pub struct ThreadEvents(pub [usize; 2]);

/// This thread's stream (and events) on device `ordinal`, created on first use. The
/// context is bound on return. Handles stay valid for the life of the thread.
pub fn thread_stream(ordinal: usize) -> Result<(StreamHandle, ThreadEvents)> {
    bind(ordinal)?;
    THREAD_CUDA.with(|cell| {
        let mut all = cell.borrow_mut();
        if let Some(t) = all.iter().find(|t| t.ordinal == ordinal) {
            return Ok((
                t.stream as usize,
                ThreadEvents(t.events.map(|e| e as usize)),
            ));
        }
        let mut stream: sys::CUstream = std::ptr::null_mut();
        // SAFETY: the device's context is current; `stream` is an out-pointer.
        check("cuStreamCreate", unsafe {
            sys::cuStreamCreate(
                &mut stream,
                sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32,
            )
        })?;
        let mut events = [std::ptr::null_mut(); 2];
        for e in &mut events {
            // SAFETY: context current; `e` is an out-pointer.
            check("cuEventCreate", unsafe {
                sys::cuEventCreate(e, sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32)
            })?;
        }
        all.push(ThreadCuda {
            ordinal,
            stream,
            events,
        });
        Ok((stream as usize, ThreadEvents(events.map(|e| e as usize))))
    })
}

/// Queue a host-to-device copy of `len` bytes on `stream`.
///
/// # Safety
/// `src..src+len` must stay valid and unchanged, and `dst..dst+len` valid device memory,
/// until the copy has completed on `stream`.
pub unsafe fn copy_htod(dst: u64, src: *const u8, len: usize, stream: StreamHandle) -> Result<()> {
    // SAFETY: forwarded from the caller's contract.
    check("cuMemcpyHtoDAsync", unsafe {
        sys::cuMemcpyHtoDAsync_v2(dst, src.cast(), len, stream as sys::CUstream)
    })
}

/// Queue a device-to-host copy of `len` bytes on `stream`.
///
/// # Safety
/// As for [`copy_htod`], with the roles of host and device swapped.
pub unsafe fn copy_dtoh(dst: *mut u8, src: u64, len: usize, stream: StreamHandle) -> Result<()> {
    // SAFETY: forwarded from the caller's contract.
    check("cuMemcpyDtoHAsync", unsafe {
        sys::cuMemcpyDtoHAsync_v2(dst.cast(), src, len, stream as sys::CUstream)
    })
}

/// Record `event` on `stream` (context must be current).
pub fn record_raw(event: usize, stream: StreamHandle) -> Result<()> {
    // SAFETY: both handles are live and belong to the current context.
    check("cuEventRecord", unsafe {
        sys::cuEventRecord(event as sys::CUevent, stream as sys::CUstream)
    })
}

/// Block until `event` has completed.
pub fn wait_event_raw(event: usize) -> Result<()> {
    // SAFETY: `event` is a live event handle.
    check("cuEventSynchronize", unsafe {
        sys::cuEventSynchronize(event as sys::CUevent)
    })
}

/// Block until all work on `stream` has completed.
pub fn sync_stream_raw(stream: StreamHandle) -> Result<()> {
    // SAFETY: `stream` is a live stream handle (or a special value the driver accepts).
    check("cuStreamSynchronize", unsafe {
        sys::cuStreamSynchronize(stream as sys::CUstream)
    })
}

/// An event recorded on someone else's stream: the point after which their earlier work
/// is done.
#[derive(Debug)]
pub struct StreamEvent {
    ordinal: usize,
    event: sys::CUevent,
}

// SAFETY: event handles may be used from any thread once the context is bound.
unsafe impl Send for StreamEvent {}
// SAFETY: as above; the methods take &self and only pass the handle to the driver.
unsafe impl Sync for StreamEvent {}

impl StreamEvent {
    /// Record an event on `stream` (a raw `CUstream` value; 0 is the legacy default stream).
    pub fn record(ordinal: usize, stream: usize) -> Result<Self> {
        bind(ordinal)?;
        let mut event: sys::CUevent = std::ptr::null_mut();
        // SAFETY: context current; `event` is an out-pointer.
        check("cuEventCreate", unsafe {
            sys::cuEventCreate(
                &mut event,
                sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32,
            )
        })?;
        let made = Self { ordinal, event };
        record_raw(event as usize, stream)?;
        Ok(made)
    }

    /// Block until the recorded point has been reached.
    pub fn synchronize(&self) -> Result<()> {
        bind(self.ordinal)?;
        wait_event_raw(self.event as usize)
    }

    /// Make `stream` wait (on the GPU, without blocking the host) for the recorded point.
    pub fn make_wait(&self, stream: StreamHandle) -> Result<()> {
        bind(self.ordinal)?;
        // SAFETY: both handles are live and belong to this device's context.
        check("cuStreamWaitEvent", unsafe {
            sys::cuStreamWaitEvent(stream as sys::CUstream, self.event, 0)
        })
    }

    /// The raw event handle (valid while `self` lives).
    pub fn raw(&self) -> usize {
        self.event as usize
    }
}

impl Drop for StreamEvent {
    fn drop(&mut self) {
        let _ = std::panic::catch_unwind(|| {
            if bind(self.ordinal).is_ok() {
                // SAFETY: created in `record`, destroyed once here; the driver defers the
                // release until the event has completed.
                let _ = unsafe { sys::cuEventDestroy_v2(self.event) };
            }
        });
    }
}

/// Record an event on `stream` and wait for it (for `__cuda_array_interface__`'s
/// `stream` field: the producer's work must be done before kvikpy touches the memory).
pub fn record_and_wait(ordinal: usize, stream: usize) -> Result<()> {
    StreamEvent::record(ordinal, stream)?.synchronize()
}

const FLAG_SLOTS: usize = 1024;

struct FlagPage {
    memory: PinnedHostAllocation,
    free: Vec<usize>,
    generation: Vec<u32>,
}

static FLAGS: Mutex<Option<FlagPage>> = Mutex::new(None);

/// A 32-bit word of pinned, device-mapped host memory that a user's stream waits on
/// (`cuStreamWaitValue32`, "greater or equal"), released by the host when kvikpy's
/// worker is done. Slots are pooled; values only grow, so a slot can be reused as soon
/// as it has been released, whatever the GPU has consumed so far.
pub struct HostFlag {
    slot: usize,
    target: u32,
    address: *mut u32,
    released: bool,
}

// SAFETY: the slot is owned exclusively by this flag until released; writes are atomic-
// width volatile stores.
unsafe impl Send for HostFlag {}

impl HostFlag {
    /// Take a slot and make `stream` (on device `ordinal`) wait until it is released.
    /// Returns `None` when the device cannot wait on host memory; the caller then falls
    /// back to blocking.
    pub fn enqueue_wait(ordinal: usize, stream: usize) -> Result<Option<Self>> {
        bind(ordinal)?;
        let mut guard = FLAGS.lock().unwrap_or_else(|e| e.into_inner());
        if guard.is_none() {
            let memory = PinnedHostAllocation::new(FLAG_SLOTS * 4)?;
            // SAFETY: fresh allocation of FLAG_SLOTS u32s.
            unsafe { std::ptr::write_bytes(memory.as_ptr(), 0, FLAG_SLOTS * 4) };
            *guard = Some(FlagPage {
                memory,
                free: (0..FLAG_SLOTS).rev().collect(),
                generation: vec![0; FLAG_SLOTS],
            });
        }
        let page = guard.as_mut().expect("initialised above");
        let Some(slot) = page.free.pop() else {
            return Ok(None); // more than FLAG_SLOTS operations in flight: block instead
        };
        page.generation[slot] = page.generation[slot].wrapping_add(1);
        let target = page.generation[slot];
        // SAFETY: slot < FLAG_SLOTS, inside the page.
        let address = unsafe { page.memory.as_ptr().cast::<u32>().add(slot) };
        let mut device_address: sys::CUdeviceptr = 0;
        // SAFETY: the page is pinned host memory; `device_address` is an out-pointer.
        let rc =
            unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device_address, address.cast(), 0) };
        let flag = Self {
            slot,
            target,
            address,
            released: false,
        };
        if rc != sys::CUresult::CUDA_SUCCESS {
            drop(guard);
            drop(flag);
            return Ok(None);
        }
        // SAFETY: the stream belongs to the current context; the address is device-mapped
        // pinned memory that outlives the wait (the page is never freed).
        let rc = unsafe {
            sys::cuStreamWaitValue32_v2(
                stream as sys::CUstream,
                device_address,
                target,
                sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32,
            )
        };
        drop(guard);
        if rc != sys::CUresult::CUDA_SUCCESS {
            drop(flag);
            return Ok(None);
        }
        Ok(Some(flag))
    }

    /// Let the waiting stream go on.
    pub fn release(mut self) {
        self.release_inner();
    }

    fn release_inner(&mut self) {
        if self.released {
            return;
        }
        self.released = true;
        // Everything written before (the bytes, via a synchronised copy) must be visible
        // before the GPU sees the flag.
        fence(Ordering::SeqCst);
        // SAFETY: `address` points into the never-freed flag page, at our slot.
        unsafe { std::ptr::write_volatile(self.address, self.target) };
        fence(Ordering::SeqCst);
        let mut guard = FLAGS.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(page) = guard.as_mut() {
            page.free.push(self.slot);
        }
    }
}

impl Drop for HostFlag {
    // A flag must never stay unreleased: the user's stream would hang forever.
    fn drop(&mut self) {
        self.release_inner();
    }
}
