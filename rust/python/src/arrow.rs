//! The Arrow C Data and C Device Data interfaces for kvikpy buffers, as PyCapsules
//! (`arrow_schema`, `arrow_array`, `arrow_device_array`): a buffer's bytes become an Arrow
//! `uint8` array without a copy, on the host or on its GPU.
//!
//! The schema comes from arrow-rs (`FFI_ArrowSchema`); arrow-rs has no device interface,
//! so the array structs are declared here, with their layout checked at compile time.
//! Release callbacks may run on any thread, without the GIL, in any order relative to the
//! capsules: each owns only Rust values (the storage `Arc`, an event).

use kvikpy_macros::boundary;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use arrow_schema::ffi::FFI_ArrowSchema;
use arrow_schema::DataType;
use kvikpy_core::cuda::{DeviceAllocation, StreamEvent};
use pyo3::exceptions::{PyNotImplementedError, PyRuntimeError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyDict;

const SCHEMA: &CStr = c"arrow_schema";
const ARRAY: &CStr = c"arrow_array";
const DEVICE_ARRAY: &CStr = c"arrow_device_array";

/// `ARROW_DEVICE_CPU`.
pub const ARROW_DEVICE_CPU: i32 = 1;
/// `ARROW_DEVICE_CUDA`.
pub const ARROW_DEVICE_CUDA: i32 = 2;

/// `struct ArrowArray` of the Arrow C data interface.
#[repr(C)]
pub struct ArrowArray {
    length: i64,
    null_count: i64,
    offset: i64,
    n_buffers: i64,
    n_children: i64,
    buffers: *mut *const c_void,
    children: *mut *mut ArrowArray,
    dictionary: *mut ArrowArray,
    release: Option<unsafe extern "C" fn(*mut ArrowArray)>,
    private_data: *mut c_void,
}

/// `struct ArrowDeviceArray` of the Arrow C device data interface.
#[repr(C)]
pub struct ArrowDeviceArray {
    array: ArrowArray,
    device_id: i64,
    device_type: i32,
    sync_event: *mut c_void,
    reserved: [i64; 3],
}

// The layouts the C headers define on 64-bit platforms.
const _: () = {
    assert!(std::mem::size_of::<ArrowArray>() == 80);
    assert!(std::mem::offset_of!(ArrowArray, buffers) == 40);
    assert!(std::mem::offset_of!(ArrowArray, release) == 64);
    assert!(std::mem::size_of::<ArrowDeviceArray>() == 128);
    assert!(std::mem::offset_of!(ArrowDeviceArray, device_id) == 80);
    assert!(std::mem::offset_of!(ArrowDeviceArray, device_type) == 88);
    assert!(std::mem::offset_of!(ArrowDeviceArray, sync_event) == 96);
    assert!(std::mem::offset_of!(ArrowDeviceArray, reserved) == 104);
};

/// What an exported array owns until its release callback runs.
struct ArrayPrivate {
    /// Buffer pointers; `ArrowArray::buffers` points here.
    buffers: Vec<*const c_void>,
    /// The event consumers wait on (device arrays), and the handle `sync_event` points at.
    _event: Option<StreamEvent>,
    event_handle: Box<usize>,
    /// Keeps the memory alive.
    _owner: Box<dyn std::any::Any + Send>,
}

/// An Arrow array to export: its element count, buffers and what keeps them alive.
pub struct ArrayExport {
    pub format: DataType,
    pub length: i64,
    /// Elements marked null in the validity buffer (0 when there is none).
    pub null_count: i64,
    /// Buffer addresses in Arrow's order (validity first, may be null).
    pub buffers: Vec<u64>,
    pub owner: Box<dyn std::any::Any + Send>,
}

unsafe extern "C" fn release_array(array: *mut ArrowArray) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: consumers call release with the array they were given; a released or
        // null one is left alone, so a second call does nothing.
        let Some(array) = (unsafe { array.as_mut() }) else {
            return;
        };
        if array.release.is_none() {
            return;
        }
        // SAFETY: `private_data` is the `Box<ArrayPrivate>` leaked in `build_array`, freed
        // only here, once (release is cleared below).
        drop(unsafe { Box::from_raw(array.private_data.cast::<ArrayPrivate>()) });
        array.private_data = std::ptr::null_mut();
        array.release = None;
    }));
}

fn build_array(export: ArrayExport, event: Option<StreamEvent>) -> (ArrowArray, *mut c_void) {
    let event_handle = Box::new(event.as_ref().map_or(0, StreamEvent::handle));
    let mut private = Box::new(ArrayPrivate {
        buffers: export.buffers.iter().map(|&p| p as *const c_void).collect(),
        _event: event,
        event_handle,
        _owner: export.owner,
    });
    let sync_event = if private._event.is_some() {
        (&mut *private.event_handle as *mut usize).cast::<c_void>()
    } else {
        std::ptr::null_mut()
    };
    let array = ArrowArray {
        length: export.length,
        null_count: export.null_count,
        offset: 0,
        n_buffers: private.buffers.len() as i64,
        n_children: 0,
        buffers: private.buffers.as_mut_ptr(),
        children: std::ptr::null_mut(),
        dictionary: std::ptr::null_mut(),
        release: Some(release_array),
        private_data: Box::into_raw(private).cast(),
    };
    (array, sync_event)
}

unsafe extern "C" fn destroy_schema(capsule: *mut ffi::PyObject) {
    // SAFETY: Python calls this with the GIL held on a capsule made in `schema_capsule`;
    // the pointer is the Box leaked there. Dropping it runs the schema's release callback
    // unless a consumer moved the schema out (release cleared).
    unsafe {
        let p = ffi::PyCapsule_GetPointer(capsule, SCHEMA.as_ptr());
        if !p.is_null() {
            drop(Box::from_raw(p.cast::<FFI_ArrowSchema>()));
        } else {
            ffi::PyErr_Clear();
        }
    }
}

unsafe extern "C" fn destroy_array(capsule: *mut ffi::PyObject) {
    // SAFETY: as in `destroy_schema`, for the Box<ArrowArray> leaked in `array_capsule`;
    // release runs only if the consumer did not take the array over.
    unsafe {
        let p = ffi::PyCapsule_GetPointer(capsule, ARRAY.as_ptr()).cast::<ArrowArray>();
        if p.is_null() {
            ffi::PyErr_Clear();
            return;
        }
        release_array(p);
        drop(Box::from_raw(p));
    }
}

unsafe extern "C" fn destroy_device_array(capsule: *mut ffi::PyObject) {
    // SAFETY: as in `destroy_array`, for the Box<ArrowDeviceArray>.
    unsafe {
        let p =
            ffi::PyCapsule_GetPointer(capsule, DEVICE_ARRAY.as_ptr()).cast::<ArrowDeviceArray>();
        if p.is_null() {
            ffi::PyErr_Clear();
            return;
        }
        release_array(&mut (*p).array);
        drop(Box::from_raw(p));
    }
}

/// Wrap a leaked Box in a capsule; on failure, `free` takes it back.
fn capsule(
    py: Python<'_>,
    ptr: *mut c_void,
    name: &'static CStr,
    destructor: unsafe extern "C" fn(*mut ffi::PyObject),
    free: impl FnOnce(),
) -> PyResult<Py<PyAny>> {
    // SAFETY: `ptr` is a leaked Box that the capsule owns from now on; `name` is static.
    let made = unsafe { ffi::PyCapsule_New(ptr, name.as_ptr(), Some(destructor)) };
    if made.is_null() {
        free();
        return Err(PyErr::fetch(py));
    }
    // SAFETY: PyCapsule_New returned a new reference.
    Ok(unsafe { Bound::from_owned_ptr(py, made) }.unbind())
}

/// An `arrow_schema` capsule for `format`.
pub fn schema_capsule(py: Python<'_>, format: &DataType) -> PyResult<Py<PyAny>> {
    let schema = FFI_ArrowSchema::try_from(format)
        .map_err(|e| PyRuntimeError::new_err(format!("cannot describe {format} to Arrow: {e}")))?;
    let ptr = Box::into_raw(Box::new(schema));
    capsule(py, ptr.cast(), SCHEMA, destroy_schema, || {
        // SAFETY: the capsule was not made, so the Box is still ours.
        drop(unsafe { Box::from_raw(ptr) })
    })
}

/// `(arrow_schema, arrow_array)` capsules of host memory.
pub fn array_capsules(py: Python<'_>, export: ArrayExport) -> PyResult<(Py<PyAny>, Py<PyAny>)> {
    let schema = schema_capsule(py, &export.format)?;
    let (array, _) = build_array(export, None);
    let ptr = Box::into_raw(Box::new(array));
    let array = capsule(py, ptr.cast(), ARRAY, destroy_array, || {
        // SAFETY: the capsule was not made: release and free the array ourselves.
        unsafe {
            release_array(ptr);
            drop(Box::from_raw(ptr));
        }
    })?;
    Ok((schema, array))
}

/// Refuse keyword arguments of an Arrow device protocol method (`method`) that this
/// version does not know, as the protocol asks (None values are allowed). Buffers call it
/// here; `Batch` and the chunk iterator call it from Python.
#[boundary]
#[pyfunction]
#[pyo3(signature = (method, kwargs=None))]
pub fn check_device_kwargs(method: &str, kwargs: Option<&Bound<'_, PyDict>>) -> PyResult<()> {
    if let Some(kwargs) = kwargs {
        for (key, value) in kwargs.iter() {
            if !value.is_none() {
                return Err(PyNotImplementedError::new_err(format!(
                    "{method} got the keyword {key}={}, which kvikpy does not support; pass \
                     it as None or leave it out",
                    value.repr()?
                )));
            }
        }
    }
    Ok(())
}

/// The schema of a batch's Arrow export (`large_binary`).
#[boundary]
#[pyfunction]
pub fn batch_schema(py: Python<'_>) -> PyResult<Py<PyAny>> {
    schema_capsule(py, &DataType::LargeBinary)
}

/// A batch's validity bitmap (bit set: valid), or None when no element failed.
fn validity_bits(count: usize, failed: &[usize]) -> Option<Vec<u8>> {
    (!failed.is_empty()).then(|| {
        let mut bits = vec![0xFFu8; count.div_ceil(8).max(1)];
        for &i in failed {
            bits[i / 8] &= !(1 << (i % 8));
        }
        bits
    })
}

/// A GPU batch's offsets and validity bitmap, uploaded once to the batch's GPU (the device
/// interface wants all of an array's buffers on one device) and shared by every export:
/// a batch never changes, so neither do they.
#[pyclass(module = "kvikpy._lib", frozen)]
pub struct BatchDeviceMeta {
    /// The offsets (8-byte items), then the bitmap, in one allocation.
    allocation: Arc<DeviceAllocation>,
    /// Where the bitmap starts, when some element failed.
    bitmap_at: Option<usize>,
}

/// Upload a GPU batch's offsets and validity bitmap (see [`BatchDeviceMeta`]).
#[boundary]
#[pyfunction]
pub fn batch_device_meta(
    py: Python<'_>,
    buffer: &crate::memory::Buffer,
    offsets: Vec<i64>,
    failed: Vec<usize>,
) -> PyResult<BatchDeviceMeta> {
    let (_, ordinal, _) = buffer.parts();
    let ordinal = ordinal.ok_or_else(|| {
        pyo3::exceptions::PyValueError::new_err("a host batch keeps its offsets on the host")
    })?;
    let count = offsets.len().saturating_sub(1);
    check_failed(count, &failed)?;
    let mut bytes: Vec<u8> = offsets.iter().flat_map(|o| o.to_le_bytes()).collect();
    let validity = validity_bits(count, &failed);
    let bitmap_at = validity.as_ref().map(|_| bytes.len());
    bytes.extend(validity.iter().flatten());
    let allocation = crate::blocking::without_gil(py, move || {
        let allocation = DeviceAllocation::new(ordinal, bytes.len())?;
        // SAFETY: `bytes` is live host memory and `allocation` a fresh allocation of the
        // same size; the copy has finished when the call returns.
        unsafe {
            kvikpy_core::cuda::copy_host_to_device(
                ordinal,
                allocation.ptr(),
                bytes.as_ptr(),
                bytes.len(),
            )?
        };
        Ok(allocation)
    })?;
    Ok(BatchDeviceMeta {
        allocation: Arc::new(allocation),
        bitmap_at,
    })
}

fn check_failed(count: usize, failed: &[usize]) -> PyResult<()> {
    match failed.iter().find(|&&i| i >= count) {
        Some(i) => Err(pyo3::exceptions::PyIndexError::new_err(format!(
            "failed element {i} of a batch of {count}"
        ))),
        None => Ok(()),
    }
}

/// Arrow `large_binary` export of a batch: one element per file or range (`offsets` has
/// one entry more than elements), `failed` elements null. `device` asks for an
/// `arrow_device_array`; a GPU batch needs its `meta` (offsets and bitmap on its GPU).
#[boundary]
#[pyfunction]
#[pyo3(signature = (buffer, offsets, failed, device, meta=None))]
pub fn batch_arrow(
    py: Python<'_>,
    buffer: &crate::memory::Buffer,
    offsets: Vec<i64>,
    failed: Vec<usize>,
    device: bool,
    meta: Option<&BatchDeviceMeta>,
) -> PyResult<(Py<PyAny>, Py<PyAny>)> {
    let count = offsets.len().saturating_sub(1);
    check_failed(count, &failed)?;
    let (data, ordinal, owner) = buffer.parts();
    let null_count = failed.len() as i64;
    match (ordinal, device) {
        (Some(_), false) => Err(pyo3::exceptions::PyBufferError::new_err(
            "this batch is in GPU memory, which the Arrow C data interface cannot describe; \
             use __arrow_c_device_array__, or read with device=\"cpu\"",
        )),
        (None, _) => {
            let offsets = offsets.into_boxed_slice();
            let validity = validity_bits(count, &failed).map(Vec::into_boxed_slice);
            let buffers = vec![
                validity.as_ref().map_or(0, |v| v.as_ptr() as u64),
                offsets.as_ptr() as u64,
                data,
            ];
            let export = ArrayExport {
                format: DataType::LargeBinary,
                length: count as i64,
                null_count,
                buffers,
                owner: Box::new((owner, offsets, validity)),
            };
            if device {
                device_array_capsules(py, export, ARROW_DEVICE_CPU, -1, None)
            } else {
                array_capsules(py, export)
            }
        }
        (Some(ordinal), true) => {
            let meta = meta.ok_or_else(|| {
                pyo3::exceptions::PyValueError::new_err(
                    "a GPU batch's export needs its offsets on the GPU (batch_device_meta)",
                )
            })?;
            let base = meta.allocation.ptr();
            let event = crate::blocking::without_gil(py, move || StreamEvent::record(ordinal, 0))?;
            let export = ArrayExport {
                format: DataType::LargeBinary,
                length: count as i64,
                null_count,
                buffers: vec![meta.bitmap_at.map_or(0, |at| base + at as u64), base, data],
                owner: Box::new((owner, Arc::clone(&meta.allocation))),
            };
            device_array_capsules(py, export, ARROW_DEVICE_CUDA, ordinal as i64, Some(event))
        }
    }
}

/// `(arrow_schema, arrow_device_array)` capsules. `event`, when given, is what consumers
/// must wait on before reading (its handle becomes `sync_event`).
pub fn device_array_capsules(
    py: Python<'_>,
    export: ArrayExport,
    device_type: i32,
    device_id: i64,
    event: Option<StreamEvent>,
) -> PyResult<(Py<PyAny>, Py<PyAny>)> {
    let schema = schema_capsule(py, &export.format)?;
    let (array, sync_event) = build_array(export, event);
    let device = Box::new(ArrowDeviceArray {
        array,
        device_id,
        device_type,
        sync_event,
        reserved: [0; 3],
    });
    let ptr = Box::into_raw(device);
    let array = capsule(py, ptr.cast(), DEVICE_ARRAY, destroy_device_array, || {
        // SAFETY: the capsule was not made: release and free the array ourselves.
        unsafe {
            release_array(&mut (*ptr).array);
            drop(Box::from_raw(ptr));
        }
    })?;
    Ok((schema, array))
}

const DEVICE_STREAM: &CStr = c"arrow_device_array_stream";

/// `struct ArrowDeviceArrayStream` of the Arrow C device stream interface.
#[repr(C)]
pub struct ArrowDeviceArrayStream {
    device_type: i32,
    get_schema:
        Option<unsafe extern "C" fn(*mut ArrowDeviceArrayStream, *mut FFI_ArrowSchema) -> c_int>,
    get_next:
        Option<unsafe extern "C" fn(*mut ArrowDeviceArrayStream, *mut ArrowDeviceArray) -> c_int>,
    get_last_error: Option<unsafe extern "C" fn(*mut ArrowDeviceArrayStream) -> *const c_char>,
    release: Option<unsafe extern "C" fn(*mut ArrowDeviceArrayStream)>,
    private_data: *mut c_void,
}

const _: () = {
    assert!(std::mem::size_of::<ArrowDeviceArrayStream>() == 48);
    assert!(std::mem::offset_of!(ArrowDeviceArrayStream, get_schema) == 8);
    assert!(std::mem::offset_of!(ArrowDeviceArrayStream, private_data) == 40);
};

/// What a stream owns: the Python iterator of buffers, and the last error's text.
struct StreamPrivate {
    iterator: Py<PyAny>,
    last_error: Option<CString>,
}

/// errno values the stream interface returns.
const EIO: c_int = 5;
const EINVAL: c_int = 22;

unsafe fn stream_private<'a>(stream: *mut ArrowDeviceArrayStream) -> Option<&'a mut StreamPrivate> {
    // SAFETY: (caller) `stream` is null or a stream made by `device_stream_capsule`,
    // whose private data is a live `StreamPrivate` until release.
    unsafe {
        stream
            .as_mut()?
            .private_data
            .cast::<StreamPrivate>()
            .as_mut()
    }
}

unsafe extern "C" fn stream_get_schema(
    stream: *mut ArrowDeviceArrayStream,
    out: *mut FFI_ArrowSchema,
) -> c_int {
    catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: the consumer passes the stream it was given.
        if out.is_null() || unsafe { stream_private(stream) }.is_none() {
            return EINVAL;
        }
        match FFI_ArrowSchema::try_from(&DataType::UInt8) {
            // SAFETY: `out` is the consumer's uninitialised schema, which it now owns.
            Ok(schema) => unsafe {
                std::ptr::write(out, schema);
                0
            },
            Err(_) => EIO,
        }
    }))
    .unwrap_or(EIO)
}

unsafe extern "C" fn stream_get_next(
    stream: *mut ArrowDeviceArrayStream,
    out: *mut ArrowDeviceArray,
) -> c_int {
    catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: the consumer passes the stream it was given.
        let Some(private) = (unsafe { stream_private(stream) }) else {
            return EINVAL;
        };
        if out.is_null() {
            return EINVAL;
        }
        Python::attach(|py| {
            let outcome = next_device_array(py, private.iterator.bind(py), out);
            match outcome {
                Ok(()) => 0,
                Err(e) => {
                    let text = e.to_string().replace('\0', " ");
                    private.last_error = CString::new(text).ok();
                    EIO
                }
            }
        })
    }))
    .unwrap_or(EIO)
}

/// Advance the iterator and move the next chunk's device array into `out`; at the end,
/// a released (zeroed) array, as the interface signals end of stream.
fn next_device_array(
    py: Python<'_>,
    iterator: &Bound<'_, PyAny>,
    out: *mut ArrowDeviceArray,
) -> PyResult<()> {
    let item = match iterator.call_method0("__next__") {
        Ok(item) => item,
        Err(e) if e.is_instance_of::<pyo3::exceptions::PyStopIteration>(py) => {
            // SAFETY: `out` is the consumer's array to fill; all-zero is a released array.
            unsafe { std::ptr::write_bytes(out, 0, 1) };
            return Ok(());
        }
        Err(e) => return Err(e),
    };
    let (_, capsule) = item
        .call_method0("__arrow_c_device_array__")?
        .extract::<(Py<PyAny>, Py<PyAny>)>()?;
    let capsule = capsule.bind(py);
    // SAFETY: the capsule was made by `device_array_capsules` (named as checked); its
    // struct is moved to `out` and its release cleared, so the capsule's destructor
    // only frees the emptied struct and the consumer owns the array.
    unsafe {
        let p = ffi::PyCapsule_GetPointer(capsule.as_ptr(), DEVICE_ARRAY.as_ptr())
            .cast::<ArrowDeviceArray>();
        if p.is_null() {
            return Err(PyErr::fetch(py));
        }
        std::ptr::copy_nonoverlapping(p, out, 1);
        (*p).array.release = None;
        (*p).array.private_data = std::ptr::null_mut();
    }
    Ok(())
}

unsafe extern "C" fn stream_get_last_error(stream: *mut ArrowDeviceArrayStream) -> *const c_char {
    // SAFETY: the consumer passes the stream it was given.
    match unsafe { stream_private(stream) } {
        Some(StreamPrivate {
            last_error: Some(text),
            ..
        }) => text.as_ptr(),
        _ => std::ptr::null(),
    }
}

unsafe extern "C" fn stream_release(stream: *mut ArrowDeviceArrayStream) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: the consumer passes the stream it was given; a released one is skipped.
        let Some(stream) = (unsafe { stream.as_mut() }) else {
            return;
        };
        if stream.release.is_none() {
            return;
        }
        let private = stream.private_data.cast::<StreamPrivate>();
        stream.private_data = std::ptr::null_mut();
        stream.release = None;
        if !private.is_null() {
            // SAFETY: the Box leaked in `device_stream_capsule`, freed once (release
            // was cleared above). Dropping the iterator needs the GIL.
            let private = unsafe { Box::from_raw(private) };
            Python::attach(|_| drop(private));
        }
    }));
}

unsafe extern "C" fn destroy_device_stream(capsule: *mut ffi::PyObject) {
    // SAFETY: as in `destroy_array`, for the Box<ArrowDeviceArrayStream>.
    unsafe {
        let p = ffi::PyCapsule_GetPointer(capsule, DEVICE_STREAM.as_ptr())
            .cast::<ArrowDeviceArrayStream>();
        if p.is_null() {
            ffi::PyErr_Clear();
            return;
        }
        stream_release(p);
        drop(Box::from_raw(p));
    }
}

/// An `arrow_device_array_stream` capsule over `iterator`, a Python iterator of kvikpy
/// buffers on device type `device_type` (`ARROW_DEVICE_CUDA` or `ARROW_DEVICE_CPU`):
/// each `get_next` advances the iterator and hands over the next chunk's array.
#[boundary]
#[pyfunction]
#[pyo3(signature = (iterator, on_gpu))]
pub fn device_stream_capsule(
    py: Python<'_>,
    iterator: Bound<'_, PyAny>,
    on_gpu: bool,
) -> PyResult<Py<PyAny>> {
    let private = Box::new(StreamPrivate {
        iterator: iterator.unbind(),
        last_error: None,
    });
    let stream = Box::new(ArrowDeviceArrayStream {
        device_type: if on_gpu {
            ARROW_DEVICE_CUDA
        } else {
            ARROW_DEVICE_CPU
        },
        get_schema: Some(stream_get_schema),
        get_next: Some(stream_get_next),
        get_last_error: Some(stream_get_last_error),
        release: Some(stream_release),
        private_data: Box::into_raw(private).cast(),
    });
    let ptr = Box::into_raw(stream);
    capsule(py, ptr.cast(), DEVICE_STREAM, destroy_device_stream, || {
        // SAFETY: the capsule was not made: release and free the stream ourselves.
        unsafe {
            stream_release(ptr);
            drop(Box::from_raw(ptr));
        }
    })
}
