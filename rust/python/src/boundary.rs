//! Where Rust meets Python: `catch` runs an entry point's body so that a panic becomes
//! `kvikpy.InternalError` with the panic message, never pyo3's `PanicException` (which
//! derives from `BaseException` and slips past `except Exception`). The `#[boundary]`
//! attribute (crate `kvikpy-macros`) routes every `#[pyfunction]` and `#[pymethods]`
//! body through it.

use std::panic::{catch_unwind, AssertUnwindSafe};

use kvikpy_core::panic_message;
use kvikpy_core::Error;
use pyo3::PyErr;

use crate::errors::{BindError, InternalError};

/// What an entry point returns when its body panicked.
pub trait FromPanic {
    /// The error for a panic whose message is `message`.
    fn from_panic(message: String) -> Self;
}

impl<T> FromPanic for Result<T, PyErr> {
    fn from_panic(message: String) -> Self {
        Err(InternalError::new_err(Error::Panic(message).to_string()))
    }
}

impl<T> FromPanic for Result<T, BindError> {
    fn from_panic(message: String) -> Self {
        Err(BindError::Engine(Error::Panic(message)))
    }
}

/// Run `body`; a panic inside becomes the entry point's error.
pub fn catch<R: FromPanic>(body: impl FnOnce() -> R) -> R {
    catch_unwind(AssertUnwindSafe(body))
        .unwrap_or_else(|payload| R::from_panic(panic_message(payload.as_ref())))
}
