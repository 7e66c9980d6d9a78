//! The safetensors engine calls: `kvikpy.safetensors.read_header`'s (the engine reads and
//! checks the header of a local file or URL), the read plan's (reads merged, pieces
//! packed, staging windows; pure planning in `kvikpy_core::safetensors::plan`) and
//! `save_file`'s header (checked, laid out and rendered in
//! `kvikpy_core::safetensors::write`). This converts arguments and results between Python
//! values and the engine's.

use kvikpy_core::cancel::CancelToken;
use kvikpy_core::safetensors::plan::{self, Merged, Order, Piece, Read};
use kvikpy_core::safetensors::write::{write_header, Entry};
use kvikpy_core::safetensors::{read_header, Header};
use kvikpy_macros::boundary;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyTuple};

use crate::batch::field;
use crate::blocking::{interruptible_alone, without_gil};
use crate::errors::BindResult;
use crate::file::FileArg;

/// One tensor as Python takes it: `(name, dtype, shape, begin, end)`.
type TensorRow = (String, String, Vec<u64>, u64, u64);
/// A header as Python takes it: `(data_start, tensors, metadata pairs)`.
type Found = (u64, Vec<TensorRow>, Vec<(String, String)>);

/// The checked header of the safetensors file `file` (a local path or a URL, or a
/// `FileHandle` already open, whose reads then see the same file as the header):
/// `(data_start, tensors in header order, metadata pairs in header order)`. `name` is
/// the file as messages show it (a URL with its credentials hidden).
#[boundary]
#[pyfunction]
pub fn safetensors_header(py: Python<'_>, file: FileArg, name: String) -> BindResult<Found> {
    let settings = kvikpy_core::settings::current()?;
    let source = file.source(py)?;
    let remote = kvikpy_core::source::is_remote(source.path());
    let work = move || read_header(&*source, &name, &settings);
    // A remote file's requests may stall: wait for them interruptibly (Ctrl-C works).
    let header: Header = if remote {
        interruptible_alone(py, &CancelToken::new(), work)?
    } else {
        without_gil(py, work)?
    };
    let tensors = header
        .tensors
        .into_iter()
        .map(|t| (t.name, t.dtype, t.shape, t.begin, t.end))
        .collect();
    Ok((header.data_start, tensors, header.metadata))
}

/// The header of a new safetensors file holding `tensors`, each `(name, dtype, shape,
/// nbytes)`, with `metadata` pairs as its `__metadata__` (none when `None`):
/// `(header, offsets, total_bytes)`, the header's bytes (length, JSON, padding), each
/// tensor's offset in the data section in the order given, and the file's size.
/// `ValueError` for what the engine refuses (an unknown dtype, a byte count other than
/// the shape's, a name twice or `__metadata__`, a header past 100 MB).
#[boundary]
#[pyfunction]
#[pyo3(signature = (tensors, metadata = None))]
pub fn safetensors_new_header(
    py: Python<'_>,
    tensors: Vec<(String, String, Vec<u64>, u64)>,
    metadata: Option<Vec<(String, String)>>,
) -> BindResult<(Py<PyBytes>, Vec<u64>, u64)> {
    let entries: Vec<Entry> = tensors
        .into_iter()
        .map(|(name, dtype, shape, nbytes)| Entry {
            name,
            dtype,
            shape,
            nbytes,
        })
        .collect();
    // Up to 100 MB of JSON to render: without the GIL.
    let written = without_gil(py, move || write_header(&entries, metadata.as_deref()))?;
    let total = written.file_size();
    let header = PyBytes::new(py, &written.header).unbind();
    Ok((header, written.offsets, total))
}

/// One merged read as Python takes it: `(file, file_offset, length, dest, at, indices)`,
/// `indices` the input reads it covers, in merge order.
type RunRow = (usize, u64, u64, u64, u64, Vec<usize>);
/// One staging window as Python takes it: `(file, offset, length, alone, indices)`,
/// `indices` the input reads it holds, in file order.
type WindowRow = (usize, u64, u64, bool, Vec<usize>);

/// Item `i` of a plan's input: a tuple of `N` integers, each from 0 to 2**64 - 1, named
/// `names` in messages (`ValueError` for a number out of range or a tuple of another
/// size, `TypeError` for what is not a tuple of integers).
fn row<const N: usize>(obj: &Bound<'_, PyAny>, i: usize, names: [&str; N]) -> PyResult<[u64; N]> {
    let shape = || format!("({})", names.join(", "));
    let item = obj.cast::<PyTuple>().map_err(|_| {
        PyTypeError::new_err(format!(
            "item {i} must be a tuple {}, not {}",
            shape(),
            obj.get_type()
                .name()
                .map_or_else(|_| "?".into(), |n| n.to_string())
        ))
    })?;
    if item.len() != N {
        return Err(PyValueError::new_err(format!(
            "item {i} must be a tuple {}, got {} fields",
            shape(),
            item.len()
        )));
    }
    let mut out = [0u64; N];
    for (k, (slot, name)) in out.iter_mut().zip(names).enumerate() {
        *slot = field(item, i, k, name)?;
    }
    Ok(out)
}

/// A file index as the engine takes it.
fn file_index(i: usize, file: u64) -> PyResult<usize> {
    usize::try_from(file)
        .map_err(|_| PyValueError::new_err(format!("item {i}: file {file} is too large")))
}

/// `(file, file_offset, length)` items as the engine's pieces.
fn pieces(items: &[Bound<'_, PyAny>]) -> PyResult<Vec<Piece>> {
    items
        .iter()
        .enumerate()
        .map(|(i, obj)| {
            let [file, file_offset, length] = row(obj, i, ["file", "file_offset", "length"])?;
            Ok(Piece {
                file: file_index(i, file)?,
                file_offset,
                length,
            })
        })
        .collect()
}

/// Merged runs as Python takes them.
fn run_rows(merged: &Merged) -> Vec<RunRow> {
    merged
        .runs
        .iter()
        .enumerate()
        .map(|(k, run)| {
            let r = run.read;
            (
                r.file,
                r.file_offset,
                r.length,
                r.dest,
                r.at,
                merged.members(k).to_vec(),
            )
        })
        .collect()
}

/// The safetensors loaders' one merge of reads: each item is `(file, file_offset, length,
/// dest, at)`, `length` bytes of file index `file` at `file_offset` into destination key
/// `dest` at `at`. Taken as given, or sorted by file then offset when `sort` (stable),
/// each read that follows the one before it both in its file and in the same destination
/// is merged into it. Returns the runs as `(file, file_offset, length, dest, at,
/// indices)`, `indices` the items each covers. `ValueError` for an offset or place plus
/// length past 2**64. Pure planning, quick: the GIL stays held.
#[boundary]
#[pyfunction]
pub fn safetensors_merge(items: Vec<Bound<'_, PyAny>>, sort: bool) -> BindResult<Vec<RunRow>> {
    let reads = items
        .iter()
        .enumerate()
        .map(|(i, obj)| {
            let [file, file_offset, length, dest, at] =
                row(obj, i, ["file", "file_offset", "length", "dest", "at"])?;
            Ok(Read {
                file: file_index(i, file)?,
                file_offset,
                length,
                dest,
                at,
            })
        })
        .collect::<PyResult<Vec<Read>>>()?;
    let order = if sort { Order::ByFile } else { Order::Given };
    Ok(run_rows(&plan::merge(&reads, order)?))
}

/// Pieces `(file, file_offset, length)` laid end to end in one destination, each at the
/// next multiple of `align`: `(places, runs, total)`, each piece's place, the merged reads
/// that fill them (as [`safetensors_merge`] returns them, `dest` 0, `indices` the pieces
/// each covers; a piece of no bytes has no read) and the bytes in all. `ValueError` for
/// an `align` of 0 or a place, offset or total past 2**64. Pure planning: GIL held.
#[boundary]
#[pyfunction]
pub fn safetensors_pack(
    items: Vec<Bound<'_, PyAny>>,
    align: u64,
) -> BindResult<(Vec<u64>, Vec<RunRow>, u64)> {
    let packed = plan::pack(&pieces(&items)?, align)?;
    Ok((packed.places, run_rows(&packed.reads), packed.total))
}

/// The staging windows that read `items` (`(file, file_offset, length)` reads), in file
/// order (file, then offset, then length; stable): each covers consecutive reads of one
/// file, reading through gaps of fewer than `gap` bytes, and spans at most `bound` bytes;
/// a read longer than `bound` is a window alone. Returns `(file, offset, length, alone,
/// indices)` per window, `indices` the reads it holds in file order. `ValueError` for an
/// offset plus length past 2**64. Pure planning: GIL held.
#[boundary]
#[pyfunction]
pub fn safetensors_windows(
    items: Vec<Bound<'_, PyAny>>,
    bound: u64,
    gap: u64,
) -> BindResult<Vec<WindowRow>> {
    let planned = plan::windows(&pieces(&items)?, bound, gap)?;
    Ok(planned
        .windows
        .iter()
        .enumerate()
        .map(|(k, w)| {
            (
                w.file,
                w.offset,
                w.length,
                w.alone,
                planned.members(k).to_vec(),
            )
        })
        .collect())
}
