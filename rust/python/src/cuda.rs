//! What CUDA is present: availability, device count, the current device.

use kvikpy_macros::boundary;
use pyo3::prelude::*;

use crate::blocking::{without_gil, without_gil_value};
use crate::errors::BindResult;

/// Whether a CUDA driver loaded and reports at least one GPU.
#[boundary]
#[pyfunction]
pub fn cuda_available(py: Python<'_>) -> BindResult<bool> {
    without_gil_value(py, kvikpy_core::cuda::available)
}

/// Number of CUDA GPUs (0 without a driver).
#[boundary]
#[pyfunction]
pub fn device_count(py: Python<'_>) -> BindResult<usize> {
    without_gil_value(py, kvikpy_core::cuda::device_count)
}

/// Why CUDA is unavailable, or None.
#[boundary]
#[pyfunction]
pub fn cuda_unavailable_reason(py: Python<'_>) -> BindResult<Option<String>> {
    without_gil_value(py, kvikpy_core::cuda::unavailable_reason)
}

/// The device of the calling thread's current CUDA context, or 0 if none is current.
#[boundary]
#[pyfunction]
pub fn current_device(py: Python<'_>) -> BindResult<usize> {
    without_gil(py, kvikpy_core::cuda::current_device)
}

/// Bytes this process has moved into GPU memory by page-cache DMA (pinned page-cache
/// pages, no bounce buffer): tells which path reads took.
#[boundary]
#[pyfunction]
pub fn page_cache_dma_bytes() -> u64 {
    kvikpy_core::source::page_cache_dma_bytes()
}

/// What a `device=` argument needs to know, asked in one call: `(device count, the
/// calling thread's current device when `current`, why CUDA is unavailable)`; `(0, None,
/// reason)` without CUDA. The caller checks an ordinal against the count and words its
/// own errors.
#[boundary]
#[pyfunction]
#[pyo3(signature = (current=false))]
pub fn device_lookup(
    py: Python<'_>,
    current: bool,
) -> BindResult<(usize, Option<usize>, Option<String>)> {
    without_gil(py, move || {
        if !kvikpy_core::cuda::available() {
            return Ok((0, None, kvikpy_core::cuda::unavailable_reason()));
        }
        let ordinal = current
            .then(kvikpy_core::cuda::current_device)
            .transpose()?;
        Ok((kvikpy_core::cuda::device_count(), ordinal, None))
    })
}
