//! `kvikpy.read` in one call: open the file, size the range (files with no size too),
//! allocate, read, and view the bytes as the items asked for.

use std::path::PathBuf;

use kvikpy_core::allocation::{Allocation, Placement};
use kvikpy_core::cuda::Stream;
use kvikpy_core::extent::{ended_early, extent, fit_shape, Extent, Want};
use kvikpy_core::{Completion, Direction, Error, Request, Span};
use kvikpy_macros::boundary;
use pyo3::prelude::*;

use crate::blocking::without_gil;
use crate::buffer::{mark_ready, Buffer, Dtype};
use crate::calls::finish;
use crate::errors::BindError;
use crate::file::open;
use crate::future::Future;

/// Read `size` bytes at `offset` of `path` (to the end for `None`) into new memory on GPU
/// `device` (host memory for `None`), viewed as `shape` items of the dtype `(typestr,
/// DLPack code, bits, name for messages)` (one dimension for `None`, one `-1` inferred).
///
/// `stream`: queue the read in that CUDA stream's order and return at once. `wait=False`:
/// return at once with the read's future (for a progress bar). Otherwise the call returns
/// when the bytes have landed. `shown`: the path as messages show it (a URL with its
/// credentials hidden); the path itself by default.
#[boundary]
#[pyfunction]
#[pyo3(signature = (path, offset, size, device, dtype, shape, stream=None, wait=true, shown=None))]
#[allow(clippy::too_many_arguments)]
pub fn read_file(
    py: Python<'_>,
    path: PathBuf,
    offset: u64,
    size: Option<u64>,
    device: Option<usize>,
    dtype: (String, u8, u8, String),
    shape: Option<Vec<i64>>,
    stream: Option<usize>,
    wait: bool,
    shown: Option<String>,
) -> PyResult<(Buffer, Option<Future>)> {
    let name = shown.unwrap_or_else(|| path.to_string_lossy().into_owned());
    let name = name.as_str();
    let (typestr, code, bits, item) = dtype;
    let dtype = Dtype::parse(typestr, code, bits)?;
    let handle = open(py, path, "r")?;
    let settings = kvikpy_core::settings::current().map_err(BindError::Engine)?;
    let want = Want {
        offset,
        size,
        strict: true,
        device: device.is_some(),
    };
    // Sizing, allocation and submission in one release of the GIL.
    let placement = Placement::from_ordinal(device);
    let (bytes, dims, future, completion) = {
        let (handle, settings, item) = (&handle, &settings, &item);
        let itemsize = dtype.itemsize();
        without_gil(py, move || {
            let found = extent(&*handle.get()?, want, name, settings)?;
            let nbytes = found.size();
            let dims = fit_shape(shape.as_deref(), nbytes, itemsize, item)?;
            let len = usize::try_from(nbytes).map_err(|_| {
                Error::InvalidArgument(format!(
                    "{nbytes} bytes do not fit in this machine's memory"
                ))
            })?;
            let bytes = Buffer::from_allocation(Allocation::new(placement, len, false)?);
            let (span, storage) = bytes.span();
            let sized = match found {
                Extent::Content(content) => {
                    let Span::Host(host) = span else {
                        unreachable!("a pseudo-file is read whole into host memory only")
                    };
                    host.copy_from(&content);
                    return Ok((bytes, dims, None, Completion::Blocking));
                }
                Extent::Open(_) => false,
                Extent::Sized(_) => true,
            };
            // A file with no size is read at once, to check that it did not end early.
            let completion = match (stream, device) {
                (Some(stream), Some(_)) if sized => {
                    Completion::StreamOrdered(Stream::from_raw(stream))
                }
                _ if sized && !wait => Completion::Future,
                _ => Completion::Blocking,
            };
            // A sized read that comes up short: the file shrank since it was sized.
            let exact = sized && !matches!(completion, Completion::StreamOrdered(_));
            let request = Request {
                direction: Direction::Read,
                span,
                file_offset: offset,
                task_size: None,
                exact,
                keepalive: Some(Box::new(storage.clone())),
            };
            let future = kvikpy_core::submit(settings, handle, request, completion)?;
            if let (Completion::StreamOrdered(_), Some(ordinal), Some(stream)) =
                (completion, device, stream)
            {
                // A kvikpy.Buffer remembers where in `stream` its bytes land.
                mark_ready(&storage, ordinal, stream)?;
            }
            Ok((bytes, dims, Some(future), completion))
        })?
    };
    let nbytes = bytes.span().0.len() as u64;
    let buffer = bytes.view_as(dtype, dims, 0, None)?;
    match (future, completion) {
        (None, _) | (Some(_), Completion::StreamOrdered(_)) => Ok((buffer, None)),
        (Some(future), Completion::Future) => Ok((buffer, Some(Future::from(future)))),
        (Some(future), _) => {
            let got = finish(py, future)? as u64;
            if got < nbytes {
                return Err(BindError::Engine(ended_early(name, offset, nbytes, got)).into());
            }
            Ok((buffer, None))
        }
    }
}
