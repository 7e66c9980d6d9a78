//! Buffer intake: turn whatever Python object the user passed into one validated memory
//! span, once, at the boundary, and keep the object alive for the whole operation.
//!
//! Accepted, in this order: kvikpy `Buffer`s; objects with `__cuda_array_interface__`
//! (v2 and v3, whose `stream` is waited for; an interface without a `stream` key on an
//! object that also speaks DLPack, torch's, is taken through DLPack so that its pending
//! work is waited for); objects whose `__dlpack_device__` is a CUDA device (torch, CuPy,
//! JAX); anything exporting the buffer protocol (host memory). Plain torch CUDA tensors
//! and plain CuPy arrays skip the interfaces (see [`crate::torch`] and [`crate::cupy`]):
//! the same ordering, a fraction of the cost.
//! Pointers are routed by the driver's view of them, so pinned host memory takes the host
//! path and managed memory the device path.

use std::any::Any;
use std::mem::MaybeUninit;

use kvikpy_core::cuda::{self, MemoryKind};
use kvikpy_core::{DeviceSpan, HostSpan, Span};
use kvikpy_macros::boundary;
use pyo3::exceptions::{PyOverflowError, PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyTuple};

use crate::blocking::without_gil;
use crate::buffer::Buffer;
use crate::cupy;
use crate::dlpack::{self, DEVICE_CPU, DEVICE_CUDA, DEVICE_CUDA_HOST, DEVICE_CUDA_MANAGED};
use crate::torch;

/// Whether the operation writes into the buffer or only reads it.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Access {
    /// The operation writes into the buffer (a file read).
    Fill,
    /// The operation only reads the buffer (a file write).
    Drain,
}

/// What intake does about work a producer has queued on a GPU buffer and not finished.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Pending {
    /// Wait for it before the call touches the memory (every call that runs on kvikpy's
    /// own streams).
    Wait,
    /// Order it before this stream (a raw `CUstream`), the one the call is ordered on
    /// (`raw_read_async`, `raw_write_async`), on the GPU: the call must not block.
    InStreamOrder(usize),
    /// Wait for it, but leave the wait to the caller: the intake carries it
    /// ([`Intake::wait`]), and the caller runs it ([`ProducerWait::run`]) inside its own
    /// release of the GIL, before the call touches the memory. A small blocking read then
    /// releases the GIL once instead of twice.
    Deferred,
}

impl Pending {
    /// The stream a DLPack producer is asked to order its pending work before: CUDA's
    /// legacy default stream (DLPack's 1) for calls that then wait for it, else the
    /// call's own stream (its handle; 0, the legacy default stream, is DLPack's 1).
    fn dlpack_stream(self) -> i64 {
        match self {
            Pending::Wait | Pending::Deferred | Pending::InStreamOrder(0) => 1,
            Pending::InStreamOrder(stream) => stream as i64,
        }
    }
}

/// Work a producer queued on a GPU buffer, still to be waited for ([`Pending::Deferred`]).
#[derive(Clone, Copy)]
#[must_use = "the producer's pending work must be waited for before the memory is touched"]
pub struct ProducerWait {
    ordinal: usize,
    /// The producer's stream (a raw `CUstream`).
    stream: usize,
}

impl ProducerWait {
    /// Wait for the work queued on the producer's stream so far (call it without the GIL).
    pub fn run(self) -> kvikpy_core::Result<()> {
        cuda::record_and_wait(self.ordinal, cuda::Stream::from_raw(self.stream))
    }
}

/// A validated buffer: its memory and what keeps that memory alive.
pub struct Intake {
    pub span: Span,
    pub keepalive: Box<dyn Any + Send>,
    /// The producer's pending work, still to be waited for (only with
    /// [`Pending::Deferred`]; every other choice has dealt with it already).
    pub wait: Option<ProducerWait>,
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
            wait: self.wait,
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
                "Non-CUDA buffers not supported: CuFile.{method} works on device (GPU) \
                 memory only, and this buffer is host memory; use CuFile.{alternative} for \
                 host buffers"
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
    intake_with(obj, access, Pending::Wait)
}

/// [`intake`], with a choice of what to do about the producer's pending work.
pub fn intake_with(obj: &Bound<'_, PyAny>, access: Access, pending: Pending) -> PyResult<Intake> {
    let py = obj.py();
    if let Ok(buffer) = obj.cast::<Buffer>() {
        let (span, storage) = buffer.get().span();
        return Ok(Intake {
            span,
            keepalive: Box::new(storage),
            wait: None,
        });
    }
    // Plain CuPy arrays before the buffer protocol, whose slot on a CuPy array raises for
    // device memory (an exception per call); a type comparison for everything else.
    if let Some(array) = cupy::view(obj) {
        if let Some(taken) = from_cupy(obj, array, pending)? {
            return Ok(taken);
        }
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
    if let Some(tensor) = torch::view(obj) {
        return from_torch(obj, tensor, pending);
    }
    if access == Access::Fill && is_jax(obj) {
        return Err(read_only_error(obj));
    }
    if let Ok(cai) = obj.getattr(intern!(py, "__cuda_array_interface__")) {
        // An interface that names no stream (version 2: torch's) says nothing of the
        // kernels that may still be writing or reading the array, and kvikpy's streams do
        // not wait for the legacy default stream by themselves. Where the object also
        // speaks DLPack, ask it to order its pending work before the legacy default
        // stream, which is then waited for: `f.write(t)` right after the kernel that
        // computed `t` writes its result, not the bytes before it.
        if names_no_stream(&cai) && obj.hasattr(intern!(py, "__dlpack__"))? {
            return from_dlpack(obj, access, Some(pending));
        }
        return from_cuda_array_interface(obj, &cai, access, pending);
    }
    if let Ok(device) = obj.call_method0(intern!(py, "__dlpack_device__")) {
        let (device_type, _): (i32, i32) = device.extract().map_err(|_| {
            PyTypeError::new_err(format!(
                "{}.__dlpack_device__() must return a tuple (device_type, device_id) of two \
                 ints, got {}",
                type_name(obj),
                device.repr().map(|r| r.to_string()).unwrap_or_default()
            ))
        })?;
        if device_type == DEVICE_CUDA || device_type == DEVICE_CUDA_MANAGED {
            return from_dlpack(obj, access, Some(pending));
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

/// Whether a `__cuda_array_interface__` has no `stream` key (version 2, or a version 3
/// producer that left it out); `"stream": None` is the producer saying that no
/// synchronisation is needed, and is taken at its word.
fn names_no_stream(cai: &Bound<'_, PyAny>) -> bool {
    cai.cast::<PyDict>()
        .is_ok_and(|d| !matches!(d.contains(intern!(cai.py(), "stream")), Ok(true)))
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

/// Whether a buffer-protocol format string (struct syntax, `None` meaning `"B"`) has
/// items that are Python objects (`O`), outside of field names (`:name:`).
fn format_has_objects(format: &[u8]) -> bool {
    let mut in_name = false;
    format.iter().any(|&c| {
        if c == b':' {
            in_name = !in_name;
            return false;
        }
        !in_name && c == b'O'
    })
}

fn from_export(obj: &Bound<'_, PyAny>, export: HostExport, access: Access) -> PyResult<Intake> {
    if !export.view.format.is_null() {
        // SAFETY: a non-null format of a live export is a NUL-terminated string.
        let format = unsafe { std::ffi::CStr::from_ptr(export.view.format) };
        if format_has_objects(format.to_bytes()) {
            return Err(PyTypeError::new_err(format!(
                "the buffer ({}) holds Python objects (format {:?}): its items are \
                 pointers, and file bytes written over them would crash the process (or \
                 pointers would be written to the file); use a plain numeric, bool or bytes \
                 dtype",
                type_name(obj),
                format.to_string_lossy()
            )));
        }
    }
    if export.view.buf.is_null() && export.view.len > 0 {
        return Err(PyValueError::new_err(format!(
            "the buffer ({}) reports {} bytes at a null address",
            type_name(obj),
            export.view.len
        )));
    }
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
        wait: None,
    })
}

/// No process has addresses at or above 2^57 (x86-64's 5-level paging gives user space
/// 56 bits, arm64 at most 52), host or device (CUDA's unified addressing shares the space).
const ADDRESS_LIMIT: u64 = 1 << 57;

/// A producer's pointer and size, checked for the one thing a consumer can check: that
/// the extent fits in an address space at all. A capsule or interface claiming more (a
/// wrong shape, a garbage pointer) would otherwise be read or written as far as the
/// kernel lets it, and a request that size split into billions of tasks.
fn plausible_extent(ptr: u64, nbytes: usize) -> PyResult<()> {
    match ptr.checked_add(nbytes as u64) {
        _ if nbytes == 0 => Ok(()), // an empty buffer's pointer is never used
        Some(end) if end <= ADDRESS_LIMIT => Ok(()),
        _ => Err(PyValueError::new_err(format!(
            "the buffer claims {nbytes} bytes at address {ptr:#x}, which reaches past the \
             largest address any process can have (2^57): its producer reported a wrong \
             shape, item size or pointer"
        ))),
    }
}

/// A pointer reported by an array interface, routed by what the driver says it is.
fn route(py: Python<'_>, ptr: u64, nbytes: usize, hint_ordinal: Option<usize>) -> PyResult<Span> {
    if nbytes == 0 {
        return Ok(Span::Host(HostSpan::from_slice(&mut [])));
    }
    plausible_extent(ptr, nbytes)?;
    let kind = without_gil(py, move || cuda::memory_kind(ptr))?;
    Ok(match kind {
        MemoryKind::Device { ordinal } | MemoryKind::Managed { ordinal } => {
            Span::Device(DeviceSpan {
                ptr,
                len: nbytes,
                ordinal: hint_ordinal.unwrap_or(ordinal),
            })
        }
        MemoryKind::Host | MemoryKind::PinnedHost => {
            // SAFETY: host memory of `nbytes` bytes at `ptr`, as the producer's interface
            // states; the producer object is kept alive with the span.
            Span::Host(unsafe { HostSpan::new(ptr as *mut u8, nbytes) })
        }
    })
}

/// A `__cuda_array_interface__` field that is missing or malformed: a `ValueError` (or
/// `TypeError` for a value of the wrong type) naming the field and what it must be.
fn cai_field_error(key: &str, expected: &str, found: &Bound<'_, PyAny>) -> PyErr {
    let shown = found
        .repr()
        .map(|r| r.to_string())
        .unwrap_or_else(|_| "?".into());
    PyTypeError::new_err(format!(
        "__cuda_array_interface__['{key}'] must be {expected}, got {shown}"
    ))
}

fn cai_int<T: for<'a, 'py> FromPyObject<'a, 'py>>(
    key: &str,
    expected: &str,
    value: &Bound<'_, PyAny>,
) -> PyResult<T> {
    // bool is an int subclass in Python; a flag where a number belongs is a mistake.
    if value.is_instance_of::<pyo3::types::PyBool>() {
        return Err(cai_field_error(key, expected, value));
    }
    value
        .extract::<T>()
        .map_err(|_| cai_field_error(key, expected, value))
}

/// The item size in bytes of a plain-data typestr such as `"<f4"` or `"|u1"`; object
/// items (`"|O8"`: pointers to Python objects) are refused before any I/O, since file
/// bytes written over them crash the process and their bytes on disk mean nothing.
pub fn typestr_itemsize(typestr: &str, field: &str) -> PyResult<usize> {
    let bytes = typestr.as_bytes();
    let malformed = || {
        PyValueError::new_err(format!(
            "{field} {typestr:?} is not an array-interface type string: expected a byte \
             order ('<', '>', '|' or '='), a kind letter and an item size in bytes, such as \
             '<f4' or '|u1'"
        ))
    };
    if bytes.len() < 3 || !b"<>|=".contains(&bytes[0]) {
        return Err(malformed());
    }
    let kind = bytes[1];
    if kind == b'O' {
        return Err(PyTypeError::new_err(format!(
            "{field} {typestr:?} describes Python objects: their items are pointers, and \
             file bytes written over them would crash the process (or pointers would be \
             written to the file); use a plain numeric, bool or bytes dtype"
        )));
    }
    if !b"biufcmMSUV".contains(&kind) {
        return Err(malformed());
    }
    let size: usize = typestr[2..].parse().map_err(|_| malformed())?;
    if size == 0 {
        return Err(malformed());
    }
    Ok(size)
}

/// Whether a `__cuda_array_interface__` `descr` (a list of `(name, typestr[, shape])`
/// entries, nested for sub-structures) contains object fields.
fn descr_has_objects(descr: &Bound<'_, PyAny>) -> bool {
    let Ok(entries) = descr.try_iter() else {
        return false;
    };
    entries.flatten().any(|entry| {
        let Ok(field) = entry.get_item(1) else {
            return false;
        };
        if let Ok(text) = field.extract::<String>() {
            text.as_bytes().get(1) == Some(&b'O')
        } else {
            descr_has_objects(&field)
        }
    })
}

/// Work queued on `stream` (a raw `CUstream`) may still be producing or reading the
/// memory of `span`: wait for it, or, in a stream-ordered call, make the call's stream
/// wait for it on the GPU, or, deferred, return the wait for the caller to run. Nothing
/// to do for host memory.
fn order_pending(
    py: Python<'_>,
    span: Span,
    stream: usize,
    pending: Pending,
) -> PyResult<Option<ProducerWait>> {
    let Span::Device(d) = span else {
        return Ok(None);
    };
    let ordinal = d.ordinal;
    let wait = ProducerWait { ordinal, stream };
    match pending {
        Pending::Deferred => return Ok(Some(wait)),
        Pending::Wait => without_gil(py, move || wait.run())?,
        Pending::InStreamOrder(call) if call != stream => without_gil(py, move || {
            let producer = cuda::Stream::from_raw(stream);
            cuda::record_and_order(ordinal, producer, cuda::Stream::from_raw(call))
        })?,
        Pending::InStreamOrder(_) => {} // the same stream orders it already
    }
    Ok(None)
}

/// A plain torch CUDA tensor ([`torch::view`]): device memory as torch reports it (torch
/// allocates CUDA tensors in device or managed memory, never host memory, so the
/// driver's pointer query is skipped), ordered after the work queued on its device's
/// current stream, as its `__dlpack__` would order it.
fn from_torch(
    obj: &Bound<'_, PyAny>,
    tensor: torch::TorchView,
    pending: Pending,
) -> PyResult<Intake> {
    let py = obj.py();
    plausible_extent(tensor.ptr, tensor.nbytes)?;
    let span = if tensor.nbytes == 0 {
        Span::Host(HostSpan::from_slice(&mut []))
    } else {
        Span::Device(DeviceSpan {
            ptr: tensor.ptr,
            len: tensor.nbytes,
            ordinal: tensor.device,
        })
    };
    let wait = order_pending(py, span, tensor.stream, pending)?;
    Ok(Intake {
        span,
        keepalive: Box::new(obj.clone().unbind()),
        wait,
    })
}

/// A plain CuPy array ([`cupy::view`]): device memory, ordered after the work queued on
/// its device's current stream, as its `__cuda_array_interface__` orders it. `None` when
/// the driver says the memory is not plain device memory (managed or host memory, which
/// the general path routes as it always has).
fn from_cupy(
    obj: &Bound<'_, PyAny>,
    array: cupy::CupyView,
    pending: Pending,
) -> PyResult<Option<Intake>> {
    let py = obj.py();
    plausible_extent(array.ptr, array.nbytes)?;
    if array.nbytes == 0 {
        return Ok(Some(Intake {
            span: Span::Host(HostSpan::from_slice(&mut [])),
            keepalive: Box::new(obj.clone().unbind()),
            wait: None,
        }));
    }
    if !array.known_device {
        let ptr = array.ptr;
        match without_gil(py, move || cuda::memory_kind(ptr))? {
            MemoryKind::Device { .. } => {}
            _ => return Ok(None),
        }
    }
    let span = Span::Device(DeviceSpan {
        ptr: array.ptr,
        len: array.nbytes,
        ordinal: array.device,
    });
    let wait = order_pending(py, span, array.stream, pending)?;
    Ok(Some(Intake {
        span,
        keepalive: Box::new(obj.clone().unbind()),
        wait,
    }))
}

fn from_cuda_array_interface(
    obj: &Bound<'_, PyAny>,
    cai: &Bound<'_, PyAny>,
    access: Access,
    pending: Pending,
) -> PyResult<Intake> {
    let py = obj.py();
    let cai = cai.cast::<PyDict>().map_err(|_| {
        PyTypeError::new_err(format!(
            "__cuda_array_interface__ of {} must be a dict, got {}",
            type_name(obj),
            cai.get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_default()
        ))
    })?;
    let get = |key: &str| -> PyResult<Bound<'_, PyAny>> {
        cai.get_item(key)?.ok_or_else(|| {
            PyValueError::new_err(format!(
                "__cuda_array_interface__ of {} has no '{key}'",
                type_name(obj)
            ))
        })
    };
    let optional = |key: &str| -> PyResult<Option<Bound<'_, PyAny>>> {
        Ok(cai.get_item(key)?.filter(|v| !v.is_none()))
    };

    let data = get("data")?;
    let pair = data
        .cast::<PyTuple>()
        .ok()
        .filter(|t| t.len() == 2)
        .ok_or_else(|| cai_field_error("data", "a tuple (pointer, read_only)", &data))?;
    let ptr: u64 = cai_int(
        "data",
        "a tuple (pointer, read_only) with a non-negative integer pointer",
        &pair.get_item(0)?,
    )?;
    let read_only = pair
        .get_item(1)?
        .extract::<bool>()
        .map_err(|_| cai_field_error("data", "a tuple (pointer, read_only) with a bool", &data))?;

    let shape_obj = get("shape")?;
    let shape_tuple = shape_obj
        .cast::<PyTuple>()
        .map_err(|_| cai_field_error("shape", "a tuple of non-negative ints", &shape_obj))?;
    let mut shape = Vec::with_capacity(shape_tuple.len());
    for dim in shape_tuple.iter() {
        let dim = cai_int::<u64>("shape", "a tuple of non-negative ints", &dim)
            .map_err(|_| cai_field_error("shape", "a tuple of non-negative ints", &shape_obj))?;
        shape.push(dim);
    }

    let typestr_obj = get("typestr")?;
    let typestr: String = typestr_obj
        .extract()
        .map_err(|_| cai_field_error("typestr", "a str such as '<f4'", &typestr_obj))?;
    let itemsize = typestr_itemsize(&typestr, "__cuda_array_interface__['typestr']")?;
    if let Some(descr) = optional("descr")? {
        if descr_has_objects(&descr) {
            return Err(PyTypeError::new_err(
                "__cuda_array_interface__['descr'] has fields of Python objects: their \
                 items are pointers, and file bytes written over them would crash the \
                 process; use plain numeric, bool or bytes fields",
            ));
        }
    }
    if optional("mask")?.is_some() {
        return Err(PyValueError::new_err(
            "__cuda_array_interface__['mask'] is set: masked arrays are not supported; \
             pass the data array without a mask",
        ));
    }

    let too_large = || {
        PyValueError::new_err(format!(
            "__cuda_array_interface__ describes an array of shape {shape:?} with {itemsize}-byte \
             items, more bytes than fit in memory"
        ))
    };
    let count = shape
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .ok_or_else(too_large)?;
    let nbytes = count
        .checked_mul(itemsize as u64)
        .filter(|&n| n <= isize::MAX as u64)
        .ok_or_else(too_large)? as usize;

    if let Some(strides_obj) = optional("strides")? {
        let expected_type = "None or a tuple of ints, one per dimension of 'shape'";
        let strides_tuple = strides_obj
            .cast::<PyTuple>()
            .ok()
            .filter(|t| t.len() == shape.len())
            .ok_or_else(|| cai_field_error("strides", expected_type, &strides_obj))?;
        let mut expected = itemsize as i128;
        for (i, stride) in strides_tuple.iter().enumerate().rev() {
            let stride: i64 = cai_int("strides", expected_type, &stride)?;
            if shape[i] != 1 && stride as i128 != expected && count != 0 {
                return Err(PyValueError::new_err(format!(
                    "the array ({}) is not C-contiguous; pass a contiguous copy",
                    type_name(obj)
                )));
            }
            expected *= shape[i] as i128;
        }
    }
    if let Some(version) = optional("version")? {
        cai_int::<u32>("version", "a non-negative int (2 or 3)", &version)?;
    }
    let stream = match optional("stream")? {
        None => None,
        Some(s) => Some(cai_int::<usize>(
            "stream",
            "None or a non-negative int (a CUstream handle)",
            &s,
        )?),
    };
    if ptr == 0 && nbytes > 0 {
        return Err(PyValueError::new_err(format!(
            "__cuda_array_interface__['data'] of {} is a null pointer for {nbytes} bytes",
            type_name(obj)
        )));
    }
    if access == Access::Fill && read_only {
        return Err(read_only_error(obj));
    }
    let span = route(py, ptr, nbytes, None)?;
    // Version 3: work queued on `stream` may still be producing the data.
    let wait = match stream {
        Some(stream) => order_pending(py, span, stream, pending)?,
        None => None,
    };
    Ok(Intake {
        span,
        keepalive: Box::new(obj.clone().unbind()),
        wait,
    })
}

/// `gpu`: for GPU memory, what to do about the producer's pending work (the producer is
/// asked to order it before [`Pending::dlpack_stream`]); `None` for host memory, where no
/// stream is named.
fn from_dlpack(obj: &Bound<'_, PyAny>, access: Access, gpu: Option<Pending>) -> PyResult<Intake> {
    let py = obj.py();
    let kwargs = PyDict::new(py);
    if let Some(pending) = gpu {
        kwargs.set_item("stream", pending.dlpack_stream())?;
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
        // (`route` checks device pointers.)
        plausible_extent(imported.ptr, imported.nbytes)?;
        // SAFETY: host memory of `nbytes` bytes, as the capsule states; the capsule keeps
        // the producer's tensor alive with the span.
        Span::Host(unsafe { HostSpan::new(imported.ptr as *mut u8, imported.nbytes) })
    } else {
        let hint =
            (imported.device_type == DEVICE_CUDA).then_some(imported.device_id.max(0) as usize);
        route(py, imported.ptr, imported.nbytes, hint)?
    };
    // Asked to order its work before the legacy default stream: wait for that (now or,
    // deferred, in the caller's call). (Asked to order it before a stream-ordered call's
    // stream, the producer has done all there is.)
    let legacy = Pending::Wait.dlpack_stream() as usize;
    let wait = match gpu {
        Some(pending @ (Pending::Wait | Pending::Deferred)) => {
            order_pending(py, span, legacy, pending)?
        }
        _ => None,
    };
    Ok(Intake {
        span,
        // The unconsumed capsule owns the producer's tensor until it is dropped.
        keepalive: Box::new(capsule.unbind()),
        wait,
    })
}

/// Validate `obj` as a buffer the way every I/O call does, without any I/O, and return
/// its size in bytes: lets callers refuse bad input before they create or truncate a file.
#[boundary]
#[pyfunction]
#[pyo3(signature = (obj, writable = false))]
pub fn buffer_nbytes(obj: &Bound<'_, PyAny>, writable: bool) -> PyResult<usize> {
    let access = if writable {
        Access::Fill
    } else {
        Access::Drain
    };
    Ok(intake(obj, access)?.span.len())
}

/// Validate `obj` as a buffer a file write takes, as [`buffer_nbytes`] does, without any
/// I/O, and return where its memory lies: `(address, nbytes, ordinal)`, `ordinal` the GPU
/// it is on (`None` for host memory, pinned memory included). Lets callers find buffers
/// that share memory before they create a file.
#[boundary]
#[pyfunction]
pub fn buffer_extent(obj: &Bound<'_, PyAny>) -> PyResult<(u64, usize, Option<usize>)> {
    let span = intake(obj, Access::Drain)?.span;
    let address = match span {
        Span::Host(host) => host.as_ptr() as u64,
        Span::Device(device) => device.ptr,
    };
    Ok((address, span.len(), span.ordinal()))
}

/// An integer argument of an entry point (an offset, a size, a count), for
/// `#[pyo3(from_py_with = int_arg)]`: whatever `operator.index` takes (ints, numpy
/// integers, objects with `__index__`) except `bool`, which is a `TypeError` as floats,
/// strings and `None` are (Python's rule for a number of bytes). An int beyond `i64` is an
/// `OverflowError` saying so. Over pyo3's own `i64` extraction this costs one
/// type-pointer comparison, and nothing more on success.
pub fn int_arg(obj: &Bound<'_, PyAny>) -> PyResult<i64> {
    if obj.is_instance_of::<PyBool>() {
        return Err(PyTypeError::new_err(format!(
            "expected an integer number of bytes, got the bool {obj}; pass an int"
        )));
    }
    match obj.extract::<i64>() {
        Ok(value) => Ok(value),
        // Below -2**63 is negative before it is out of range, as `kvikpy._args` says.
        Err(e) if e.is_instance_of::<PyOverflowError>(obj.py()) && obj.lt(0)? => {
            Err(PyValueError::new_err(format!(
                "{obj} is negative: offsets, sizes and counts must be non-negative"
            )))
        }
        Err(e) if e.is_instance_of::<PyOverflowError>(obj.py()) => {
            Err(PyOverflowError::new_err(format!(
                "{obj} is out of range: offsets, sizes and counts are at most 2**63 - 1 ({})",
                i64::MAX
            )))
        }
        Err(e) => Err(e),
    }
}

/// [`int_arg`] for an argument that may be `None`.
pub fn opt_int_arg(obj: &Bound<'_, PyAny>) -> PyResult<Option<i64>> {
    if obj.is_none() {
        return Ok(None);
    }
    int_arg(obj).map(Some)
}

/// Convert a Python file offset, rejecting negatives with a clear message.
pub fn file_offset(offset: i64) -> PyResult<u64> {
    non_negative("file_offset", offset)
}

/// `value` as a byte count or offset, or a `ValueError` naming the argument `name`.
pub fn non_negative(name: &str, value: i64) -> PyResult<u64> {
    u64::try_from(value)
        .map_err(|_| PyValueError::new_err(format!("{name} must be non-negative, got {value}")))
}
