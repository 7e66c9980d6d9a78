//! Pinning memory the engine did not allocate (page-cache pages mapped from a file) so the
//! DMA engine can read it directly: `cuMemHostRegister` with the read-only flag, undone on
//! drop.

use std::sync::Mutex;

use cudarc::driver::sys;

use super::driver::{bind, check, free_under};
use crate::error::Result;

/// Per device: can it register read-only host memory (a file's pages mapped `PROT_READ`)?
/// Asked once per device.
static READ_ONLY_SUPPORT: Mutex<Vec<Option<bool>>> = Mutex::new(Vec::new());

/// Whether device `ordinal` can DMA from read-only host memory registered with
/// `CU_MEMHOSTREGISTER_READ_ONLY` (false where the driver or the device cannot).
pub fn can_register_read_only(ordinal: usize) -> bool {
    let mut known = READ_ONLY_SUPPORT.lock().unwrap_or_else(|e| e.into_inner());
    if known.len() <= ordinal {
        known.resize(ordinal + 1, None);
    }
    *known[ordinal].get_or_insert_with(|| ask_read_only_support(ordinal).unwrap_or(false))
}

fn ask_read_only_support(ordinal: usize) -> Result<bool> {
    let _context = bind(ordinal)?;
    let mut device: sys::CUdevice = 0;
    // SAFETY: the driver is initialised (bind succeeded); `device` is an out-pointer.
    check("cuCtxGetDevice", unsafe {
        sys::cuCtxGetDevice(&mut device)
    })?;
    let mut value = 0i32;
    for attribute in [
        sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED,
        sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED,
    ] {
        // SAFETY: `device` is valid and `value` an out-pointer.
        check("cuDeviceGetAttribute", unsafe {
            sys::cuDeviceGetAttribute(&mut value, attribute, device)
        })?;
        if value == 0 {
            return Ok(false);
        }
    }
    Ok(true)
}

/// Host memory pinned for DMA by [`HostRegistration::read_only`]; unpinned on drop.
#[derive(Debug)]
pub struct HostRegistration {
    ordinal: usize,
    ptr: usize,
}

impl HostRegistration {
    /// Pin `ptr..ptr+len` (page-aligned) so device `ordinal` can DMA from it. Fails
    /// (without side effects) where the range overlaps another registration, is not
    /// backed by pages (a file truncated meanwhile), or the driver refuses.
    ///
    /// # Safety
    /// The range must stay mapped until the registration is dropped, and no DMA may read
    /// it after the drop (wait for the copies first).
    pub unsafe fn read_only(ordinal: usize, ptr: *const u8, len: usize) -> Result<Self> {
        let _context = bind(ordinal)?;
        // SAFETY: forwarded from the caller: the range is mapped. READ_ONLY because the
        // pages are mapped PROT_READ; PORTABLE so any device's context may use them.
        check("cuMemHostRegister", unsafe {
            sys::cuMemHostRegister_v2(
                ptr.cast_mut().cast(),
                len,
                sys::CU_MEMHOSTREGISTER_READ_ONLY | sys::CU_MEMHOSTREGISTER_PORTABLE,
            )
        })?;
        Ok(Self {
            ordinal,
            ptr: ptr as usize,
        })
    }
}

impl Drop for HostRegistration {
    fn drop(&mut self) {
        let ptr = self.ptr;
        free_under(self.ordinal, move || {
            // SAFETY: `ptr` was registered in `read_only` and is unregistered exactly once,
            // here; the caller has waited for every copy that read it.
            let _ = unsafe { sys::cuMemHostUnregister(ptr as *mut std::ffi::c_void) };
        });
    }
}
