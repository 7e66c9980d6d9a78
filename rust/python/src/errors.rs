//! The single mapping from engine errors to Python exceptions.
//!
//! OS errors become `(errno, message, path)` exceptions of the errno's `OSError` subclass,
//! as Python picks it (`FileNotFoundError` for ENOENT, ...), that are also the
//! `RuntimeError` kvikio raises (`kvikpy.errors.FileNotFoundRuntimeError`, ...); so is
//! `io.UnsupportedOperation`. kvikpy's own failures use the `kvikpy.errors` hierarchy
//! rooted at `KvikpyError`.

use kvikpy_core::Error;
use kvikpy_core::RemoteFailure;
use pyo3::exceptions::{PyIndexError, PyKeyError, PyMemoryError, PyRuntimeError, PyValueError};
use pyo3::PyErr;

pyo3::import_exception!(kvikpy.errors, UnsupportedOperationError);
pyo3::import_exception!(kvikpy.errors, NegativeValueError);
pyo3::import_exception!(kvikpy.errors, OSRuntimeError);
pyo3::import_exception!(kvikpy.errors, FileNotFoundRuntimeError);
pyo3::import_exception!(kvikpy.errors, PermissionRuntimeError);
pyo3::import_exception!(kvikpy.errors, IsADirectoryRuntimeError);
pyo3::import_exception!(kvikpy.errors, NotADirectoryRuntimeError);
pyo3::import_exception!(kvikpy.errors, FileExistsRuntimeError);
pyo3::import_exception!(kvikpy.errors, InterruptedRuntimeError);
pyo3::import_exception!(kvikpy.errors, BlockingIORuntimeError);
pyo3::import_exception!(kvikpy.errors, TimeoutRuntimeError);
pyo3::import_exception!(kvikpy.errors, BrokenPipeRuntimeError);
pyo3::import_exception!(kvikpy.errors, ConnectionAbortedRuntimeError);
pyo3::import_exception!(kvikpy.errors, ConnectionRefusedRuntimeError);
pyo3::import_exception!(kvikpy.errors, ConnectionResetRuntimeError);
pyo3::import_exception!(kvikpy.errors, ChildProcessRuntimeError);
pyo3::import_exception!(kvikpy.errors, ProcessLookupRuntimeError);
pyo3::import_exception!(kvikpy.errors, ConfigError);
pyo3::import_exception!(kvikpy.errors, InternalError);
pyo3::import_exception!(kvikpy.errors, CudaUnavailableError);
pyo3::import_exception!(kvikpy.errors, CudaError);
pyo3::import_exception!(kvikpy.errors, CuFileError);
pyo3::import_exception!(kvikpy.errors, MmapClosedError);
pyo3::import_exception!(kvikpy.errors, RemoteError);
pyo3::import_exception!(kvikpy.errors, RemoteNotFoundError);
pyo3::import_exception!(kvikpy.errors, RemotePermissionError);
pyo3::import_exception!(kvikpy.errors, RemoteConnectionError);
pyo3::import_exception!(kvikpy.errors, RemoteTimeoutError);
pyo3::import_exception!(kvikpy.errors, RemoteRangeError);
pyo3::import_exception!(kvikpy.errors, RemoteUrlError);

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

/// The `(errno, strerror, filename)` exception of `errno`'s class: the builtin `OSError`
/// subclass Python picks for it (CPython's table), as kvikpy's twin that is also a
/// `RuntimeError`.
fn os_error(errno: i32, strerror: String, filename: String) -> PyErr {
    let args = (errno, strerror, filename);
    match errno {
        libc::ENOENT => FileNotFoundRuntimeError::new_err(args),
        libc::EACCES | libc::EPERM => PermissionRuntimeError::new_err(args),
        libc::EISDIR => IsADirectoryRuntimeError::new_err(args),
        libc::ENOTDIR => NotADirectoryRuntimeError::new_err(args),
        libc::EEXIST => FileExistsRuntimeError::new_err(args),
        libc::EINTR => InterruptedRuntimeError::new_err(args),
        libc::EAGAIN | libc::EALREADY | libc::EINPROGRESS => BlockingIORuntimeError::new_err(args),
        libc::ETIMEDOUT => TimeoutRuntimeError::new_err(args),
        libc::EPIPE | libc::ESHUTDOWN => BrokenPipeRuntimeError::new_err(args),
        libc::ECONNABORTED => ConnectionAbortedRuntimeError::new_err(args),
        libc::ECONNREFUSED => ConnectionRefusedRuntimeError::new_err(args),
        libc::ECONNRESET => ConnectionResetRuntimeError::new_err(args),
        libc::ECHILD => ChildProcessRuntimeError::new_err(args),
        libc::ESRCH => ProcessLookupRuntimeError::new_err(args),
        _ => OSRuntimeError::new_err(args),
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
                    // kvikio's words for a file that does not open, which its users match.
                    let strerror = match op {
                        "open" => format!("Unable to open file: {text}"),
                        _ => format!("{text} (during {op})"),
                    };
                    os_error(errno, strerror, path)
                }
                None => OSRuntimeError::new_err(format!("{op} failed on '{path}': {source}")),
            }
        }
        Error::UnsupportedOperation(_) => UnsupportedOperationError::new_err(e.to_string()),
        Error::Negative { .. } => NegativeValueError::new_err(e.to_string()),
        Error::UnknownSetting(_) => PyKeyError::new_err(e.to_string()),
        Error::MalformedEnv { .. } | Error::Config(_) => ConfigError::new_err(e.to_string()),
        Error::Truncated(_) => OSRuntimeError::new_err(e.to_string()),
        Error::Panic(_) => InternalError::new_err(e.to_string()),
        Error::StartedBeforeFork => PyRuntimeError::new_err(e.to_string()),
        Error::OutOfMemory(_) => PyMemoryError::new_err(e.to_string()),
        Error::CudaUnavailable(_) => CudaUnavailableError::new_err(e.to_string()),
        Error::Cuda { .. } => CudaError::new_err(e.to_string()),
        Error::CuFile(_) => CuFileError::new_err(e.to_string()),
        Error::OutOfRange(_) => PyIndexError::new_err(e.to_string()),
        Error::MmapClosed(_) => MmapClosedError::new_err(e.to_string()),
        Error::Remote { kind, url, message } => remote_error(kind, url, message),
        Error::InvalidArgument(_) | Error::InvalidSetting { .. } | Error::Closed => {
            PyValueError::new_err(e.to_string())
        }
    }
}

/// Raises the exception an OS error with `errno` maps to, so that kvikpy's tests can
/// check the errno table against Python's own (`type(OSError(errno, ...))`) for every
/// errno.
#[kvikpy_macros::boundary]
#[pyo3::pyfunction]
pub fn _os_error_for_tests(errno: i32) -> BindResult<()> {
    Err(BindError::Engine(Error::os(
        "test",
        std::path::Path::new("errno-test"),
        std::io::Error::from_raw_os_error(errno),
    )))
}

/// The exception for a failed remote request: `kvikpy.errors.RemoteError` or the subclass
/// that is also Python's own type for it, built as `OSError(errno, message, url)`.
fn remote_error(kind: RemoteFailure, url: String, message: String) -> PyErr {
    use RemoteFailure as F;
    let args = |errno: i32| (errno, message.clone(), url.clone());
    match kind {
        F::NotFound => RemoteNotFoundError::new_err(args(libc::ENOENT)),
        F::Forbidden => RemotePermissionError::new_err(args(libc::EACCES)),
        F::Refused => RemoteConnectionError::new_err(args(libc::ECONNREFUSED)),
        F::Connection => RemoteConnectionError::new_err(args(libc::ECONNRESET)),
        F::Timeout => RemoteTimeoutError::new_err(args(libc::ETIMEDOUT)),
        F::Cancelled => RemoteConnectionError::new_err(args(libc::ECONNABORTED)),
        F::Status | F::Body => RemoteError::new_err(args(libc::EIO)),
        F::NoRange => RemoteRangeError::new_err(args(libc::EIO)),
        F::Changed => RemoteError::new_err(args(libc::ESTALE)),
        F::InvalidUrl => RemoteUrlError::new_err(message),
    }
}

/// Result type of binding functions.
pub type BindResult<T> = Result<T, BindError>;
