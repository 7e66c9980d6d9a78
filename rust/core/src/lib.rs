//! kvikpy-core: the Python-free I/O engine behind kvikpy (sources behind one trait, one
//! request path, one bounce ring for device transfers, batches, settings and futures).
//!
//! The Python binding (`rust/python`) only converts types and maps [`Error`] to Python
//! exceptions; everything that decides *how* bytes move lives here.
//!
//! # Public surface
//!
//! What the binding (and the engine's own benches and integration tests) use, and nothing
//! more, is `pub`; every other module and item is `pub(crate)`, the engine's internals
//! (as kvikio keeps `include/kvikio` apart from its `detail/`). The crate root re-exports
//! the core types: [`FileHandle`], [`Request`] and [`submit`], the spans, [`IoFuture`]
//! ([`run_caught`], [`wait_idle`]), [`Settings`], [`Error`] and [`Source`]. The public
//! modules, by what the binding uses them for:
//!
//! - I/O: [`request`] (batch requests), [`batch_plan`] (batch plans), [`mmap_handle`]
//!   (`kvikpy.Mmap`), [`replace`] (write-then-rename), [`extent`] (what a read of a file
//!   covers: its range, files with no size, the range's shape), [`arrow_ipc`] (Arrow IPC reading
//!   and writing), [`source`] (remote files, residency probes, path kinds, counters).
//! - Memory and devices: [`allocation`] (`kvikpy.Buffer` memory), [`cuda`] (streams and
//!   events handed in by callers, copies, device queries), [`cufile`]
//!   (`kvikpy.cufile_driver` and buffer registration).
//! - Process-wide state: [`settings`], [`cancel`] (Ctrl-C and cancellation), [`pool`]
//!   (thread pool sizes), [`bounce`] (freeing idle bounce buffers), [`atfork`] (fork
//!   handlers), [`page_cache`] (residency and eviction), [`profile`] and [`ceiling`]
//!   (measurement), [`tasks`] (task splitting, for the benches).
//!
//! Crate-private: the device transfer path (`device_io`), the bounce ring (`ring`),
//! fork generations (`fork`), credential redaction (`redact`), the settings vocabulary
//! (`vocab`), and the modules behind the root re-exports (`error`, `file`, `future`,
//! `span`).

#![deny(missing_docs)]
// The docs are written for the engine's maintainers and link crate-private items;
// `cargo doc --document-private-items` renders them all.
#![allow(rustdoc::private_intra_doc_links)]

pub mod allocation;
pub mod arrow_ipc;
pub mod atfork;
pub mod batch_plan;
pub mod bounce;
pub mod cancel;
pub mod ceiling;
pub mod cuda;
pub mod cufile;
pub(crate) mod device_io;
pub(crate) mod error;
pub mod extent;
pub(crate) mod file;
pub(crate) mod fork;
pub(crate) mod future;
pub mod mmap_handle;
pub mod page_cache;
pub mod pool;
pub mod profile;
pub(crate) mod redact;
#[cfg(test)]
mod remote_cancel_tests;
pub mod replace;
pub mod request;
pub(crate) mod ring;
pub mod safetensors;
pub mod settings;
pub mod source;
pub(crate) mod span;
pub mod staging;
pub mod tasks;
pub(crate) mod vocab;

pub use device_io::{checkpoint_split, shared_pieces, staging_demand, Demand as StagingDemand};
pub use error::{panic_message, Error, RemoteFailure, Result};
pub use file::{FileHandle, OpenFlags};
pub use future::{run_caught, wait_idle, IoFuture};
pub use request::{submit, Completion, Direction, Request};
pub use settings::{CompatMode, SettingValue, Settings};
pub use source::Source;
pub use span::{DeviceSpan, HostSpan, Span};
