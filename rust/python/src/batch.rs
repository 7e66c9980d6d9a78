//! `read_many` and `read_ranges`: many files or byte ranges into one new allocation, with
//! the element boundaries and each element's error; and `read_scattered`: many byte
//! ranges of files, each into memory the caller owns, as one batch request.

use kvikpy_macros::boundary;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use kvikpy_core::allocation::Placement;
use kvikpy_core::batch_plan::{plan_file_ranges, plan_files, plan_ranges, Plan, Start};
use kvikpy_core::request::{submit_batch, BatchRequest, Item, ItemSource};
use kvikpy_core::{DeviceSpan, Error, HostSpan, Settings, Span};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyInt, PyTuple};

use kvikpy_core::cancel::CancelToken;

use crate::blocking::interruptible;
use crate::buffer::Buffer;
use crate::errors::{BindError, BindResult};
use crate::file::FileArg;

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
    /// Cancels the batch from another thread (the caller drawing the bar was interrupted).
    cancel: CancelToken,
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
            cancel: CancelToken::new(),
        }
    }

    /// Stop the batch following this counter: pieces not yet read are skipped and remote
    /// requests stop waiting; the call then raises (its caller was interrupted).
    fn cancel(&self) {
        self.cancel.cancel();
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

/// Read `paths` into one allocation (on GPU `ordinal`, or the host when it is `None`). With
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
    let token = token_of(progress);
    let planned = settings.clone();
    let plan = interruptible(py, &token, move || plan_files(&planned, paths, skip))?;
    read(py, &settings, plan, ordinal, progress)
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
    let token = token_of(progress);
    let planned = settings.clone();
    let plan = interruptible(py, &token, move || plan_ranges(&planned, &path, &ranges))?;
    read(py, &settings, plan, ordinal, progress)
}

/// What the zarr store's batch read returns: the allocation, each element's start (and
/// the total), each element's length, and the failed elements as `(index, exception)`.
type RangesResult = (Buffer, Vec<i64>, Vec<i64>, Vec<(usize, PyErr)>);

/// Read a byte range of each of many files into one allocation, each element starting at
/// a multiple of `align` bytes (kvikpy.zarr's store). Each range is `(path, start,
/// from_end, size)`: `start` bytes from the file's start, or with `from_end` the last
/// `start` bytes; `size` `None` for the rest of the file. Ranges are cut at the file's
/// end. With `skip`, files that cannot be read are listed; otherwise the first raises.
#[boundary]
#[pyfunction]
#[pyo3(signature = (ranges, ordinal, skip, align))]
pub fn read_file_ranges_batch(
    py: Python<'_>,
    ranges: Vec<(PathBuf, u64, bool, Option<u64>)>,
    ordinal: Option<usize>,
    skip: bool,
    align: usize,
) -> PyResult<RangesResult> {
    let settings = kvikpy_core::settings::current().map_err(to_py)?;
    let ranges = ranges
        .into_iter()
        .map(|(path, start, from_end, size)| {
            let start = if from_end {
                Start::Suffix(start)
            } else {
                Start::Offset(start)
            };
            (path, start, size)
        })
        .collect();
    let planned = settings.clone();
    let plan = interruptible(py, &CancelToken::new(), move || {
        plan_file_ranges(&planned, ranges, skip, align)
    })?;
    let (buffer, offsets, lengths, failures) = read_plan(py, &settings, plan, ordinal, None)?;
    let lengths = lengths.iter().map(|&n| n as i64).collect();
    Ok((buffer, offsets, lengths, failures))
}

/// The token a batch watches: its progress counter's, which the caller can cancel from
/// another thread, or a new one.
fn token_of(progress: Option<&Progress>) -> CancelToken {
    progress.map_or_else(CancelToken::new, |p| p.cancel.clone())
}

/// Allocate the plan's destination and read it; convert the outcome.
fn read(
    py: Python<'_>,
    settings: &Settings,
    plan: Plan,
    ordinal: Option<usize>,
    progress: Option<&Progress>,
) -> PyResult<BatchResult> {
    let (buffer, offsets, _, failures) = read_plan(py, settings, plan, ordinal, progress)?;
    Ok((buffer, offsets, failures))
}

/// Allocate the plan's destination and read it: the buffer, the element starts (and the
/// total), the element lengths and the failures.
#[allow(clippy::type_complexity)]
fn read_plan(
    py: Python<'_>,
    settings: &Settings,
    plan: Plan,
    ordinal: Option<usize>,
    progress: Option<&Progress>,
) -> PyResult<(Buffer, Vec<i64>, Vec<usize>, Vec<(usize, PyErr)>)> {
    let total = plan.total();
    if let Some(p) = progress {
        p.total.store(total as u64, Ordering::Relaxed);
    }
    let placement = ordinal.map_or(Placement::Host, Placement::Device);
    let buffer = Buffer::allocate_at(py, total, placement, false)?;
    let (span, owner) = buffer.span();
    let counter = progress.map(|p| Arc::clone(&p.bytes));
    let settings = settings.clone();
    // On an error `buffer` is dropped: nothing half-allocated stays. Interrupted (Ctrl-C),
    // the call raises at once and the read, cancelled, keeps the memory until it stops.
    let outcome = interruptible(py, &token_of(progress), move || {
        let _memory = owner;
        plan.read(&settings, span, counter.as_deref())
    })?;
    let offsets = outcome.offsets.iter().map(|&o| o as i64).collect();
    let failures = outcome
        .failures
        .into_iter()
        .map(|(i, e)| (i, to_py(e)))
        .collect();
    Ok((buffer, offsets, outcome.lengths, failures))
}

/// One scattered read as the caller gave it: file index, file offset, length, address,
/// device (`None` for host memory).
type Scattered = (usize, u64, usize, u64, Option<usize>);

/// Field `k` of item `i`, a non-negative integer (not a bool) below 2**64.
pub(crate) fn field(item: &Bound<'_, PyTuple>, i: usize, k: usize, name: &str) -> PyResult<u64> {
    let value = item.get_item(k)?;
    if value.is_instance_of::<PyBool>() || !value.is_instance_of::<PyInt>() {
        return Err(PyTypeError::new_err(format!(
            "item {i}: {name} must be an integer, not {}",
            value.get_type().name()?
        )));
    }
    value.extract::<u64>().map_err(|_| {
        PyValueError::new_err(format!(
            "item {i}: {name} must be a non-negative integer below 2**64, got {value}"
        ))
    })
}

/// Item `i` checked: a 5-tuple of integers (the device may be `None`) whose file index is
/// below `files`, whose address range fits in 64 bits and whose address is not null.
fn scattered_item(obj: &Bound<'_, PyAny>, i: usize, files: usize) -> PyResult<Scattered> {
    let item = obj.cast::<PyTuple>().map_err(|_| {
        PyTypeError::new_err(format!(
            "item {i} must be a tuple (file, offset, length, address, device), not {}",
            obj.get_type()
                .name()
                .map_or_else(|_| "?".into(), |n| n.to_string())
        ))
    })?;
    if item.len() != 5 {
        return Err(PyValueError::new_err(format!(
            "item {i} must be a tuple (file, offset, length, address, device), got {} fields",
            item.len()
        )));
    }
    let file = field(item, i, 0, "file")?;
    let offset = field(item, i, 1, "offset")?;
    let length = field(item, i, 2, "length")?;
    let address = field(item, i, 3, "address")?;
    let device = if item.get_item(4)?.is_none() {
        None
    } else {
        Some(field(item, i, 4, "device")?)
    };
    let file = usize::try_from(file)
        .ok()
        .filter(|&f| f < files)
        .ok_or_else(|| {
            PyValueError::new_err(format!(
                "item {i} reads file {file}, but only {files} file(s) were given"
            ))
        })?;
    let length = usize::try_from(length)
        .map_err(|_| PyValueError::new_err(format!("item {i}: length {length} is too large")))?;
    if offset
        .checked_add(length as u64)
        .is_none_or(|end| end > i64::MAX as u64)
    {
        return Err(PyValueError::new_err(format!(
            "item {i}: offset {offset} + length {length} is past the largest file offset"
        )));
    }
    if address.checked_add(length as u64).is_none() {
        return Err(PyValueError::new_err(format!(
            "item {i}: address {address:#x} + length {length} overflows 64 bits"
        )));
    }
    if address == 0 && length > 0 {
        return Err(PyValueError::new_err(format!(
            "item {i}: address 0 (a null pointer) cannot receive {length} bytes"
        )));
    }
    let device = device
        .map(|d| {
            usize::try_from(d)
                .map_err(|_| PyValueError::new_err(format!("item {i}: device {d} is too large")))
        })
        .transpose()?;
    Ok((file, offset, length, address, device))
}

/// Read many byte ranges of `paths` straight into memory the caller owns, as one batch
/// request (the I/O pool reads them all at once; GPU memory through pinned bounce
/// buffers). `paths` are paths to open or `FileHandle`s already open. Each item is
/// `(file, offset, length, address, device)`: `length` bytes of `paths[file]` at `offset` to `address`, in host memory (`device` `None`) or in the
/// memory of CUDA device `device`. The memory must stay valid until the call returns:
/// `keepalive` (the objects owning it) is held until the last read has stopped, even
/// when the call is interrupted. Every item is attempted; returns the failed ones as
/// `(index, exception)`, in item order. A file that cannot be opened raises, and nothing
/// is read.
#[boundary]
#[pyfunction]
#[pyo3(signature = (paths, items, keepalive, progress=None))]
pub fn read_scattered(
    py: Python<'_>,
    paths: Vec<FileArg>,
    items: Vec<Bound<'_, PyAny>>,
    keepalive: Py<PyAny>,
    progress: Option<&Progress>,
) -> PyResult<Vec<(usize, PyErr)>> {
    let checked = items
        .iter()
        .enumerate()
        .map(|(i, obj)| scattered_item(obj, i, paths.len()))
        .collect::<PyResult<Vec<Scattered>>>()?;
    if let Some(device) = checked.iter().filter_map(|item| item.4).max() {
        let count = crate::blocking::without_gil_value(py, kvikpy_core::cuda::device_count)?;
        if device >= count {
            return Err(PyValueError::new_err(format!(
                "an item names CUDA device {device}, but this machine has {count} CUDA \
                 device(s)"
            )));
        }
    }
    let settings = kvikpy_core::settings::current().map_err(to_py)?;
    let total = checked
        .iter()
        .try_fold(0u64, |sum, item| sum.checked_add(item.2 as u64))
        .ok_or_else(|| PyValueError::new_err("the items' lengths add up past 2**64 bytes"))?;
    if let Some(p) = progress {
        p.total.store(total, Ordering::Relaxed);
    }
    let counter = progress.map(|p| Arc::clone(&p.bytes));
    let items = checked
        .into_iter()
        .map(|(source, file_offset, len, address, device)| {
            let dest = match device {
                Some(ordinal) => Span::Device(DeviceSpan {
                    ptr: address,
                    len,
                    ordinal,
                }),
                // SAFETY: the caller promises (see the docstring) that `address..+len` is
                // writable host memory owned by `keepalive`, which the closure below holds
                // until every read has stopped; no other code writes it meanwhile.
                None => Span::Host(unsafe { HostSpan::new(address as *mut u8, len) }),
            };
            Item {
                source,
                file_offset,
                dest,
            }
        })
        .collect();
    let sources = paths
        .iter()
        .map(|file| Ok(ItemSource::Open(file.source(py)?)))
        .collect::<BindResult<Vec<_>>>()?;
    let errors = interruptible(py, &token_of(progress), move || {
        let _memory = keepalive;
        let request = BatchRequest {
            sources,
            items,
            fail_fast: false,
            gaps_writable: false,
        };
        submit_batch(&settings, request, counter.as_deref())
    })?;
    Ok(errors
        .into_iter()
        .enumerate()
        .filter_map(|(i, e)| e.map(|e| (i, to_py(e))))
        .collect())
}
