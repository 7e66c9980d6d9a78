//! Registrations of user buffers and CUDA streams with the driver.

use std::ffi::c_void;

use cudarc::cufile::sys as cf;

use crate::error::{Error, Result};

use super::driver::{ready, state};
use super::status::check;
use super::system::is_compat_mode_preferred;

/// kvikio's `memory_register`: register `len` bytes at `ptr` with cuFile; a no-op where
/// compat mode is preferred, and memory already registered is not an error.
pub fn memory_register(ptr: u64, len: usize, flags: i32) -> Result<()> {
    if is_compat_mode_preferred(crate::settings::current()?.compat_mode) {
        return Ok(());
    }
    let api = ready()?;
    // SAFETY: the caller passes memory it owns; cuFile only records the range.
    let status = unsafe { (api.buf_register)(ptr as *const c_void, len, flags) };
    if status.err == cf::CUfileOpError::CU_FILE_MEMORY_ALREADY_REGISTERED as u32 {
        return Ok(());
    }
    check("cuFileBufRegister", status)
}

/// kvikio's `memory_deregister`: a no-op where compat mode is preferred.
pub fn memory_deregister(ptr: u64) -> Result<()> {
    if is_compat_mode_preferred(crate::settings::current()?.compat_mode) {
        return Ok(());
    }
    let api = ready()?;
    // SAFETY: deregistering an address cuFile does not know is an error code, not UB.
    check("cuFileBufDeregister", unsafe {
        (api.buf_deregister)(ptr as *const c_void)
    })
}

/// kvikio's `stream_register`: a no-op where compat mode is preferred.
pub fn stream_register(stream: usize, flags: u32) -> Result<()> {
    if is_compat_mode_preferred(crate::settings::current()?.compat_mode) {
        return Ok(());
    }
    register_stream_raw(stream, flags)
}

/// Register `stream` with cuFile (kvikpy's own registrations are remembered and undone
/// at exit); already-registered streams are accepted.
pub fn register_stream_raw(stream: usize, flags: u32) -> Result<()> {
    let api = ready()?;
    let Some(register) = api.stream_register else {
        return Err(Error::CuFile(format!(
            "{} has no cuFileStreamRegister (libcufile 1.6 or later has it)",
            api.library
        )));
    };
    // SAFETY: `stream` is a live CUstream (or 0) given by the caller.
    check("cuFileStreamRegister", unsafe {
        register(stream as *mut c_void, flags)
    })?;
    state()
        .streams
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(stream);
    Ok(())
}

/// Whether kvikpy registered `stream` with cuFile (and has not deregistered it).
pub fn stream_known(stream: usize) -> bool {
    state()
        .streams
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .contains(&stream)
}

/// kvikio's `stream_deregister`: a no-op where compat mode is preferred.
pub fn stream_deregister(stream: usize) -> Result<()> {
    if is_compat_mode_preferred(crate::settings::current()?.compat_mode) {
        return Ok(());
    }
    let api = ready()?;
    let Some(deregister) = api.stream_deregister else {
        return Ok(());
    };
    state()
        .streams
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&stream);
    // SAFETY: `stream` is a CUstream given by the caller.
    check("cuFileStreamDeregister", unsafe {
        deregister(stream as *mut c_void)
    })
}
