//! The stand-in's process-wide state: whether the driver is open (and how many times), its
//! properties, and the tables of registered file handles, buffers, streams and batches.
//! Handles given out are table keys (never addresses), so an unknown or stale handle is
//! found out by a lookup instead of being dereferenced.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, MutexGuard, PoisonError};

use cudarc::cufile::sys::{CUfileDrvProps__bindgen_ty_1, CUfileDrvProps_t, CUfileOpError};

use crate::batch::Batch;
use crate::error::Fail;

/// `nvfs.major_version` and `nvfs.minor_version`: the stand-in's own version (there is no
/// nvidia-fs behind it), taken from the crate's version.
pub const STANDIN_MAJOR: u32 = parse_u32(env!("CARGO_PKG_VERSION_MAJOR"));
/// See [`STANDIN_MAJOR`].
pub const STANDIN_MINOR: u32 = parse_u32(env!("CARGO_PKG_VERSION_MINOR"));

const fn parse_u32(s: &str) -> u32 {
    let bytes = s.as_bytes();
    let mut value = 0u32;
    let mut i = 0;
    while i < bytes.len() {
        value = value * 10 + (bytes[i] - b'0') as u32;
        i += 1;
    }
    value
}

/// Bit numbers of `dcontrolflags` and `fflags` (cufile.h's flag enums are bit positions).
pub const CONTROL_USE_POLL_MODE: u32 = 0;
/// See [`CONTROL_USE_POLL_MODE`].
pub const CONTROL_ALLOW_COMPAT_MODE: u32 = 1;
const FEATURE_BATCH_IO: u32 = 1;
const FEATURE_STREAMS: u32 = 2;

/// The properties a freshly opened driver reports: the defaults of NVIDIA's cufile.json
/// (sizes in KiB), compat mode allowed, batch and stream APIs supported.
pub fn default_props() -> CUfileDrvProps_t {
    CUfileDrvProps_t {
        nvfs: CUfileDrvProps__bindgen_ty_1 {
            major_version: STANDIN_MAJOR,
            minor_version: STANDIN_MINOR,
            poll_thresh_size: 4,
            max_direct_io_size: 16384,
            dstatusflags: 0,
            dcontrolflags: 1 << CONTROL_ALLOW_COMPAT_MODE,
        },
        fflags: (1 << FEATURE_BATCH_IO) | (1 << FEATURE_STREAMS),
        max_device_cache_size: 131_072,
        per_buffer_cache_size: 1024,
        max_device_pinned_mem_size: 33_554_432,
        max_batch_io_size: 128,
        max_batch_io_timeout_msecs: 5,
    }
}

/// A registered file: the descriptor it was registered with, and the one I/O goes through.
#[derive(Debug, Clone, Copy)]
pub struct FileEntry {
    /// The caller's descriptor (not owned: the caller closes it).
    pub fd: i32,
    /// The descriptor reads and writes use: `fd` itself, or, when `fd` was opened with
    /// O_DIRECT (as kvikpy and kvikio register it), a buffered reopening of the same file
    /// owned by the entry, since the stand-in stages through unaligned host memory.
    pub io_fd: i32,
}

/// Everything the API keeps between calls.
pub struct State {
    /// How many `cuFileDriverOpen` calls are not yet matched by a close; 0 = closed.
    pub open_count: i64,
    /// The driver's properties (reset at each first open).
    pub props: CUfileDrvProps_t,
    next_id: usize,
    /// Registered files by handle value.
    pub handles: HashMap<usize, FileEntry>,
    /// Registered buffers: base address -> length.
    pub buffers: HashMap<usize, usize>,
    /// Registered streams: stream address -> `CU_FILE_STREAM_*` flags.
    pub streams: HashMap<usize, u32>,
    /// Batches set up and not yet destroyed, by handle value.
    pub batches: HashMap<usize, Arc<Batch>>,
}

impl State {
    fn new() -> State {
        State {
            open_count: 0,
            props: default_props(),
            next_id: 0,
            handles: HashMap::new(),
            buffers: HashMap::new(),
            streams: HashMap::new(),
            batches: HashMap::new(),
        }
    }

    /// A fresh handle value: never 0, never reused within the process.
    pub fn new_id(&mut self) -> usize {
        self.next_id += 1;
        // Spaced by 16 so that a handle off by a few bytes is never another valid handle.
        self.next_id << 4
    }

    /// Fails with `CU_FILE_DRIVER_NOT_INITIALIZED` unless the driver is open.
    pub fn require_open(&self) -> Result<(), Fail> {
        if self.open_count > 0 {
            Ok(())
        } else {
            Err(Fail::op(CUfileOpError::CU_FILE_DRIVER_NOT_INITIALIZED))
        }
    }

    /// The registered file behind `handle`, or `CU_FILE_HANDLE_NOT_REGISTERED`.
    pub fn file(&self, handle: usize) -> Result<FileEntry, Fail> {
        self.handles
            .get(&handle)
            .copied()
            .ok_or(Fail::op(CUfileOpError::CU_FILE_HANDLE_NOT_REGISTERED))
    }

    /// Forgets every registration (the driver's last close).
    pub fn clear(&mut self) {
        self.handles.clear();
        self.buffers.clear();
        self.streams.clear();
        for batch in self.batches.values() {
            batch.cancel();
        }
        self.batches.clear();
    }
}

static STATE: LazyLock<Mutex<State>> = LazyLock::new(|| Mutex::new(State::new()));

/// The state, locked. A panic while it was held (caught at the API boundary) leaves
/// consistent tables, so poisoning is ignored.
pub fn lock() -> MutexGuard<'static, State> {
    STATE.lock().unwrap_or_else(PoisonError::into_inner)
}

/// The state locked, if the driver is open; `CU_FILE_DRIVER_NOT_INITIALIZED` otherwise.
pub fn lock_open() -> Result<MutexGuard<'static, State>, Fail> {
    let state = lock();
    state.require_open()?;
    Ok(state)
}
