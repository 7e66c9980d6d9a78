//! Buffer intake: validate a Python object exporting the buffer protocol once, at the
//! boundary, and keep its export alive for the whole operation.

use std::mem::MaybeUninit;

use kvikpy_core::HostSpan;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;

/// A buffer-protocol export, held for as long as an operation uses the memory: holding it
/// pins the memory (numpy cannot free it, a bytearray cannot resize). Unlike pyo3's
/// `PyBuffer` it accepts 0-dimensional exports (numpy scalars' arrays).
pub struct HostExport {
    view: Box<ffi::Py_buffer>,
}

// SAFETY: the view is only read after creation, and released once under the GIL in Drop.
unsafe impl Send for HostExport {}
// SAFETY: as above.
unsafe impl Sync for HostExport {}

impl HostExport {
    fn get(obj: &Bound<'_, PyAny>) -> PyResult<Self> {
        let mut view: Box<MaybeUninit<ffi::Py_buffer>> = Box::new(MaybeUninit::zeroed());
        // SAFETY: `view` is a writable Py_buffer-sized allocation; on success Python fills
        // it and we release it exactly once in Drop.
        let rc =
            unsafe { ffi::PyObject_GetBuffer(obj.as_ptr(), view.as_mut_ptr(), ffi::PyBUF_FULL_RO) };
        if rc != 0 {
            return Err(PyErr::fetch(obj.py()));
        }
        // SAFETY: PyObject_GetBuffer succeeded, so the view is initialised.
        let view = unsafe { Box::from_raw(Box::into_raw(view).cast::<ffi::Py_buffer>()) };
        Ok(Self { view })
    }

    fn readonly(&self) -> bool {
        self.view.readonly != 0
    }

    fn contiguous(&self) -> bool {
        // SAFETY: the view is a live export.
        unsafe { ffi::PyBuffer_IsContiguous(&*self.view, b'A' as std::ffi::c_char) == 1 }
    }

    fn ptr(&self) -> *mut u8 {
        self.view.buf.cast()
    }

    fn len(&self) -> usize {
        self.view.len as usize
    }
}

impl Drop for HostExport {
    fn drop(&mut self) {
        // After finalisation began there is nothing left to release to.
        Python::try_attach(|_| {
            // SAFETY: the view came from a successful PyObject_GetBuffer, released once.
            unsafe { ffi::PyBuffer_Release(&mut *self.view) }
        });
    }
}

/// A validated host buffer: its memory span and the export that keeps it valid.
pub struct HostBuffer {
    pub span: HostSpan,
    pub export: HostExport,
}

/// Which way the operation moves bytes, deciding whether the buffer must be writable.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// The operation writes into the buffer (a file read).
    Fill,
    /// The operation only reads the buffer (a file write).
    Drain,
}

/// Validate `obj` as a contiguous host buffer (writable for `Access::Fill`) and select
/// `size` bytes of it (`None`: all of it).
pub fn intake(obj: &Bound<'_, PyAny>, size: Option<i64>, access: Access) -> PyResult<HostBuffer> {
    let export = HostExport::get(obj).map_err(|_| not_a_buffer(obj))?;
    if access == Access::Fill && export.readonly() {
        return Err(PyValueError::new_err(format!(
            "cannot read into a read-only buffer ({}); pass a writable one such as a \
             bytearray or a writeable numpy array",
            type_name(obj)
        )));
    }
    if !export.contiguous() {
        return Err(PyValueError::new_err(format!(
            "the buffer ({}) is not contiguous; pass a contiguous array \
             (for numpy: numpy.ascontiguousarray(a), then copy back if you read into it)",
            type_name(obj)
        )));
    }
    let len = export.len();
    let size = match size {
        None => len,
        Some(s) if s < 0 => {
            return Err(PyValueError::new_err(format!(
                "size must be non-negative, got {s}"
            )))
        }
        Some(s) if s as u64 > len as u64 => {
            return Err(PyValueError::new_err(format!(
                "size {s} is larger than the buffer, which has {len} bytes; \
                 pass size <= {len} or a larger buffer"
            )))
        }
        Some(s) => s as usize,
    };
    // SAFETY: the export guarantees `ptr()..+len()` is valid, contiguous memory
    // (checked above) for as long as `export` lives; `size <= len`. `HostBuffer` keeps the
    // export next to the span, and callers move both into the operation's future, so the
    // memory outlives every task. Writability was checked for Access::Fill.
    let span = unsafe { HostSpan::new(export.ptr(), size) };
    Ok(HostBuffer { span, export })
}

/// Convert a Python file offset, rejecting negatives with a clear message.
pub fn file_offset(offset: i64) -> PyResult<u64> {
    u64::try_from(offset).map_err(|_| {
        PyValueError::new_err(format!("file_offset must be non-negative, got {offset}"))
    })
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into())
}

fn not_a_buffer(obj: &Bound<'_, PyAny>) -> PyErr {
    // numpy arrays have __dlpack_device__ too; only a CUDA device type means GPU memory.
    let cuda_dlpack = obj
        .call_method0("__dlpack_device__")
        .and_then(|d| d.extract::<(i32, i32)>())
        .is_ok_and(|(device_type, _)| matches!(device_type, 2 | 3 | 13));
    let device = obj.hasattr("__cuda_array_interface__").unwrap_or(false) || cuda_dlpack;
    if device {
        PyTypeError::new_err(format!(
            "{} looks like device (GPU) memory, which this kvikpy build cannot read into or \
             write from yet; copy it to host memory (e.g. cupy.asnumpy) or use a host buffer",
            type_name(obj)
        ))
    } else {
        PyTypeError::new_err(format!(
            "expected a buffer (bytearray, memoryview, numpy array, ...), got {}",
            type_name(obj)
        ))
    }
}
