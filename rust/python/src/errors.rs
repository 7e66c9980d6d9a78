//! The single mapping from engine errors to Python exceptions.
//!
//! OS errors become `OSError(errno, message, path)`, which Python itself turns into the
//! errno's subclass (`FileNotFoundError`, `PermissionError`, `IsADirectoryError`, ...).
//! kvikpy's own failures use the `kvikpy.errors` hierarchy rooted at `KvikpyError`.

use kvikpy_core::Error;
use pyo3::exceptions::{PyKeyError, PyMemoryError, PyOSError, PyValueError};
use pyo3::PyErr;

pyo3::import_exception!(io, UnsupportedOperation);
pyo3::import_exception!(kvikpy.errors, ConfigError);
pyo3::import_exception!(kvikpy.errors, InternalError);
pyo3::import_exception!(kvikpy.errors, CudaUnavailableError);
pyo3::import_exception!(kvikpy.errors, CudaError);
pyo3::import_exception!(kvikpy.errors, CuFileError);

/// The error of a binding function: an engine error on its way to Python, or a Python
/// exception already raised (a failed conversion, an attribute lookup). Binding functions
/// return [`BindResult`] and use `?` on both; pyo3 turns the error into an exception
/// through the one mapping below.
#[derive(Debug)]
pub enum BindError {
    /// A failure inside the engine, mapped by [`engine_error`].
    Engine(Error),
    /// A Python exception, passed through unchanged.
    Python(PyErr),
}

impl From<Error> for BindError {
    fn from(e: Error) -> Self {
        Self::Engine(e)
    }
}

impl From<PyErr> for BindError {
    fn from(e: PyErr) -> Self {
        Self::Python(e)
    }
}

/// Conversions that cannot fail (pyo3's `into_pyobject` of plain values) need no variant.
impl From<std::convert::Infallible> for BindError {
    fn from(never: std::convert::Infallible) -> Self {
        match never {}
    }
}

impl From<BindError> for PyErr {
    fn from(e: BindError) -> PyErr {
        match e {
            BindError::Engine(e) => engine_error(e),
            BindError::Python(e) => e,
        }
    }
}

/// The Python exception for an engine error: the single mapping.
fn engine_error(e: Error) -> PyErr {
    match e {
        Error::Os { op, path, source } => {
            let path = path.to_string_lossy().into_owned();
            match source.raw_os_error() {
                Some(errno) => {
                    // io::Error's text ends in " (os error N)"; Python prints the errno itself.
                    let text = source.to_string();
                    let text = text.split(" (os error").next().unwrap_or(&text);
                    PyOSError::new_err((errno, format!("{text} (during {op})"), path))
                }
                None => PyOSError::new_err(format!("{op} failed on '{path}': {source}")),
            }
        }
        Error::UnsupportedOperation(_) => UnsupportedOperation::new_err(e.to_string()),
        Error::UnknownSetting(_) => PyKeyError::new_err(e.to_string()),
        Error::MalformedEnv { .. } => ConfigError::new_err(e.to_string()),
        Error::Truncated(_) => PyOSError::new_err(e.to_string()),
        Error::Panic(_) => InternalError::new_err(e.to_string()),
        Error::OutOfMemory(_) => PyMemoryError::new_err(e.to_string()),
        Error::CudaUnavailable(_) => CudaUnavailableError::new_err(e.to_string()),
        Error::Cuda { .. } => CudaError::new_err(e.to_string()),
        Error::CuFile(_) => CuFileError::new_err(e.to_string()),
        Error::InvalidArgument(_) | Error::InvalidSetting { .. } | Error::Closed => {
            PyValueError::new_err(e.to_string())
        }
    }
}

/// Result type of binding functions.
pub type BindResult<T> = Result<T, BindError>;
