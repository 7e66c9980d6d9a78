//! `_lib.FileHandle`: an open file and its read/write entry points.

use kvikpy_core::device_io::submit_stream_ordered;
use kvikpy_core::io::{run_if_single_task, run_whole, submit_with, Caller, Direction};
use kvikpy_core::Span;
use kvikpy_macros::boundary;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::blocking::without_gil;
use crate::errors::{BindError, BindResult};
use crate::future::{Future, StreamFuture};
use crate::intake::{file_offset, intake, Access, Intake};
use crate::memory::{mark_ready, Buffer};

/// An open file (the private handle behind `kvikpy.CuFile`).
#[pyclass(module = "kvikpy._lib", frozen)]
pub struct FileHandle {
    inner: kvikpy_core::FileHandle,
}

fn access(direction: Direction) -> Access {
    match direction {
        Direction::Read => Access::Fill,
        Direction::Write => Access::Drain,
    }
}

fn task_size_arg(task_size: Option<i64>) -> PyResult<Option<usize>> {
    match task_size {
        Some(t) if t <= 0 => Err(PyValueError::new_err(format!(
            "task_size must be a positive number of bytes, got {t}"
        ))),
        t => Ok(t.map(|t| t as usize)),
    }
}

impl FileHandle {
    fn run(
        &self,
        py: Python<'_>,
        taken: Intake,
        offset: i64,
        task_size: Option<usize>,
        direction: Direction,
        caller: Caller,
    ) -> PyResult<kvikpy_core::IoFuture> {
        let offset = file_offset(offset)?;
        let Intake { span, keepalive } = taken;
        let inner = &self.inner;
        let keepalive = Some(keepalive);
        Ok(without_gil(py, move || {
            let settings = kvikpy_core::settings::current()?;
            submit_with(
                &settings, inner, direction, span, offset, task_size, keepalive, caller,
            )
        })?)
    }

    /// A blocking read or write: in this thread when it is one task, else on the pool
    /// with an interruptible wait.
    fn blocking(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        size: Option<i64>,
        offset: i64,
        task_size: Option<i64>,
        direction: Direction,
    ) -> PyResult<usize> {
        let task_size = task_size_arg(task_size)?;
        let taken = intake(buf, access(direction))?.select(0, size, "offset")?;
        let file_offset = file_offset(offset)?;
        let (span, inner) = (taken.span, &self.inner);
        // The caller's frame keeps `buf` (and `taken`) alive for this whole call.
        let inline = without_gil(py, move || {
            run_if_single_task(inner, direction, span, file_offset, task_size)
        })?;
        match inline {
            Some(n) => Ok(n),
            None => {
                let future = self.run(py, taken, offset, task_size, direction, Caller::Helps)?;
                Future::from(future).get(py)
            }
        }
    }

    /// A read or write returning a future (`pread`/`pwrite`).
    fn start(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        size: Option<i64>,
        offset: i64,
        task_size: Option<i64>,
        direction: Direction,
    ) -> PyResult<Future> {
        let task_size = task_size_arg(task_size)?;
        let taken = intake(buf, access(direction))?.select(0, size, "offset")?;
        Ok(Future::from(self.run(
            py,
            taken,
            offset,
            task_size,
            direction,
            Caller::Returns,
        )?))
    }

    /// One pool-free call on device memory (`raw_read`/`raw_write`).
    #[allow(clippy::too_many_arguments)]
    fn raw(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        size: Option<i64>,
        offset: i64,
        dev_offset: i64,
        direction: Direction,
        method: &str,
        alternative: &str,
    ) -> PyResult<usize> {
        self.inner.get().map_err(BindError::Engine)?;
        let taken = intake(buf, access(direction))?;
        taken.device_only(method, alternative)?;
        let taken = taken.select(dev_offset, size, "dev_offset")?;
        let file_offset = file_offset(offset)?;
        // One task covering the whole request, run in this thread.
        let (span, inner) = (taken.span, &self.inner);
        Ok(without_gil(py, move || {
            run_whole(inner, direction, span, file_offset)
        })?)
    }

    #[allow(clippy::too_many_arguments)]
    fn ordered(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        stream: usize,
        size: Option<i64>,
        offset: i64,
        dev_offset: i64,
        direction: Direction,
        method: &str,
        alternative: &str,
    ) -> PyResult<(StreamFuture, usize)> {
        self.inner.get().map_err(BindError::Engine)?;
        let taken = intake(buf, access(direction))?;
        taken.device_only(method, alternative)?;
        let taken = taken.select(dev_offset, size, "dev_offset")?;
        let Span::Device(span) = taken.span else {
            unreachable!("device memory was checked before select")
        };
        let offset = file_offset(offset)?;
        let inner = &self.inner;
        let keepalive = taken.keepalive;
        let future = without_gil(py, move || {
            submit_stream_ordered(
                inner,
                direction,
                span,
                offset,
                kvikpy_core::cuda::Stream::from_raw(stream),
                Some(keepalive),
            )
        })?;
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
        let flags = flags.to_owned();
        let inner = without_gil(py, move || kvikpy_core::FileHandle::open(path, &flags))?;
        Ok(Self { inner })
    }

    fn close(&self) {
        self.inner.close();
    }

    #[getter]
    fn closed(&self) -> bool {
        self.inner.is_closed()
    }

    #[getter]
    fn path(&self) -> std::path::PathBuf {
        self.inner.path().to_path_buf()
    }

    fn fileno(&self) -> BindResult<i32> {
        Ok(self.inner.get()?.buffered_fd())
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
        Ok(self.inner.get()?.size_for(what)?)
    }

    fn is_direct_io_supported(&self) -> BindResult<bool> {
        Ok(self.inner.get()?.direct_fd().is_some())
    }

    #[pyo3(signature = (buf, size=None, file_offset=0, task_size=None))]
    fn pread(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        size: Option<i64>,
        file_offset: i64,
        task_size: Option<i64>,
    ) -> PyResult<Future> {
        self.start(py, buf, size, file_offset, task_size, Direction::Read)
    }

    #[pyo3(signature = (buf, size=None, file_offset=0, task_size=None))]
    fn pwrite(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        size: Option<i64>,
        file_offset: i64,
        task_size: Option<i64>,
    ) -> PyResult<Future> {
        self.start(py, buf, size, file_offset, task_size, Direction::Write)
    }

    #[pyo3(signature = (buf, size=None, file_offset=0, task_size=None))]
    fn read(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        size: Option<i64>,
        file_offset: i64,
        task_size: Option<i64>,
    ) -> PyResult<usize> {
        self.blocking(py, buf, size, file_offset, task_size, Direction::Read)
    }

    #[pyo3(signature = (buf, size=None, file_offset=0, task_size=None))]
    fn write(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        size: Option<i64>,
        file_offset: i64,
        task_size: Option<i64>,
    ) -> PyResult<usize> {
        self.blocking(py, buf, size, file_offset, task_size, Direction::Write)
    }

    #[pyo3(signature = (buf, size=None, file_offset=0, dev_offset=0))]
    fn raw_read(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        size: Option<i64>,
        file_offset: i64,
        dev_offset: i64,
    ) -> PyResult<usize> {
        self.raw(
            py,
            buf,
            size,
            file_offset,
            dev_offset,
            Direction::Read,
            "raw_read",
            "read",
        )
    }

    #[pyo3(signature = (buf, size=None, file_offset=0, dev_offset=0))]
    fn raw_write(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        size: Option<i64>,
        file_offset: i64,
        dev_offset: i64,
    ) -> PyResult<usize> {
        self.raw(
            py,
            buf,
            size,
            file_offset,
            dev_offset,
            Direction::Write,
            "raw_write",
            "write",
        )
    }

    #[pyo3(signature = (buf, stream, size=None, file_offset=0, dev_offset=0))]
    #[allow(clippy::too_many_arguments)]
    fn raw_read_async(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        stream: usize,
        size: Option<i64>,
        file_offset: i64,
        dev_offset: i64,
    ) -> PyResult<StreamFuture> {
        let (future, ordinal) = self.ordered(
            py,
            buf,
            stream,
            size,
            file_offset,
            dev_offset,
            Direction::Read,
            "raw_read_async",
            "pread",
        )?;
        // A kvikpy.Buffer remembers where in `stream` its bytes land, for its consumers.
        if let Ok(buffer) = buf.cast::<Buffer>() {
            let storage = buffer.get().span().1;
            without_gil(py, move || mark_ready(&storage, ordinal, stream))?;
        }
        Ok(future)
    }

    #[pyo3(signature = (buf, stream, size=None, file_offset=0, dev_offset=0))]
    #[allow(clippy::too_many_arguments)]
    fn raw_write_async(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        stream: usize,
        size: Option<i64>,
        file_offset: i64,
        dev_offset: i64,
    ) -> PyResult<StreamFuture> {
        Ok(self
            .ordered(
                py,
                buf,
                stream,
                size,
                file_offset,
                dev_offset,
                Direction::Write,
                "raw_write_async",
                "pwrite",
            )?
            .0)
    }
}
