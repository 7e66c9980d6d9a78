//! Arrow tables and arrays kvikpy makes and takes: IPC files and streams read into one
//! allocation (`ipc`) and written (`write`), a batch as one `large_binary` array
//! (`batch_array`), and Arrow C (device) streams over Python iterators of arrays
//! (`stream`, `arrow_array_stream` and `arrow_device_array_stream` capsules). The C
//! interface machinery they export through is `crate::arrow_c`.

mod batch_array;
mod ipc;
mod stream;
mod write;

pub use batch_array::{batch_arrow, batch_device_meta, batch_schema, BatchDeviceMeta};
pub use ipc::{ipc_decode_plan, read_ipc_table, IpcRead, IpcTable};
pub use stream::{device_stream_capsule, host_stream_capsule, typed_stream_capsule};
pub use write::{write_ipc_array, write_ipc_stream};
