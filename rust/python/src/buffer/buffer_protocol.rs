//! The buffer protocol of host buffers (`memoryview(buf)`, `numpy.asarray(buf)`): filling
//! and releasing the `Py_buffer` Python asks for.

use std::ffi::{c_int, c_void, CString};
use std::sync::Arc;

use pyo3::exceptions::PyBufferError;
use pyo3::prelude::*;

use super::Buffer;
use crate::blocking::without_gil;

/// Arrays a Py_buffer points into, owned by the view until released.
struct BufferExtras {
    format: CString,
    shape: Box<[isize]>,
    strides: Box<[isize]>,
}

/// The body of `Buffer.__getbuffer__`: fill `view` for a host buffer, after its bytes
/// have landed; `BufferError` for GPU buffers.
///
/// # Safety
/// `view` is null or the `Py_buffer` Python passed to fill, which nothing else touches
/// during this call.
pub(super) unsafe fn get_buffer(
    slf: Bound<'_, Buffer>,
    view: *mut pyo3::ffi::Py_buffer,
    flags: c_int,
) -> PyResult<()> {
    let this = slf.get();
    if this.ordinal().is_some() {
        return Err(PyBufferError::new_err(
            "GPU buffers do not support the buffer protocol; use DLPack \
             (torch.from_dlpack, cupy.from_dlpack) or copy to a host buffer",
        ));
    }
    if view.is_null() {
        return Err(PyBufferError::new_err("view is NULL"));
    }
    let storage = Arc::clone(&this.storage);
    without_gil(slf.py(), move || storage.readiness().wait_on(None))?;
    let itemsize = this.dtype.itemsize();
    let format = CString::new(this.dtype.struct_format()).map_err(|e| {
        PyBufferError::new_err(format!(
            "the buffer's element format {:?} contains a NUL byte and cannot be exported \
             through the buffer protocol; use DLPack instead",
            String::from_utf8_lossy(&e.into_vec())
        ))
    })?;
    let shape: Box<[isize]> = this.shape.iter().map(|&d| d as isize).collect();
    let mut strides = vec![itemsize as isize; this.shape.len()];
    for i in (0..this.shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * this.shape[i + 1] as isize;
    }
    let extras = Box::new(BufferExtras {
        format,
        shape,
        strides: strides.into_boxed_slice(),
    });
    // SAFETY: `view` (not null, checked above) is the Py_buffer Python passed us to
    // fill, and nothing else touches it during this call (the caller's promise).
    let view = unsafe { &mut *view };
    // Every pointer stored stays valid until __releasebuffer__ (the extras box) or
    // longer (the storage, kept alive by `view.obj`, a strong reference to this Buffer).
    view.buf = this.ptr() as *mut c_void;
    view.obj = slf.clone().into_any().into_ptr();
    view.len = this.nbytes as isize;
    view.readonly = 0;
    view.itemsize = itemsize as isize;
    view.ndim = this.shape.len() as c_int;
    view.format = if flags & pyo3::ffi::PyBUF_FORMAT != 0 {
        extras.format.as_ptr().cast_mut()
    } else {
        std::ptr::null_mut()
    };
    view.shape = if flags & pyo3::ffi::PyBUF_ND != 0 {
        extras.shape.as_ptr().cast_mut()
    } else {
        std::ptr::null_mut()
    };
    view.strides = if flags & pyo3::ffi::PyBUF_STRIDES == pyo3::ffi::PyBUF_STRIDES {
        extras.strides.as_ptr().cast_mut()
    } else {
        std::ptr::null_mut()
    };
    view.suboffsets = std::ptr::null_mut();
    view.internal = Box::into_raw(extras).cast();
    Ok(())
}

/// The body of `Buffer.__releasebuffer__`: free what [`get_buffer`] stored in the view.
///
/// # Safety
/// `view` is the `Py_buffer` that [`get_buffer`] filled, which nothing else touches
/// during this call.
pub(super) unsafe fn release_buffer(view: *mut pyo3::ffi::Py_buffer) {
    // SAFETY: the caller passes the Py_buffer that `get_buffer` filled, untouched by
    // anything else during this call.
    let view = unsafe { &mut *view };
    let internal = std::mem::replace(&mut view.internal, std::ptr::null_mut());
    if !internal.is_null() {
        // SAFETY: `internal` holds the extras boxed in `get_buffer`, released once
        // here (the field is cleared above).
        drop(unsafe { Box::from_raw(internal.cast::<BufferExtras>()) });
    }
}
