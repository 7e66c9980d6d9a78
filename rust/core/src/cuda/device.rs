//! One [`Device`] object per GPU: its retained primary context and binding it to a thread
//! ([`ContextGuard`]), the slot of the pinned bounce-buffer pool that serves it, and what
//! it can do, asked once. Every per-device fact of the
//! engine lives here rather than in statics keyed by ordinal.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{result, sys};

use super::driver::{ensure_driver, Named};
use crate::bounce::BouncePool;
use crate::error::{Error, Result};

/// A GPU as the engine uses it. Made on first use and kept for the life of the process
/// (releasing the primary context at exit would race other libraries' teardown).
#[derive(Debug)]
pub struct Device {
    ordinal: usize,
    /// The retained primary context (the one CuPy, PyTorch and JAX use), as an address.
    context: usize,
    /// The driver's handle of the device.
    handle: sys::CUdevice,
    /// Made on first use by [`super::pinned_pool`] (memory sits above this file).
    pinned: OnceLock<Arc<BouncePool>>,
    read_only_register: OnceLock<bool>,
}

/// The devices made so far, by ordinal.
static DEVICES: Mutex<Vec<Option<&'static Device>>> = Mutex::new(Vec::new());

/// The device with CUDA ordinal `ordinal`; [`Error::InvalidArgument`] when there is none.
pub fn device(ordinal: usize) -> Result<&'static Device> {
    let count = ensure_driver()?;
    if ordinal >= count {
        return Err(Error::InvalidArgument(format!(
            "CUDA device {ordinal} does not exist: this machine has {count} device(s) \
             (0..{})",
            count - 1
        )));
    }
    let mut devices = DEVICES.lock().unwrap_or_else(|e| e.into_inner());
    if devices.len() < count {
        devices.resize(count, None);
    }
    if let Some(device) = devices[ordinal] {
        return Ok(device);
    }
    let handle = result::device::get(ordinal as i32).named("cuDeviceGet")?;
    // SAFETY: `handle` came from cuDeviceGet. The retain is never released (see `Device`).
    let context =
        unsafe { result::primary_ctx::retain(handle) }.named("cuDevicePrimaryCtxRetain")?;
    let device: &'static Device = Box::leak(Box::new(Device {
        ordinal,
        context: context as usize,
        handle,
        pinned: OnceLock::new(),
        read_only_register: OnceLock::new(),
    }));
    devices[ordinal] = Some(device);
    Ok(device)
}

/// Every device made so far.
pub(super) fn made() -> Vec<&'static Device> {
    DEVICES
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .flatten()
        .copied()
        .collect()
}

impl Device {
    /// The CUDA ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }

    /// The retained primary context.
    pub(super) fn context(&self) -> sys::CUcontext {
        self.context as sys::CUcontext
    }

    /// The slot of the pool of pinned bounce buffers for transfers to and from this device
    /// (allocated and freed under its context), filled by [`super::pinned_pool`].
    pub(super) fn pinned_slot(&self) -> &OnceLock<Arc<BouncePool>> {
        &self.pinned
    }

    /// Whether the device can DMA from read-only host memory registered with
    /// `CU_MEMHOSTREGISTER_READ_ONLY` (a file's pages mapped `PROT_READ`); false where the
    /// driver or the device cannot, or the question fails.
    pub fn can_register_read_only(&self) -> bool {
        *self.read_only_register.get_or_init(|| {
            let supported = |attribute| {
                // SAFETY: `handle` came from cuDeviceGet.
                let value = unsafe { result::device::get_attribute(self.handle, attribute) };
                value.is_ok_and(|v| v != 0)
            };
            supported(sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_HOST_REGISTER_SUPPORTED)
                && supported(
                    sys::CUdevice_attribute::CU_DEVICE_ATTRIBUTE_READ_ONLY_HOST_REGISTER_SUPPORTED,
                )
        })
    }
}

/// Device `ordinal`'s primary context made current on this thread for the guard's
/// lifetime. Dropping the guard makes the context that was current before `bind` current
/// again (none, if none was), so no kvikpy call changes which GPU the caller's thread
/// uses. Guards nest: an inner `bind` of the context already current changes nothing.
/// Not `Send`: a context binding belongs to the thread that made it.
#[must_use = "the context is unbound again when the guard is dropped"]
#[derive(Debug)]
pub struct ContextGuard {
    ordinal: usize,
    previous: sys::CUcontext,
    switched: bool,
}

impl ContextGuard {
    /// The device whose context this guard holds current.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }
}

impl Drop for ContextGuard {
    fn drop(&mut self) {
        if self.switched {
            // A destructor never panics: cudarc may panic if the driver went away at exit.
            let previous = self.previous as usize;
            let _ = catch_unwind(move || {
                // SAFETY: `previous` was current on this thread when the guard was made: a
                // retained context or null (no context), both valid to make current.
                let _ = unsafe { sys::cuCtxSetCurrent(previous as sys::CUcontext) };
            });
        }
    }
}

/// The context current on this thread (null when none is).
fn current_context() -> Result<sys::CUcontext> {
    let current = result::ctx::get_current().named("cuCtxGetCurrent")?;
    Ok(current.unwrap_or(std::ptr::null_mut()))
}

/// Make device `ordinal`'s primary context current on this thread until the returned
/// guard is dropped.
pub fn bind(ordinal: usize) -> Result<ContextGuard> {
    device(ordinal)?.bind()
}

impl Device {
    /// Make this device's primary context current on this thread until the returned
    /// guard is dropped (see [`ContextGuard`]).
    pub fn bind(&self) -> Result<ContextGuard> {
        let (ordinal, ctx) = (self.ordinal(), self.context());
        let previous = current_context()?;
        if previous == ctx {
            return Ok(ContextGuard {
                ordinal,
                previous,
                switched: false,
            });
        }
        // SAFETY: `ctx` is a retained primary context, valid for the life of the process.
        unsafe { result::ctx::set_current(ctx) }.named("cuCtxSetCurrent")?;
        Ok(ContextGuard {
            ordinal,
            previous,
            switched: true,
        })
    }
}

/// Run `free` (a destructor's driver calls) with device `ordinal`'s context current, then
/// make the caller's context current again. Never panics: where the driver is gone (at
/// interpreter exit) or the context cannot be bound, there is nothing left to free.
pub fn free_under(ordinal: usize, free: impl FnOnce()) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        if let Ok(_context) = bind(ordinal) {
            free();
        }
    }));
}
