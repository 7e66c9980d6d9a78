//! `kvikpy.safetensors.read_header`'s binding: the engine reads and checks the header of
//! a local file or URL; this converts what it found to Python values.

use kvikpy_core::cancel::CancelToken;
use kvikpy_core::safetensors::{read_header, Header};
use kvikpy_macros::boundary;
use pyo3::prelude::*;

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
