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

/// An engine error on its way to Python (a local type, so the conversion can live here).
#[derive(Debug)]
pub struct EngineError(pub Error);

impl From<Error> for EngineError {
    fn from(e: Error) -> Self {
        Self(e)
    }
}

impl From<EngineError> for PyErr {
    fn from(EngineError(e): EngineError) -> PyErr {
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
            Error::InvalidArgument(_) | Error::InvalidSetting { .. } | Error::Closed => {
                PyValueError::new_err(e.to_string())
            }
        }
    }
}

/// Result type of binding functions.
pub type BindResult<T> = Result<T, EngineError>;
