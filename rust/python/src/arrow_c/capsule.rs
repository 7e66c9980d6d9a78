//! Arrow arrays and schemas in PyCapsules named as the PyCapsule interface says, freed by
//! the capsule's destructor unless a consumer took them over; and the check of the
//! protocol methods' keywords.

use std::ffi::{c_void, CStr};

use arrow_schema::ffi::FFI_ArrowSchema;
use arrow_schema::DataType;
use kvikpy_core::cuda::StreamEvent;
use kvikpy_macros::boundary;
use pyo3::exceptions::{PyNotImplementedError, PyRuntimeError};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::PyDict;

use super::c_abi::{ArrowArray, ArrowDeviceArray, ARRAY, DEVICE_ARRAY, SCHEMA};
use super::export::{build_array, release_array, ArrayExport};

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
pub fn capsule(
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
    let schema = super::types::ffi_type(format)
        .map_err(|e| PyRuntimeError::new_err(format!("cannot describe {format} to Arrow: {e}")))?;
    ffi_schema_capsule(py, schema)
}

/// An `arrow_schema` capsule owning `schema` (released by the capsule's destructor).
pub fn ffi_schema_capsule(py: Python<'_>, schema: FFI_ArrowSchema) -> PyResult<Py<PyAny>> {
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
