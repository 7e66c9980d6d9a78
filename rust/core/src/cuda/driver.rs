//! Loading the driver: `cuInit` once per process (and never in a forked child), the device
//! count, and the driver's result codes as engine errors. The bottom of `cuda/`: it
//! imports nothing of its siblings.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use cudarc::driver::{sys, DriverError};

use crate::error::{Error, Result};

static INIT: OnceLock<std::result::Result<usize, String>> = OnceLock::new();

/// The fork generation (see [`crate::fork`]) that called `cuInit`, or [`NEVER`].
static INIT_GENERATION: AtomicU64 = AtomicU64::new(NEVER);
const NEVER: u64 = u64::MAX;

/// Why CUDA is refused in a forked child of a process that initialised it.
const FORKED: &str = "CUDA was initialised in the parent process before os.fork(), and a \
     forked child cannot use it (a CUDA context does not survive fork); start worker \
     processes with multiprocessing's \"spawn\" or \"forkserver\" start method to use the \
     GPU in them";

fn init() -> std::result::Result<usize, String> {
    // SAFETY: is_culib_present only tries to dlopen the library names.
    if !unsafe { sys::is_culib_present() } {
        return Err("the NVIDIA driver library libcuda.so.1 was not found".into());
    }
    // Recorded before cuInit, so that a child forked while it runs refuses CUDA too.
    note_initialised();
    // cudarc panics when a symbol is missing (a driver older than the API we were built
    // for); contain that here so it becomes "unavailable" rather than a crash.
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: cuInit(0) has no preconditions and may be called repeatedly.
        let rc = unsafe { sys::cuInit(0) };
        if rc != sys::CUresult::CUDA_SUCCESS {
            return Err(format!("cuInit failed: {}", error_name(rc)));
        }
        let mut count = 0i32;
        // SAFETY: `count` is a valid out-pointer.
        let rc = unsafe { sys::cuDeviceGetCount(&mut count) };
        if rc != sys::CUresult::CUDA_SUCCESS {
            return Err(format!("cuDeviceGetCount failed: {}", error_name(rc)));
        }
        Ok(count.max(0) as usize)
    }));
    outcome.unwrap_or_else(|_| Err("the CUDA driver is too old for kvikpy".into()))
}

/// The name of a driver error code (for example `CUDA_ERROR_OUT_OF_MEMORY`).
pub fn error_name(rc: sys::CUresult) -> String {
    format!("{rc:?}")
}

/// Whether CUDA was initialised in a process this one was forked from (two relaxed
/// atomic loads; never initialises anything).
fn forked_after_init() -> bool {
    let born = INIT_GENERATION.load(Ordering::Relaxed);
    born != NEVER && born != crate::fork::generation()
}

/// The driver's state: the device count, or why there is no usable driver. In a forked
/// child of a process that initialised CUDA, always the refusal, checked before anything
/// that could wait on a lock of the parent's driver.
fn driver() -> std::result::Result<usize, &'static str> {
    if forked_after_init() {
        return Err(FORKED);
    }
    INIT.get_or_init(init)
        .as_ref()
        .map(|n| *n)
        .map_err(String::as_str)
}

/// Record that a library initialising CUDA by itself (cuFile's driver) is being started
/// in this process, so that a child forked from now on refuses CUDA (and cuFile) as it
/// would after kvikpy's own `cuInit`.
pub fn note_initialised() {
    let _ = INIT_GENERATION.compare_exchange(
        NEVER,
        crate::fork::generation(),
        Ordering::Relaxed,
        Ordering::Relaxed,
    );
}

/// [`Error::CudaUnavailable`] saying why, in a forked child of a process that initialised
/// CUDA (which the child cannot use); for callers such as the cuFile driver that must
/// not start there. Initialises nothing.
pub fn refuse_after_fork() -> Result<()> {
    if forked_after_init() {
        return Err(Error::CudaUnavailable(FORKED.into()));
    }
    Ok(())
}

/// Whether a CUDA driver loaded and reported at least one device.
pub fn available() -> bool {
    matches!(driver(), Ok(n) if n > 0)
}

/// Why CUDA is unavailable, or `None` when it is available.
pub fn unavailable_reason() -> Option<String> {
    match driver() {
        Ok(0) => Some("the CUDA driver reports no GPU".into()),
        Ok(_) => None,
        Err(reason) => Some(reason.into()),
    }
}

/// Fail with [`Error::CudaUnavailable`] unless the driver is usable.
pub fn ensure_driver() -> Result<usize> {
    match driver() {
        Ok(n) if n > 0 => Ok(n),
        _ => Err(Error::CudaUnavailable(
            unavailable_reason().unwrap_or_else(|| "unknown reason".into()),
        )),
    }
}

/// Number of CUDA devices (0 without a driver, and in a forked child that cannot use
/// the parent's CUDA).
pub fn device_count() -> usize {
    driver().unwrap_or(0)
}

/// Names the driver call behind a cudarc `result` layer error.
pub trait Named<T> {
    /// The engine's [`Error::Cuda`] for `call`, from cudarc's error.
    fn named(self, call: &'static str) -> Result<T>;
}

impl<T> Named<T> for std::result::Result<T, DriverError> {
    fn named(self, call: &'static str) -> Result<T> {
        self.map_err(|DriverError(rc)| Error::Cuda {
            call,
            code: rc as i32,
            name: error_name(rc),
        })
    }
}

/// Turn a driver status into a `Result`, naming the call.
pub fn check(call: &'static str, rc: sys::CUresult) -> Result<()> {
    if rc == sys::CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(Error::Cuda {
            call,
            code: rc as i32,
            name: error_name(rc),
        })
    }
}

/// The device of the calling thread's current context, or 0 when none is current.
pub fn current_device() -> Result<usize> {
    ensure_driver()?;
    let mut device: sys::CUdevice = 0;
    // SAFETY: `device` is an out-pointer; without a current context the call fails cleanly.
    let rc = unsafe { sys::cuCtxGetDevice(&mut device) };
    Ok(if rc == sys::CUresult::CUDA_SUCCESS {
        device.max(0) as usize
    } else {
        0
    })
}
