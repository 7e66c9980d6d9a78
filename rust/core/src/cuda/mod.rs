//! CUDA through the driver API, loaded at run time: nothing here needs CUDA to build, and
//! every entry point reports `CudaUnavailable` instead of failing where no driver exists.
//!
//! All raw driver calls of the engine live in this module's files; each binds the right
//! device's primary context first (the one CuPy, PyTorch and JAX use), on whatever thread
//! it runs, destructors included, through a [`ContextGuard`](device::ContextGuard) that makes the caller's
//! previous context current again when dropped.

// Layered bottom up: driver (loading, result codes), device (contexts and binding),
// memory (allocations, the pinned pool), then streams (queues, events, copies) and
// registrations; a file names only the files below it.
mod device;
mod driver;
mod memory;
mod register;
mod stream;

// The surface the binding uses (streams and events it is handed, copies, device queries,
// pinned memory for the pread ceiling); the rest is the engine's own.
pub use device::bind;
pub use driver::{available, current_device, device_count, ensure_driver, unavailable_reason};
pub use memory::{
    free_idle_pinned, memory_kind, pinned_memory, reset_pinned_peaks, DeviceAllocation, MemoryKind,
    PinnedAllocator,
};
pub use stream::{
    copy_device_to_host, copy_host_to_device, record_and_order, record_and_wait, synchronize,
    wait_event, zero_device, Event, Stream, StreamEvent,
};

pub(crate) use driver::{note_initialised, refuse_after_fork};
pub(crate) use memory::{pinned_pool, PinnedHostAllocation};
pub(crate) use register::{can_register_read_only, HostRegistration};
pub(crate) use stream::{copy_dtoh, copy_htod, thread_stream, Counter, Lane, LANE_EVENTS};
