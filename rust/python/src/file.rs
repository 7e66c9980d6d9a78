//! `_lib.FileHandle`: an open file and its read/write entry points.

use kvikpy_core::io::{submit, Direction, Waiting};
use pyo3::prelude::*;

use crate::blocking::without_gil;
use crate::buffer::{file_offset, intake, Access};
use crate::errors::BindResult;
use crate::future::Future;

/// An open file (the private handle behind `kvikpy.CuFile`).
#[pyclass(module = "kvikpy._lib", frozen)]
pub struct FileHandle {
    inner: kvikpy_core::FileHandle,
}

impl FileHandle {
    #[allow(clippy::too_many_arguments)]
    fn start(
        &self,
        py: Python<'_>,
        buf: &Bound<'_, PyAny>,
        size: Option<i64>,
        offset: i64,
        task_size: Option<i64>,
        direction: Direction,
        waiting: Waiting,
    ) -> PyResult<kvikpy_core::IoFuture> {
        let access = match direction {
            Direction::Read => Access::Fill,
            Direction::Write => Access::Drain,
        };
        let buffer = intake(buf, size, access)?;
        let offset = file_offset(offset)?;
        let task_size = match task_size {
            Some(t) if t <= 0 => {
                return Err(pyo3::exceptions::PyValueError::new_err(format!(
                    "task_size must be a positive number of bytes, got {t}"
                )))
            }
            t => t.map(|t| t as usize),
        };
        let span = buffer.span;
        let keepalive: Box<dyn std::any::Any + Send> = Box::new(buffer.export);
        let inner = &self.inner;
        Ok(without_gil(py, move || {
            submit(
                inner,
                direction,
                span,
                offset,
                task_size,
                waiting,
                Some(keepalive),
            )
        })?)
    }
}

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
        let f = self.start(
            py,
            buf,
            size,
            file_offset,
            task_size,
            Direction::Read,
            Waiting::Async,
        )?;
        Ok(Future::from(f))
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
        let f = self.start(
            py,
            buf,
            size,
            file_offset,
            task_size,
            Direction::Write,
            Waiting::Async,
        )?;
        Ok(Future::from(f))
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
        let f = self.start(
            py,
            buf,
            size,
            file_offset,
            task_size,
            Direction::Read,
            Waiting::Blocking,
        )?;
        Future::from(f).get(py)
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
        let f = self.start(
            py,
            buf,
            size,
            file_offset,
            task_size,
            Direction::Write,
            Waiting::Blocking,
        )?;
        Future::from(f).get(py)
    }
}
