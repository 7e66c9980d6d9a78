//! The driver's properties: read once and cached, and the settable ones set.

use std::sync::Mutex;

use cudarc::cufile::sys as cf;

use crate::error::Result;
use crate::fork::ForkLocal;

use super::driver::{library, ready};
use super::status::check;

/// The driver properties kvikio exposes, kept as kvikio keeps them: read from the driver
/// once, then updated by each successful set (cuFile does not always report its own
/// setters back).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Properties {
    /// nvidia-fs major version (0 without nvidia-fs).
    pub major_version: u32,
    /// nvidia-fs minor version.
    pub minor_version: u32,
    /// Whether cuFile may fall back to its own compatibility mode.
    pub allow_compat_mode: bool,
    /// Whether cuFile polls for completion of small transfers.
    pub poll_mode: bool,
    /// The largest transfer polled for, in KiB.
    pub poll_thresh_size: usize,
    /// The GPU bounce buffer cache, in KiB.
    pub max_device_cache_size: usize,
    /// Per-buffer cache size, in KiB.
    pub per_buffer_cache_size: usize,
    /// The largest pinned GPU memory, in KiB.
    pub max_pinned_memory_size: usize,
}

impl Properties {
    /// Whether nvidia-fs reports a version (kvikio's `is_gds_available`).
    pub fn is_gds_available(&self) -> bool {
        self.major_version != 0 || self.minor_version != 0
    }
}

static PROPS: ForkLocal<Mutex<Option<Properties>>> = ForkLocal::new(|| Mutex::new(None));

/// In a forked child: forget the parent's cached properties. Async-signal-safe.
pub(super) fn forget_in_child() {
    PROPS.forget();
}

fn cached() -> &'static Mutex<Option<Properties>> {
    PROPS.get()
}

/// The driver's properties (opening the driver first).
pub fn properties() -> Result<Properties> {
    library()?;
    let mut guard = cached().lock().unwrap_or_else(|e| e.into_inner());
    if let Some(p) = *guard {
        return Ok(p);
    }
    let api = ready()?;
    let mut raw = std::mem::MaybeUninit::<cf::CUfileDrvProps_t>::zeroed();
    // SAFETY: `raw` is a valid out-pointer for the properties.
    check("cuFileDriverGetProperties", unsafe {
        (api.get_properties)(raw.as_mut_ptr())
    })?;
    // SAFETY: zero-initialised and filled by a successful call; plain integers only.
    let raw = unsafe { raw.assume_init() };
    let flag = |bit: u32| raw.nvfs.dcontrolflags & (1 << bit) != 0;
    let p = Properties {
        major_version: raw.nvfs.major_version,
        minor_version: raw.nvfs.minor_version,
        allow_compat_mode: flag(cf::CUfileDriverControlFlags::CU_FILE_ALLOW_COMPAT_MODE as u32),
        poll_mode: flag(cf::CUfileDriverControlFlags::CU_FILE_USE_POLL_MODE as u32),
        poll_thresh_size: raw.nvfs.poll_thresh_size,
        max_device_cache_size: raw.max_device_cache_size as usize,
        per_buffer_cache_size: raw.per_buffer_cache_size as usize,
        max_pinned_memory_size: raw.max_device_pinned_mem_size as usize,
    };
    *guard = Some(p);
    Ok(p)
}

/// A settable driver property.
#[derive(Debug, Clone, Copy)]
pub enum Setting {
    /// `poll_mode`.
    PollMode(bool),
    /// `poll_thresh_size`, KiB.
    PollThreshSize(usize),
    /// `max_device_cache_size`, KiB.
    MaxDeviceCacheSize(usize),
    /// `max_pinned_memory_size`, KiB.
    MaxPinnedMemorySize(usize),
}

/// Set one driver property.
pub fn set_property(setting: Setting) -> Result<()> {
    let mut p = properties()?;
    let api = ready()?;
    match setting {
        Setting::PollMode(on) => {
            // SAFETY: plain values.
            check("cuFileDriverSetPollMode", unsafe {
                (api.set_poll_mode)(on, p.poll_thresh_size)
            })?;
            p.poll_mode = on;
        }
        Setting::PollThreshSize(kib) => {
            // SAFETY: plain values.
            check("cuFileDriverSetPollMode", unsafe {
                (api.set_poll_mode)(p.poll_mode, kib)
            })?;
            p.poll_thresh_size = kib;
        }
        Setting::MaxDeviceCacheSize(kib) => {
            // SAFETY: plain value.
            check("cuFileDriverSetMaxCacheSize", unsafe {
                (api.set_max_cache_size)(kib)
            })?;
            p.max_device_cache_size = kib;
        }
        Setting::MaxPinnedMemorySize(kib) => {
            // SAFETY: plain value.
            check("cuFileDriverSetMaxPinnedMemSize", unsafe {
                (api.set_max_pinned_size)(kib)
            })?;
            p.max_pinned_memory_size = kib;
        }
    }
    *cached().lock().unwrap_or_else(|e| e.into_inner()) = Some(p);
    Ok(())
}
