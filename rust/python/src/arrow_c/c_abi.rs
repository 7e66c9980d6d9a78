//! The C structs of the Arrow C data, C device data and C (device) stream interfaces that
//! arrow-rs does not declare, their layouts checked at compile time, and the capsule names
//! and device types of the PyCapsule interface.

use std::ffi::{c_char, c_int, c_void, CStr};

use arrow_schema::ffi::FFI_ArrowSchema;

/// Capsule name of an `ArrowSchema`.
pub const SCHEMA: &CStr = c"arrow_schema";
/// Capsule name of an `ArrowArray`.
pub const ARRAY: &CStr = c"arrow_array";
/// Capsule name of an `ArrowDeviceArray`.
pub const DEVICE_ARRAY: &CStr = c"arrow_device_array";
/// Capsule name of an `ArrowDeviceArrayStream`.
pub const DEVICE_STREAM: &CStr = c"arrow_device_array_stream";
/// Capsule name of an `ArrowArrayStream`.
pub const STREAM: &CStr = c"arrow_array_stream";

/// `ARROW_DEVICE_CPU`.
pub const ARROW_DEVICE_CPU: i32 = 1;
/// `ARROW_DEVICE_CUDA`.
pub const ARROW_DEVICE_CUDA: i32 = 2;

/// `struct ArrowArray` of the Arrow C data interface.
#[repr(C)]
pub struct ArrowArray {
    pub length: i64,
    pub null_count: i64,
    pub offset: i64,
    pub n_buffers: i64,
    pub n_children: i64,
    pub buffers: *mut *const c_void,
    pub children: *mut *mut ArrowArray,
    pub dictionary: *mut ArrowArray,
    pub release: Option<unsafe extern "C" fn(*mut ArrowArray)>,
    pub private_data: *mut c_void,
}

/// `struct ArrowDeviceArray` of the Arrow C device data interface.
#[repr(C)]
pub struct ArrowDeviceArray {
    pub array: ArrowArray,
    pub device_id: i64,
    pub device_type: i32,
    pub sync_event: *mut c_void,
    pub reserved: [i64; 3],
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

/// `struct ArrowDeviceArrayStream` of the Arrow C device stream interface.
#[repr(C)]
pub struct ArrowDeviceArrayStream {
    pub device_type: i32,
    pub get_schema:
        Option<unsafe extern "C" fn(*mut ArrowDeviceArrayStream, *mut FFI_ArrowSchema) -> c_int>,
    pub get_next:
        Option<unsafe extern "C" fn(*mut ArrowDeviceArrayStream, *mut ArrowDeviceArray) -> c_int>,
    pub get_last_error: Option<unsafe extern "C" fn(*mut ArrowDeviceArrayStream) -> *const c_char>,
    pub release: Option<unsafe extern "C" fn(*mut ArrowDeviceArrayStream)>,
    pub private_data: *mut c_void,
}

/// `struct ArrowArrayStream` of the Arrow C stream interface (host memory).
#[repr(C)]
pub struct ArrowArrayStream {
    pub get_schema:
        Option<unsafe extern "C" fn(*mut ArrowArrayStream, *mut FFI_ArrowSchema) -> c_int>,
    pub get_next: Option<unsafe extern "C" fn(*mut ArrowArrayStream, *mut ArrowArray) -> c_int>,
    pub get_last_error: Option<unsafe extern "C" fn(*mut ArrowArrayStream) -> *const c_char>,
    pub release: Option<unsafe extern "C" fn(*mut ArrowArrayStream)>,
    pub private_data: *mut c_void,
}

const _: () = {
    assert!(std::mem::size_of::<ArrowDeviceArrayStream>() == 48);
    assert!(std::mem::offset_of!(ArrowDeviceArrayStream, get_schema) == 8);
    assert!(std::mem::offset_of!(ArrowDeviceArrayStream, private_data) == 40);
    assert!(std::mem::size_of::<ArrowArrayStream>() == 40);
    assert!(std::mem::offset_of!(ArrowArrayStream, release) == 24);
    assert!(std::mem::offset_of!(ArrowArrayStream, private_data) == 32);
};

/// What the two stream structs share, for code written once for both: the producer's
/// callbacks (`arrow/stream.rs`) and the consumer's taking over (`arrow/write.rs`).
pub trait StreamStruct: Sized {
    /// The capsule name.
    const NAME: &'static CStr;
    /// The producer's private data.
    fn private_data(&mut self) -> &mut *mut c_void;
    /// Whether the stream was released (its `release` cleared).
    fn is_released(&self) -> bool;
    /// Mark the stream released (a consumer took it over, or its release ran).
    fn mark_released(&mut self);
    /// Release the stream, once: its `release` callback runs if it is still set.
    fn release(&mut self);
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
            fn release(&mut self) {
                if let Some(release) = self.release {
                    // SAFETY: a live stream's release callback, called by its one owner
                    // once (the callback clears `release`, as the interface requires).
                    unsafe { release(self) };
                }
            }
        }
    };
}

stream_struct!(ArrowDeviceArrayStream, DEVICE_STREAM);
stream_struct!(ArrowArrayStream, STREAM);
