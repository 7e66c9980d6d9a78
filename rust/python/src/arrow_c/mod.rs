//! The Arrow C Data, C Device Data interfaces as PyCapsules (`arrow_schema`,
//! `arrow_array`, `arrow_device_array`): the C structs (`c_abi`), arrays built from an
//! export description with their release callbacks (`export`), the capsules and the check
//! of the protocol methods' keywords (`capsule`), and Arrow types and their C schemas
//! (`types`). It knows nothing of what is exported: `buffer/` (a `Buffer` as an array)
//! and `arrow/` (IPC tables, batches, streams) describe their memory to it.
//!
//! The schema comes from arrow-rs (`FFI_ArrowSchema`, completed in `types` with the list
//! views it cannot describe); arrow-rs has no device interface, so the array structs are
//! declared here, with their layout checked at compile time. Release callbacks may run on
//! any thread, without the GIL, in any order relative to the capsules: each owns only
//! Rust values (the storage `Arc`, an event).

mod c_abi;
mod capsule;
mod export;
mod types;

pub use c_abi::{
    ArrowArray, ArrowArrayStream, ArrowDeviceArray, ArrowDeviceArrayStream, StreamStruct, ARRAY,
    ARROW_DEVICE_CPU, ARROW_DEVICE_CUDA, DEVICE_ARRAY, DEVICE_STREAM, SCHEMA, STREAM,
};
pub use capsule::{
    array_capsules, capsule, check_device_kwargs, device_array_capsules, ffi_schema_capsule,
    schema_capsule,
};
pub use export::{build_array, ArrayExport};
pub use types::{buffer_type, ffi_field, ffi_schema, ffi_type};
