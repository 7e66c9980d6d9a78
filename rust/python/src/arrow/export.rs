//! Arrow arrays built from an export description ([`ArrayExport`]): the C structs with
//! their buffers, children and owner, and the release callback that frees them on any
//! thread, without the GIL, in any order relative to the capsules.

use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use arrow_schema::DataType;
use kvikpy_core::arrow_ipc::Column;
use kvikpy_core::cuda::StreamEvent;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;

use super::c_abi::ArrowArray;
use super::types::{buffer_type, element_type};
use crate::buffer::Dtype;

/// What an exported array owns until its release callback runs.
struct ArrayPrivate {
    /// Buffer pointers; `ArrowArray::buffers` points here.
    buffers: Vec<*const c_void>,
    /// The child arrays (each with its own release and owner, so a consumer may move one
    /// out), and the pointers `ArrowArray::children` points at.
    children: Vec<ArrowArray>,
    child_pointers: Vec<*mut ArrowArray>,
    /// The dictionary of a dictionary-encoded array (boxed, so its address is stable).
    dictionary: Option<Box<ArrowArray>>,
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
        if let Some(dictionary) = &mut self.dictionary {
            // SAFETY: made by `build_array`, as the children.
            unsafe { release_array(&mut **dictionary) };
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
    /// The dictionary of a dictionary-encoded array (`format` is its index type then).
    pub dictionary: Option<Box<ArrayExport>>,
    pub owner: Box<dyn std::any::Any + Send>,
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
        dictionary: None,
        owner: Box::new(Arc::clone(owner)),
    })
}

/// The typed Arrow export of a buffer's memory at `ptr` (see [`element_type`] and
/// [`buffer_type`]), kept alive by `owner`; no copy.
pub fn buffer_export<T: Send + Sync + 'static>(
    ptr: u64,
    dtype: &Dtype,
    shape: &[i64],
    owner: &Arc<T>,
) -> PyResult<ArrayExport> {
    let format = buffer_type(element_type(dtype)?, shape)?;
    typed_level(&format, shape.first().copied().unwrap_or(1), ptr, owner)
}

/// The release callback of every array kvikpy exports (idempotent).
pub unsafe extern "C" fn release_array(array: *mut ArrowArray) {
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

/// The C struct of `export`, and the `sync_event` pointer of `event` (null without one).
pub fn build_array(export: ArrayExport, event: Option<StreamEvent>) -> (ArrowArray, *mut c_void) {
    let event_handle = Box::new(event.as_ref().map_or(0, StreamEvent::handle));
    // The children stay where they are (the Vec is never resized), so pointers to them
    // stay valid while the private data lives.
    let mut children: Vec<ArrowArray> = export
        .children
        .into_iter()
        .map(|child| build_array(child, None).0)
        .collect();
    let child_pointers = children.iter_mut().map(|c| c as *mut _).collect();
    let dictionary = export.dictionary.map(|d| Box::new(build_array(*d, None).0));
    let mut private = Box::new(ArrayPrivate {
        buffers: export.buffers.iter().map(|&p| p as *const c_void).collect(),
        children,
        child_pointers,
        dictionary,
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
        dictionary: private
            .dictionary
            .as_mut()
            .map_or(std::ptr::null_mut(), |d| &mut **d as *mut ArrowArray),
        release: Some(release_array),
        private_data: Box::into_raw(private).cast(),
    };
    (array, sync_event)
}

/// The last buffer of a view-typed (`string_view`, `binary_view`) array: the sizes of its
/// data buffers (its buffers after the validity and the views), as `int64`, taken from
/// `range_sizes` (each planned range's size). It lives in host memory for host and
/// device arrays alike: consumers read it on the host to learn the sizes before touching
/// the data (Arrow C++'s importer and nanoarrow's array view do). None for other types.
pub fn view_sizes(column: &Column, range_sizes: &[u64]) -> Option<Box<[i64]>> {
    if !matches!(column.data_type, DataType::Utf8View | DataType::BinaryView) {
        return None;
    }
    let data = column.buffers.get(2..).unwrap_or_default();
    Some(
        data.iter()
            .map(|b| {
                b.and_then(|i| range_sizes.get(i))
                    .map_or(0, |&s| i64::try_from(s).unwrap_or(i64::MAX))
            })
            .collect(),
    )
}
