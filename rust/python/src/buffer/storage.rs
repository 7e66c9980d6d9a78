//! What a `Buffer` and its views, exports and running operations share: the engine's
//! [`Allocation`], counted while alive so tests can prove every holder lets go.

use std::ops::Deref;
use std::sync::atomic::{AtomicUsize, Ordering};

use kvikpy_core::allocation::Allocation;
use kvikpy_macros::boundary;
use pyo3::prelude::*;

/// The allocation behind one or more `Buffer` views; freed when the last view, export or
/// running operation lets go of it.
#[derive(Debug)]
pub struct Storage {
    allocation: Allocation,
}

/// Storages alive in this process: tests use it to prove every export lets go exactly
/// once (a leak keeps the count up; a double free crashes).
static LIVE_STORAGES: AtomicUsize = AtomicUsize::new(0);

/// How many buffer allocations are alive (see [`LIVE_STORAGES`]).
#[boundary]
#[pyfunction]
pub fn live_buffers() -> usize {
    LIVE_STORAGES.load(Ordering::Acquire)
}

impl Storage {
    /// Take over `allocation`.
    pub fn new(allocation: Allocation) -> Self {
        LIVE_STORAGES.fetch_add(1, Ordering::AcqRel);
        Self { allocation }
    }
}

impl Deref for Storage {
    type Target = Allocation;

    fn deref(&self) -> &Allocation {
        &self.allocation
    }
}

impl Drop for Storage {
    fn drop(&mut self) {
        LIVE_STORAGES.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Stream-ordering helper used by `kvikpy.read(..., stream=...)`: the bytes land when
/// `stream` (on device `ordinal`) reaches what was queued on it so far.
pub fn mark_ready(storage: &Storage, ordinal: usize, stream: usize) -> kvikpy_core::Result<()> {
    storage.readiness().mark(ordinal, stream)
}
