//! Where a buffer lives and how bytes reach it: host memory (unknown to the CUDA driver,
//! pinned host memory, or any memory when there is no CUDA driver at all) is read and
//! written in place; device memory is reached through the CUDA driver, inside the context
//! that owns the pointer, which is made current for the copy and then put back.

use std::collections::HashMap;
use std::ffi::c_void;
use std::ptr;
use std::sync::{LazyLock, Mutex, OnceLock, PoisonError};

use cudarc::driver::sys::{
    self as cu, CUcontext, CUdeviceptr, CUpointer_attribute as Attribute, CUresult,
};

use crate::error::Fail;

/// Whether a CUDA driver is present and initialises (decided once per process).
pub fn cuda_available() -> bool {
    static AVAILABLE: OnceLock<bool> = OnceLock::new();
    *AVAILABLE.get_or_init(|| {
        // SAFETY: only tries to dlopen libcuda under its usual names.
        let present = unsafe { cu::is_culib_present() };
        // SAFETY: cuInit takes no pointers; the library was found above.
        present && unsafe { cu::cuInit(0) } == CUresult::CUDA_SUCCESS
    })
}

fn check(result: CUresult) -> Result<(), Fail> {
    if result == CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(Fail::cuda(result as u32))
    }
}

/// Where the bytes at an address live.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Place {
    /// Host memory: read and written directly.
    Host,
    /// Device memory owned by this context.
    Device(usize),
}

/// Primary contexts retained for device pointers that report no context (virtual memory
/// management allocations), by device ordinal; kept for the life of the process.
static PRIMARY: LazyLock<Mutex<HashMap<i32, usize>>> = LazyLock::new(|| Mutex::new(HashMap::new()));

fn primary_context(ordinal: i32) -> Result<usize, Fail> {
    let mut table = PRIMARY.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(&ctx) = table.get(&ordinal) {
        return Ok(ctx);
    }
    let mut device = 0;
    // SAFETY: `device` is a valid out-pointer.
    check(unsafe { cu::cuDeviceGet(&mut device, ordinal) })?;
    let mut ctx: CUcontext = ptr::null_mut();
    // SAFETY: `ctx` is a valid out-pointer; `device` came from cuDeviceGet.
    check(unsafe { cu::cuDevicePrimaryCtxRetain(&mut ctx, device) })?;
    table.insert(ordinal, ctx as usize);
    Ok(ctx as usize)
}

/// `cuPointerGetAttribute`: the driver's answer about `addr`, written into `out`.
///
/// # Safety
/// `T` is the type the driver writes for `which`.
unsafe fn attribute<T>(out: &mut T, which: Attribute, addr: usize) -> CUresult {
    // SAFETY: `out` is a valid out-pointer of the type the caller promises for `which`.
    unsafe {
        cu::cuPointerGetAttribute((out as *mut T).cast::<c_void>(), which, addr as CUdeviceptr)
    }
}

/// Where `addr` lives: asks the CUDA driver when there is one.
pub fn place(addr: usize) -> Result<Place, Fail> {
    if !cuda_available() {
        return Ok(Place::Host);
    }
    let mut ctx: CUcontext = ptr::null_mut();
    // SAFETY: the attribute CONTEXT writes one CUcontext into `ctx`.
    let found = unsafe { attribute(&mut ctx, Attribute::CU_POINTER_ATTRIBUTE_CONTEXT, addr) };
    if found == CUresult::CUDA_ERROR_INVALID_VALUE {
        return Ok(Place::Host); // memory the driver does not know: ordinary host memory
    }
    check(found)?;
    let mut kind: u32 = 0;
    // SAFETY: the attribute MEMORY_TYPE writes one CUmemorytype (a 32-bit enum) into `kind`.
    check(unsafe { attribute(&mut kind, Attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE, addr) })?;
    if kind == cu::CUmemorytype::CU_MEMORYTYPE_HOST as u32 {
        return Ok(Place::Host); // pinned host memory: reachable from the host as it is
    }
    if ctx.is_null() {
        let mut ordinal: i32 = 0;
        // SAFETY: the attribute DEVICE_ORDINAL writes one int into `ordinal`.
        check(unsafe {
            attribute(
                &mut ordinal,
                Attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
                addr,
            )
        })?;
        return Ok(Place::Device(primary_context(ordinal)?));
    }
    Ok(Place::Device(ctx as usize))
}

/// A context made current on this thread; the previous one is restored on drop.
pub struct Bound {
    previous: CUcontext,
    changed: bool,
}

/// Makes `ctx` current on this thread until the returned guard drops.
pub fn bind(ctx: usize) -> Result<Bound, Fail> {
    let mut previous: CUcontext = ptr::null_mut();
    // SAFETY: `previous` is a valid out-pointer.
    check(unsafe { cu::cuCtxGetCurrent(&mut previous) })?;
    if previous as usize == ctx {
        return Ok(Bound {
            previous,
            changed: false,
        });
    }
    // SAFETY: `ctx` is a context the driver reported for a live pointer (or a retained
    // primary context).
    check(unsafe { cu::cuCtxSetCurrent(ctx as CUcontext) })?;
    Ok(Bound {
        previous,
        changed: true,
    })
}

impl Drop for Bound {
    fn drop(&mut self) {
        if self.changed {
            // SAFETY: `previous` was current on this thread when the guard was made (or null).
            let _ = unsafe { cu::cuCtxSetCurrent(self.previous) };
        }
    }
}

/// Copies `len` host bytes at `src` to device address `dst` (its context current).
pub fn to_device(dst: usize, src: *const u8, len: usize) -> Result<(), Fail> {
    // SAFETY: the caller gives `len` readable bytes at `src` and a device range at `dst`.
    check(unsafe { cu::cuMemcpyHtoD_v2(dst as CUdeviceptr, src.cast::<c_void>(), len) })
}

/// Copies `len` bytes at device address `src` to host memory `dst` (its context current).
pub fn from_device(dst: *mut u8, src: usize, len: usize) -> Result<(), Fail> {
    // SAFETY: the caller gives `len` writable bytes at `dst` and a device range at `src`.
    check(unsafe { cu::cuMemcpyDtoH_v2(dst.cast::<c_void>(), src as CUdeviceptr, len) })
}

/// Pinned host memory of `len` bytes (portable: usable from every context).
pub fn pinned(len: usize) -> Result<usize, Fail> {
    let mut p: *mut c_void = ptr::null_mut();
    // SAFETY: `p` is a valid out-pointer; CU_MEMHOSTALLOC_PORTABLE = 1.
    check(unsafe { cu::cuMemHostAlloc(&mut p, len.max(1), 1) })?;
    Ok(p as usize)
}

/// Frees pinned memory from [`pinned`].
pub fn free_pinned(p: usize) {
    // SAFETY: `p` came from cuMemHostAlloc and is no longer used by any pending copy.
    let _ = unsafe { cu::cuMemFreeHost(p as *mut c_void) };
}
