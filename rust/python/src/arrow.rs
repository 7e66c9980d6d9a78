//! The Arrow C Data, C Device Data and C (Device) Stream interfaces for kvikpy buffers, as
//! PyCapsules (`arrow_schema`, `arrow_array`, `arrow_device_array`, `arrow_array_stream`,
//! `arrow_device_array_stream`): a buffer becomes an Arrow array of its dtype (nested
//! fixed-size lists for 2-D and higher shapes) without a copy, on the host or on its GPU.
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
use arrow_schema::{DataType, Field, Fields};
use kvikpy_core::cuda::{DeviceAllocation, StreamEvent};
use pyo3::exceptions::{PyNotImplementedError, PyRuntimeError, PyTypeError, PyValueError};
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
    /// The child arrays (each with its own release and owner, so a consumer may move one
    /// out), and the pointers `ArrowArray::children` points at.
    children: Vec<ArrowArray>,
    child_pointers: Vec<*mut ArrowArray>,
    /// The event consumers wait on (device arrays), and the handle `sync_event` points at.
    _event: Option<StreamEvent>,
    event_handle: Box<usize>,
    /// Keeps the memory alive.
    _owner: Box<dyn std::any::Any + Send>,
}

impl Drop for ArrayPrivate {
    fn drop(&mut self) {
        for child in &mut self.children {
            // SAFETY: each child was made by `build_array`; one a consumer moved out has
            // its release cleared here, so `release_array` leaves it alone.
            unsafe { release_array(child) };
        }
    }
}

/// An Arrow array to export: its element count, buffers, children and what keeps them
/// alive.
pub struct ArrayExport {
    pub format: DataType,
    pub length: i64,
    /// Elements marked null in the validity buffer (0 when there is none).
    pub null_count: i64,
    /// Buffer addresses in Arrow's order (validity first, may be null).
    pub buffers: Vec<u64>,
    /// Child arrays (a fixed-size list's values, a struct's columns).
    pub children: Vec<ArrayExport>,
    pub owner: Box<dyn std::any::Any + Send>,
}

/// The Arrow type of one element of a buffer, from its DLPack type code and bit width and
/// its numpy typestr (for the byte order). Booleans (one byte each) export as `uint8`:
/// Arrow's boolean is bit-packed, which would need a copy.
pub fn element_type(code: u8, bits: u8, typestr: &str) -> PyResult<DataType> {
    let (other, order) = if cfg!(target_endian = "little") {
        (b'>', "little")
    } else {
        (b'<', "big")
    };
    if bits > 8 && typestr.as_bytes().first() == Some(&other) {
        return Err(PyTypeError::new_err(format!(
            "the buffer's items ({typestr:?}) are not in this machine's byte order, and \
             Arrow arrays hold items in it ({order}-endian); read with the native dtype \
             and swap the bytes (numpy's byteswap), or read with dtype='uint8' to export \
             the bytes"
        )));
    }
    Ok(match (code, bits) {
        (0, 8) => DataType::Int8,
        (0, 16) => DataType::Int16,
        (0, 32) => DataType::Int32,
        (0, 64) => DataType::Int64,
        (1, 8) | (6, 8) => DataType::UInt8,
        (1, 16) => DataType::UInt16,
        (1, 32) => DataType::UInt32,
        (1, 64) => DataType::UInt64,
        (2, 16) => DataType::Float16,
        (2, 32) => DataType::Float32,
        (2, 64) => DataType::Float64,
        (5, bits) => {
            return Err(PyTypeError::new_err(format!(
                "complex{bits} has no Arrow type (Arrow has no complex numbers); read with \
                 dtype='float{}' and a shape ending in 2 to export (real, imaginary) \
                 pairs as a fixed-size list, or with dtype='uint8' to export the bytes",
                bits / 2
            )))
        }
        (code, bits) => {
            let kind = match code {
                0 => "int".to_owned(),
                1 => "uint".to_owned(),
                2 => "float".to_owned(),
                4 => "bfloat".to_owned(),
                6 => "bool".to_owned(),
                _ => format!("DLPack type code {code}, bits "),
            };
            return Err(PyTypeError::new_err(format!(
                "{kind}{bits} ({typestr:?}) has no Arrow type; read with dtype='uint8' to \
                 export the bytes"
            )));
        }
    })
}

/// The Arrow type of a buffer of `element`s with `shape`: the element type for 0-D and
/// 1-D buffers (a 0-D buffer is one element long), nested fixed-size lists of it for
/// more dimensions, one level per dimension after the first, so `(n, a, b)` becomes
/// `fixed_size_list<fixed_size_list<element>[b]>[a]` of length `n`.
pub fn buffer_type(element: DataType, shape: &[i64]) -> PyResult<DataType> {
    let mut t = element;
    for &d in shape.iter().skip(1).rev() {
        let size = i32::try_from(d).map_err(|_| {
            PyValueError::new_err(format!(
                "dimension {d} of shape {shape:?} is longer than an Arrow fixed-size list \
                 can be (2^31 - 1); view the buffer with fewer, shorter inner dimensions"
            ))
        })?;
        t = DataType::FixedSizeList(Arc::new(Field::new_list_field(t, true)), size);
    }
    Ok(t)
}

/// The export of `length` values of type `format` whose elements start at `ptr`: a
/// primitive array, or a fixed-size list whose child holds `length * size` values. Every
/// level owns a reference to `owner`.
fn typed_level<T: Send + Sync + 'static>(
    format: &DataType,
    length: i64,
    ptr: u64,
    owner: &Arc<T>,
) -> PyResult<ArrayExport> {
    let (buffers, children) = match format {
        DataType::FixedSizeList(field, size) => {
            let values = length.checked_mul(i64::from(*size)).ok_or_else(|| {
                PyValueError::new_err(format!("{length} lists of {size} values overflow"))
            })?;
            (
                vec![0],
                vec![typed_level(field.data_type(), values, ptr, owner)?],
            )
        }
        _ => (vec![0, ptr], Vec::new()),
    };
    Ok(ArrayExport {
        format: format.clone(),
        length,
        null_count: 0,
        buffers,
        children,
        owner: Box::new(Arc::clone(owner)),
    })
}

/// The typed Arrow export of a buffer's memory at `ptr` (see [`element_type`] and
/// [`buffer_type`]), kept alive by `owner`; no copy.
pub fn buffer_export<T: Send + Sync + 'static>(
    ptr: u64,
    (code, bits, typestr): (u8, u8, &str),
    shape: &[i64],
    owner: &Arc<T>,
) -> PyResult<ArrayExport> {
    let format = buffer_type(element_type(code, bits, typestr)?, shape)?;
    typed_level(&format, shape.first().copied().unwrap_or(1), ptr, owner)
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
    // The children stay where they are (the Vec is never resized), so pointers to them
    // stay valid while the private data lives.
    let mut children: Vec<ArrowArray> = export
        .children
        .into_iter()
        .map(|child| build_array(child, None).0)
        .collect();
    let child_pointers = children.iter_mut().map(|c| c as *mut _).collect();
    let mut private = Box::new(ArrayPrivate {
        buffers: export.buffers.iter().map(|&p| p as *const c_void).collect(),
        children,
        child_pointers,
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
        n_children: private.children.len() as i64,
        buffers: private.buffers.as_mut_ptr(),
        children: if private.children.is_empty() {
            std::ptr::null_mut()
        } else {
            private.child_pointers.as_mut_ptr()
        },
        dictionary: std::ptr::null_mut(),
        release: Some(release_array),
        private_data: Box::into_raw(private).cast(),
    };
    (array, sync_event)
}

unsafe extern "C" fn destroy_schema(capsule: *mut ffi::PyObject) {
    // SAFETY: Python calls this with the GIL held on a capsule made in `schema_capsule`.
    let p = unsafe { ffi::PyCapsule_GetPointer(capsule, SCHEMA.as_ptr()) };
    if p.is_null() {
        // SAFETY: the GIL is held; this clears the error the failed lookup set.
        unsafe { ffi::PyErr_Clear() };
        return;
    }
    // SAFETY: the pointer is the Box leaked in `schema_capsule`, freed once, here.
    // Dropping it runs the schema's release callback unless a consumer moved the schema
    // out (release cleared).
    drop(unsafe { Box::from_raw(p.cast::<FFI_ArrowSchema>()) });
}

unsafe extern "C" fn destroy_array(capsule: *mut ffi::PyObject) {
    // SAFETY: Python calls this with the GIL held on a capsule made in `array_capsules`.
    let p = unsafe { ffi::PyCapsule_GetPointer(capsule, ARRAY.as_ptr()) }.cast::<ArrowArray>();
    if p.is_null() {
        // SAFETY: the GIL is held; this clears the error the failed lookup set.
        unsafe { ffi::PyErr_Clear() };
        return;
    }
    // SAFETY: `p` is the live array leaked in `array_capsules`; release does something
    // only if the consumer did not take the array over (release cleared).
    unsafe { release_array(p) };
    // SAFETY: `p` is the Box<ArrowArray> leaked in `array_capsules`, freed once, here.
    drop(unsafe { Box::from_raw(p) });
}

unsafe extern "C" fn destroy_device_array(capsule: *mut ffi::PyObject) {
    // SAFETY: Python calls this with the GIL held on a capsule made in
    // `device_array_capsules`.
    let p = unsafe { ffi::PyCapsule_GetPointer(capsule, DEVICE_ARRAY.as_ptr()) }
        .cast::<ArrowDeviceArray>();
    if p.is_null() {
        // SAFETY: the GIL is held; this clears the error the failed lookup set.
        unsafe { ffi::PyErr_Clear() };
        return;
    }
    // SAFETY: `p` is the live Box<ArrowDeviceArray> leaked in `device_array_capsules`;
    // this only takes the address of its array.
    let array = unsafe { &raw mut (*p).array };
    // SAFETY: `array` is live; release does something only if the consumer did not take
    // the array over (release cleared).
    unsafe { release_array(array) };
    // SAFETY: `p` is the Box leaked in `device_array_capsules`, freed once, here.
    drop(unsafe { Box::from_raw(p) });
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
        // SAFETY: the capsule was not made, so the live array is still ours to release.
        unsafe { release_array(ptr) };
        // SAFETY: the capsule was not made, so the Box is still ours to free, once.
        drop(unsafe { Box::from_raw(ptr) });
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
                children: Vec::new(),
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
            let event = crate::blocking::without_gil(py, move || {
                StreamEvent::record(ordinal, kvikpy_core::cuda::Stream::LEGACY)
            })?;
            let export = ArrayExport {
                format: DataType::LargeBinary,
                length: count as i64,
                null_count,
                buffers: vec![meta.bitmap_at.map_or(0, |at| base + at as u64), base, data],
                children: Vec::new(),
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
        // SAFETY: `ptr` is the live Box just leaked; this only takes its array's address.
        let inner = unsafe { &raw mut (*ptr).array };
        // SAFETY: the capsule was not made, so the live array is still ours to release.
        unsafe { release_array(inner) };
        // SAFETY: the capsule was not made, so the Box is still ours to free, once.
        drop(unsafe { Box::from_raw(ptr) });
    })?;
    Ok((schema, array))
}

const DEVICE_STREAM: &CStr = c"arrow_device_array_stream";
const STREAM: &CStr = c"arrow_array_stream";

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

/// `struct ArrowArrayStream` of the Arrow C stream interface (host memory).
#[repr(C)]
pub struct ArrowArrayStream {
    get_schema: Option<unsafe extern "C" fn(*mut ArrowArrayStream, *mut FFI_ArrowSchema) -> c_int>,
    get_next: Option<unsafe extern "C" fn(*mut ArrowArrayStream, *mut ArrowArray) -> c_int>,
    get_last_error: Option<unsafe extern "C" fn(*mut ArrowArrayStream) -> *const c_char>,
    release: Option<unsafe extern "C" fn(*mut ArrowArrayStream)>,
    private_data: *mut c_void,
}

const _: () = {
    assert!(std::mem::size_of::<ArrowDeviceArrayStream>() == 48);
    assert!(std::mem::offset_of!(ArrowDeviceArrayStream, get_schema) == 8);
    assert!(std::mem::offset_of!(ArrowDeviceArrayStream, private_data) == 40);
    assert!(std::mem::size_of::<ArrowArrayStream>() == 40);
    assert!(std::mem::offset_of!(ArrowArrayStream, release) == 24);
    assert!(std::mem::offset_of!(ArrowArrayStream, private_data) == 32);
};

/// What the two stream structs share, for the callbacks written once for both.
trait StreamStruct: Sized {
    /// The capsule name.
    const NAME: &'static CStr;
    fn private_data(&mut self) -> &mut *mut c_void;
    fn is_released(&self) -> bool;
    fn mark_released(&mut self);
}

/// Both stream structs keep `private_data` and `release` under the same names.
macro_rules! stream_struct {
    ($type:ty, $name:expr) => {
        impl StreamStruct for $type {
            const NAME: &'static CStr = $name;
            fn private_data(&mut self) -> &mut *mut c_void {
                &mut self.private_data
            }
            fn is_released(&self) -> bool {
                self.release.is_none()
            }
            fn mark_released(&mut self) {
                self.release = None;
            }
        }
    };
}

stream_struct!(ArrowDeviceArrayStream, DEVICE_STREAM);
stream_struct!(ArrowArrayStream, STREAM);

/// What a stream owns: the Python iterator of buffers, the stream's schema, and the last
/// error's text.
struct StreamPrivate {
    iterator: Py<PyAny>,
    schema: DataType,
    last_error: Option<CString>,
}

/// errno values the stream interface returns.
const EIO: c_int = 5;
const EINVAL: c_int = 22;

unsafe fn stream_private<'a, S: StreamStruct>(stream: *mut S) -> Option<&'a mut StreamPrivate> {
    // SAFETY: (caller) `stream` is null or a live stream made by `stream_capsule`.
    let stream = unsafe { stream.as_mut() }?;
    let private = (*stream.private_data()).cast::<StreamPrivate>();
    // SAFETY: (caller) a stream made by `stream_capsule` has as private data a live
    // `StreamPrivate` until release, and null after.
    unsafe { private.as_mut() }
}

unsafe extern "C" fn stream_get_schema<S: StreamStruct>(
    stream: *mut S,
    out: *mut FFI_ArrowSchema,
) -> c_int {
    catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: the consumer passes the stream it was given.
        let Some(private) = (unsafe { stream_private(stream) }) else {
            return EINVAL;
        };
        if out.is_null() {
            return EINVAL;
        }
        match FFI_ArrowSchema::try_from(&private.schema) {
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

/// The body of both `get_next` callbacks: find the stream's private data, run `next`
/// with the GIL, and keep an error's text for `get_last_error`.
fn stream_next<S: StreamStruct>(
    stream: *mut S,
    out_is_null: bool,
    next: impl FnOnce(Python<'_>, &Bound<'_, PyAny>, &DataType) -> PyResult<()>,
) -> c_int {
    catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: the consumer passes the stream it was given.
        let Some(private) = (unsafe { stream_private(stream) }) else {
            return EINVAL;
        };
        if out_is_null {
            return EINVAL;
        }
        Python::attach(
            |py| match next(py, private.iterator.bind(py), &private.schema) {
                Ok(()) => 0,
                Err(e) => {
                    let text = e.to_string().replace('\0', " ");
                    private.last_error = CString::new(text).ok();
                    EIO
                }
            },
        )
    }))
    .unwrap_or(EIO)
}

unsafe extern "C" fn device_stream_get_next(
    stream: *mut ArrowDeviceArrayStream,
    out: *mut ArrowDeviceArray,
) -> c_int {
    stream_next(stream, out.is_null(), |py, iterator, _| {
        next_device_array(py, iterator, out)
    })
}

unsafe extern "C" fn host_stream_get_next(
    stream: *mut ArrowArrayStream,
    out: *mut ArrowArray,
) -> c_int {
    stream_next(stream, out.is_null(), |py, iterator, schema| {
        next_host_array(py, iterator, schema, out)
    })
}

/// The iterator's next item, or None at its end.
fn next_item<'py>(
    py: Python<'py>,
    iterator: &Bound<'py, PyAny>,
) -> PyResult<Option<Bound<'py, PyAny>>> {
    match iterator.call_method0("__next__") {
        Ok(item) => Ok(Some(item)),
        Err(e) if e.is_instance_of::<pyo3::exceptions::PyStopIteration>(py) => Ok(None),
        Err(e) => Err(e),
    }
}

/// Advance the iterator and move the next chunk's device array into `out`; at the end,
/// a released (zeroed) array, as the interface signals end of stream.
fn next_device_array(
    py: Python<'_>,
    iterator: &Bound<'_, PyAny>,
    out: *mut ArrowDeviceArray,
) -> PyResult<()> {
    let Some(item) = next_item(py, iterator)? else {
        // SAFETY: `out` is the consumer's array to fill; all-zero is a released array.
        unsafe { std::ptr::write_bytes(out, 0, 1) };
        return Ok(());
    };
    let (_, capsule) = item
        .call_method0("__arrow_c_device_array__")?
        .extract::<(Py<PyAny>, Py<PyAny>)>()?;
    let capsule = capsule.bind(py);
    // SAFETY: the GIL is held; PyCapsule_GetPointer checks the object is a capsule of
    // that name, setting an error otherwise.
    let p = unsafe { ffi::PyCapsule_GetPointer(capsule.as_ptr(), DEVICE_ARRAY.as_ptr()) }
        .cast::<ArrowDeviceArray>();
    if p.is_null() {
        return Err(PyErr::fetch(py));
    }
    // SAFETY: a capsule of that name was made by `device_array_capsules` and holds a live
    // `ArrowDeviceArray`; the capsule (held in `capsule`) keeps it alive, and nothing
    // else touches it while the GIL is held.
    let device = unsafe { &mut *p };
    // SAFETY: `out` is the consumer's array to fill, valid for one write and apart from
    // the capsule's struct.
    unsafe { std::ptr::copy_nonoverlapping(std::ptr::from_ref(device), out, 1) };
    // The struct is moved to `out`: with release cleared, the capsule's destructor only
    // frees the emptied struct and the consumer owns the array.
    device.array.release = None;
    device.array.private_data = std::ptr::null_mut();
    Ok(())
}

/// Advance the iterator (of host buffers) and write the next chunk's array into `out`:
/// the chunk's own array when the stream's schema is its type, or a struct array with it
/// as the one column; at the end, a released (zeroed) array.
fn next_host_array(
    py: Python<'_>,
    iterator: &Bound<'_, PyAny>,
    schema: &DataType,
    out: *mut ArrowArray,
) -> PyResult<()> {
    let Some(item) = next_item(py, iterator)? else {
        // SAFETY: `out` is the consumer's array to fill; all-zero is a released array.
        unsafe { std::ptr::write_bytes(out, 0, 1) };
        return Ok(());
    };
    let buffer: PyRef<'_, crate::memory::Buffer> = item.extract()?;
    if let (_, Some(ordinal), _) = buffer.parts() {
        return Err(pyo3::exceptions::PyBufferError::new_err(format!(
            "a chunk in the memory of GPU {ordinal} cannot go into an Arrow C stream (host \
             memory); use __arrow_c_device_stream__"
        )));
    }
    let chunk = buffer.arrow_export()?;
    let column = match schema {
        DataType::Struct(fields) if fields.len() == 1 => fields[0].data_type(),
        other => other,
    };
    if &chunk.format != column {
        return Err(PyTypeError::new_err(format!(
            "a chunk of Arrow type {} in a stream of {column}",
            chunk.format
        )));
    }
    let export = match schema {
        DataType::Struct(_) => ArrayExport {
            format: schema.clone(),
            length: chunk.length,
            null_count: 0,
            buffers: vec![0],
            children: vec![chunk],
            owner: Box::new(()),
        },
        _ => chunk,
    };
    let (array, _) = build_array(export, None);
    // SAFETY: `out` is the consumer's uninitialised array, which it now owns.
    unsafe { std::ptr::write(out, array) };
    Ok(())
}

unsafe extern "C" fn stream_get_last_error<S: StreamStruct>(stream: *mut S) -> *const c_char {
    // SAFETY: the consumer passes the stream it was given.
    match unsafe { stream_private(stream) } {
        Some(StreamPrivate {
            last_error: Some(text),
            ..
        }) => text.as_ptr(),
        _ => std::ptr::null(),
    }
}

unsafe extern "C" fn stream_release<S: StreamStruct>(stream: *mut S) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: the consumer passes the stream it was given; a released one is skipped.
        let Some(stream) = (unsafe { stream.as_mut() }) else {
            return;
        };
        if stream.is_released() {
            return;
        }
        let private =
            std::mem::replace(stream.private_data(), std::ptr::null_mut()).cast::<StreamPrivate>();
        stream.mark_released();
        if !private.is_null() {
            // SAFETY: the Box leaked in `stream_capsule`, freed once (release was
            // cleared above). Dropping the iterator needs the GIL.
            let private = unsafe { Box::from_raw(private) };
            Python::attach(|_| drop(private));
        }
    }));
}

unsafe extern "C" fn destroy_stream<S: StreamStruct>(capsule: *mut ffi::PyObject) {
    // SAFETY: Python calls this with the GIL held on a capsule made in `stream_capsule`.
    let p = unsafe { ffi::PyCapsule_GetPointer(capsule, S::NAME.as_ptr()) }.cast::<S>();
    if p.is_null() {
        // SAFETY: the GIL is held; this clears the error the failed lookup set.
        unsafe { ffi::PyErr_Clear() };
        return;
    }
    // SAFETY: `p` is the live stream leaked in `stream_capsule`; release does something
    // only if the consumer did not take the stream over (release cleared).
    unsafe { stream_release(p) };
    // SAFETY: `p` is the Box<S> leaked in `stream_capsule`, freed once, here.
    drop(unsafe { Box::from_raw(p) });
}

/// Put a stream struct, made by `make` around its private data, in a capsule.
fn stream_capsule<S: StreamStruct>(
    py: Python<'_>,
    iterator: Bound<'_, PyAny>,
    schema: DataType,
    make: impl FnOnce(*mut c_void) -> S,
) -> PyResult<Py<PyAny>> {
    let private = Box::new(StreamPrivate {
        iterator: iterator.unbind(),
        schema,
        last_error: None,
    });
    let ptr = Box::into_raw(Box::new(make(Box::into_raw(private).cast())));
    capsule(py, ptr.cast(), S::NAME, destroy_stream::<S>, || {
        // SAFETY: the capsule was not made, so the live stream is still ours to release.
        unsafe { stream_release(ptr) };
        // SAFETY: the capsule was not made, so the Box is still ours to free, once.
        drop(unsafe { Box::from_raw(ptr) });
    })
}

/// An `arrow_device_array_stream` capsule over `iterator`, a Python iterator of kvikpy
/// `uint8` buffers on device type `device_type` (`ARROW_DEVICE_CUDA` or
/// `ARROW_DEVICE_CPU`): each `get_next` advances the iterator and hands over the next
/// chunk's array.
#[boundary]
#[pyfunction]
#[pyo3(signature = (iterator, on_gpu))]
pub fn device_stream_capsule(
    py: Python<'_>,
    iterator: Bound<'_, PyAny>,
    on_gpu: bool,
) -> PyResult<Py<PyAny>> {
    stream_capsule(py, iterator, DataType::UInt8, |private_data| {
        ArrowDeviceArrayStream {
            device_type: if on_gpu {
                ARROW_DEVICE_CUDA
            } else {
                ARROW_DEVICE_CPU
            },
            get_schema: Some(stream_get_schema::<ArrowDeviceArrayStream>),
            get_next: Some(device_stream_get_next),
            get_last_error: Some(stream_get_last_error::<ArrowDeviceArrayStream>),
            release: Some(stream_release::<ArrowDeviceArrayStream>),
            private_data,
        }
    })
}

/// The format string of an `arrow_schema` capsule, or a TypeError for anything else.
fn requested_format(py: Python<'_>, requested: &Bound<'_, PyAny>) -> PyResult<String> {
    // SAFETY: the GIL is held; PyCapsule_GetPointer checks the object is a capsule of
    // that name, setting an error otherwise.
    let p = unsafe { ffi::PyCapsule_GetPointer(requested.as_ptr(), SCHEMA.as_ptr()) };
    if p.is_null() {
        let cause = PyErr::fetch(py);
        let e = PyTypeError::new_err(format!(
            "requested_schema must be an arrow_schema capsule or None, got {}",
            requested.get_type().name()?
        ));
        e.set_cause(py, Some(cause));
        return Err(e);
    }
    // SAFETY: such a capsule holds a `struct ArrowSchema`, whose first field is its
    // format, a C string pointer, live while the capsule is.
    let format = unsafe { *p.cast::<*const c_char>() };
    if format.is_null() {
        return Err(PyValueError::new_err(
            "requested_schema is a released arrow_schema",
        ));
    }
    // SAFETY: a format not yet released is a NUL-terminated C string, live while the
    // capsule (borrowed as `requested`) is.
    Ok(unsafe { CStr::from_ptr(format) }
        .to_string_lossy()
        .into_owned())
}

/// The schema of a host chunk stream by default: a struct (a record batch) of one
/// `uint8` column, `bytes`.
fn chunk_struct() -> DataType {
    DataType::Struct(Fields::from(vec![Field::new(
        "bytes",
        DataType::UInt8,
        false,
    )]))
}

/// An `arrow_array_stream` capsule (the Arrow C stream interface) over `iterator`, a
/// Python iterator of host `uint8` buffers: record batches of one `uint8` column,
/// `bytes`, one per chunk, or plain `uint8` arrays when `requested_schema` asks for
/// `uint8`. Each `get_next` advances the iterator and hands over the next chunk.
#[boundary]
#[pyfunction]
#[pyo3(signature = (iterator, requested_schema=None))]
pub fn host_stream_capsule(
    py: Python<'_>,
    iterator: Bound<'_, PyAny>,
    requested_schema: Option<&Bound<'_, PyAny>>,
) -> PyResult<Py<PyAny>> {
    let schema = match requested_schema {
        Some(r) if !r.is_none() && requested_format(py, r)? == "C" => DataType::UInt8,
        _ => chunk_struct(),
    };
    stream_capsule(py, iterator, schema, |private_data| ArrowArrayStream {
        get_schema: Some(stream_get_schema::<ArrowArrayStream>),
        get_next: Some(host_stream_get_next),
        get_last_error: Some(stream_get_last_error::<ArrowArrayStream>),
        release: Some(stream_release::<ArrowArrayStream>),
        private_data,
    })
}
