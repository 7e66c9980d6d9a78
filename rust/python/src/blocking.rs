//! The one way the binding runs engine code that may block: without the GIL, with panics
//! caught so that none crosses into Python.

use kvikpy_core::future::run_caught;
use pyo3::prelude::*;

use crate::errors::{BindResult, EngineError};

/// Run `work` with the GIL released; a panic inside becomes `kvikpy.InternalError`.
pub fn without_gil<T, F>(py: Python<'_>, work: F) -> BindResult<T>
where
    F: FnOnce() -> kvikpy_core::Result<T> + Send,
    T: Send,
{
    py.detach(|| run_caught(work)).map_err(EngineError)
}

/// Panics inside the engine on purpose, to test that a panic surfaces as an exception.
#[pyfunction]
pub fn _panic_for_tests(py: Python<'_>) -> BindResult<()> {
    without_gil(py, || panic!("deliberate panic for kvikpy's tests"))
}
