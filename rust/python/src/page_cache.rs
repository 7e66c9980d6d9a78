//! kvikio's page-cache utilities for Python: how much of a file is cached, dropping a
//! file's cached pages, dropping the system's page cache.

use std::path::PathBuf;

use kvikpy_core::page_cache::{self, FileRef};
use kvikpy_core::Error;
use kvikpy_macros::boundary;
use pyo3::prelude::*;

use crate::blocking::{without_gil, without_gil_value};
use crate::errors::BindResult;
use crate::intake::int_arg;

/// A file as the Python layer passes it: a descriptor or a path.
#[derive(FromPyObject)]
pub enum FileArg {
    /// An open descriptor (`int`; `kvikpy` passes a file object's `fileno()`).
    Fd(i32),
    /// A path (`str`, `bytes` or `os.PathLike`).
    Path(PathBuf),
}

impl FileArg {
    fn as_ref(&self) -> FileRef<'_> {
        match self {
            Self::Fd(fd) => FileRef::Fd(*fd),
            Self::Path(p) => FileRef::Path(p),
        }
    }
}

/// `value` as a `u64` byte count, or the error kvikio's `size_t` conversion gives it.
fn non_negative(what: &str, value: i64) -> Result<u64, Error> {
    u64::try_from(value).map_err(|_| Error::Negative {
        what: what.to_string(),
        value: value.to_string(),
        expected: "a non-negative number of bytes (0 for the end of the file)",
    })
}

/// `(resident pages, total pages)` of `length` bytes of `file` from `offset`.
#[boundary]
#[pyfunction]
pub fn page_cache_info(
    py: Python<'_>,
    file: FileArg,
    #[pyo3(from_py_with = int_arg)] offset: i64,
    #[pyo3(from_py_with = int_arg)] length: i64,
) -> BindResult<(u64, u64)> {
    let offset = non_negative("offset", offset)?;
    let length = non_negative("length", length)?;
    without_gil(py, || page_cache::residency(file.as_ref(), offset, length))
}

/// Evict `length` bytes of `file` from `offset` from the page cache.
#[boundary]
#[pyfunction]
pub fn drop_file_page_cache(
    py: Python<'_>,
    file: FileArg,
    #[pyo3(from_py_with = int_arg)] offset: i64,
    #[pyo3(from_py_with = int_arg)] length: i64,
    sync_first: bool,
) -> BindResult<()> {
    let offset = non_negative("offset", offset)?;
    let length = non_negative("length", length)?;
    without_gil(py, || {
        page_cache::drop_file(file.as_ref(), offset, length, sync_first)
    })
}

/// Drop the system's page cache where permitted; whether it was dropped.
#[boundary]
#[pyfunction]
pub fn drop_system_page_cache(
    py: Python<'_>,
    reclaim_dentries_and_inodes: bool,
    sync_first: bool,
) -> BindResult<bool> {
    without_gil_value(py, move || {
        page_cache::drop_system(reclaim_dentries_and_inodes, sync_first)
    })
}

/// `(bytes read by O_DIRECT, residency probes)` since the process started: tells which
/// path reads took (tests, diagnostics).
#[boundary]
#[pyfunction]
pub fn read_path_counters() -> (u64, u64) {
    (
        kvikpy_core::source::direct_read_bytes(),
        kvikpy_core::source::residency_probes(),
    )
}
