//! The cuFile (GPUDirect Storage) library and driver, process-wide: loading libcufile at
//! run time, opening the driver on first use and closing it at exit, its properties, the
//! buffer and stream registrations, and the reasons cuFile cannot be used here.
//!
//! libcufile is found through cudarc's `cufile` module (its library names and loader), so
//! nothing is needed at build time; every entry point is looked up by name once, and a
//! missing library or symbol is an error value, never a panic. `KVIKPY_CUFILE_LIBRARY`
//! names a library file to load instead (the test suite's stand-in): it is opened by path,
//! globally, before cudarc's first lookup, and cudarc's lookup must then resolve to it.
//!
//! The entry points are called through function pointers typed here with plain integers
//! for cuFile's status codes: a code newer than cudarc's enums cannot become an invalid
//! Rust enum value.

use std::collections::HashSet;
use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use cudarc::cufile::sys as cf;

use crate::error::{Error, Result};
use crate::fork::ForkLocal;
use crate::settings::CompatMode;

/// The environment variable naming a libcufile to load instead of the system's.
pub const LIBRARY_VAR: &str = "KVIKPY_CUFILE_LIBRARY";

/// cuFile's status pair as returned by value: the cuFile code and a CUDA driver code.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct Status {
    /// `CUfileOpError`: 0 on success, 5001 and up for cuFile's errors.
    pub err: c_uint,
    /// The CUDA driver's `CUresult` where cuFile reports one.
    pub cu_err: c_uint,
}

type Plain = unsafe extern "C" fn() -> Status;
type Register = unsafe extern "C" fn(*mut cf::CUfileHandle_t, *mut cf::CUfileDescr_t) -> Status;
type Deregister = unsafe extern "C" fn(cf::CUfileHandle_t);
type Rw = unsafe extern "C" fn(cf::CUfileHandle_t, *mut c_void, usize, i64, i64) -> isize;
/// `cuFileReadAsync` / `cuFileWriteAsync`.
pub type RwAsync = unsafe extern "C" fn(
    cf::CUfileHandle_t,
    *mut c_void,
    *mut usize,
    *mut i64,
    *mut i64,
    *mut isize,
    *mut c_void,
) -> Status;
type BufRegister = unsafe extern "C" fn(*const c_void, usize, c_int) -> Status;
type BufDeregister = unsafe extern "C" fn(*const c_void) -> Status;
type StreamRegister = unsafe extern "C" fn(*mut c_void, c_uint) -> Status;
type StreamDeregister = unsafe extern "C" fn(*mut c_void) -> Status;
type GetProps = unsafe extern "C" fn(*mut cf::CUfileDrvProps_t) -> Status;
type SetPoll = unsafe extern "C" fn(bool, usize) -> Status;
type SetSize = unsafe extern "C" fn(usize) -> Status;
type GetVersion = unsafe extern "C" fn(*mut c_int) -> Status;
type BatchSetUp = unsafe extern "C" fn(*mut cf::CUfileBatchHandle_t, c_uint) -> Status;
type BatchSubmit = unsafe extern "C" fn(
    cf::CUfileBatchHandle_t,
    c_uint,
    *mut cf::CUfileIOParams,
    c_uint,
) -> Status;
type BatchStatus = unsafe extern "C" fn(
    cf::CUfileBatchHandle_t,
    c_uint,
    *mut c_uint,
    *mut RawEvent,
    *mut libc::timespec,
) -> Status;
type BatchDestroy = unsafe extern "C" fn(cf::CUfileBatchHandle_t);
type Describe = unsafe extern "C" fn() -> *const c_char;

/// `CUfileIOEvents_t` with its status as a plain integer (cuFile fills it in).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct RawEvent {
    /// The cookie given with the request.
    pub cookie: *mut c_void,
    /// `CUfileStatus_t`.
    pub status: u32,
    /// Bytes moved (or a negative error, as a `size_t`).
    pub ret: usize,
}

/// libcufile's entry points, looked up once.
#[derive(Debug)]
pub struct Api {
    /// `cuFileDriverOpen`.
    pub driver_open: Plain,
    /// `cuFileDriverClose` (`_v2` where the library has it).
    pub driver_close: Plain,
    /// `cuFileHandleRegister`.
    pub handle_register: Register,
    /// `cuFileHandleDeregister`.
    pub handle_deregister: Deregister,
    /// `cuFileRead`.
    pub read: Rw,
    /// `cuFileWrite`.
    pub write: Rw,
    /// `cuFileBufRegister`.
    pub buf_register: BufRegister,
    /// `cuFileBufDeregister`.
    pub buf_deregister: BufDeregister,
    /// `cuFileDriverGetProperties`.
    pub get_properties: GetProps,
    /// `cuFileDriverSetPollMode`.
    pub set_poll_mode: SetPoll,
    /// `cuFileDriverSetMaxCacheSize`.
    pub set_max_cache_size: SetSize,
    /// `cuFileDriverSetMaxPinnedMemSize`.
    pub set_max_pinned_size: SetSize,
    /// `cuFileGetVersion` (libcufile 1.8 and later).
    pub get_version: Option<GetVersion>,
    /// `cuFileReadAsync` (libcufile 1.6 and later), with the three below.
    pub read_async: Option<RwAsync>,
    /// `cuFileWriteAsync`.
    pub write_async: Option<RwAsync>,
    /// `cuFileStreamRegister`.
    pub stream_register: Option<StreamRegister>,
    /// `cuFileStreamDeregister`.
    pub stream_deregister: Option<StreamDeregister>,
    /// The batch API: `cuFileBatchIOSetUp`, `Submit`, `GetStatus`, `Destroy`.
    pub batch: Option<(BatchSetUp, BatchSubmit, BatchStatus, BatchDestroy)>,
    /// The file the entry points live in.
    pub library: String,
    /// The stand-in's own description, where the library is kvikpy's test stand-in.
    pub standin: Option<String>,
}

// SAFETY: the struct holds plain function pointers and strings; libcufile's entry points
// may be called from any thread.
unsafe impl Sync for Api {}
// SAFETY: as above.
unsafe impl Send for Api {}

/// The library, or why it could not be loaded (computed once per process).
pub fn api() -> std::result::Result<&'static Api, String> {
    static API: OnceLock<std::result::Result<Api, String>> = OnceLock::new();
    API.get_or_init(|| {
        catch_unwind(load).unwrap_or_else(|p| {
            Err(format!(
                "loading libcufile failed: {}",
                crate::error::panic_message(p.as_ref())
            ))
        })
    })
    .as_ref()
    .map_err(Clone::clone)
}

fn dlerror() -> String {
    // SAFETY: dlerror has no preconditions; a non-null result is a NUL-terminated string
    // valid until the next dl call on this thread, copied at once.
    let msg = unsafe { libc::dlerror() };
    if msg.is_null() {
        return "unknown error".into();
    }
    // SAFETY: non-null, NUL-terminated (see above).
    unsafe { CStr::from_ptr(msg) }
        .to_string_lossy()
        .into_owned()
}

fn load() -> std::result::Result<Api, String> {
    let chosen = match std::env::var(LIBRARY_VAR) {
        Ok(path) if !path.is_empty() => Some(path),
        _ => None,
    };
    let mut own_handle: *mut c_void = std::ptr::null_mut();
    if let Some(path) = &chosen {
        let cpath = CString::new(path.as_str())
            .map_err(|_| format!("{LIBRARY_VAR}={path:?} contains a NUL byte"))?;
        // SAFETY: `cpath` is NUL-terminated. The handle is never closed: the library
        // stays loaded for the life of the process, as cudarc's own handle does.
        own_handle = unsafe { libc::dlopen(cpath.as_ptr(), libc::RTLD_NOW | libc::RTLD_GLOBAL) };
        if own_handle.is_null() {
            return Err(format!(
                "{LIBRARY_VAR}={path} cannot be loaded: {}",
                dlerror()
            ));
        }
    }
    // SAFETY: cudarc's presence check only tries to open its candidate names.
    if !unsafe { cf::is_culib_present() } {
        return Err(match &chosen {
            Some(path) => format!(
                "{LIBRARY_VAR}={path} loaded, but cudarc's names for libcufile \
                 (libcufile.so, libcufile.so.1, ...) do not resolve to it: its SONAME \
                 must be one of them"
            ),
            None => "libcufile is not installed (no libcufile.so or libcufile.so.1 on the \
                     library path; it ships with the CUDA toolkit and the nvidia-cufile \
                     wheels)"
                .into(),
        });
    }
    // SAFETY: the presence check passed, so cudarc's loader finds a library (it would
    // panic otherwise, and `api` catches that too).
    let lib = unsafe { cf::culib() };
    let need = |name: &str| -> std::result::Result<*mut c_void, String> {
        // SAFETY: looking a symbol up has no preconditions; it is typed by the caller.
        unsafe { lib.get::<*mut c_void>(name.as_bytes()) }
            .map(|s| *s)
            .map_err(|e| format!("libcufile has no {name}: {e}"))
    };
    let want = |name: &str| need(name).ok();
    if !own_handle.is_null() {
        // The library cudarc resolved must be the one named by the variable.
        // SAFETY: `own_handle` is a live handle; the name is NUL-terminated.
        let ours = unsafe { libc::dlsym(own_handle, c"cuFileDriverOpen".as_ptr()) };
        if ours.is_null() || ours != need("cuFileDriverOpen")? {
            return Err(format!(
                "{LIBRARY_VAR}={} loaded, but cudarc resolved libcufile to another \
                 library; give the file the SONAME libcufile.so",
                chosen.unwrap_or_default()
            ));
        }
    }
    macro_rules! cast {
        ($ptr:expr, $ty:ty) => {{
            let p: *mut c_void = $ptr;
            // SAFETY: the symbol is cuFile's entry point of this name, whose C signature
            // is the type named here (status codes as plain integers).
            unsafe { std::mem::transmute::<*mut c_void, $ty>(p) }
        }};
    }
    let driver_open = need("cuFileDriverOpen")?;
    let close = want("cuFileDriverClose_v2").map_or_else(|| need("cuFileDriverClose"), Ok)?;
    let batch = match (
        want("cuFileBatchIOSetUp"),
        want("cuFileBatchIOSubmit"),
        want("cuFileBatchIOGetStatus"),
        want("cuFileBatchIODestroy"),
    ) {
        (Some(a), Some(b), Some(c), Some(d)) => Some((
            cast!(a, BatchSetUp),
            cast!(b, BatchSubmit),
            cast!(c, BatchStatus),
            cast!(d, BatchDestroy),
        )),
        _ => None,
    };
    let standin = want("kvikpy_cufile_standin").and_then(|p| {
        let describe = cast!(p, Describe);
        // SAFETY: the stand-in's description function takes nothing and returns a
        // static NUL-terminated string (or null).
        let text = unsafe { describe() };
        if text.is_null() {
            return None;
        }
        // SAFETY: checked non-null; static for the life of the library.
        let text = unsafe { CStr::from_ptr(text) };
        Some(text.to_string_lossy().into_owned())
    });
    Ok(Api {
        driver_open: cast!(driver_open, Plain),
        driver_close: cast!(close, Plain),
        handle_register: cast!(need("cuFileHandleRegister")?, Register),
        handle_deregister: cast!(need("cuFileHandleDeregister")?, Deregister),
        read: cast!(need("cuFileRead")?, Rw),
        write: cast!(need("cuFileWrite")?, Rw),
        buf_register: cast!(need("cuFileBufRegister")?, BufRegister),
        buf_deregister: cast!(need("cuFileBufDeregister")?, BufDeregister),
        get_properties: cast!(need("cuFileDriverGetProperties")?, GetProps),
        set_poll_mode: cast!(need("cuFileDriverSetPollMode")?, SetPoll),
        set_max_cache_size: cast!(need("cuFileDriverSetMaxCacheSize")?, SetSize),
        set_max_pinned_size: cast!(need("cuFileDriverSetMaxPinnedMemSize")?, SetSize),
        get_version: want("cuFileGetVersion").map(|p| cast!(p, GetVersion)),
        read_async: want("cuFileReadAsync").map(|p| cast!(p, RwAsync)),
        write_async: want("cuFileWriteAsync").map(|p| cast!(p, RwAsync)),
        stream_register: want("cuFileStreamRegister").map(|p| cast!(p, StreamRegister)),
        stream_deregister: want("cuFileStreamDeregister").map(|p| cast!(p, StreamDeregister)),
        batch,
        library: library_file(driver_open).unwrap_or_else(|| "libcufile".into()),
        standin,
    })
}

/// The file a loaded symbol lives in.
fn library_file(symbol: *mut c_void) -> Option<String> {
    let mut info = std::mem::MaybeUninit::<libc::Dl_info>::zeroed();
    // SAFETY: `symbol` is an address inside a loaded library; `info` is a valid out-pointer.
    if unsafe { libc::dladdr(symbol, info.as_mut_ptr()) } == 0 {
        return None;
    }
    // SAFETY: dladdr succeeded, so it filled `info`.
    let info = unsafe { info.assume_init() };
    if info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: a non-null dli_fname is a NUL-terminated path owned by the loader.
    let name = unsafe { CStr::from_ptr(info.dli_fname) };
    Some(name.to_string_lossy().into_owned())
}

/// The name and a short description of cuFile status code `code`.
pub fn describe(code: u32) -> (&'static str, &'static str) {
    match code {
        0 => ("SUCCESS", "success"),
        5001 => (
            "DRIVER_NOT_INITIALIZED",
            "the nvidia-fs driver is not loaded",
        ),
        5002 => ("DRIVER_INVALID_PROPS", "invalid driver properties"),
        5003 => ("DRIVER_UNSUPPORTED_LIMIT", "a driver limit is out of range"),
        5004 => (
            "DRIVER_VERSION_MISMATCH",
            "the nvidia-fs driver's version does not match",
        ),
        5005 => (
            "DRIVER_VERSION_READ_ERROR",
            "the nvidia-fs driver's version cannot be read",
        ),
        5006 => ("DRIVER_CLOSING", "the driver is closing"),
        5007 => (
            "PLATFORM_NOT_SUPPORTED",
            "this platform does not support GDS",
        ),
        5008 => ("IO_NOT_SUPPORTED", "this file system does not support GDS"),
        5009 => ("DEVICE_NOT_SUPPORTED", "this GPU does not support GDS"),
        5010 => ("NVFS_DRIVER_ERROR", "the nvidia-fs driver failed"),
        5011 => ("CUDA_DRIVER_ERROR", "a CUDA driver call failed"),
        5012 => ("CUDA_POINTER_INVALID", "the pointer is not device memory"),
        5013 => (
            "CUDA_MEMORY_TYPE_INVALID",
            "this kind of memory is not supported",
        ),
        5014 => (
            "CUDA_POINTER_RANGE_ERROR",
            "the range lies outside the allocation",
        ),
        5015 => (
            "CUDA_CONTEXT_MISMATCH",
            "the memory belongs to another CUDA context",
        ),
        5016 => ("INVALID_MAPPING_SIZE", "the mapping size is invalid"),
        5017 => ("INVALID_MAPPING_RANGE", "the mapping range is invalid"),
        5018 => ("INVALID_FILE_TYPE", "this kind of file is not supported"),
        5019 => (
            "INVALID_FILE_OPEN_FLAG",
            "the file's open flags are not supported",
        ),
        5020 => ("DIO_NOT_SET", "the file was not opened with O_DIRECT"),
        5022 => ("INVALID_VALUE", "an argument is invalid"),
        5023 => (
            "MEMORY_ALREADY_REGISTERED",
            "the memory is already registered",
        ),
        5024 => ("MEMORY_NOT_REGISTERED", "the memory is not registered"),
        5025 => ("PERMISSION_DENIED", "permission denied"),
        5026 => ("DRIVER_ALREADY_OPEN", "the driver is already open"),
        5027 => ("HANDLE_NOT_REGISTERED", "file descriptor is not registered"),
        5028 => (
            "HANDLE_ALREADY_REGISTERED",
            "the file is already registered",
        ),
        5029 => ("DEVICE_NOT_FOUND", "no GPU found"),
        5030 => ("INTERNAL_ERROR", "cuFile internal error"),
        5031 => (
            "GETNEWFD_FAILED",
            "cuFile could not get a new file descriptor",
        ),
        5033 => (
            "NVFS_SETUP_ERROR",
            "the nvidia-fs driver could not be set up",
        ),
        5034 => ("IO_DISABLED", "GDS is disabled by the configuration"),
        5035 => ("BATCH_SUBMIT_FAILED", "the batch could not be submitted"),
        5036 => (
            "GPU_MEMORY_PINNING_FAILED",
            "GPU memory could not be pinned",
        ),
        5037 => ("BATCH_FULL", "the batch has no free slot"),
        5038 => ("ASYNC_NOT_SUPPORTED", "asynchronous I/O is not supported"),
        _ => ("UNKNOWN", "an error code kvikpy does not know"),
    }
}

/// cuFile's message for status code `code`: `NAME (code) description`.
pub fn message(code: u32) -> String {
    let (name, text) = describe(code);
    format!("{name} ({code}) {text}")
}

/// `Ok` for a successful status, else [`Error::CuFile`] naming `call` and cuFile's message.
pub fn check(call: &str, status: Status) -> Result<()> {
    if status.err == 0 {
        return Ok(());
    }
    let mut text = format!("{} (in {call}", message(status.err));
    if status.cu_err != 0 {
        text.push_str(&format!(", CUDA error {}", status.cu_err));
    }
    text.push(')');
    Err(Error::CuFile(text))
}

/// The loaded library, or [`Error::CuFile`] saying why there is none. In a forked child
/// of a process that initialised CUDA, [`Error::CudaUnavailable`] saying so: cuFile runs
/// on the parent's CUDA context, which the child cannot use.
pub fn library() -> Result<&'static Api> {
    crate::cuda::refuse_after_fork()?;
    api().map_err(|why| Error::CuFile(format!("cuFile is not available: {why}")))
}

/// Driver state: whether kvikpy opened it, whether it is shutting down, calls in flight.
struct State {
    opened: Mutex<bool>,
    closing: AtomicBool,
    in_flight: AtomicUsize,
    handles: Mutex<HashSet<usize>>,
    streams: Mutex<HashSet<usize>>,
}

/// Forgotten in a forked child (see [`forget_in_child`]).
static STATE: ForkLocal<State> = ForkLocal::new(|| State {
    opened: Mutex::new(false),
    closing: AtomicBool::new(false),
    in_flight: AtomicUsize::new(0),
    handles: Mutex::new(HashSet::new()),
    streams: Mutex::new(HashSet::new()),
});

fn state() -> &'static State {
    STATE.get()
}

/// In a forked child: forget the parent's driver state (its calls in flight, handles and
/// locks are the parent's), so that the child's exit does not wait for the parent's calls
/// or close the parent's handles. Async-signal-safe.
pub(crate) fn forget_in_child() {
    STATE.forget();
    PROPS.forget();
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

/// Why cuFile is not usable on this system as kvikio's AUTO mode decides it (libcufile
/// loads, `/run/udev` is readable, not WSL), or `None` where it may be. Per-file
/// registration can still refuse.
pub fn system_refusal() -> Option<String> {
    if let Err(why) = api() {
        return Some(why);
    }
    if std::fs::read_dir("/run/udev").is_err() {
        return Some("/run/udev is not readable (cuFile needs udev to find devices)".into());
    }
    if is_wsl() {
        return Some("this is WSL, where cuFile is not supported".into());
    }
    None
}

/// Whether libcufile loads, `/run/udev` is readable and this is not WSL (cached).
pub fn usable() -> bool {
    static USABLE: OnceLock<bool> = OnceLock::new();
    *USABLE.get_or_init(|| system_refusal().is_none())
}

fn is_wsl() -> bool {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.to_ascii_lowercase().contains("microsoft"))
        .unwrap_or(false)
}

/// Whether the nvidia-fs kernel module is loaded (`/proc/driver/nvidia-fs` exists).
pub fn nvidia_fs_loaded() -> bool {
    std::path::Path::new("/proc/driver/nvidia-fs").exists()
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

/// Whether I/O is expected to run through POSIX rather than cuFile for this mode:
/// `ON` is, `OFF` is not, and `AUTO` is unless cuFile is usable on this system.
/// It asks the driver (for `AUTO`), so it lives here, above the settings it reads.
pub fn is_compat_mode_preferred(mode: CompatMode) -> bool {
    match mode {
        CompatMode::On => true,
        CompatMode::Off => false,
        CompatMode::Auto => !usable(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_code() {
        assert_eq!(
            message(5027),
            "HANDLE_NOT_REGISTERED (5027) file descriptor is not registered"
        );
        assert!(message(4242).starts_with("UNKNOWN (4242)"));
        assert!(check("x", Status { err: 0, cu_err: 0 }).is_ok());
        let e = check(
            "cuFileRead",
            Status {
                err: 5012,
                cu_err: 1,
            },
        )
        .unwrap_err();
        assert!(e.to_string().contains("CUDA_POINTER_INVALID (5012)"), "{e}");
        assert!(e.to_string().contains("CUDA error 1"), "{e}");
    }
}
