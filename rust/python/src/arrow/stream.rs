//! The Arrow C stream and C device stream interfaces over a Python iterator of kvikpy
//! buffers (`iter_chunks`): the callbacks, written once for both stream structs, and their
//! capsules.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};

use arrow_schema::ffi::FFI_ArrowSchema;
use arrow_schema::{DataType, Field, Fields};
use kvikpy_macros::boundary;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;

use crate::arrow_c::{
    build_array, capsule, ffi_type, ArrayExport, ArrowArray, ArrowArrayStream, ArrowDeviceArray,
    ArrowDeviceArrayStream, StreamStruct, ARRAY, ARROW_DEVICE_CPU, ARROW_DEVICE_CUDA, DEVICE_ARRAY,
    SCHEMA,
};

/// What a stream owns: the Python iterator of buffers, the stream's schema, and the last
/// error's text.
struct StreamPrivate {
    iterator: Py<PyAny>,
    schema: DataType,
    /// The schema's key/value metadata (a table's), empty for chunk streams.
    metadata: HashMap<String, String>,
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
        let schema = ffi_type(&private.schema);
        let schema = match &private.metadata {
            m if m.is_empty() => schema,
            m => schema.and_then(|s| s.with_metadata(m.clone())),
        };
        match schema {
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
    let buffer: PyRef<'_, crate::buffer::Buffer> = item.extract()?;
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
            dictionary: None,
            owner: Box::new(()),
        },
        _ => chunk,
    };
    let (array, _) = build_array(export, None);
    // SAFETY: `out` is the consumer's uninitialised array, which it now owns.
    unsafe { std::ptr::write(out, array) };
    Ok(())
}

unsafe extern "C" fn table_stream_get_next(
    stream: *mut ArrowArrayStream,
    out: *mut ArrowArray,
) -> c_int {
    stream_next(stream, out.is_null(), |py, iterator, _| {
        match next_item(py, iterator)? {
            Some(item) => move_host_array(py, &item, out),
            None => {
                // SAFETY: `out` is the consumer's array to fill; all-zero is a released array.
                unsafe { std::ptr::write_bytes(out, 0, 1) };
                Ok(())
            }
        }
    })
}

/// Move the array of `item`'s `__arrow_c_array__` (a table's record batch) into `out`.
fn move_host_array(py: Python<'_>, item: &Bound<'_, PyAny>, out: *mut ArrowArray) -> PyResult<()> {
    let (_, capsule) = item
        .call_method0("__arrow_c_array__")?
        .extract::<(Py<PyAny>, Py<PyAny>)>()?;
    let capsule = capsule.bind(py);
    // SAFETY: the GIL is held; PyCapsule_GetPointer checks the capsule's name.
    let p =
        unsafe { ffi::PyCapsule_GetPointer(capsule.as_ptr(), ARRAY.as_ptr()) }.cast::<ArrowArray>();
    if p.is_null() {
        return Err(PyErr::fetch(py));
    }
    // SAFETY: an `arrow_array` capsule holds a live `ArrowArray`, kept alive by `capsule`.
    let array = unsafe { &mut *p };
    // SAFETY: `out` is the consumer's array to fill, apart from the capsule's struct.
    unsafe { std::ptr::copy_nonoverlapping(std::ptr::from_ref(array), out, 1) };
    // Moved: the capsule's destructor now frees only the emptied struct.
    array.release = None;
    array.private_data = std::ptr::null_mut();
    Ok(())
}

/// An Arrow C (device) stream capsule of `schema` over `iterator`, whose items export
/// `__arrow_c_device_array__` (with `device`: a device stream on the GPU when `on_gpu`)
/// or `__arrow_c_array__` (a host stream).
pub fn typed_stream_capsule(
    py: Python<'_>,
    iterator: Bound<'_, PyAny>,
    schema: DataType,
    metadata: HashMap<String, String>,
    device: bool,
    on_gpu: bool,
) -> PyResult<Py<PyAny>> {
    if device {
        stream_capsule(py, iterator, schema, metadata, |private_data| {
            device_stream(private_data, on_gpu)
        })
    } else {
        stream_capsule(py, iterator, schema, metadata, |private_data| {
            host_stream(private_data, table_stream_get_next)
        })
    }
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
    metadata: HashMap<String, String>,
    make: impl FnOnce(*mut c_void) -> S,
) -> PyResult<Py<PyAny>> {
    let private = Box::new(StreamPrivate {
        iterator: iterator.unbind(),
        schema,
        metadata,
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
    stream_capsule(
        py,
        iterator,
        DataType::UInt8,
        HashMap::new(),
        |private_data| device_stream(private_data, on_gpu),
    )
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
    stream_capsule(py, iterator, schema, HashMap::new(), |private_data| {
        host_stream(private_data, host_stream_get_next)
    })
}

/// A host stream over `private_data` whose arrays `get_next` hands out.
fn host_stream(
    private_data: *mut c_void,
    get_next: unsafe extern "C" fn(*mut ArrowArrayStream, *mut ArrowArray) -> c_int,
) -> ArrowArrayStream {
    ArrowArrayStream {
        get_schema: Some(stream_get_schema::<ArrowArrayStream>),
        get_next: Some(get_next),
        get_last_error: Some(stream_get_last_error::<ArrowArrayStream>),
        release: Some(stream_release::<ArrowArrayStream>),
        private_data,
    }
}

/// A device stream over `private_data` whose arrays live on the GPU (`on_gpu`) or the host.
fn device_stream(private_data: *mut c_void, on_gpu: bool) -> ArrowDeviceArrayStream {
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
}
