//! The one way the binding runs engine code that may block: without the GIL, with panics
//! caught so that none crosses into Python. No other module of the binding releases the
//! GIL itself (tests/test_binding_rules.py checks it).

use kvikpy_core::future::run_caught;
use kvikpy_macros::boundary;
use pyo3::prelude::*;

use crate::errors::{BindError, BindResult};

/// Run `work` with the GIL released; a panic inside becomes `kvikpy.InternalError`.
pub fn without_gil<T, F>(py: Python<'_>, work: F) -> BindResult<T>
where
    F: FnOnce() -> kvikpy_core::Result<T> + Send,
    T: Send,
{
    py.detach(|| run_caught(work)).map_err(BindError::Engine)
}

/// [`without_gil`] for work that cannot fail (a query, a wait with a timeout): its value,
/// or `kvikpy.InternalError` if it panicked.
pub fn without_gil_value<T, F>(py: Python<'_>, work: F) -> BindResult<T>
where
    F: FnOnce() -> T + Send,
    T: Send,
{
    without_gil(py, move || Ok(work()))
}

/// Panics on purpose, to test that a panic surfaces as `kvikpy.InternalError`: inside
/// engine work without the GIL (`where_="engine"`) or in the binding's own code, with the
/// GIL held (`where_="binding"`, caught by `#[boundary]`).
#[boundary]
#[pyfunction]
#[pyo3(signature = (where_ = "engine"))]
pub fn _panic_for_tests(py: Python<'_>, where_: &str) -> BindResult<()> {
    match where_ {
        "engine" => without_gil(py, || panic!("deliberate panic for kvikpy's tests")),
        _ => panic!("deliberate panic in the binding for kvikpy's tests"),
    }
}
