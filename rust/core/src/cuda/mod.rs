//! CUDA through the driver API, loaded at run time: nothing here needs CUDA to build, and
//! every entry point reports `CudaUnavailable` instead of failing where no driver exists.
//!
//! All raw driver calls of the engine live in this module's files; each binds the right
//! device's primary context first (the one CuPy, PyTorch and JAX use), on whatever thread
//! it runs, destructors included, through a [`ContextGuard`] that makes the caller's
//! previous context current again when dropped.

// Layered bottom up: driver (loading, result codes), device (contexts and binding),
// memory (allocations, the pinned pool), then streams (queues, events, copies) and
// registrations; a file names only the files below it.
mod device;
mod driver;
mod memory;
mod register;
mod stream;

pub use device::{bind, device, free_under, ContextGuard, Device};
pub use driver::{
    available, check, current_device, device_count, ensure_driver, note_initialised,
    refuse_after_fork, unavailable_reason,
};
pub use memory::{
    free_idle_pinned, memory_kind, pinned_pool, DeviceAllocation, MemoryKind, PinnedAllocator,
    PinnedHostAllocation,
};
pub use register::{can_register_read_only, HostRegistration};
pub use stream::{
    copy_device_to_host, copy_dtoh, copy_host_to_device, copy_htod, record, record_and_order,
    record_and_wait, synchronize, thread_stream, wait_event, zero_device, Counter, Event, Lane,
    Stream, StreamEvent,
};
