//! Buffer intake: turn whatever Python object the user passed into one validated memory
//! span, once, at the boundary, and keep the object alive for the whole operation.
//!
//! Accepted, in this order: kvikpy `Buffer`s; objects with `__cuda_array_interface__`
//! (v2 and v3, whose `stream` is waited for); objects whose `__dlpack_device__` is a CUDA
//! device (torch, CuPy, JAX); anything exporting the buffer protocol (host memory).
//! Pointers are routed by the driver's view of them, so pinned host memory takes the host
//! path and managed memory the device path.

use std::any::Any;
use std::mem::MaybeUninit;

use kvikpy_core::cuda::{self, MemoryKind};
use kvikpy_core::{DeviceSpan, HostSpan, Span};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use crate::blocking::without_gil;
use crate::dlpack::{self, DEVICE_CPU, DEVICE_CUDA, DEVICE_CUDA_HOST, DEVICE_CUDA_MANAGED};
use crate::memory::Buffer;

/// Whether the operation writes into the buffer or only reads it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// The operation writes into the buffer (a file read).
    Fill,
    /// The operation only reads the buffer (a file write).
    Drain,
}

/// A validated buffer: its memory and what keeps that memory alive.
pub struct Intake {
    pub span: Span,
    pub keepalive: Box<dyn Any + Send>,
}

impl Intake {
    /// Narrow to `size` bytes (default: the rest) starting `offset` bytes in.
    pub fn select(self, offset: i64, size: Option<i64>, offset_name: &str) -> PyResult<Self> {
        let len = self.span.len();
        let offset = usize::try_from(offset)
            .ok()
            .filter(|&o| o <= len)
            .ok_or_else(|| {
                PyValueError::new_err(format!(
                    "{offset_name} {offset} is outside the buffer, which has {len} bytes"
                ))
            })?;
        let available = len - offset;
        let size = match size {
            None => available,
            Some(s) if s < 0 => {
                return Err(PyValueError::new_err(format!(
                    "size must be non-negative, got {s}"
                )))
            }
            Some(s) if s as u64 > available as u64 => {
                return Err(PyValueError::new_err(format!(
                    "size {s} is larger than the buffer, which has {available} bytes{}; \
                     pass size <= {available} or a larger buffer",
                    if offset > 0 {
                        format!(" after {offset_name} {offset}")
                    } else {
                        String::new()
                    }
                )))
            }
            Some(s) => s as usize,
        };
        Ok(Self {
            span: self.span.sub(offset, size),
            keepalive: self.keepalive,
        })
    }

    /// The device span, or a `ValueError` naming `method` for host memory.
    pub fn device_only(
        &self,
        method: &str,
        alternative: &str,
    ) -> PyResult<kvikpy_core::DeviceSpan> {
        match self.span {
            Span::Device(d) => Ok(d),
            Span::Host(_) => Err(PyValueError::new_err(format!(
                "CuFile.{method} works on device (GPU) memory only, and this buffer is host \
                 memory; use CuFile.{alternative} for host buffers"
            ))),
        }
    }
}

fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .fully_qualified_name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into())
}

fn is_jax(obj: &Bound<'_, PyAny>) -> bool {
    let name = type_name(obj);
    name.starts_with("jax") || name.starts_with("jaxlib")
}

fn read_only_error(obj: &Bound<'_, PyAny>) -> PyErr {
    let hint = if is_jax(obj) {
        "JAX arrays are immutable; read into a torch or CuPy array, or use kvikpy.read() \
         and jax.dlpack.from_dlpack on the result"
    } else {
        "pass a writable one such as a bytearray, a writeable numpy array or a GPU array"
    };
    PyValueError::new_err(format!(
        "cannot read into a read-only buffer ({}); {hint}",
        type_name(obj)
    ))
}

/// Validate `obj` for `access`.
pub fn intake(obj: &Bound<'_, PyAny>, access: Access) -> PyResult<Intake> {
    let py = obj.py();
    if let Ok(buffer) = obj.cast::<Buffer>() {
        let (span, storage) = buffer.get().span();
        return Ok(Intake {
            span,
            keepalive: Box::new(storage),
        });
    }
    // Host memory first: numpy arrays, bytearrays and memoryviews export a buffer, and
    // probing them for GPU interfaces first would cost a failed attribute lookup (an
    // exception object) on every small read.
    // Some GPU arrays (CuPy) have a buffer slot that always fails: fall through to their
    // GPU interfaces then.
    // SAFETY: PyObject_CheckBuffer only inspects the object's type.
    let has_buffer_slot = unsafe { ffi::PyObject_CheckBuffer(obj.as_ptr()) } == 1;
    if has_buffer_slot {
        if let Ok(export) = HostExport::get(obj) {
            return from_export(obj, export, access);
        }
    }
    if access == Access::Fill && is_jax(obj) {
        return Err(read_only_error(obj));
    }
    if let Ok(cai) = obj.getattr(intern!(py, "__cuda_array_interface__")) {
        return from_cuda_array_interface(obj, &cai, access);
    }
    if let Ok(device) = obj.call_method0(intern!(py, "__dlpack_device__")) {
        let (device_type, _): (i32, i32) = device.extract()?;
        if device_type == DEVICE_CUDA || device_type == DEVICE_CUDA_MANAGED {
            return from_dlpack(obj, access, Some(1));
        }
        // Host memory without the buffer protocol: DLPack without a stream (torch CPU and
        // pinned tensors, which report kDLCUDAHost). Host objects whose buffer export
        // failed (numpy datetimes) get the buffer-protocol error below instead.
        if !has_buffer_slot && [DEVICE_CPU, DEVICE_CUDA_HOST].contains(&device_type) {
            return from_dlpack(obj, access, None);
        }
    }
    from_buffer_protocol(obj, access)
}

/// A buffer-protocol export, held for as long as an operation uses the memory: holding it
/// pins the memory (numpy cannot free it, a bytearray cannot resize). Unlike pyo3's
/// `PyBuffer` it accepts 0-dimensional exports (numpy scalars' arrays).
struct HostExport {
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

fn from_buffer_protocol(obj: &Bound<'_, PyAny>, access: Access) -> PyResult<Intake> {
    let export = HostExport::get(obj).map_err(|_| {
        PyTypeError::new_err(format!(
            "{} exports no buffer; pass a bytearray, memoryview, numpy array (not of \
             datetime/object dtype), a CUDA array (torch, CuPy, JAX) or a kvikpy.Buffer",
            type_name(obj)
        ))
    })?;
    from_export(obj, export, access)
}

fn from_export(obj: &Bound<'_, PyAny>, export: HostExport, access: Access) -> PyResult<Intake> {
    if access == Access::Fill && export.readonly() {
        return Err(read_only_error(obj));
    }
    if !export.contiguous() {
        return Err(PyValueError::new_err(format!(
            "the buffer ({}) is not contiguous; pass a contiguous array \
             (for numpy: numpy.ascontiguousarray(a), then copy back if you read into it)",
            type_name(obj)
        )));
    }
    // SAFETY: the export guarantees `buf..buf+len` is valid contiguous memory (checked
    // above) while `export` lives, and the export travels with the span as its keepalive
    // into the operation's future. Writability was checked for Access::Fill.
    let span = unsafe { HostSpan::new(export.view.buf.cast(), export.view.len as usize) };
    Ok(Intake {
        span: Span::Host(span),
        keepalive: Box::new(export),
    })
}

/// A pointer reported by an array interface, routed by what the driver says it is.
fn route(py: Python<'_>, ptr: u64, nbytes: usize, hint_ordinal: Option<usize>) -> PyResult<Span> {
    if nbytes == 0 {
        return Ok(Span::Host(HostSpan::from_slice(&mut [])));
    }
    let kind = without_gil(py, move || cuda::memory_kind(ptr))?;
    Ok(match kind {
        MemoryKind::Device { ordinal } | MemoryKind::Managed { ordinal } => {
            Span::Device(DeviceSpan {
                ptr,
                len: nbytes,
                ordinal: hint_ordinal.unwrap_or(ordinal),
            })
        }
        // SAFETY: host memory of `nbytes` bytes at `ptr`, as the producer's interface
        // states; the producer object is kept alive with the span.
        MemoryKind::Host | MemoryKind::PinnedHost => {
            Span::Host(unsafe { HostSpan::new(ptr as *mut u8, nbytes) })
        }
    })
}

fn from_cuda_array_interface(
    obj: &Bound<'_, PyAny>,
    cai: &Bound<'_, PyAny>,
    access: Access,
) -> PyResult<Intake> {
    let py = obj.py();
    let cai = cai
        .cast::<PyDict>()
        .map_err(|_| PyTypeError::new_err("__cuda_array_interface__ is not a dict"))?;
    let get = |key: &str| -> PyResult<Bound<'_, PyAny>> {
        cai.get_item(key)?.ok_or_else(|| {
            PyValueError::new_err(format!("__cuda_array_interface__ has no '{key}'"))
        })
    };
    let (ptr, read_only): (u64, bool) = get("data")?.extract()?;
    let shape: Vec<i64> = get("shape")?.cast::<PyTuple>()?.extract()?;
    let typestr: String = get("typestr")?.extract()?;
    let itemsize: i64 = typestr
        .get(2..)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| PyValueError::new_err(format!("unsupported typestr {typestr:?}")))?;
    let count: i64 = shape.iter().product();
    if let Some(strides) = cai.get_item("strides")?.filter(|s| !s.is_none()) {
        let strides: Vec<i64> = strides.extract()?;
        let mut expected = itemsize;
        for i in (0..shape.len()).rev() {
            if shape[i] != 1 && strides[i] != expected && count != 0 {
                return Err(PyValueError::new_err(format!(
                    "the array ({}) is not C-contiguous; pass a contiguous copy",
                    type_name(obj)
                )));
            }
            expected *= shape[i];
        }
    }
    if access == Access::Fill && read_only {
        return Err(read_only_error(obj));
    }
    let nbytes = (count.max(0) * itemsize) as usize;
    let span = route(py, ptr, nbytes, None)?;
    // Version 3: work queued on `stream` may still be producing the data; wait for it.
    if let (Span::Device(d), Some(stream)) = (span, cai.get_item("stream")?) {
        if !stream.is_none() {
            let stream: usize = stream.extract()?;
            let ordinal = d.ordinal;
            without_gil(py, move || cuda::record_and_wait(ordinal, stream))?;
        }
    }
    Ok(Intake {
        span,
        keepalive: Box::new(obj.clone().unbind()),
    })
}

/// `stream`: for GPU memory, the stream the producer must order its pending work before
/// (1, CUDA's legacy default stream), which is then waited for; `None` for host memory.
fn from_dlpack(obj: &Bound<'_, PyAny>, access: Access, stream: Option<i64>) -> PyResult<Intake> {
    let py = obj.py();
    let kwargs = PyDict::new(py);
    if let Some(stream) = stream {
        kwargs.set_item("stream", stream)?;
    }
    kwargs.set_item("max_version", (1, 0))?;
    let capsule = match obj.call_method(intern!(py, "__dlpack__"), (), Some(&kwargs)) {
        Ok(c) => c,
        Err(e) if e.is_instance_of::<PyTypeError>(py) => {
            kwargs.del_item("max_version")?;
            obj.call_method(intern!(py, "__dlpack__"), (), Some(&kwargs))?
        }
        Err(e) => return Err(e),
    };
    let imported = dlpack::inspect(&capsule)?;
    if access == Access::Fill && imported.read_only {
        return Err(read_only_error(obj));
    }
    let span = if [DEVICE_CPU, DEVICE_CUDA_HOST].contains(&imported.device_type) {
        // SAFETY: host memory of `nbytes` bytes, as the capsule states; the capsule keeps
        // the producer's tensor alive with the span.
        Span::Host(unsafe { HostSpan::new(imported.ptr as *mut u8, imported.nbytes) })
    } else {
        let hint =
            (imported.device_type == DEVICE_CUDA).then_some(imported.device_id.max(0) as usize);
        route(py, imported.ptr, imported.nbytes, hint)?
    };
    if let (Span::Device(d), Some(stream)) = (span, stream) {
        let ordinal = d.ordinal;
        without_gil(py, move || cuda::record_and_wait(ordinal, stream as usize))?;
    }
    Ok(Intake {
        span,
        // The unconsumed capsule owns the producer's tensor until it is dropped.
        keepalive: Box::new(capsule.unbind()),
    })
}

/// Convert a Python file offset, rejecting negatives with a clear message.
pub fn file_offset(offset: i64) -> PyResult<u64> {
    u64::try_from(offset).map_err(|_| {
        PyValueError::new_err(format!("file_offset must be non-negative, got {offset}"))
    })
}
