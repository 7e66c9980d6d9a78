//! Streams, events and copies: one non-blocking stream and its events per (thread, device),
//! events on users' streams, and host flags that hold a user's stream until kvikpy's
//! worker has finished (`cuStreamWaitValue32`).

use std::cell::RefCell;
use std::sync::atomic::{fence, Ordering};
use std::sync::Mutex;

use cudarc::driver::{result, sys};

use super::device::{bind, free_under, ContextGuard};
use super::driver::{check, Named};
use super::memory::PinnedHostAllocation;
use crate::error::Result;

/// A CUDA stream handle (`CUstream`) as kvikpy passes it around: its own or a user's
/// (from torch, CuPy or a raw integer; 0 is the legacy default stream). Calls that queue
/// work on it take a [`ContextGuard`] to prove the device's context is current.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stream(usize);

impl Stream {
    /// CUDA's legacy default stream (`CUstream` 0) of the current context.
    pub const LEGACY: Stream = Stream(0);

    /// The stream whose raw `CUstream` value is `handle`.
    pub fn from_raw(handle: usize) -> Self {
        Self(handle)
    }

    /// The raw `CUstream` value.
    pub fn as_raw(self) -> usize {
        self.0
    }

    fn cu(self) -> sys::CUstream {
        self.0 as sys::CUstream
    }
}

/// A CUDA event handle (`CUevent`) owned by kvikpy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event(usize);

impl Event {
    /// The event whose raw `CUevent` value is `handle` (one an Arrow producer hands over
    /// as its `sync_event`, to wait on; kvikpy never destroys it).
    pub fn from_raw(handle: usize) -> Self {
        Self(handle)
    }

    fn cu(self) -> sys::CUevent {
        self.0 as sys::CUevent
    }
}

/// A thread's stream and its events on device `ordinal`.
struct ThreadCuda {
    ordinal: usize,
    stream: sys::CUstream,
    events: [sys::CUevent; LANE_EVENTS],
}

impl Drop for ThreadCuda {
    fn drop(&mut self) {
        let (stream, events) = (self.stream as usize, self.events.map(|e| e as usize));
        free_under(self.ordinal, move || {
            for e in events {
                // SAFETY: the event was created on this device's context by this thread
                // and is destroyed exactly once, here.
                let _ = unsafe { result::event::destroy(e as sys::CUevent) };
            }
            // SAFETY: the stream was created on this device's context by this thread and
            // is destroyed exactly once, here.
            let _ = unsafe { result::stream::destroy(stream as sys::CUstream) };
        });
    }
}

thread_local! {
    static THREAD_CUDA: RefCell<Vec<ThreadCuda>> = const { RefCell::new(Vec::new()) };
}

/// Events of a [`Lane`]: one per slot of the largest bounce ring (`crate::ring::MAX_SLOTS`).
pub const LANE_EVENTS: usize = 4;

/// The calling thread's own stream and [`LANE_EVENTS`] events on one device, used while
/// the context guard it borrows lives: every device pipeline queues its copies here and
/// paces its ring's slots with the events.
#[derive(Debug, Clone, Copy)]
pub struct Lane<'a> {
    /// The guard holding the device's context current.
    pub context: &'a ContextGuard,
    /// This thread's non-blocking stream on the device.
    pub stream: Stream,
    /// This thread's events on the device, one per ring slot.
    pub events: [Event; LANE_EVENTS],
}

impl Lane<'_> {
    /// Queue a host-to-device copy on this lane's stream.
    ///
    /// # Safety
    /// As for [`copy_htod`].
    pub unsafe fn copy_htod(&self, dst: u64, src: *const u8, len: usize) -> Result<()> {
        // SAFETY: forwarded from the caller's contract.
        unsafe { copy_htod(self.context, dst, src, len, self.stream) }
    }

    /// Queue a device-to-host copy on this lane's stream.
    ///
    /// # Safety
    /// As for [`copy_dtoh`].
    pub unsafe fn copy_dtoh(&self, dst: *mut u8, src: u64, len: usize) -> Result<()> {
        // SAFETY: forwarded from the caller's contract.
        unsafe { copy_dtoh(self.context, dst, src, len, self.stream) }
    }

    /// Record event `slot` (below [`LANE_EVENTS`]) on this lane's stream.
    pub fn record(&self, slot: usize) -> Result<()> {
        record(self.context, self.events[slot % LANE_EVENTS], self.stream)
    }

    /// Block until event `slot` (below [`LANE_EVENTS`]) has completed.
    pub fn wait(&self, slot: usize) -> Result<()> {
        wait_event(self.context, self.events[slot % LANE_EVENTS])
    }

    /// Block until everything queued on this lane's stream has completed.
    pub fn synchronize(&self) -> Result<()> {
        synchronize(self.context, self.stream)
    }
}

/// This thread's stream and events on the device whose context `context` holds current,
/// created on first use; the handles stay valid for the life of the thread.
pub fn thread_stream(context: &ContextGuard) -> Result<Lane<'_>> {
    let ordinal = context.ordinal();
    let (stream, events) = THREAD_CUDA.with(|cell| -> Result<(usize, [usize; LANE_EVENTS])> {
        let mut all = cell.borrow_mut();
        if let Some(t) = all.iter().find(|t| t.ordinal == ordinal) {
            return Ok((t.stream as usize, t.events.map(|e| e as usize)));
        }
        let stream = result::stream::create(result::stream::StreamKind::NonBlocking)
            .named("cuStreamCreate")?;
        let mut events = [std::ptr::null_mut(); LANE_EVENTS];
        for e in &mut events {
            *e = new_event()?;
        }
        all.push(ThreadCuda {
            ordinal,
            stream,
            events,
        });
        Ok((stream as usize, events.map(|e| e as usize)))
    })?;
    Ok(Lane {
        context,
        stream: Stream(stream),
        events: events.map(Event),
    })
}

/// A new event without timing, on the current context.
fn new_event() -> Result<sys::CUevent> {
    result::event::create(sys::CUevent_flags::CU_EVENT_DISABLE_TIMING).named("cuEventCreate")
}

/// Queue a host-to-device copy of `len` bytes on `stream`.
///
/// # Safety
/// `src..src+len` must stay valid and unchanged, and `dst..dst+len` valid device memory,
/// until the copy has completed on `stream`.
pub unsafe fn copy_htod(
    _context: &ContextGuard,
    dst: u64,
    src: *const u8,
    len: usize,
    stream: Stream,
) -> Result<()> {
    // SAFETY: the caller keeps `src..src+len` valid until the copy completes.
    let src = unsafe { std::slice::from_raw_parts(src, len) };
    // SAFETY: forwarded from the caller's contract; the context is current.
    unsafe { result::memcpy_htod_async(dst, src, stream.cu()) }.named("cuMemcpyHtoDAsync")
}

/// Queue a device-to-host copy of `len` bytes on `stream`.
///
/// # Safety
/// As for [`copy_htod`], with the roles of host and device swapped.
pub unsafe fn copy_dtoh(
    _context: &ContextGuard,
    dst: *mut u8,
    src: u64,
    len: usize,
    stream: Stream,
) -> Result<()> {
    // SAFETY: the caller keeps `dst..dst+len` valid and unused until the copy completes.
    let dst = unsafe { std::slice::from_raw_parts_mut(dst, len) };
    // SAFETY: forwarded from the caller's contract; the context is current.
    unsafe { result::memcpy_dtoh_async(dst, src, stream.cu()) }.named("cuMemcpyDtoHAsync")
}

/// Record `event` on `stream`.
pub fn record(_context: &ContextGuard, event: Event, stream: Stream) -> Result<()> {
    // SAFETY: both handles are live and belong to the current context.
    unsafe { result::event::record(event.cu(), stream.cu()) }.named("cuEventRecord")
}

/// Block until `event` has completed.
pub fn wait_event(_context: &ContextGuard, event: Event) -> Result<()> {
    // SAFETY: `event` is a live event handle of the current context.
    unsafe { result::event::synchronize(event.cu()) }.named("cuEventSynchronize")
}

/// Block until all work on `stream` has completed.
pub fn synchronize(_context: &ContextGuard, stream: Stream) -> Result<()> {
    // SAFETY: `stream` is a live stream handle (or a special value the driver accepts).
    unsafe { result::stream::synchronize(stream.cu()) }.named("cuStreamSynchronize")
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
    /// The raw `CUevent` handle (valid while `self` lives).
    pub fn handle(&self) -> usize {
        self.event as usize
    }

    /// Record an event on `stream` of device `ordinal`.
    pub fn record(ordinal: usize, stream: Stream) -> Result<Self> {
        let context = bind(ordinal)?;
        let event = new_event()?;
        let made = Self { ordinal, event };
        record(&context, Event(event as usize), stream)?;
        Ok(made)
    }

    /// Block until the recorded point has been reached.
    pub fn synchronize(&self) -> Result<()> {
        let context = bind(self.ordinal)?;
        wait_event(&context, Event(self.event as usize))
    }

    /// Make `stream` wait (on the GPU, without blocking the host) for the recorded point.
    pub(crate) fn make_wait(&self, stream: Stream) -> Result<()> {
        let _context = bind(self.ordinal)?;
        let flags = sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT;
        // SAFETY: both handles are live and belong to this device's context.
        unsafe { result::stream::wait_event(stream.cu(), self.event, flags) }
            .named("cuStreamWaitEvent")
    }
}

impl Drop for StreamEvent {
    fn drop(&mut self) {
        let event = self.event as usize;
        free_under(self.ordinal, move || {
            // SAFETY: created in `record`, destroyed once here; the driver defers the
            // release until the event has completed.
            let _ = unsafe { result::event::destroy(event as sys::CUevent) };
        });
    }
}

/// Record an event on `stream` and wait for it (for `__cuda_array_interface__`'s
/// `stream` field: the producer's work must be done before kvikpy touches the memory).
/// Uses one of the calling thread's own events: this runs on every intake of such an
/// array, and the thread does nothing else with its events until this returns. A stream
/// with nothing left to run (`cuStreamQuery`, which reads the stream's progress from
/// host memory) is not waited for at all: an event's record and wait is a round trip to
/// the GPU, about a tenth of a 4 KiB read on the H100 machine.
pub fn record_and_wait(ordinal: usize, stream: Stream) -> Result<()> {
    let context = bind(ordinal)?;
    // SAFETY: `stream` is a live handle of this context (or a special handle, which the
    // current context resolves); the query only reads its state.
    if unsafe { sys::cuStreamQuery(stream.cu()) } == sys::CUresult::CUDA_SUCCESS {
        return Ok(());
    }
    let lane = thread_stream(&context)?;
    record(&context, lane.events[0], stream)?;
    wait_event(&context, lane.events[0])
}

/// Make `consumer` wait on the GPU, without blocking the host, for the work queued on
/// `producer` so far (a stream-ordered call taking an array whose interface names the
/// stream that writes it). Uses one of the calling thread's own events, as
/// [`record_and_wait`] does: `cuStreamWaitEvent` waits for the record made just before it,
/// so the event may be recorded again at once.
pub fn record_and_order(ordinal: usize, producer: Stream, consumer: Stream) -> Result<()> {
    let context = bind(ordinal)?;
    let lane = thread_stream(&context)?;
    record(&context, lane.events[0], producer)?;
    let flags = sys::CUevent_wait_flags::CU_EVENT_WAIT_DEFAULT;
    // SAFETY: both handles are live and belong to the current context.
    unsafe { result::stream::wait_event(consumer.cu(), lane.events[0].cu(), flags) }
        .named("cuStreamWaitEvent")
}

const COUNTER_SLOTS: usize = 1024;

struct CounterPage {
    memory: PinnedHostAllocation,
    free: Vec<usize>,
}

static COUNTERS: Mutex<Option<CounterPage>> = Mutex::new(None);

/// A 32-bit counter in pinned, device-mapped host memory, shared by a host thread and a
/// stream: the stream waits for it to reach a value (`cuStreamWaitValue32`, "greater or
/// equal") or writes it (`cuStreamWriteValue32`); the host reads and writes it with plain
/// volatile accesses, with no driver call. That is what lets a worker thread take part in
/// a stream's order while the application makes device-synchronising calls (which hold
/// the driver's locks) without deadlock. Slots are pooled and start at 0.
pub struct Counter {
    slot: usize,
    host: *mut u32,
    device: u64,
}

// SAFETY: the slot is owned exclusively by this counter; accesses are volatile u32
// loads and stores, which are atomic on the platforms CUDA supports.
unsafe impl Send for Counter {}
// SAFETY: as above.
unsafe impl Sync for Counter {}

impl Counter {
    /// A zeroed counter usable by streams of device `ordinal`, or `None` when the device
    /// cannot wait on host memory (the caller then synchronises instead).
    pub fn acquire(ordinal: usize) -> Result<Option<Self>> {
        let _context = bind(ordinal)?;
        let mut guard = COUNTERS.lock().unwrap_or_else(|e| e.into_inner());
        let page = match &mut *guard {
            Some(page) => page,
            empty @ None => empty.insert(CounterPage {
                memory: PinnedHostAllocation::new(ordinal, COUNTER_SLOTS * 4)?,
                free: (0..COUNTER_SLOTS).rev().collect(),
            }),
        };
        let Some(slot) = page.free.pop() else {
            return Ok(None); // over a thousand ordered transfers in flight: synchronise
        };
        // SAFETY: slot < COUNTER_SLOTS, inside the page.
        let host = unsafe { page.memory.as_ptr().cast::<u32>().add(slot) };
        drop(guard);
        let mut device: sys::CUdeviceptr = 0;
        // SAFETY: the page is pinned host memory; `device` is an out-pointer.
        let rc = unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device, host.cast(), 0) };
        // Built once, complete: a Counter gives its slot back when dropped.
        let counter = Self { slot, host, device };
        if rc != sys::CUresult::CUDA_SUCCESS {
            return Ok(None);
        }
        counter.store(0);
        Ok(Some(counter))
    }

    /// The current value.
    pub fn load(&self) -> u32 {
        fence(Ordering::SeqCst);
        // SAFETY: `host` points at this counter's slot in the never-freed page.
        unsafe { std::ptr::read_volatile(self.host) }
    }

    /// Set the value; everything written before (file bytes in a bounce buffer) is
    /// visible to the GPU first.
    pub fn store(&self, value: u32) {
        fence(Ordering::SeqCst);
        // SAFETY: as for `load`.
        unsafe { std::ptr::write_volatile(self.host, value) };
        fence(Ordering::SeqCst);
    }

    /// Block (spinning, then sleeping briefly) until the value reaches `target`.
    pub fn wait_for(&self, target: u32) {
        let mut spins = 0u32;
        while self.load() < target {
            if spins < 200 {
                std::hint::spin_loop();
                spins += 1;
            } else {
                std::thread::sleep(std::time::Duration::from_micros(20));
            }
        }
    }

    /// Queue on `stream`: wait until the value is at least `target`. The GPU compares
    /// cyclically, `(int32)(value - target) >= 0`: keep values within 2^31 of targets.
    pub fn enqueue_wait(&self, _context: &ContextGuard, stream: Stream, target: u32) -> Result<()> {
        // SAFETY: the stream belongs to the current context; the address is device-mapped
        // pinned memory that is never freed.
        check("cuStreamWaitValue32", unsafe {
            sys::cuStreamWaitValue32_v2(
                stream.cu(),
                self.device,
                target,
                sys::CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32,
            )
        })
    }

    /// Queue on `stream`: once all earlier work on it is done, set the value to `value`.
    pub fn enqueue_write(&self, _context: &ContextGuard, stream: Stream, value: u32) -> Result<()> {
        // SAFETY: as for `enqueue_wait`; the default flags order the write after earlier
        // work, with a memory barrier.
        check("cuStreamWriteValue32", unsafe {
            sys::cuStreamWriteValue32_v2(stream.cu(), self.device, value, 0)
        })
    }
}

impl Drop for Counter {
    fn drop(&mut self) {
        let mut guard = COUNTERS.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(page) = guard.as_mut() {
            page.free.push(self.slot);
        }
    }
}

/// Run `queue` (one copy) on the calling thread's stream of device `ordinal`, then wait
/// for it.
fn copy_blocking(
    ordinal: usize,
    queue: impl FnOnce(&ContextGuard, Stream) -> Result<()>,
) -> Result<()> {
    let context = bind(ordinal)?;
    let lane = thread_stream(&context)?;
    queue(&context, lane.stream)?;
    synchronize(&context, lane.stream)
}

/// Copy `len` bytes from host memory to device memory on `ordinal`, blocking until done.
///
/// # Safety
/// `src..src+len` must be readable host memory and `dst..dst+len` valid device memory.
pub unsafe fn copy_host_to_device(
    ordinal: usize,
    dst: u64,
    src: *const u8,
    len: usize,
) -> Result<()> {
    copy_blocking(ordinal, |context, stream| {
        // SAFETY: forwarded from the caller; `copy_blocking` waits for the copy.
        unsafe { copy_htod(context, dst, src, len, stream) }
    })
}

/// Set `len` bytes of device memory on `ordinal` at `dst` to zero, blocking until done.
///
/// # Safety
/// `dst..dst+len` must be valid device memory on `ordinal` that nothing else uses meanwhile.
pub unsafe fn zero_device(ordinal: usize, dst: u64, len: usize) -> Result<()> {
    copy_blocking(ordinal, |_context, stream| {
        // SAFETY: forwarded from the caller; the context is current (`copy_blocking`
        // binds it) and waits for the memset.
        unsafe { result::memset_d8_async(dst, 0, len, stream.cu()) }.named("cuMemsetD8Async")
    })
}

/// Copy `len` bytes from device memory on `ordinal` to host memory, blocking until done.
///
/// # Safety
/// `src..src+len` must be valid device memory and `dst..dst+len` writable host memory.
pub unsafe fn copy_device_to_host(
    ordinal: usize,
    dst: *mut u8,
    src: u64,
    len: usize,
) -> Result<()> {
    copy_blocking(ordinal, |context, stream| {
        // SAFETY: forwarded from the caller; `copy_blocking` waits for the copy.
        unsafe { copy_dtoh(context, dst, src, len, stream) }
    })
}
