//! `_lib.FileHandle`: an open file and its read/write entry points. Each one converts its
//! arguments into one engine [`Request`] and submits it; the engine decides how it runs.

use std::time::Duration;

use kvikpy_core::cuda::Stream;
use kvikpy_core::extent::{extent, Extent, Want};
use kvikpy_core::{Completion, Direction, IoFuture, Request, Span};
use kvikpy_macros::boundary;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::blocking::{interruptible_alone, without_gil};
use crate::buffer::{mark_ready, Buffer};
use crate::errors::{BindError, BindResult};
use crate::future::{Future, StreamFuture};
use crate::intake::{file_offset, int_arg, intake_with, opt_int_arg, Access, Pending};

/// An open file (the private handle behind `kvikpy.CuFile`).
#[pyclass(module = "kvikpy._lib", frozen)]
pub struct FileHandle {
    inner: kvikpy_core::FileHandle,
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

/// The arguments of one Python-level read or write, before conversion.
struct Call<'a> {
    direction: Direction,
    size: Option<i64>,
    file_offset: i64,
    task_size: Option<i64>,
    exact: bool,
    completion: Completion,
    /// For kvikio's `raw_*` methods: device memory only, from this offset into it.
    raw: Option<Raw<'a>>,
}

/// What a `raw_*` call adds: where in the device buffer it starts, its own name and the
/// method to suggest for host memory.
struct Raw<'a> {
    dev_offset: i64,
    method: &'a str,
    alternative: &'a str,
}

impl<'a> Call<'a> {
    fn new(
        direction: Direction,
        size: Option<i64>,
        file_offset: i64,
        completion: Completion,
    ) -> Self {
        Self {
            direction,
            size,
            file_offset,
            task_size: None,
            exact: false,
            completion,
            raw: None,
        }
    }

    fn raw(mut self, dev_offset: i64, method: &'a str, alternative: &'a str) -> Self {
        self.raw = Some(Raw {
            dev_offset,
            method,
            alternative,
        });
        self
    }
}

/// Open `path` in mode `flags` (kvikio's `"r"`, `"w"`...) with the GIL released: a URL
/// interruptibly (opening it asks the server for the size), a local file again after a
/// signal other than Ctrl-C interrupts an open that waits (a FIFO nobody writes).
pub(crate) fn open(
    py: Python<'_>,
    path: std::path::PathBuf,
    flags: &str,
) -> BindResult<kvikpy_core::FileHandle> {
    if kvikpy_core::source::is_remote(&path) {
        let flags = flags.to_owned();
        let token = kvikpy_core::cancel::CancelToken::new();
        return interruptible_alone(py, &token, move || {
            kvikpy_core::FileHandle::open(path, &flags)
        });
    }
    let path = &path;
    loop {
        match without_gil(py, move || kvikpy_core::FileHandle::open(path, flags)) {
            Ok(inner) => return Ok(inner),
            Err(BindError::Engine(kvikpy_core::Error::Os { source, .. }))
                if source.raw_os_error() == Some(libc::EINTR) =>
            {
                py.check_signals()?
            }
            Err(e) => return Err(e),
        }
    }
}

/// The count of a future the caller waits for at once: without another GIL release when
/// it is already complete (an inline request), else an interruptible wait.
pub(crate) fn finish(py: Python<'_>, future: IoFuture) -> PyResult<usize> {
    match future.wait_timeout(Duration::ZERO) {
        Some(result) => result.map_err(|e| BindError::Engine(e).into()),
        None => Future::from(future).get(py),
    }
}

impl FileHandle {
    /// The Python handle of a file the engine already opened (a remote file).
    pub fn from_core(inner: kvikpy_core::FileHandle) -> Self {
        Self { inner }
    }

    /// Convert `call` into one request on `buf` and submit it; the span it covers too.
    fn submit(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        call: Call<'_>,
    ) -> PyResult<(IoFuture, Span)> {
        let task_size = task_size_arg(call.task_size)?;
        let file_offset = file_offset(call.file_offset)?;
        let access = match call.direction {
            Direction::Read => Access::Fill,
            Direction::Write => Access::Drain,
        };
        // A producer's pending work is waited for inside the submission's own release of
        // the GIL below, not in a release of its own.
        let pending = match call.completion {
            Completion::StreamOrdered(stream) => Pending::InStreamOrder(stream.as_raw()),
            _ => Pending::Deferred,
        };
        let taken = match call.raw {
            Some(raw) => {
                self.inner.get().map_err(BindError::Engine)?; // a closed file first
                let taken = intake_with(buf, access, pending)?;
                taken.device_only(raw.method, raw.alternative)?;
                taken.select(raw.dev_offset, call.size, "dev_offset")?
            }
            None => intake_with(buf, access, pending)?.select(0, call.size, "offset")?,
        };
        let (span, wait) = (taken.span, taken.wait);
        let request = Request {
            direction: call.direction,
            span,
            file_offset,
            task_size,
            exact: call.exact,
            keepalive: Some(taken.keepalive),
        };
        let (inner, completion) = (&self.inner, call.completion);
        let future = without_gil(py, move || {
            if let Some(wait) = wait {
                wait.run()?;
            }
            let settings = kvikpy_core::settings::current()?;
            kvikpy_core::submit(&settings, inner, request, completion)
        })?;
        Ok((future, span))
    }

    /// A stream-ordered `raw_*_async` call; the future and the device's ordinal.
    fn ordered(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        stream: usize,
        call: Call<'_>,
    ) -> PyResult<(StreamFuture, usize)> {
        let (future, span) = self.submit(py, buf, call)?;
        let Span::Device(span) = span else {
            unreachable!("raw calls take device memory only")
        };
        Ok((
            StreamFuture::new(future, span.ordinal, stream),
            span.ordinal,
        ))
    }
}

#[boundary]
#[pymethods]
impl FileHandle {
    #[new]
    fn new(py: Python<'_>, path: std::path::PathBuf, flags: &str) -> BindResult<Self> {
        Ok(Self {
            inner: open(py, path, flags)?,
        })
    }

    fn close(&self) {
        self.inner.close();
    }

    #[getter]
    fn closed(&self) -> bool {
        self.inner.is_closed()
    }

    /// Which source reads the file (`"posix"` or `"cufile"`) and why it was chosen.
    #[getter]
    fn backend(&self) -> (&'static str, String) {
        let (name, why) = self.inner.backend();
        (name, why.to_owned())
    }

    #[getter]
    fn path(&self) -> std::path::PathBuf {
        self.inner.path().to_path_buf()
    }

    fn fileno(&self) -> BindResult<i32> {
        let source = self.inner.get()?;
        source.descriptor().ok_or_else(|| {
            BindError::Engine(kvikpy_core::Error::UnsupportedOperation(format!(
                "the {} source of '{}' has no file descriptor",
                source.name(),
                source.path().display()
            )))
        })
    }

    fn open_flags(&self) -> BindResult<i32> {
        Ok(self.inner.get()?.status_flags()?)
    }

    fn nbytes(&self) -> BindResult<u64> {
        Ok(self.inner.get()?.size()?)
    }

    /// The size for sizing `what`; `ValueError` for a pseudo-file that reports 0 bytes
    /// but has content.
    fn size_for(&self, what: &str) -> BindResult<u64> {
        let settings = kvikpy_core::settings::current()?;
        Ok(self.inner.get()?.size_for(what, &settings)?)
    }

    /// What the file holds for a read of `size` bytes at `offset` (to the end for
    /// `None`), cut to what it has (`numpy.fromfile`'s `count`): `(bytes, whether the
    /// file may end before them, the bytes themselves where the file had to be read to
    /// its end to be sized)`; `ValueError` for a device or pipe read to its end.
    #[pyo3(signature = (offset, size=None))]
    fn extent(
        &self,
        py: Python<'_>,
        offset: u64,
        size: Option<u64>,
    ) -> BindResult<(u64, bool, Option<Py<PyBytes>>)> {
        let settings = kvikpy_core::settings::current()?;
        let source = self.inner.get()?;
        let want = Want {
            offset,
            size,
            strict: false,
            device: false,
        };
        let name = source.path().to_string_lossy().into_owned();
        let found = without_gil(py, move || extent(&*source, want, &name, &settings))?;
        Ok(match found {
            Extent::Sized(n) => (n, false, None),
            Extent::Open(n) => (n, true, None),
            Extent::Content(bytes) => (
                bytes.len() as u64,
                false,
                Some(PyBytes::new(py, &bytes).unbind()),
            ),
        })
    }

    fn is_direct_io_supported(&self) -> BindResult<bool> {
        Ok(self.inner.get()?.direct_io_supported())
    }

    #[pyo3(signature = (buf, size=None, file_offset=0, task_size=None))]
    fn pread(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = opt_int_arg)] size: Option<i64>,
        #[pyo3(from_py_with = int_arg)] file_offset: i64,
        #[pyo3(from_py_with = opt_int_arg)] task_size: Option<i64>,
    ) -> PyResult<Future> {
        let mut call = Call::new(Direction::Read, size, file_offset, Completion::Future);
        call.task_size = task_size;
        Ok(Future::from(self.submit(py, buf, call)?.0))
    }

    /// `pread` that must fill `size` bytes: a file that ends first (it shrank after it
    /// was sized) is an `OSError`, not a short count.
    #[pyo3(signature = (buf, size, file_offset=0, task_size=None))]
    fn pread_exact(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = int_arg)] size: i64,
        #[pyo3(from_py_with = int_arg)] file_offset: i64,
        #[pyo3(from_py_with = opt_int_arg)] task_size: Option<i64>,
    ) -> PyResult<Future> {
        let mut call = Call::new(Direction::Read, Some(size), file_offset, Completion::Future);
        call.exact = true;
        call.task_size = task_size;
        Ok(Future::from(self.submit(py, buf, call)?.0))
    }

    #[pyo3(signature = (buf, size=None, file_offset=0, task_size=None))]
    fn pwrite(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = opt_int_arg)] size: Option<i64>,
        #[pyo3(from_py_with = int_arg)] file_offset: i64,
        #[pyo3(from_py_with = opt_int_arg)] task_size: Option<i64>,
    ) -> PyResult<Future> {
        let mut call = Call::new(Direction::Write, size, file_offset, Completion::Future);
        call.task_size = task_size;
        Ok(Future::from(self.submit(py, buf, call)?.0))
    }

    #[pyo3(signature = (buf, size=None, file_offset=0, task_size=None))]
    fn read(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = opt_int_arg)] size: Option<i64>,
        #[pyo3(from_py_with = int_arg)] file_offset: i64,
        #[pyo3(from_py_with = opt_int_arg)] task_size: Option<i64>,
    ) -> PyResult<usize> {
        let mut call = Call::new(Direction::Read, size, file_offset, Completion::Blocking);
        call.task_size = task_size;
        finish(py, self.submit(py, buf, call)?.0)
    }

    /// `read` that must fill `size` bytes: a file that ends first (it shrank after it was
    /// sized) is an `OSError`, not a short count.
    #[pyo3(signature = (buf, size, file_offset=0, task_size=None))]
    fn read_exact(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = int_arg)] size: i64,
        #[pyo3(from_py_with = int_arg)] file_offset: i64,
        #[pyo3(from_py_with = opt_int_arg)] task_size: Option<i64>,
    ) -> PyResult<usize> {
        let mut call = Call::new(
            Direction::Read,
            Some(size),
            file_offset,
            Completion::Blocking,
        );
        call.exact = true;
        call.task_size = task_size;
        finish(py, self.submit(py, buf, call)?.0)
    }

    #[pyo3(signature = (buf, size=None, file_offset=0, task_size=None))]
    fn write(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = opt_int_arg)] size: Option<i64>,
        #[pyo3(from_py_with = int_arg)] file_offset: i64,
        #[pyo3(from_py_with = opt_int_arg)] task_size: Option<i64>,
    ) -> PyResult<usize> {
        let mut call = Call::new(Direction::Write, size, file_offset, Completion::Blocking);
        call.task_size = task_size;
        finish(py, self.submit(py, buf, call)?.0)
    }

    #[pyo3(signature = (buf, size=None, file_offset=0, dev_offset=0))]
    fn raw_read(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = opt_int_arg)] size: Option<i64>,
        #[pyo3(from_py_with = int_arg)] file_offset: i64,
        #[pyo3(from_py_with = int_arg)] dev_offset: i64,
    ) -> PyResult<usize> {
        let call = Call::new(Direction::Read, size, file_offset, Completion::Whole);
        finish(
            py,
            self.submit(py, buf, call.raw(dev_offset, "raw_read", "read"))?
                .0,
        )
    }

    #[pyo3(signature = (buf, size=None, file_offset=0, dev_offset=0))]
    fn raw_write(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        #[pyo3(from_py_with = opt_int_arg)] size: Option<i64>,
        #[pyo3(from_py_with = int_arg)] file_offset: i64,
        #[pyo3(from_py_with = int_arg)] dev_offset: i64,
    ) -> PyResult<usize> {
        let call = Call::new(Direction::Write, size, file_offset, Completion::Whole);
        finish(
            py,
            self.submit(py, buf, call.raw(dev_offset, "raw_write", "write"))?
                .0,
        )
    }

    #[pyo3(signature = (buf, stream, size=None, file_offset=0, dev_offset=0))]
    fn raw_read_async(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        stream: usize,
        #[pyo3(from_py_with = opt_int_arg)] size: Option<i64>,
        #[pyo3(from_py_with = int_arg)] file_offset: i64,
        #[pyo3(from_py_with = int_arg)] dev_offset: i64,
    ) -> PyResult<StreamFuture> {
        let ordered = Completion::StreamOrdered(Stream::from_raw(stream));
        let call = Call::new(Direction::Read, size, file_offset, ordered);
        let call = call.raw(dev_offset, "raw_read_async", "pread");
        let (future, ordinal) = self.ordered(py, buf, stream, call)?;
        // A kvikpy.Buffer remembers where in `stream` its bytes land, for its consumers.
        if let Ok(buffer) = buf.cast::<Buffer>() {
            let storage = buffer.get().span().1;
            without_gil(py, move || mark_ready(&storage, ordinal, stream))?;
        }
        Ok(future)
    }

    #[pyo3(signature = (buf, stream, size=None, file_offset=0, dev_offset=0))]
    fn raw_write_async(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        stream: usize,
        #[pyo3(from_py_with = opt_int_arg)] size: Option<i64>,
        #[pyo3(from_py_with = int_arg)] file_offset: i64,
        #[pyo3(from_py_with = int_arg)] dev_offset: i64,
    ) -> PyResult<StreamFuture> {
        let ordered = Completion::StreamOrdered(Stream::from_raw(stream));
        let call = Call::new(Direction::Write, size, file_offset, ordered);
        let call = call.raw(dev_offset, "raw_write_async", "pwrite");
        Ok(self.ordered(py, buf, stream, call)?.0)
    }
}
