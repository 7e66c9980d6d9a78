//! Buffer intake: validate a Python object exporting the buffer protocol once, at the
//! boundary, and keep its export alive for the whole operation.

use kvikpy_core::HostSpan;
use pyo3::buffer::PyUntypedBuffer;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;

/// A validated host buffer: its memory span and the export that keeps it valid.
pub struct HostBuffer {
    pub span: HostSpan,
    /// Holding the export pins the memory (numpy cannot free it, a bytearray cannot resize).
    pub export: PyUntypedBuffer,
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
    let export = PyUntypedBuffer::get(obj).map_err(|_| not_a_buffer(obj))?;
    if access == Access::Fill && export.readonly() {
        return Err(PyValueError::new_err(format!(
            "cannot read into a read-only buffer ({}); pass a writable one such as a \
             bytearray or a writeable numpy array",
            type_name(obj)
        )));
    }
    if !export.is_c_contiguous() && !export.is_fortran_contiguous() {
        return Err(PyValueError::new_err(format!(
            "the buffer ({}) is not contiguous; pass a contiguous array \
             (for numpy: numpy.ascontiguousarray(a), then copy back if you read into it)",
            type_name(obj)
        )));
    }
    let len = export.len_bytes();
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
    // SAFETY: the export guarantees `buf_ptr()..+len_bytes()` is valid, contiguous memory
    // (checked above) for as long as `export` lives; `size <= len`. `HostBuffer` keeps the
    // export next to the span, and callers move both into the operation's future, so the
    // memory outlives every task. Writability was checked for Access::Fill.
    let span = unsafe { HostSpan::new(export.buf_ptr().cast::<u8>(), size) };
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
    let device = obj.hasattr("__cuda_array_interface__").unwrap_or(false)
        || obj.hasattr("__dlpack_device__").unwrap_or(false);
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
