//! The read and write entry points of the file handles (`_lib.FileHandle`,
//! `_lib.MmapHandle`), written once: a [`Call`] holds one Python-level call's arguments,
//! [`run`] submits it through the handle and hands Python what the method returns, and
//! [`io_pymethods!`] declares each entry point as one row of its handle's table.

use std::time::Duration;

use kvikpy_core::{Completion, Direction, IoFuture, Span};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::errors::BindError;
use crate::future::{Future, StreamFuture};

/// The arguments of one Python-level read or write, before conversion.
pub(crate) struct Call<'a> {
    pub direction: Direction,
    pub size: Option<i64>,
    pub file_offset: i64,
    pub task_size: Option<i64>,
    /// `size` bytes or an error: a file that ends first (it shrank after it was sized) is
    /// an `OSError`, not a short count.
    pub exact: bool,
    pub completion: Completion,
    /// For kvikio's `raw_*` methods: device memory only, from this offset into it.
    pub raw: Option<Raw<'a>>,
}

/// What a `raw_*` call adds: where in the device buffer it starts, its own name and the
/// method to suggest for host memory.
pub(crate) struct Raw<'a> {
    pub dev_offset: i64,
    pub method: &'a str,
    pub alternative: &'a str,
}

impl<'a> Call<'a> {
    /// A call of the whole buffer at file offset 0; the builders below say the rest.
    pub fn new(direction: Direction, completion: Completion) -> Self {
        Self {
            direction,
            size: None,
            file_offset: 0,
            task_size: None,
            exact: false,
            completion,
            raw: None,
        }
    }

    /// `size` bytes (`None`: as many as the buffer holds) at `file_offset`.
    pub fn at(self, size: Option<i64>, file_offset: i64) -> Self {
        Self {
            size,
            file_offset,
            ..self
        }
    }

    /// Tasks of `task_size` bytes (`None`: the setting).
    pub fn task_size(self, task_size: Option<i64>) -> Self {
        Self { task_size, ..self }
    }

    /// Every byte asked for, or an `OSError` (see [`Call::exact`]).
    pub fn exact(self) -> Self {
        Self {
            exact: true,
            ..self
        }
    }

    /// A `raw_*` call named `method`: device memory only (host memory is pointed to
    /// `alternative`), from `dev_offset` into it.
    pub fn raw(self, dev_offset: i64, method: &'a str, alternative: &'a str) -> Self {
        Self {
            raw: Some(Raw {
                dev_offset,
                method,
                alternative,
            }),
            ..self
        }
    }
}

/// A `task_size` argument: `None` for the setting, else a positive byte count.
pub(crate) fn task_size_arg(task_size: Option<i64>) -> PyResult<Option<usize>> {
    match task_size {
        Some(t) if t <= 0 => Err(PyValueError::new_err(format!(
            "task_size must be a positive number of bytes, got {t}"
        ))),
        t => Ok(t.map(|t| t as usize)),
    }
}

/// A handle whose entry points are [`Call`]s: it converts one into one engine request on
/// `buf` and submits it, returning the future and the span the request covers.
pub(crate) trait Submit {
    fn submit(&self, py: Python<'_>, buf: &Bound<'_, PyAny>, call: &Call<'_>) -> Submitted;
}

/// A submitted request's future and the span of memory it covers.
pub(crate) type Submitted = PyResult<(IoFuture, Span)>;

/// What an entry point returns to Python for its submitted request.
pub(crate) trait Outcome: Sized {
    fn of(py: Python<'_>, future: IoFuture, span: Span, completion: Completion) -> PyResult<Self>;
}

/// A future (`pread`, `pwrite`).
impl Outcome for Future {
    fn of(_: Python<'_>, future: IoFuture, _: Span, _: Completion) -> PyResult<Self> {
        Ok(Future::from(future))
    }
}

/// The count of a request the caller waits for at once: without another GIL release when
/// it is already complete (an inline request), else an interruptible wait.
pub(crate) fn finish(py: Python<'_>, future: IoFuture) -> PyResult<usize> {
    match future.wait_timeout(Duration::ZERO) {
        Some(result) => result.map_err(|e| BindError::Engine(e).into()),
        None => Future::from(future).get(py),
    }
}

/// The count (blocking `read`, `write`...), as [`finish`] waits for it.
impl Outcome for usize {
    fn of(py: Python<'_>, future: IoFuture, _: Span, _: Completion) -> PyResult<Self> {
        finish(py, future)
    }
}

/// A stream-ordered `raw_*_async` call's future, with its device and stream.
impl Outcome for StreamFuture {
    fn of(_: Python<'_>, future: IoFuture, span: Span, completion: Completion) -> PyResult<Self> {
        let (Span::Device(span), Completion::StreamOrdered(stream)) = (span, completion) else {
            unreachable!("stream-ordered calls take device memory only")
        };
        Ok(StreamFuture::new(future, span.ordinal, stream.as_raw()))
    }
}

/// Submit `call` on `buf` through `handle`; what the entry point returns.
pub(crate) fn run<T: Outcome>(
    py: Python<'_>,
    handle: &impl Submit,
    buf: &Bound<'_, PyAny>,
    call: Call<'_>,
) -> PyResult<T> {
    let (future, span) = handle.submit(py, buf, &call)?;
    T::of(py, future, span, call.completion)
}

/// The `#[pymethods]` block of `$handle`, a [`Submit`] handle (in a module that has
/// `pyo3::prelude::*` and `boundary` in scope): the methods written out in its `impl`
/// block, then one read or write entry point per row of the tables that follow. A table
/// gives its entry points' Python signature; a row names the method, its return type
/// ([`Outcome`]) and the [`Call`] it makes, which the table completes with the arguments:
///
/// - `tuned($offset) { name -> T = call; }`: `(buf, size=None, $offset=0, task_size=None)`
/// - `exact(file_offset) { ... }`: `(buf, size, file_offset=0, task_size=None)`, and the
///   call is [`Call::exact`]
/// - `untuned($offset) { ... }`: `(buf, size=None, $offset=0)`, tasks of the setting's size
/// - `raw { name -> T = direction, alternative; }`: `(buf, size=None, file_offset=0,
///   dev_offset=0)`, one whole task in this thread ([`Call::raw`])
/// - `raw_async { ... }`: `(buf, stream, size=None, file_offset=0, dev_offset=0)`, ordered
///   in `stream`
macro_rules! io_pymethods {
    (
        impl $handle:ident { $($written:tt)* }
        $(tuned($tuned_offset:ident) {
            $($tuned:ident -> $tuned_out:ty = $tuned_call:expr;)*
        })?
        $(exact(file_offset) {
            $($exact:ident -> $exact_out:ty = $exact_call:expr;)*
        })?
        $(untuned($untuned_offset:ident) {
            $($untuned:ident -> $untuned_out:ty = $untuned_call:expr;)*
        })?
        $(raw {
            $($raw:ident -> $raw_out:ty = $raw_direction:expr, $raw_alternative:literal;)*
        })?
        $(raw_async {
            $($async:ident -> $async_out:ty = $async_direction:expr, $async_alternative:literal;)*
        })?
    ) => {
        #[boundary]
        #[pymethods]
        impl $handle {
            $($written)*

            $($(
                #[pyo3(signature = (buf, size=None, $tuned_offset=0, task_size=None))]
                fn $tuned(&self, py: Python<'_>, buf: &Bound<'_, PyAny>,
                    #[pyo3(from_py_with = crate::intake::opt_int_arg)] size: Option<i64>,
                    #[pyo3(from_py_with = crate::intake::int_arg)] $tuned_offset: i64,
                    #[pyo3(from_py_with = crate::intake::opt_int_arg)] task_size: Option<i64>,
                ) -> PyResult<$tuned_out> {
                    let call = $tuned_call.at(size, $tuned_offset).task_size(task_size);
                    crate::calls::run(py, self, buf, call)
                }
            )*)?

            $($(
                #[pyo3(signature = (buf, size, file_offset=0, task_size=None))]
                fn $exact(&self, py: Python<'_>, buf: &Bound<'_, PyAny>,
                    #[pyo3(from_py_with = crate::intake::int_arg)] size: i64,
                    #[pyo3(from_py_with = crate::intake::int_arg)] file_offset: i64,
                    #[pyo3(from_py_with = crate::intake::opt_int_arg)] task_size: Option<i64>,
                ) -> PyResult<$exact_out> {
                    let call = $exact_call.at(Some(size), file_offset).task_size(task_size);
                    crate::calls::run(py, self, buf, call.exact())
                }
            )*)?

            $($(
                #[pyo3(signature = (buf, size=None, $untuned_offset=0))]
                fn $untuned(&self, py: Python<'_>, buf: &Bound<'_, PyAny>,
                    #[pyo3(from_py_with = crate::intake::opt_int_arg)] size: Option<i64>,
                    #[pyo3(from_py_with = crate::intake::int_arg)] $untuned_offset: i64,
                ) -> PyResult<$untuned_out> {
                    crate::calls::run(py, self, buf, $untuned_call.at(size, $untuned_offset))
                }
            )*)?

            $($(
                #[pyo3(signature = (buf, size=None, file_offset=0, dev_offset=0))]
                fn $raw(&self, py: Python<'_>, buf: &Bound<'_, PyAny>,
                    #[pyo3(from_py_with = crate::intake::opt_int_arg)] size: Option<i64>,
                    #[pyo3(from_py_with = crate::intake::int_arg)] file_offset: i64,
                    #[pyo3(from_py_with = crate::intake::int_arg)] dev_offset: i64,
                ) -> PyResult<$raw_out> {
                    let whole = ::kvikpy_core::Completion::Whole;
                    let call = crate::calls::Call::new($raw_direction, whole)
                        .at(size, file_offset)
                        .raw(dev_offset, stringify!($raw), $raw_alternative);
                    crate::calls::run(py, self, buf, call)
                }
            )*)?

            $($(
                #[pyo3(signature = (buf, stream, size=None, file_offset=0, dev_offset=0))]
                fn $async(&self, py: Python<'_>, buf: &Bound<'_, PyAny>,
                    stream: usize,
                    #[pyo3(from_py_with = crate::intake::opt_int_arg)] size: Option<i64>,
                    #[pyo3(from_py_with = crate::intake::int_arg)] file_offset: i64,
                    #[pyo3(from_py_with = crate::intake::int_arg)] dev_offset: i64,
                ) -> PyResult<$async_out> {
                    let ordered = ::kvikpy_core::Completion::StreamOrdered(
                        ::kvikpy_core::cuda::Stream::from_raw(stream),
                    );
                    let call = crate::calls::Call::new($async_direction, ordered)
                        .at(size, file_offset)
                        .raw(dev_offset, stringify!($async), $async_alternative);
                    crate::calls::run(py, self, buf, call)
                }
            )*)?
        }
    };
}

pub(crate) use io_pymethods;
