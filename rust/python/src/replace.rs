//! `_lib.Replacement`: the engine's whole-or-nothing file replacement for the writers of
//! the Python layer (`kvikpy.write`, `write_ipc` through pyarrow).

use std::path::PathBuf;
use std::sync::Mutex;

use kvikpy_core::replace::{Replacement as Inner, Start};
use kvikpy_core::Error;
use kvikpy_macros::boundary;
use pyo3::prelude::*;

use crate::blocking::without_gil;
use crate::errors::BindResult;

/// A new version of a file written under a temporary name beside it: `commit` renames it
/// over the target; `abort` (or losing the object) removes it.
#[pyclass(module = "kvikpy._lib", frozen)]
pub struct Replacement {
    inner: Mutex<Option<Inner>>,
    temp: PathBuf,
}

fn finished() -> Error {
    Error::InvalidArgument("this replacement was already committed or aborted".into())
}

#[boundary]
#[pymethods]
impl Replacement {
    /// A temporary file beside `target`: empty, or with `keep` a copy of the target's bytes.
    #[new]
    fn new(py: Python<'_>, target: PathBuf, keep: bool) -> BindResult<Self> {
        let start = if keep { Start::Copy } else { Start::Empty };
        let inner = without_gil(py, move || Inner::new(&target, start))?;
        let temp = inner.path().to_path_buf();
        Ok(Self {
            inner: Mutex::new(Some(inner)),
            temp,
        })
    }

    /// The temporary file to write.
    #[getter]
    fn path(&self) -> PathBuf {
        self.temp.clone()
    }

    /// `fsync` of the written file (see `commit`): a writer of several files syncs them
    /// all before the first is renamed into place.
    fn sync(&self, py: Python<'_>) -> BindResult<()> {
        let guard = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        let inner = guard.as_ref().ok_or_else(finished)?;
        // The lock is held: `commit` and `abort` wait for the sync to finish.
        without_gil(py, || inner.sync())
    }

    /// Rename the written file over the target (synced first with `sync`).
    fn commit(&self, py: Python<'_>, sync: bool) -> BindResult<()> {
        let inner = self
            .inner
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .ok_or_else(finished)?;
        without_gil(py, move || inner.commit(sync))
    }

    /// Remove the temporary file; the target stays as it was.
    fn abort(&self) {
        drop(self.inner.lock().unwrap_or_else(|e| e.into_inner()).take());
    }
}

/// `fsync` of directory `path`: the renames into it and removals from it reach the disk.
#[boundary]
#[pyfunction]
pub fn sync_directory(py: Python<'_>, path: PathBuf) -> BindResult<()> {
    without_gil(py, move || kvikpy_core::replace::sync_directory(&path))
}
