//! The cuFile (GPUDirect Storage) library and driver, process-wide: loading libcufile at
//! run time, opening the driver on first use and closing it at exit, its properties, the
//! buffer and stream registrations, and the reasons cuFile cannot be used here.
//!
//! libcufile is found through cudarc's `cufile` module (its library names and loader), so
//! nothing is needed at build time; every entry point is looked up by name once, and a
//! missing library or symbol is an error value, never a panic. `KVIKPY_CUFILE_LIBRARY`
//! names a library file to load instead (the test suite's stand-in): it is opened by path,
//! globally, before cudarc's first lookup, and cudarc's lookup must then resolve to it.
//!
//! The entry points are called through function pointers typed here with plain integers
//! for cuFile's status codes: a code newer than cudarc's enums cannot become an invalid
//! Rust enum value.
//!
//! One job per file, layered bottom up: `library` (loading libcufile), `status` (its
//! status codes), `driver` (opening and closing the driver, file handles), `properties`,
//! `system` (whether cuFile can be used here), `register` (buffers and streams). A file
//! names only the files before it; this one only names them and hands their names on.

mod driver;
mod library;
mod properties;
mod register;
mod status;
mod system;

// The surface the binding uses (`kvikpy.cufile_driver` and the register functions);
// the rest is the cuFile source's.
pub use driver::{contained, driver_close, driver_open, shutdown, version};
pub use library::api;
pub use properties::{properties, set_property, Setting};
pub use register::{memory_deregister, memory_register, stream_deregister, stream_register};
pub use system::{is_compat_mode_preferred, nvidia_fs_loaded, system_refusal};

pub(crate) use driver::{deregister_handle, ready, register_handle, InFlight};
pub(crate) use library::{Api, RawEvent, RwAsync};
pub(crate) use register::{register_stream_raw, stream_known};
pub(crate) use status::{check, message};

/// In a forked child: forget the parent's driver state and cached properties (its calls in
/// flight, handles and locks are the parent's), so that the child's exit does not wait for
/// the parent's calls or close the parent's handles. Async-signal-safe.
pub(crate) fn forget_in_child() {
    driver::forget_in_child();
    properties::forget_in_child();
}
