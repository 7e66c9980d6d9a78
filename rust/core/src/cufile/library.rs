//! Loading libcufile at run time: every entry point looked up by name once (a missing
//! library or symbol is an error value, never a panic), and `KVIKPY_CUFILE_LIBRARY`, a
//! library file loaded instead (the test suite's stand-in).
//!
//! The entry points are called through function pointers typed here with plain integers
//! for cuFile's status codes: a code newer than cudarc's enums cannot become an invalid
//! Rust enum value.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};
use std::panic::catch_unwind;
use std::sync::OnceLock;

use cudarc::cufile::sys as cf;

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
