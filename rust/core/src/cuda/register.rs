//! Pinning memory the engine did not allocate (page-cache pages mapped from a file) so the
//! DMA engine can read it directly: `cuMemHostRegister` with the read-only flag, undone on
//! drop.

use cudarc::driver::sys;

use super::device::{bind, device, free_under};
use super::driver::check;
use crate::error::Result;

/// Whether device `ordinal` can DMA from read-only host memory registered with
/// `CU_MEMHOSTREGISTER_READ_ONLY` (false where the driver or the device cannot).
pub fn can_register_read_only(ordinal: usize) -> bool {
    device(ordinal).is_ok_and(|d| d.can_register_read_only())
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
