//! kvikpy-core: the Python-free I/O engine behind kvikpy (settings, thread pool, task splitting,
//! POSIX file I/O with opportunistic O_DIRECT, bounce buffers and futures).
//!
//! The Python binding (`rust/python`) only converts types and maps [`Error`] to Python
//! exceptions; everything that decides *how* bytes move lives here.

#![deny(missing_docs)]

pub mod allocation;
pub mod batch;
pub mod bounce;
pub mod ceiling;
pub mod cuda;
mod cufile_probe;
pub mod device_io;
pub mod error;
pub mod file;
pub mod future;
pub mod io;
pub mod memory;
pub mod page_cache_dma;
pub mod pool;
pub mod posix;
pub mod settings;
pub mod tasks;

pub use error::{Error, Result};
pub use file::{FileHandle, OpenFlags};
pub use future::IoFuture;
pub use memory::{DeviceSpan, HostSpan, Span};
pub use settings::{CompatMode, SettingValue, Settings};
