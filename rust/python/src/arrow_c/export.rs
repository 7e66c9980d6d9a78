//! Arrow arrays built from an export description ([`ArrayExport`]): the C structs with
//! their buffers, children and owner, and the release callback that frees them on any
//! thread, without the GIL, in any order relative to the capsules.

use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};

use arrow_schema::DataType;
use kvikpy_core::cuda::StreamEvent;

use super::c_abi::ArrowArray;

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
