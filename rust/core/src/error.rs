//! The one error type of the engine; the binding maps each variant to a Python exception.

use std::fmt;
use std::io;
use std::path::PathBuf;

/// Result alias used throughout the engine.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Everything that can go wrong in the engine.
#[derive(Debug)]
pub enum Error {
    /// An operating-system call failed. `op` says what kvikpy was doing (for example
    /// `"open"` or `"pread"`), `path` which file, and `source` carries the errno.
    /// Mapped to `OSError` and its errno-specific subclasses (`FileNotFoundError`, ...).
    Os {
        /// What kvikpy was doing, such as `"open"` or `"pread"`.
        op: &'static str,
        /// The file the call was about.
        path: PathBuf,
        /// The operating system's error, carrying the errno.
        source: io::Error,
    },
    /// An argument is out of range or inconsistent (a size larger than the buffer, a
    /// negative offset, an unknown open mode...). Mapped to `ValueError`.
    InvalidArgument(String),
    /// The file was opened without the access the operation needs (reading a file
    /// opened `"w"`, writing one opened `"r"`). Mapped to `io.UnsupportedOperation`.
    UnsupportedOperation(String),
    /// The operation was attempted on a file that was already closed. Mapped to
    /// `ValueError("I/O operation on closed file")`, as Python's own files do.
    Closed,
    /// `defaults.get/set` was given a setting name that does not exist. Mapped to `KeyError`.
    UnknownSetting(String),
    /// A setting was given a value it cannot take. Mapped to `ValueError`.
    InvalidSetting {
        /// The setting's name.
        name: String,
        /// The refused value, as given.
        value: String,
        /// What the setting accepts, for the message.
        expected: &'static str,
    },
    /// A negative number where kvikio takes a C `size_t` (a setting, a page-cache offset or
    /// length). Mapped to `kvikpy.errors.NegativeValueError`: a `ValueError`, and the
    /// `OverflowError` kvikio raises for it.
    Negative {
        /// What was given the value, such as `"setting 'task_size'"` or `"offset"`.
        what: String,
        /// The refused value, as given.
        value: String,
        /// What is accepted, for the message.
        expected: &'static str,
    },
    /// An environment variable holds a value that cannot be parsed. Mapped to
    /// `kvikpy.ConfigError` (a `ValueError`), naming the variable.
    MalformedEnv {
        /// The environment variable's name.
        var: &'static str,
        /// The variable's value, as found.
        value: String,
        /// What the variable accepts, for the message.
        expected: &'static str,
    },
    /// A configuration that names something unusable (a CA bundle that cannot be read or
    /// holds no certificate); the message names it and where it was named. Mapped to
    /// `kvikpy.ConfigError` (a `ValueError`).
    Config(String),
    /// No usable CUDA driver or device (no libcuda, no GPU, driver too old). Mapped to
    /// `kvikpy.CudaUnavailableError`, whose message suggests `device="cpu"`.
    CudaUnavailable(String),
    /// A CUDA driver call failed. `call` names it, `code`/`name` give the `CUresult`.
    /// Mapped to `kvikpy.CudaError`.
    Cuda {
        /// The driver call that failed, such as `"cuMemcpyHtoDAsync"`.
        call: &'static str,
        /// The numeric `CUresult`.
        code: i32,
        /// The `CUresult`'s name, such as `"CUDA_ERROR_INVALID_VALUE"`.
        name: String,
    },
    /// Host or device memory could not be allocated (a GPU out of memory, pinned memory
    /// the driver refused, a host allocation that failed). The message says how much,
    /// where, and what to do. Mapped to `MemoryError` on host and device alike.
    OutOfMemory(String),
    /// A read that had to fill its memory reached the end of the file first: the file
    /// shrank after it was sized (a whole-file read, a batch element). The message names
    /// the file, the offset and the counts. Mapped to `OSError`.
    Truncated(String),
    /// cuFile (GPUDirect Storage) cannot be used or one of its calls failed; the message
    /// carries cuFile's own (`HANDLE_NOT_REGISTERED (5027) ...`). Mapped to
    /// `kvikpy.CuFileError` (a `RuntimeError`, as kvikio raises).
    CuFile(String),
    /// A range outside what a mapping or file covers (kvikio's `std::out_of_range`: a
    /// `kvikpy.Mmap` region past the end of the file, a read outside the mapped region).
    /// Mapped to `IndexError`, as kvikio raises.
    OutOfRange(String),
    /// A read from a closed `kvikpy.Mmap`. Mapped to `kvikpy.MmapClosedError`, both a
    /// `ValueError` (as Python's closed files raise) and a `RuntimeError` (as kvikio
    /// raises).
    MmapClosed(PathBuf),
    /// A remote file (HTTP, S3, WebHDFS) could not be opened or read. `kind` says what
    /// failed, for the binding's choice of exception (`kvikpy.errors.RemoteError` and its
    /// subclasses, which are also `FileNotFoundError`, `PermissionError`,
    /// `ConnectionError`, `TimeoutError`... as fits); `message` names the URL, what the
    /// server answered and what to do.
    Remote {
        /// What failed.
        kind: RemoteFailure,
        /// The URL the failure is about, as given (for the exception's `filename`).
        url: String,
        /// The full message.
        message: String,
    },
    /// Waiting, in a forked child, on a read or write the parent started before
    /// `fork()`: the threads running it do not exist in the child, so it can never finish
    /// there. Mapped to `RuntimeError`.
    StartedBeforeFork,
    /// A bug: engine code panicked. The panic is caught at the task or call boundary
    /// and reported as `kvikpy.InternalError` instead of crossing into Python.
    Panic(String),
}

/// What kind of failure an [`Error::Remote`] is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RemoteFailure {
    /// The server has no such file (HTTP 404 or 410, WebHDFS `FileNotFoundException`).
    NotFound,
    /// The server refused access (HTTP 401 or 403): credentials missing or wrong.
    Forbidden,
    /// Nothing listens at the address (connection refused).
    Refused,
    /// The connection failed otherwise: the host is unknown, TLS failed, or the server
    /// closed the connection before the answer was complete.
    Connection,
    /// The request took longer than the `http_timeout` setting, every attempt.
    Timeout,
    /// The server answered with an error status (after the retries the
    /// `http_status_codes` setting asks for).
    Status,
    /// The answer is not what was asked for: a body shorter or longer than the range,
    /// a size the server does not report.
    Body,
    /// The server ignored a range request (answered the whole file to a request for
    /// part of it): it does not support HTTP ranges.
    NoRange,
    /// The URL, endpoint type or credentials cannot make a request (a malformed URL, an
    /// unsupported scheme, an endpoint type outside the allow list, missing AWS keys).
    InvalidUrl,
    /// The file changed on the server since it was opened: a ranged request pinned to the
    /// `ETag` the server gave at open (`If-Match`) was answered `412 Precondition
    /// Failed`, or with another `ETag`. Never retried: reading on would mix two versions.
    Changed,
    /// The request was abandoned before it finished: the call waiting for it was
    /// interrupted (Ctrl-C), another request of the same read failed, or the interpreter
    /// is exiting.
    Cancelled,
}

impl Error {
    /// An [`Error::Remote`] of `kind` about `url`. The user info of every URL in `url`
    /// and `message` is redacted (`user:***@host`), so that no password reaches an
    /// exception, its `filename` or a log.
    pub fn remote(kind: RemoteFailure, url: &str, message: impl Into<String>) -> Self {
        use crate::redact::redact;
        let message = message.into();
        Self::Remote {
            kind,
            url: redact(url).into_owned(),
            message: match redact(&message) {
                std::borrow::Cow::Owned(redacted) => redacted,
                std::borrow::Cow::Borrowed(_) => message,
            },
        }
    }

    /// An [`Error::Os`] built from the current `errno`.
    pub fn last_os(op: &'static str, path: &std::path::Path) -> Self {
        Self::os(op, path, io::Error::last_os_error())
    }

    /// An [`Error::Os`] for `op` on `path`.
    pub fn os(op: &'static str, path: &std::path::Path, source: io::Error) -> Self {
        Self::Os {
            op,
            path: path.to_path_buf(),
            source,
        }
    }

    /// An [`Error::Panic`] from a payload caught by `catch_unwind`.
    pub fn from_panic(payload: Box<dyn std::any::Any + Send>) -> Self {
        Self::Panic(panic_message(payload.as_ref()))
    }
}

/// The text of a panic payload caught by `catch_unwind`.
pub fn panic_message(payload: &(dyn std::any::Any + Send)) -> String {
    if let Some(s) = payload.downcast_ref::<&str>() {
        (*s).to_string()
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s.clone()
    } else {
        "unknown panic payload".to_string()
    }
}

// `io::Error` is not `Clone`, but a future hands the same error to every `get()`.
impl Clone for Error {
    fn clone(&self) -> Self {
        match self {
            Self::Os { op, path, source } => Self::Os {
                op,
                path: path.clone(),
                source: match source.raw_os_error() {
                    Some(errno) => io::Error::from_raw_os_error(errno),
                    None => io::Error::new(source.kind(), source.to_string()),
                },
            },
            Self::InvalidArgument(m) => Self::InvalidArgument(m.clone()),
            Self::UnsupportedOperation(m) => Self::UnsupportedOperation(m.clone()),
            Self::Closed => Self::Closed,
            Self::UnknownSetting(n) => Self::UnknownSetting(n.clone()),
            Self::InvalidSetting {
                name,
                value,
                expected,
            } => Self::InvalidSetting {
                name: name.clone(),
                value: value.clone(),
                expected,
            },
            Self::Negative {
                what,
                value,
                expected,
            } => Self::Negative {
                what: what.clone(),
                value: value.clone(),
                expected,
            },
            Self::MalformedEnv {
                var,
                value,
                expected,
            } => Self::MalformedEnv {
                var,
                value: value.clone(),
                expected,
            },
            Self::CudaUnavailable(m) => Self::CudaUnavailable(m.clone()),
            Self::Cuda { call, code, name } => Self::Cuda {
                call,
                code: *code,
                name: name.clone(),
            },
            Self::Truncated(m) => Self::Truncated(m.clone()),
            Self::Config(m) => Self::Config(m.clone()),
            Self::Remote { kind, url, message } => Self::Remote {
                kind: *kind,
                url: url.clone(),
                message: message.clone(),
            },
            Self::Panic(m) => Self::Panic(m.clone()),
            Self::CuFile(m) => Self::CuFile(m.clone()),
            Self::OutOfMemory(m) => Self::OutOfMemory(m.clone()),
            Self::OutOfRange(m) => Self::OutOfRange(m.clone()),
            Self::MmapClosed(p) => Self::MmapClosed(p.clone()),
            Self::StartedBeforeFork => Self::StartedBeforeFork,
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Os { op, path, source } => {
                write!(f, "{op} failed on '{}': {source}", path.display())
            }
            Self::InvalidArgument(m) | Self::UnsupportedOperation(m) => f.write_str(m),
            Self::Closed => f.write_str("I/O operation on closed file"),
            Self::UnknownSetting(name) => write!(
                f,
                "unknown setting '{name}'; known settings: {}",
                crate::vocab::SETTING_NAMES.join(", ")
            ),
            Self::InvalidSetting {
                name,
                value,
                expected,
            } => write!(
                f,
                "invalid value {value} for setting '{name}': expected {expected}"
            ),
            Self::Negative {
                what,
                value,
                expected,
            } => write!(
                f,
                "invalid value {value} for {what}: a negative value cannot be a size, a count \
                 or an offset; expected {expected}"
            ),
            Self::MalformedEnv {
                var,
                value,
                expected,
            } => write!(
                f,
                "environment variable {var}={value:?} is malformed: expected {expected}; \
                 fix or unset {var}"
            ),
            Self::CudaUnavailable(why) => write!(
                f,
                "CUDA is not available ({why}); pass device=\"cpu\" to read into host memory"
            ),
            Self::Cuda { call, code, name } => {
                write!(f, "CUDA driver call {call} failed with {name} ({code})")
            }
            Self::OutOfMemory(m)
            | Self::Truncated(m)
            | Self::CuFile(m)
            | Self::OutOfRange(m)
            | Self::Config(m) => f.write_str(m),
            Self::MmapClosed(path) => write!(
                f,
                "Cannot read from a closed MmapHandle ('{}' was closed by close() or by \
                 leaving its with block); create a new kvikpy.Mmap to read it again",
                path.display()
            ),
            Self::Remote { message, .. } => f.write_str(message),
            Self::StartedBeforeFork => f.write_str(crate::fork::STARTED_BEFORE_FORK),
            Self::Panic(m) => write!(f, "internal error in kvikpy (a bug, please report it): {m}"),
        }
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Os { source, .. } => Some(source),
            _ => None,
        }
    }
}
