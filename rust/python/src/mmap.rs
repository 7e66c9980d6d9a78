//! `_lib.MmapHandle`: the private handle behind `kvikpy.Mmap`. Each read converts its
//! arguments, asks the engine which bytes kvikio's rules allow, checks that the
//! destination holds them, and submits one engine request.

use std::path::PathBuf;

use kvikpy_core::mmap_handle::{MmapHandle as Mapped, MmapOptions};
use kvikpy_core::{Completion, Direction};
use kvikpy_macros::boundary;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::blocking::without_gil;
use crate::calls::{io_pymethods, task_size_arg, Call, Submit, Submitted};
use crate::errors::{BindError, BindResult};
use crate::future::Future;
use crate::intake::{int_arg, intake, non_negative, opt_int_arg, Access};

/// A file region mapped read-only (the private handle behind `kvikpy.Mmap`).
#[pyclass(module = "kvikpy._lib", frozen)]
pub struct MmapHandle {
    inner: Mapped,
}

/// A read of `size` bytes (`None`: to the end of the file) at `offset` into `buf`; the
/// rows below make reads only, neither exact nor raw.
impl Submit for MmapHandle {
    fn submit(&self, py: Python<'_>, buf: &Bound<'_, PyAny>, call: &Call<'_>) -> Submitted {
        let (size, completion) = (call.size, call.completion);
        let offset = non_negative("offset", call.file_offset)?;
        let size = size.map(|s| non_negative("size", s)).transpose()?;
        let task_size = task_size_arg(call.task_size)?;
        let taken = intake(buf, Access::Fill)?;
        let count = self
            .inner
            .check_read(size, offset)
            .map_err(BindError::Engine)?;
        let room = taken.span.len();
        if count > room as u64 {
            let asked = match size {
                Some(_) => format!("size {count}"),
                None => format!("{count} bytes (from offset {offset} to the end of the file)"),
            };
            return Err(PyValueError::new_err(format!(
                "the read asks for {asked} but the buffer has {room} bytes; pass a size of \
                 at most {room} or a larger buffer"
            )));
        }
        let span = taken.span.sub(0, count as usize);
        let keepalive = Some(taken.keepalive);
        let inner = &self.inner;
        let future = without_gil(py, move || {
            let settings = kvikpy_core::settings::current()?;
            inner.submit(&settings, span, offset, task_size, keepalive, completion)
        })?;
        Ok((future, span))
    }
}

// The methods written out, then the reads, one a row.
io_pymethods! {
impl MmapHandle {
    #[new]
    #[pyo3(signature = (path, flags="r", initial_map_size=None, initial_map_offset=0, mode=0o644, map_flags=None))]
    fn new(
        py: Python<'_>,
        path: PathBuf,
        flags: &str,
        #[pyo3(from_py_with = opt_int_arg)] initial_map_size: Option<i64>,
        #[pyo3(from_py_with = int_arg)] initial_map_offset: i64,
        mode: i64,
        map_flags: Option<i64>,
    ) -> BindResult<Self> {
        if !(0..=0o7777).contains(&mode) {
            return Err(PyValueError::new_err(format!(
                "mode must be permission bits between 0 and 0o7777, got {mode:#o}"
            ))
            .into());
        }
        let options = MmapOptions {
            initial_map_size: initial_map_size
                .map(|s| non_negative("initial_map_size", s))
                .transpose()?,
            initial_map_offset: non_negative("initial_map_offset", initial_map_offset)?,
            map_flags,
        };
        let flags = flags.to_owned();
        let inner = without_gil(py, move || Mapped::open(path, &flags, options))?;
        Ok(Self { inner })
    }

    fn initial_map_size(&self) -> u64 {
        self.inner.initial_map_size()
    }

    fn initial_map_offset(&self) -> u64 {
        self.inner.initial_map_offset()
    }

    fn file_size(&self) -> BindResult<u64> {
        Ok(self.inner.file_size()?)
    }

    fn close(&self) {
        self.inner.close();
    }

    fn closed(&self) -> bool {
        self.inner.is_closed()
    }

    /// The path, as text (for `repr`).
    #[getter]
    fn path(&self) -> String {
        self.inner.path().to_string_lossy().into_owned()
    }
}
    // kvikio's range rules, then split over the pool like a file's reads.
    tuned(offset) {
        pread -> Future = Call::new(Direction::Read, Completion::Future);
    }
    untuned(offset) {
        read -> usize = Call::new(Direction::Read, Completion::Blocking);
    }
}
