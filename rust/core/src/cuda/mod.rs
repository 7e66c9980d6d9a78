//! CUDA through the driver API, loaded at run time: nothing here needs CUDA to build, and
//! every entry point reports `CudaUnavailable` instead of failing where no driver exists.
//!
//! All raw driver calls of the engine live in this module's files; each binds the right
//! device's primary context first (the one CuPy, PyTorch and JAX use), on whatever thread
//! it runs, destructors included, through a [`ContextGuard`] that makes the caller's
//! previous context current again when dropped.

mod device;
mod driver;
mod memory;
mod register;
mod stream;

pub use device::{device, Device};
pub use driver::{
    available, bind, check, current_device, device_count, ensure_driver, free_under,
    note_initialised, refuse_after_fork, unavailable_reason, ContextGuard,
};
pub use memory::{
    copy_device_to_host, copy_host_to_device, free_idle_pinned, memory_kind, pinned_pool,
    DeviceAllocation, MemoryKind, PinnedAllocator, PinnedHostAllocation,
};
pub use register::{can_register_read_only, HostRegistration};
pub use stream::{
    copy_dtoh, copy_htod, record, record_and_order, record_and_wait, synchronize, thread_stream,
    wait_event, Counter, Event, Lane, Stream, StreamEvent,
};
