//! `kvikpy.arrow.write_ipc`'s engine side: Arrow data handed over as PyCapsules (a C
//! stream or C device stream, or one C (device) array of a record batch) taken over,
//! described to the engine's IPC encoder (`kvikpy_core::arrow_ipc::FileEncoder`), and
//! written with each buffer's bytes straight from the memory they lie in (GPU or host).

use std::ffi::{c_char, CStr};
use std::path::PathBuf;

use arrow_schema::ffi::FFI_ArrowSchema;
use arrow_schema::{DataType, Schema};
use kvikpy_core::arrow_ipc::{check_schema, write_file, ArrayIn, FileEncoder, Memory};
use kvikpy_core::cancel::CancelToken;
use kvikpy_macros::boundary;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;

use crate::arrow_c::{
    ArrowArray, ArrowArrayStream, ArrowDeviceArray, ArrowDeviceArrayStream, StreamStruct, ARRAY,
    ARROW_DEVICE_CPU, ARROW_DEVICE_CUDA, DEVICE_ARRAY, DEVICE_STREAM, SCHEMA, STREAM,
};
use crate::blocking::interruptible_alone;
use crate::errors::{BindResult, UnsupportedOperationError};

/// `ARROW_DEVICE_CUDA_HOST` (pinned host memory).
const ARROW_DEVICE_CUDA_HOST: i32 = 3;
/// `ARROW_DEVICE_CUDA_MANAGED`.
const ARROW_DEVICE_CUDA_MANAGED: i32 = 13;

/// Arrays taken over from a producer, released (by their own callbacks) when dropped.
struct Held(Vec<ArrowArray>);

// SAFETY: the Arrow C data interface lets an array's release callback run on any thread;
// the arrays are only read (through their buffers' addresses) until they are released.
unsafe impl Send for Held {}

impl Drop for Held {
    fn drop(&mut self) {
        for a in &mut self.0 {
            if let Some(release) = a.release {
                // SAFETY: the array was moved out of its capsule or stream (its release
                // cleared there): this is its one owner, releasing it once.
                unsafe { release(a) };
            }
        }
    }
}

/// Take the struct at `p` over: a bitwise copy, with the original's release cleared so
/// that its capsule no longer frees it.
///
/// # Safety
/// `p` must point at a live `ArrowArray`.
unsafe fn take_array(p: *mut ArrowArray) -> ArrowArray {
    // SAFETY: `p` is live; the copy becomes the owner and the original is marked released.
    let out = unsafe { std::ptr::read(p) };
    // SAFETY: as above.
    unsafe { (*p).release = None };
    out
}

/// The engine's description of `a` and its children.
///
/// # Safety
/// `a` must be a live, unreleased array as the C data interface defines it.
unsafe fn describe(a: &ArrowArray, depth: usize) -> PyResult<ArrayIn> {
    if depth > 64 {
        return Err(PyValueError::new_err(
            "the Arrow data nests deeper than 64 levels",
        ));
    }
    let counts = usize::try_from(a.n_buffers)
        .ok()
        .zip(usize::try_from(a.n_children).ok())
        .filter(|&(b, c)| b <= 16 && c <= 1 << 16);
    let Some((n_buffers, n_children)) = counts else {
        return Err(PyValueError::new_err(format!(
            "an Arrow array claims {} buffers and {} children",
            a.n_buffers, a.n_children
        )));
    };
    let pointers: &[*const std::ffi::c_void] = if n_buffers == 0 || a.buffers.is_null() {
        &[]
    } else {
        // SAFETY: a live array's `buffers` holds `n_buffers` pointers.
        unsafe { std::slice::from_raw_parts(a.buffers, n_buffers) }
    };
    if pointers.len() != n_buffers {
        return Err(PyValueError::new_err("an Arrow array has no buffer list"));
    }
    let buffers = pointers.iter().map(|&b| b as u64).collect();
    let kids: &[*mut ArrowArray] = if n_children == 0 || a.children.is_null() {
        &[]
    } else {
        // SAFETY: a live array's `children` holds `n_children` child pointers.
        unsafe { std::slice::from_raw_parts(a.children, n_children) }
    };
    if kids.len() != n_children {
        return Err(PyValueError::new_err("an Arrow array has no child list"));
    }
    let mut children = Vec::with_capacity(n_children);
    for &child in kids {
        // SAFETY: a live array's children are live arrays (or null, refused).
        let child = unsafe { child.as_ref() }
            .ok_or_else(|| PyValueError::new_err("an Arrow array has a null child"))?;
        // SAFETY: a live array's children are live arrays.
        children.push(unsafe { describe(child, depth + 1) }?);
    }
    Ok(ArrayIn {
        length: a.length,
        null_count: a.null_count,
        offset: a.offset,
        buffers,
        children,
        has_dictionary: !a.dictionary.is_null(),
    })
}

/// The schema a producer wrote into `schema`, as a struct (a record batch).
fn struct_schema(schema: &FFI_ArrowSchema) -> PyResult<Schema> {
    let data_type = DataType::try_from(schema).map_err(|e| {
        UnsupportedOperationError::new_err(format!(
            "kvikpy's IPC writer cannot take the Arrow schema of the data ({e})"
        ))
    })?;
    let DataType::Struct(_) = data_type else {
        return Err(PyTypeError::new_err(format!(
            "write_ipc writes tables and record batches (struct arrays), not {data_type}"
        )));
    };
    Schema::try_from(schema).map_err(|e| {
        UnsupportedOperationError::new_err(format!(
            "kvikpy's IPC writer cannot take the Arrow schema of the data ({e})"
        ))
    })
}

/// The memory of a device array of `device_type` on `device_id`.
fn memory_of(device_type: i32, device_id: i64) -> PyResult<Memory> {
    match device_type {
        ARROW_DEVICE_CPU | ARROW_DEVICE_CUDA_HOST => Ok(Memory::Host),
        ARROW_DEVICE_CUDA | ARROW_DEVICE_CUDA_MANAGED => usize::try_from(device_id)
            .map(Memory::Device)
            .map_err(|_| PyValueError::new_err(format!("a CUDA array on device {device_id}"))),
        other => Err(PyTypeError::new_err(format!(
            "write_ipc writes Arrow data in host or CUDA memory, not on Arrow device type {other}"
        ))),
    }
}

/// Wait for a device array's `sync_event` (a pointer to a `CUevent`), if it has one.
fn wait_for(memory: Memory, sync_event: *mut std::ffi::c_void) -> PyResult<()> {
    if memory == Memory::Host || sync_event.is_null() {
        return Ok(());
    }
    // SAFETY: the device interface's CUDA `sync_event` points at a `CUevent`.
    let handle = unsafe { *sync_event.cast::<usize>() };
    // SAFETY: the producer's event, of the GPU its array's memory is on, live while the
    // array is held (it is: the caller holds it).
    unsafe { memory.wait_for(handle) }.map_err(py_err)
}

/// Encode and write `held` (record batches of `schema` in `memory`) to `path`.
fn write(
    py: Python<'_>,
    path: PathBuf,
    schema: Schema,
    held: Held,
    memory: Memory,
) -> BindResult<u64> {
    let mut batches = Vec::with_capacity(held.0.len());
    for a in &held.0 {
        // SAFETY: every held array is live and unreleased until `held` drops.
        batches.push(unsafe { describe(a, 0) }?);
    }
    let settings = kvikpy_core::settings::current()?;
    let written = interruptible_alone(py, &CancelToken::new(), move || {
        let _owner = held; // the memory stays alive until the writes have stopped
        let mut encoder = FileEncoder::new(&schema, memory)?;
        let mut peek = |addr: u64, out: &mut [u8]| -> kvikpy_core::Result<()> {
            // SAFETY: `addr` is inside a buffer of a held array (an offsets buffer's last
            // value, a validity bitmap) in `memory`, `out.len()` bytes long.
            unsafe { memory.peek(addr, out) }
        };
        for b in &batches {
            encoder.batch(b, &mut peek)?;
        }
        let encoded = encoder.finish()?;
        // SAFETY: every memory piece is a buffer of a held array (`_owner`), in `memory`,
        // of the length the Arrow format gives it.
        unsafe { write_file(&path, &encoded, memory, &settings) }
    })?;
    Ok(written)
}

/// The name of the capsule `obj`, or a TypeError.
fn capsule_name<'a>(obj: &'a Bound<'_, PyAny>, what: &str) -> PyResult<&'a CStr> {
    // SAFETY: the GIL is held; PyCapsule_GetName checks that the object is a capsule.
    let name = unsafe { ffi::PyCapsule_GetName(obj.as_ptr()) };
    if name.is_null() {
        // SAFETY: the GIL is held.
        unsafe { ffi::PyErr_Clear() };
        return Err(PyTypeError::new_err(format!("{what} must be a PyCapsule")));
    }
    // SAFETY: a capsule's name is a NUL-terminated string that lives as long as it does.
    Ok(unsafe { CStr::from_ptr(name) })
}

/// The capsule's pointer under `name`.
fn capsule_pointer(obj: &Bound<'_, PyAny>, name: &CStr) -> PyResult<*mut std::ffi::c_void> {
    // SAFETY: the GIL is held; the name was checked to be the capsule's.
    let p = unsafe { ffi::PyCapsule_GetPointer(obj.as_ptr(), name.as_ptr()) };
    if p.is_null() {
        return Err(PyErr::fetch(obj.py()));
    }
    Ok(p)
}

/// A stream's `get_last_error` text, or `what`.
fn stream_error(text: *const c_char, code: i32, what: &str) -> PyErr {
    let detail = if text.is_null() {
        format!("error code {code}")
    } else {
        // SAFETY: a non-null last error is a NUL-terminated string the stream owns.
        unsafe { CStr::from_ptr(text) }
            .to_string_lossy()
            .into_owned()
    };
    PyValueError::new_err(format!("the Arrow stream failed while {what}: {detail}"))
}

/// Write the Arrow data of `stream` (an `arrow_device_array_stream` or
/// `arrow_array_stream` capsule, taken over) to a new IPC file at `path`; returns its
/// size in bytes.
#[boundary]
#[pyfunction]
pub fn write_ipc_stream(
    py: Python<'_>,
    path: PathBuf,
    stream: Bound<'_, PyAny>,
) -> BindResult<u64> {
    let name = capsule_name(&stream, "stream")?;
    if name == DEVICE_STREAM {
        return taken(&stream, |s| device_stream(py, path, s));
    }
    if name == STREAM {
        return taken(&stream, |s| host_stream(py, path, s));
    }
    Err(PyTypeError::new_err(format!(
        "write_ipc takes an arrow_device_array_stream or arrow_array_stream capsule, not {name:?}"
    ))
    .into())
}

/// `write` run on the stream in capsule `stream` (named `S::NAME`), taken over: its struct
/// read out and the original's release cleared, so that this copy is its one owner, and
/// released once after.
fn taken<S: StreamStruct>(
    stream: &Bound<'_, PyAny>,
    write: impl FnOnce(&mut S) -> BindResult<u64>,
) -> BindResult<u64> {
    let p = capsule_pointer(stream, S::NAME)?.cast::<S>();
    // SAFETY: the capsule holds a live stream of type `S` (its name was checked); it is
    // taken over and released below, once.
    let mut s = unsafe { std::ptr::read(p) };
    // SAFETY: as above; the capsule's copy, released, is left alone by its destructor.
    unsafe { (*p).mark_released() };
    let out = write(&mut s);
    s.release();
    out
}

fn device_stream(py: Python<'_>, path: PathBuf, s: &mut ArrowDeviceArrayStream) -> BindResult<u64> {
    let (Some(get_schema), Some(get_next)) = (s.get_schema, s.get_next) else {
        return Err(PyValueError::new_err("the Arrow device stream was released").into());
    };
    let mut ffi_schema = FFI_ArrowSchema::empty();
    // SAFETY: the stream is live; get_schema fills the schema we own.
    let rc = unsafe { get_schema(s, &mut ffi_schema) };
    if rc != 0 {
        return Err(last_error_device(s, rc, "giving its schema").into());
    }
    let schema = struct_schema(&ffi_schema)?;
    check_schema(&schema)?;
    let mut held = Held(Vec::new());
    let mut memory = None;
    loop {
        // SAFETY: an all-zero ArrowDeviceArray is a valid out-parameter.
        let mut next: ArrowDeviceArray = unsafe { std::mem::zeroed() };
        // SAFETY: the stream is live; get_next moves the next array into `next`.
        let rc = unsafe { get_next(s, &mut next) };
        if rc != 0 {
            return Err(last_error_device(s, rc, "giving its next record batch").into());
        }
        if next.array.release.is_none() {
            break; // the end of the stream
        }
        let this = memory_of(next.device_type, next.device_id);
        let sync_event = next.sync_event;
        held.0.push(next.array);
        let this = this?;
        if memory.is_some_and(|m| m != this) {
            return Err(PyValueError::new_err(
                "the stream's record batches lie in different memories (devices); write_ipc \
                 writes a stream from one",
            )
            .into());
        }
        memory = Some(this);
        wait_for(this, sync_event)?;
    }
    write(py, path, schema, held, memory.unwrap_or(Memory::Host))
}

fn last_error_device(s: &mut ArrowDeviceArrayStream, code: i32, what: &str) -> PyErr {
    let text = s.get_last_error.map_or(std::ptr::null(), |f| {
        // SAFETY: the stream is live.
        unsafe { f(s) }
    });
    stream_error(text, code, what)
}

fn host_stream(py: Python<'_>, path: PathBuf, s: &mut ArrowArrayStream) -> BindResult<u64> {
    let (Some(get_schema), Some(get_next)) = (s.get_schema, s.get_next) else {
        return Err(PyValueError::new_err("the Arrow stream was released").into());
    };
    let mut ffi_schema = FFI_ArrowSchema::empty();
    // SAFETY: the stream is live; get_schema fills the schema we own.
    let rc = unsafe { get_schema(s, &mut ffi_schema) };
    if rc != 0 {
        return Err(last_error_host(s, rc, "giving its schema").into());
    }
    let schema = struct_schema(&ffi_schema)?;
    check_schema(&schema)?;
    let mut held = Held(Vec::new());
    loop {
        // SAFETY: an all-zero ArrowArray is a valid out-parameter.
        let mut next: ArrowArray = unsafe { std::mem::zeroed() };
        // SAFETY: the stream is live; get_next moves the next array into `next`.
        let rc = unsafe { get_next(s, &mut next) };
        if rc != 0 {
            return Err(last_error_host(s, rc, "giving its next record batch").into());
        }
        if next.release.is_none() {
            break;
        }
        held.0.push(next);
    }
    write(py, path, schema, held, Memory::Host)
}

fn last_error_host(s: &mut ArrowArrayStream, code: i32, what: &str) -> PyErr {
    let text = s.get_last_error.map_or(std::ptr::null(), |f| {
        // SAFETY: the stream is live.
        unsafe { f(s) }
    });
    stream_error(text, code, what)
}

/// Write one record batch, `array` (an `arrow_device_array` or `arrow_array` capsule,
/// taken over) of `schema` (an `arrow_schema` capsule), to a new IPC file at `path`;
/// returns its size in bytes.
#[boundary]
#[pyfunction]
pub fn write_ipc_array(
    py: Python<'_>,
    path: PathBuf,
    schema: Bound<'_, PyAny>,
    array: Bound<'_, PyAny>,
) -> BindResult<u64> {
    let p = capsule_pointer(&schema, SCHEMA)?.cast::<FFI_ArrowSchema>();
    // SAFETY: an arrow_schema capsule holds a live schema, borrowed while it lives.
    let schema = struct_schema(unsafe { &*p })?;
    check_schema(&schema)?;
    let name = capsule_name(&array, "array")?;
    if name == DEVICE_ARRAY {
        let p = capsule_pointer(&array, DEVICE_ARRAY)?.cast::<ArrowDeviceArray>();
        // SAFETY: the capsule holds a live device array.
        let device = unsafe { &*p };
        let memory = memory_of(device.device_type, device.device_id)?;
        wait_for(memory, device.sync_event)?;
        // SAFETY: as above; its array (the first field) is taken over and released when
        // `held` drops.
        let held = Held(vec![unsafe { take_array(p.cast::<ArrowArray>()) }]);
        return write(py, path, schema, held, memory);
    }
    if name == ARRAY {
        let p = capsule_pointer(&array, ARRAY)?.cast::<ArrowArray>();
        // SAFETY: the capsule holds a live array, taken over here.
        let held = Held(vec![unsafe { take_array(p) }]);
        return write(py, path, schema, held, Memory::Host);
    }
    Err(PyTypeError::new_err(format!(
        "write_ipc takes an arrow_device_array or arrow_array capsule, not {name:?}"
    ))
    .into())
}

fn py_err(e: kvikpy_core::Error) -> PyErr {
    crate::errors::BindError::from(e).into()
}
