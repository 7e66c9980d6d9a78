//! `_lib.Future`: waiting on an engine future without the GIL, interruptibly, and
//! done-callbacks that call back into Python.

use kvikpy_macros::boundary;
use std::time::Duration;

use kvikpy_core::IoFuture;
use pyo3::prelude::*;

use crate::blocking::{without_gil, without_gil_value, SIGNAL_CHECK_INTERVAL};
use crate::errors::{BindError, BindResult};

/// A running or finished read or write (the private handle behind `kvikpy.IOFuture`).
#[pyclass(module = "kvikpy._lib", frozen)]
pub struct Future {
    inner: IoFuture,
}

impl Future {
    /// `py.check_signals()`, cancelling the operation if a handler raised.
    fn check_signals(&self, py: Python<'_>) -> PyResult<()> {
        py.check_signals().inspect_err(|_| self.inner.cancel())
    }
}

impl From<IoFuture> for Future {
    fn from(inner: IoFuture) -> Self {
        Self { inner }
    }
}

#[boundary]
#[pymethods]
impl Future {
    /// Wait for the result with the GIL released, checking for signals now and then. A
    /// signal handler's exception (KeyboardInterrupt) cancels the operation where it can
    /// be (remote reads stop; their memory stays alive until they have) and is raised.
    /// (`PyResult` rather than `BindResult`: `file.rs` returns it as is.)
    pub fn get(&self, py: Python<'_>) -> PyResult<usize> {
        loop {
            let inner = &self.inner;
            let outcome = without_gil_value(py, move || inner.wait_timeout(SIGNAL_CHECK_INTERVAL))?;
            if let Some(result) = outcome {
                return Ok(result.map_err(BindError::Engine)?);
            }
            self.check_signals(py)?;
        }
    }

    /// Ask the operation to stop where it can: remote reads stop within tens of
    /// milliseconds and fail (`RemoteConnectionError`, errno `ECONNABORTED`); local reads
    /// and writes run to their end. The future still completes only when every task has.
    fn cancel(&self) {
        self.inner.cancel();
    }

    fn done(&self) -> bool {
        self.inner.is_done()
    }

    /// Wait up to `timeout` seconds (GIL released, checking for signals as `get` does);
    /// whether the operation is done.
    fn wait(&self, py: Python<'_>, timeout: f64) -> BindResult<bool> {
        let end = std::time::Instant::now() + seconds(timeout);
        loop {
            let slice = end
                .saturating_duration_since(std::time::Instant::now())
                .min(SIGNAL_CHECK_INTERVAL);
            let inner = &self.inner;
            if without_gil_value(py, move || inner.wait_timeout(slice))?.is_some() {
                return Ok(true);
            }
            if slice < SIGNAL_CHECK_INTERVAL {
                return Ok(false);
            }
            self.check_signals(py)?;
        }
    }

    /// Bytes moved by the tasks finished so far (for progress bars).
    #[getter]
    fn bytes_so_far(&self) -> u64 {
        self.inner.bytes_so_far()
    }

    /// Call `callback()` (no arguments) once done, from whichever thread completes the
    /// operation, or at once if it is already done. Exceptions it raises go to
    /// `sys.unraisablehook`, as nothing could catch them there.
    fn add_done_callback(&self, callback: Py<PyAny>) {
        self.inner.add_done_callback(move || {
            // At interpreter exit there is nobody left to call back.
            Python::try_attach(|py| {
                if let Err(err) = callback.call0(py) {
                    err.write_unraisable(py, Some(callback.bind(py)));
                }
            });
        });
    }
}

/// A stream-ordered read or write (the private handle behind `kvikpy.IOFutureStream`).
#[pyclass(module = "kvikpy._lib", frozen)]
pub struct StreamFuture {
    inner: IoFuture,
    ordinal: usize,
    stream: usize,
}

impl StreamFuture {
    /// Wrap an engine future running in `stream`'s order on device `ordinal`.
    pub fn new(inner: IoFuture, ordinal: usize, stream: usize) -> Self {
        Self {
            inner,
            ordinal,
            stream,
        }
    }
}

#[boundary]
#[pymethods]
impl StreamFuture {
    /// Wait for the transfer and for `stream` to reach it; the bytes transferred.
    fn check_bytes_done(&self, py: Python<'_>) -> BindResult<usize> {
        let bytes = Future::from(self.inner.clone()).get(py)?;
        let (ordinal, stream) = (self.ordinal, self.stream);
        without_gil(py, move || {
            let context = kvikpy_core::cuda::bind(ordinal)?;
            kvikpy_core::cuda::synchronize(&context, kvikpy_core::cuda::Stream::from_raw(stream))
        })?;
        Ok(bytes)
    }

    fn done(&self) -> bool {
        self.inner.is_done()
    }

    #[getter]
    fn stream(&self) -> usize {
        self.stream
    }
}

/// Cancel every remote request in flight (they stop within tens of milliseconds); later
/// ones are not affected. kvikpy registers this with `atexit`, before `wait_for_io`, so
/// that a pending read of a server that stalls does not hold up the interpreter's exit.
#[boundary]
#[pyfunction]
pub fn cancel_remote_io() {
    kvikpy_core::cancel::cancel_all();
}

/// Wait (without the GIL) until no read or write is in flight, at most `timeout` seconds;
/// whether none is. kvikpy registers this with `atexit`: I/O threads finishing an
/// operation may still call back into Python (done-callbacks, releasing buffers), which
/// must happen before the interpreter finalises.
#[boundary]
#[pyfunction]
pub fn wait_for_io(py: Python<'_>, timeout: f64) -> BindResult<bool> {
    let timeout = seconds(timeout);
    without_gil_value(py, move || kvikpy_core::wait_idle(timeout))
}

/// A timeout in seconds from Python as a `Duration`: negative and NaN are 0, and anything
/// over a million seconds (infinity included) is a million, since `from_secs_f64` panics
/// on values it cannot represent.
fn seconds(timeout: f64) -> Duration {
    if timeout.is_nan() {
        return Duration::ZERO;
    }
    Duration::from_secs_f64(timeout.clamp(0.0, 1e6))
}
