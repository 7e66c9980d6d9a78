//! kvikpy-core: the Python-free I/O engine behind kvikpy (sources behind one trait, one
//! request path, one bounce ring for device transfers, batches, settings and futures).
//!
//! The Python binding (`rust/python`) only converts types and maps [`Error`] to Python
//! exceptions; everything that decides *how* bytes move lives here.

#![deny(missing_docs)]

pub mod allocation;
pub mod arrow_ipc;
pub mod atfork;
pub mod batch;
pub mod bounce;
pub mod cancel;
pub mod ceiling;
pub mod cuda;
pub mod cufile;
pub mod device_io;
pub mod error;
pub mod file;
pub mod fork;
pub mod future;
pub mod memory;
pub mod mmap_handle;
pub mod page_cache;
pub mod pool;
pub mod profile;
pub mod redact;
#[cfg(test)]
mod remote_cancel_tests;
pub mod replace;
pub mod request;
pub mod ring;
pub mod settings;
pub mod source;
pub mod tasks;
pub mod vocab;

pub use error::{Error, Result};
pub use file::{FileHandle, OpenFlags};
pub use future::IoFuture;
pub use memory::{DeviceSpan, HostSpan, Span};
pub use request::{submit, Completion, Direction, Request};
pub use settings::{CompatMode, SettingValue, Settings};
pub use source::Source;
