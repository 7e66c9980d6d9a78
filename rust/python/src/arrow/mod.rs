//! The Arrow C Data, C Device Data and C (Device) Stream interfaces for kvikpy buffers, as
//! PyCapsules (`arrow_schema`, `arrow_array`, `arrow_device_array`, `arrow_array_stream`,
//! `arrow_device_array_stream`): a buffer becomes an Arrow array of its dtype (nested
//! fixed-size lists for 2-D and higher shapes) without a copy, on the host or on its GPU.
//!
//! The schema comes from arrow-rs (`FFI_ArrowSchema`, completed in `types` with the list
//! views it cannot describe); arrow-rs has no device interface,
//! so the array structs are declared here, with their layout checked at compile time.
//! Release callbacks may run on any thread, without the GIL, in any order relative to the
//! capsules: each owns only Rust values (the storage `Arc`, an event).

mod batch_array;
mod c_abi;
mod capsule;
mod export;
mod ipc;
mod stream;
mod types;
mod write;

pub use batch_array::{batch_arrow, batch_device_meta, batch_schema, BatchDeviceMeta};
pub use c_abi::{ARROW_DEVICE_CPU, ARROW_DEVICE_CUDA};
pub use capsule::{array_capsules, check_device_kwargs, device_array_capsules, schema_capsule};
pub use export::{buffer_export, ArrayExport};
pub use ipc::{ipc_decode_plan, read_ipc_table, IpcRead, IpcTable};
pub use stream::{device_stream_capsule, host_stream_capsule, typed_stream_capsule};
pub use types::{buffer_type, element_type};
pub use write::{write_ipc_array, write_ipc_stream};
