//! `read_many` and `read_ranges`: many files or byte ranges into one new allocation, with
//! the element boundaries and each element's error.

use kvikpy_macros::boundary;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use kvikpy_core::batch::{file_sizes, layout, read_elements, Element, Source};
use kvikpy_core::{Error, FileHandle, Settings};
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use crate::blocking::without_gil;
use crate::errors::BindError;
use crate::memory::Buffer;

/// What a batch read returns: the allocation, the element boundaries (`len + 1` offsets)
/// and the failed elements as `(index, exception)`.
type BatchResult = (Buffer, Vec<i64>, Vec<(usize, PyErr)>);

fn to_py(e: Error) -> PyErr {
    BindError::Engine(e).into()
}

/// A byte counter a batch read advances as its pieces finish, which another Python thread
/// reads to draw a progress bar, and the batch's total once its sizes are known.
#[pyclass(module = "kvikpy._lib", frozen)]
pub struct Progress {
    bytes: Arc<AtomicU64>,
    /// `UNKNOWN` until the batch has laid out its elements.
    total: AtomicU64,
}

const UNKNOWN: u64 = u64::MAX;

#[boundary]
#[pymethods]
impl Progress {
    #[new]
    fn new() -> Self {
        Self {
            bytes: Arc::new(AtomicU64::new(0)),
            total: AtomicU64::new(UNKNOWN),
        }
    }

    /// The bytes the batch will read, once known (its files' sizes are looked up first).
    #[getter]
    fn total(&self) -> Option<u64> {
        Some(self.total.load(Ordering::Relaxed)).filter(|&t| t != UNKNOWN)
    }

    /// Bytes done so far.
    #[getter]
    fn bytes(&self) -> u64 {
        self.bytes.load(Ordering::Relaxed)
    }
}

/// Read `paths` into one allocation (on GPU `ordinal`, or the host when it is None). With
/// `skip`, failed files become empty elements listed in the result; otherwise the first
/// failure (in `paths` order) raises and nothing is returned.
#[boundary]
#[pyfunction]
#[pyo3(signature = (paths, ordinal, skip, progress=None))]
pub fn read_files_batch(
    py: Python<'_>,
    paths: Vec<PathBuf>,
    ordinal: Option<usize>,
    skip: bool,
    progress: Option<&Progress>,
) -> PyResult<BatchResult> {
    let settings = kvikpy_core::settings::current().map_err(to_py)?;
    let sizes = without_gil(py, || file_sizes(&settings, &paths))?;
    let mut failures: Vec<(usize, PyErr)> = Vec::new();
    let mut elements = Vec::with_capacity(paths.len());
    for (i, (path, size)) in paths.into_iter().zip(sizes).enumerate() {
        let size = size.and_then(|s| {
            usize::try_from(s)
                .map_err(|_| Error::InvalidArgument(format!("'{}' is too large", path.display())))
        });
        match size {
            Ok(len) => elements.push((true, Source::File(path), len)),
            Err(e) if skip => {
                failures.push((i, to_py(e)));
                elements.push((false, Source::File(path), 0)); // an empty element
            }
            Err(e) => return Err(to_py(e)),
        }
    }
    run(
        py, settings, elements, None, ordinal, skip, failures, progress,
    )
}

/// Read `ranges` (`(offset, size)` pairs) of the file at `path` into one allocation. Every
/// range must lie inside the file; a range that does not raises `ValueError` naming it.
#[boundary]
#[pyfunction]
#[pyo3(signature = (path, ranges, ordinal, progress=None))]
pub fn read_ranges_batch(
    py: Python<'_>,
    path: PathBuf,
    ranges: Vec<(u64, u64)>,
    ordinal: Option<usize>,
    progress: Option<&Progress>,
) -> PyResult<BatchResult> {
    let settings = kvikpy_core::settings::current().map_err(to_py)?;
    let (handle, file_size) = without_gil(py, || {
        let handle = FileHandle::open(&path, "r")?;
        let size = handle.get()?.size_for("read_ranges")?;
        Ok((handle, size))
    })?;
    let mut elements = Vec::with_capacity(ranges.len());
    for (i, &(offset, size)) in ranges.iter().enumerate() {
        let end = offset.checked_add(size);
        if end.is_none_or(|end| end > file_size) {
            return Err(PyValueError::new_err(format!(
                "range {i} (offset {offset}, size {size}) ends past the end of '{}', which \
                 has {file_size} bytes; every range must lie inside the file",
                path.display()
            )));
        }
        let len = usize::try_from(size)
            .map_err(|_| PyValueError::new_err(format!("range {i} is too large")))?;
        elements.push((true, Source::Range(offset), len));
    }
    run(
        py,
        settings,
        elements,
        Some(handle),
        ordinal,
        false,
        Vec::new(),
        progress,
    )
}

#[allow(clippy::too_many_arguments)]
fn run(
    py: Python<'_>,
    settings: Settings,
    sources: Vec<(bool, Source, usize)>,
    shared: Option<FileHandle>,
    ordinal: Option<usize>,
    skip: bool,
    mut failures: Vec<(usize, PyErr)>,
    progress: Option<&Progress>,
) -> PyResult<BatchResult> {
    let lengths: Vec<usize> = sources.iter().map(|(_, _, len)| *len).collect();
    let (starts, total) = layout(&lengths).map_err(to_py)?;
    if let Some(p) = progress {
        p.total.store(total as u64, Ordering::Relaxed);
    }
    let buffer = Buffer::allocate(py, total, ordinal, false)?;
    let (span, _owner) = buffer.span();
    // Elements that already failed (their size could not be read) are not read again.
    let (indices, elements): (Vec<usize>, Vec<Element>) = sources
        .into_iter()
        .zip(&starts)
        .enumerate()
        .filter(|(_, ((ok, _, _), _))| *ok)
        .map(|(i, ((_, source, len), &dst))| (i, Element { source, len, dst }))
        .unzip();
    let counter = progress.map(|p| Arc::clone(&p.bytes));
    let errors = without_gil(py, move || {
        read_elements(
            &settings,
            shared.as_ref(),
            &elements,
            span,
            counter.as_deref(),
        )
    })?;
    for (i, e) in indices.into_iter().zip(errors) {
        if let Some(e) = e {
            if !skip {
                return Err(to_py(e)); // `buffer` is dropped: nothing half-allocated stays
            }
            failures.push((i, to_py(e)));
        }
    }
    failures.sort_by_key(|(i, _)| *i);
    let mut offsets: Vec<i64> = starts.iter().map(|&s| s as i64).collect();
    offsets.push(total as i64);
    Ok((buffer, offsets, failures))
}
