//! Memory the driver knows about: what kind a pointer is, device allocations, pinned host
//! allocations, and the pinned bounce-buffer pool. Above the device, below the streams.

use std::ffi::c_void;
use std::ptr::NonNull;
use std::sync::Arc;

use cudarc::driver::{result, sys, DriverError};

use super::device::free_under;
use super::device::{bind, device, made};
use super::driver::{check, ensure_driver, Named};
use crate::bounce::{BounceAllocator, BouncePool};
use crate::error::{Error, Result};

/// Where a pointer's memory lives, as the driver sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MemoryKind {
    /// Ordinary host memory, unknown to CUDA.
    Host,
    /// Page-locked host memory (cudaHostAlloc / cuMemHostRegister).
    PinnedHost,
    /// Device memory of GPU `ordinal`.
    Device {
        /// The CUDA device ordinal of the GPU that owns the memory.
        ordinal: usize,
    },
    /// Managed (unified) memory associated with GPU `ordinal`.
    Managed {
        /// The CUDA device ordinal the memory is associated with.
        ordinal: usize,
    },
}

/// The kind of memory at `ptr`.
pub fn memory_kind(ptr: u64) -> Result<MemoryKind> {
    ensure_driver()?;
    let mut mem_type: u32 = 0;
    let mut ordinal: i32 = -1;
    let mut managed: u32 = 0;
    let mut attrs = [
        sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_MEMORY_TYPE,
        sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL,
        sys::CUpointer_attribute::CU_POINTER_ATTRIBUTE_IS_MANAGED,
    ];
    let mut data: [*mut c_void; 3] = [
        (&mut mem_type as *mut u32).cast(),
        (&mut ordinal as *mut i32).cast(),
        (&mut managed as *mut u32).cast(),
    ];
    // SAFETY: three attributes, each with an out-pointer of the documented type
    // (CUmemorytype as u32, int, bool as u32), all valid for the call.
    let rc = unsafe {
        sys::cuPointerGetAttributes(
            3,
            attrs.as_mut_ptr(),
            data.as_mut_ptr(),
            ptr as sys::CUdeviceptr,
        )
    };
    if rc == sys::CUresult::CUDA_ERROR_INVALID_VALUE {
        return Ok(MemoryKind::Host); // memory the driver has never seen
    }
    check("cuPointerGetAttributes", rc)?;
    let ordinal = ordinal.max(0) as usize;
    Ok(if managed != 0 {
        MemoryKind::Managed { ordinal }
    } else if mem_type == sys::CUmemorytype::CU_MEMORYTYPE_DEVICE as u32 {
        MemoryKind::Device { ordinal }
    } else if mem_type == sys::CUmemorytype::CU_MEMORYTYPE_HOST as u32 {
        MemoryKind::PinnedHost
    } else {
        MemoryKind::Host
    })
}

/// Device memory owned by kvikpy (freed on drop, with its device's context bound).
#[derive(Debug)]
pub struct DeviceAllocation {
    ptr: sys::CUdeviceptr,
    size: usize,
    ordinal: usize,
}

impl DeviceAllocation {
    /// Allocate `size` bytes (at least 1) on device `ordinal`.
    pub fn new(ordinal: usize, size: usize) -> Result<Self> {
        let _context = bind(ordinal)?;
        // SAFETY: the device's context is current.
        let ptr = match unsafe { result::malloc_sync(size.max(1)) } {
            Err(DriverError(sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY)) => {
                return Err(Error::OutOfMemory(format!(
                    "out of GPU memory allocating {size} bytes on cuda:{ordinal}; read a \
                     smaller range or free GPU memory"
                )))
            }
            other => other.named("cuMemAlloc")?,
        };
        Ok(Self { ptr, size, ordinal })
    }

    /// Device address of the first byte.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Size in bytes.
    pub fn size(&self) -> usize {
        self.size
    }

    /// The device's ordinal.
    pub fn ordinal(&self) -> usize {
        self.ordinal
    }
}

impl Drop for DeviceAllocation {
    fn drop(&mut self) {
        let ptr = self.ptr;
        free_under(self.ordinal, move || {
            // SAFETY: `ptr` came from cuMemAlloc in this context and is freed only here.
            let _ = unsafe { result::free_sync(ptr) };
        });
    }
}

/// Pinned host memory allocated under device `ordinal`'s context (the device it serves).
fn host_alloc(ordinal: usize, size: usize, flags: u32) -> Result<NonNull<u8>> {
    let _context = bind(ordinal)?;
    // SAFETY: a context is current. PORTABLE makes the memory pinned for every context,
    // so any device can DMA from it.
    let ptr =
        match unsafe { result::malloc_host(size.max(1), flags | sys::CU_MEMHOSTALLOC_PORTABLE) } {
            Err(DriverError(sys::CUresult::CUDA_ERROR_OUT_OF_MEMORY)) => {
                return Err(Error::OutOfMemory(format!(
                    "could not pin {size} bytes of host memory for cuda:{ordinal}; lower \
                 bounce_buffer_size or num_threads, or free host memory"
                )))
            }
            other => other.named("cuMemHostAlloc")?,
        };
    NonNull::new(ptr.cast())
        .ok_or_else(|| Error::InvalidArgument("cuMemHostAlloc returned NULL".into()))
}

/// Free memory from [`host_alloc`] under the same device's context.
fn host_free(ordinal: usize, ptr: NonNull<u8>) {
    let address = ptr.as_ptr() as usize;
    free_under(ordinal, move || {
        // SAFETY: `address` came from cuMemHostAlloc and is freed exactly once, here.
        let _ = unsafe { result::free_host(address as *mut c_void) };
    });
}

/// Page-locked host memory owned by kvikpy (for `device="cpu"` reads and stream flags).
#[derive(Debug)]
pub struct PinnedHostAllocation {
    ptr: NonNull<u8>,
    ordinal: usize,
}

// SAFETY: plain memory exclusively owned by this value.
unsafe impl Send for PinnedHostAllocation {}
// SAFETY: shared access only exposes the address.
unsafe impl Sync for PinnedHostAllocation {}

impl PinnedHostAllocation {
    /// Allocate `size` bytes of pinned, page-aligned host memory for device `ordinal`
    /// (portable: every device can DMA from it; allocated and freed under `ordinal`'s
    /// context).
    pub fn new(ordinal: usize, size: usize) -> Result<Self> {
        Ok(Self {
            ptr: host_alloc(ordinal, size, 0)?,
            ordinal,
        })
    }

    /// Address of the first byte.
    pub fn as_ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }
}

impl Drop for PinnedHostAllocation {
    fn drop(&mut self) {
        host_free(self.ordinal, self.ptr);
    }
}

/// Pinned, page-aligned bounce buffers for device `ordinal`: the driver DMAs straight from
/// them, and O_DIRECT reads land in them with no further copy.
#[derive(Debug, Default, Clone, Copy)]
pub struct PinnedAllocator {
    /// The device whose context allocates and frees the buffers.
    pub ordinal: usize,
}

impl BounceAllocator for PinnedAllocator {
    fn allocate(&self, size: usize) -> Result<NonNull<u8>> {
        host_alloc(self.ordinal, size, 0)
    }

    unsafe fn deallocate(&self, ptr: NonNull<u8>, _size: usize) {
        host_free(self.ordinal, ptr);
    }
}

/// The pool of pinned bounce buffers for transfers to and from device `ordinal`.
pub fn pinned_pool(ordinal: usize) -> Result<Arc<BouncePool>> {
    let slot = device(ordinal)?.pinned_slot();
    Ok(Arc::clone(slot.get_or_init(|| {
        BouncePool::new(PinnedAllocator { ordinal })
    })))
}

/// What each device's pinned pool holds, by device ordinal (devices whose pool was never
/// made are left out).
pub fn pinned_memory() -> Vec<(usize, crate::bounce::PoolMemory)> {
    made()
        .iter()
        .filter_map(|device| Some((device.ordinal(), device.pinned_slot().get()?.memory())))
        .collect()
}

/// Start every pinned pool's peaks again from what it holds now.
pub fn reset_pinned_peaks() {
    for device in made() {
        if let Some(pool) = device.pinned_slot().get() {
            pool.reset_peaks();
        }
    }
}

/// Free the idle buffers of every device's pinned pool; returns the bytes freed.
pub fn free_idle_pinned() -> usize {
    made()
        .iter()
        .filter_map(|device| device.pinned_slot().get())
        .map(|pool| pool.free_idle())
        .sum()
}
