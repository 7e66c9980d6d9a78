//! Pickling host buffers: their bytes (out of band with protocol 5), dtype and shape, and
//! rebuilding them in new host memory; GPU buffers refuse.

use std::sync::Arc;

use kvikpy_core::allocation::Placement;
use pyo3::prelude::*;
use pyo3::types::PyTuple;

use super::{Buffer, Dtype};
use crate::blocking::without_gil;
use crate::errors::BindResult;

/// The body of `Buffer.__reduce_ex__` (see there).
pub(super) fn reduce<'py>(
    slf: &Bound<'py, Buffer>,
    protocol: i64,
) -> BindResult<(Bound<'py, PyAny>, Bound<'py, PyTuple>)> {
    let py = slf.py();
    let this = slf.get();
    if let Some(ordinal) = this.ordinal() {
        return Err(pyo3::exceptions::PyTypeError::new_err(format!(
            "a kvikpy.Buffer in the memory of GPU {ordinal} cannot be pickled (another \
             process cannot see this GPU allocation); pickle buf.to_numpy() (a host copy) \
             or send the file's path and read it where it is needed"
        ))
        .into());
    }
    let storage = Arc::clone(&this.storage);
    without_gil(py, move || storage.readiness().wait_on(None))?;
    let bytes = this.view_as(Dtype::bytes(), vec![this.nbytes as i64], 0, None)?;
    let payload = if protocol >= 5 {
        py.import("pickle")?
            .getattr("PickleBuffer")?
            .call1((Bound::new(py, bytes)?,))?
    } else {
        // SAFETY: host memory of `nbytes` bytes at `ptr`, kept alive by `this`.
        let data = unsafe { std::slice::from_raw_parts(this.ptr() as *const u8, this.nbytes) };
        pyo3::types::PyBytes::new(py, data).into_any()
    };
    let rebuild = py.get_type::<Buffer>().getattr("_from_pickle")?;
    let args = PyTuple::new(
        py,
        [
            payload,
            this.dtype.typestr().into_pyobject(py)?.into_any(),
            this.dtype.code().into_pyobject(py)?.into_any(),
            this.dtype.bits().into_pyobject(py)?.into_any(),
            PyTuple::new(py, &this.shape)?.into_any(),
        ],
    )?;
    Ok((rebuild, args))
}

/// The body of `Buffer._from_pickle`: `data`'s bytes in new host memory, as `shape`
/// items of `dtype`.
pub(super) fn rebuild(
    py: Python<'_>,
    data: &Bound<'_, PyAny>,
    dtype: Dtype,
    shape: Vec<i64>,
) -> BindResult<Buffer> {
    let source = pyo3::buffer::PyBuffer::<u8>::get(data)?;
    let nbytes = source.len_bytes();
    let buffer = Buffer::allocate_at(py, nbytes, Placement::Host, false)?;
    // SAFETY: fresh host memory of `nbytes` bytes owned by `buffer`, which nothing else
    // can see yet.
    let dst = unsafe { std::slice::from_raw_parts_mut(buffer.ptr() as *mut u8, nbytes) };
    source.copy_to_slice(py, dst)?;
    Ok(buffer.view_as(dtype, shape, 0, None)?)
}
