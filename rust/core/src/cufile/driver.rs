//! The driver's lifecycle, process-wide: opened on first use, closed at exit (after the
//! operations in flight), forgotten in a forked child; and file handles registered with it.

use std::collections::HashSet;
use std::ffi::{c_int, c_void};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use cudarc::cufile::sys as cf;

use crate::error::{Error, Result};
use crate::fork::ForkLocal;

use super::library::{api, Api};
use super::status::check;

/// The loaded library, or [`Error::CuFile`] saying why there is none. In a forked child
/// of a process that initialised CUDA, [`Error::CudaUnavailable`] saying so: cuFile runs
/// on the parent's CUDA context, which the child cannot use.
pub fn library() -> Result<&'static Api> {
    crate::cuda::refuse_after_fork()?;
    api().map_err(|why| Error::CuFile(format!("cuFile is not available: {why}")))
}

/// Driver state: whether kvikpy opened it, whether it is shutting down, calls in flight.
pub(super) struct State {
    opened: Mutex<bool>,
    closing: AtomicBool,
    in_flight: AtomicUsize,
    handles: Mutex<HashSet<usize>>,
    /// The streams registered with the driver (see `register.rs`), deregistered at shutdown.
    pub(super) streams: Mutex<HashSet<usize>>,
}

/// Forgotten in a forked child (see [`forget_in_child`]).
static STATE: ForkLocal<State> = ForkLocal::new(|| State {
    opened: Mutex::new(false),
    closing: AtomicBool::new(false),
    in_flight: AtomicUsize::new(0),
    handles: Mutex::new(HashSet::new()),
    streams: Mutex::new(HashSet::new()),
});

pub(super) fn state() -> &'static State {
    STATE.get()
}

/// In a forked child: forget the parent's driver state (its calls in flight, handles and
/// locks are the parent's), so that the child's exit does not wait for the parent's calls
/// or close the parent's handles. Async-signal-safe.
pub(super) fn forget_in_child() {
    STATE.forget();
}

/// The library with its driver open (opened on the first call, by kvikpy, and closed by
/// [`shutdown`]).
pub fn ready() -> Result<&'static Api> {
    let api = library()?;
    let s = state();
    if s.closing.load(Ordering::Acquire) {
        return Err(Error::CuFile(
            "the cuFile driver was closed at interpreter exit".into(),
        ));
    }
    let mut opened = s.opened.lock().unwrap_or_else(|e| e.into_inner());
    if !*opened {
        crate::cuda::note_initialised(); // the driver initialises CUDA
                                         // SAFETY: cuFileDriverOpen takes no arguments.
        check("cuFileDriverOpen", unsafe { (api.driver_open)() })?;
        *opened = true;
    }
    Ok(api)
}

/// A cuFile call in flight: [`shutdown`] waits for these before it closes the driver.
pub struct InFlight(());

impl InFlight {
    /// Start a call; fails once the driver is closing.
    pub fn begin() -> Result<Self> {
        let s = state();
        s.in_flight.fetch_add(1, Ordering::AcqRel);
        if s.closing.load(Ordering::Acquire) {
            s.in_flight.fetch_sub(1, Ordering::AcqRel);
            return Err(Error::CuFile(
                "the cuFile driver was closed at interpreter exit".into(),
            ));
        }
        Ok(Self(()))
    }
}

impl Drop for InFlight {
    fn drop(&mut self) {
        state().in_flight.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Register `fd` with cuFile; the handle is tracked so that [`shutdown`] can deregister
/// it if its file is still open at exit.
pub fn register_handle(fd: c_int) -> Result<usize> {
    let api = ready()?;
    let _call = InFlight::begin()?;
    // Built field by field: all-zero bytes are not a valid `CUfileDescr_t` (its tag is a
    // Rust enum), and `mem::zeroed` of it aborts the process.
    let mut descr = cf::CUfileDescr_t {
        type_: cf::CUfileFileHandleType::CU_FILE_HANDLE_TYPE_OPAQUE_FD,
        handle: cf::CUfileDescr_t__bindgen_ty_1 { fd },
        fs_ops: std::ptr::null(),
    };
    let d: *mut cf::CUfileDescr_t = &mut descr;
    let mut handle: cf::CUfileHandle_t = std::ptr::null_mut();
    // SAFETY: both pointers are valid for the call; `fd` is an open descriptor.
    check("cuFileHandleRegister", unsafe {
        (api.handle_register)(&mut handle, d)
    })?;
    let key = handle as usize;
    state()
        .handles
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .insert(key);
    Ok(key)
}

/// Deregister a handle from [`register_handle`], unless [`shutdown`] already did.
pub fn deregister_handle(handle: usize) {
    let known = state()
        .handles
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(&handle);
    if let (true, Ok(api)) = (known, api()) {
        // SAFETY: the handle came from cuFileHandleRegister and was removed from the set
        // above, so it is deregistered exactly once.
        unsafe { (api.handle_deregister)(handle as cf::CUfileHandle_t) };
    }
}

/// Close everything kvikpy opened, once, at interpreter exit: wait up to `timeout` for
/// cuFile calls in flight, deregister the streams kvikpy registered and the handles of
/// files still open, and close the driver. Later cuFile calls fail with a clear error.
/// Returns whether the driver was closed (false: never opened, or calls still running).
pub fn shutdown(timeout: Duration) -> bool {
    let s = state();
    if s.closing.swap(true, Ordering::AcqRel) {
        return false;
    }
    let Ok(api) = api() else { return false };
    let deadline = Instant::now() + timeout;
    while s.in_flight.load(Ordering::Acquire) > 0 {
        if Instant::now() >= deadline {
            return false; // leave the driver open rather than pull it from under a call
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    if let Some(deregister) = api.stream_deregister {
        for stream in s.streams.lock().unwrap_or_else(|e| e.into_inner()).drain() {
            // SAFETY: kvikpy registered this stream; deregistered once, here.
            let _ = unsafe { deregister(stream as *mut c_void) };
        }
    }
    for handle in s.handles.lock().unwrap_or_else(|e| e.into_inner()).drain() {
        // SAFETY: registered by `register_handle`, removed from the set here, so once.
        unsafe { (api.handle_deregister)(handle as cf::CUfileHandle_t) };
    }
    let mut opened = s.opened.lock().unwrap_or_else(|e| e.into_inner());
    if std::mem::take(&mut *opened) {
        // SAFETY: the driver was opened by `ready`; closed once.
        return unsafe { (api.driver_close)() }.err == 0;
    }
    false
}

/// kvikio's `driver_open()`: one more `cuFileDriverOpen`, to be matched by [`driver_close`].
pub fn driver_open() -> Result<()> {
    let api = library()?;
    crate::cuda::note_initialised(); // the driver initialises CUDA
                                     // SAFETY: cuFileDriverOpen takes no arguments.
    check("cuFileDriverOpen", unsafe { (api.driver_open)() })
}

/// kvikio's `driver_close()`: one `cuFileDriverClose`.
pub fn driver_close() -> Result<()> {
    let api = library()?;
    // SAFETY: cuFileDriverClose takes no arguments.
    check("cuFileDriverClose", unsafe { (api.driver_close)() })
}

/// libcufile's version as cuFile reports it (`1150` for 1.15), 0 without the library or
/// before libcufile 1.8.
pub fn version() -> i32 {
    let Ok(api) = api() else { return 0 };
    let Some(get) = api.get_version else { return 0 };
    let mut v: c_int = 0;
    // SAFETY: `v` is a valid out-pointer.
    if unsafe { get(&mut v) }.err == 0 {
        v
    } else {
        0
    }
}

/// Contain a panic from cudarc or libcufile in `f` as an [`Error::CuFile`].
pub fn contained<T>(f: impl FnOnce() -> Result<T>) -> Result<T> {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|p| {
        Err(Error::CuFile(format!(
            "cuFile call panicked: {}",
            crate::error::panic_message(p.as_ref())
        )))
    })
}
