//! One [`Device`] object per GPU: its retained primary context, the pool of pinned bounce
//! buffers that serves it, and what it can do, asked once. Every per-device fact of the
//! engine lives here rather than in statics keyed by ordinal.

use std::sync::{Arc, Mutex, OnceLock};

use cudarc::driver::{result, sys};

use super::driver::{ensure_driver, Named};
use super::memory::PinnedAllocator;
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
    pinned: Arc<BouncePool>,
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
        pinned: BouncePool::new(PinnedAllocator { ordinal }),
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

    /// The pool of pinned bounce buffers for transfers to and from this device (allocated
    /// and freed under its context).
    pub fn pinned_pool(&self) -> &Arc<BouncePool> {
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
