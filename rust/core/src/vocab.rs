//! Shared vocabulary: the small types that every layer names (which way bytes move, how a
//! file is opened, the settings' names). A leaf: it imports nothing of the engine, so any
//! file may use it without tying itself to the layers above.

/// Which way bytes move.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// File to memory.
    Read,
    /// Memory to file.
    Write,
}

/// An open mode in kvikio's (and Python's) spelling: `r`, `r+`, `w`, `w+`, each with an
/// optional `b`; or kvikpy's own [`OpenFlags::CREATE_KEEP`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenFlags {
    /// The mode allows reading (`r`, `r+`, `w+`).
    pub readable: bool,
    /// The mode allows writing (`r+`, `w`, `w+`).
    pub writable: bool,
    /// Create the file if it is missing (O_CREAT): `w` modes and [`OpenFlags::CREATE_KEEP`].
    pub create: bool,
    /// Truncate the file (O_TRUNC): `w` modes.
    pub truncate: bool,
}

impl OpenFlags {
    /// kvikpy's own mode, not one of kvikio's: read and write, the file created if missing
    /// and never truncated (O_CREAT without O_TRUNC), in one `open(2)` so that no other
    /// process can create or remove the file between a check and the open.
    pub const CREATE_KEEP: &'static str = "r+:create";

    /// Read only, as mode `r`: what the sources that cannot write (mmap, remote files)
    /// report.
    pub const READ_ONLY: Self = Self {
        readable: true,
        writable: false,
        create: false,
        truncate: false,
    };
}

/// Every setting and the environment variable it is read from, in documentation order:
/// the one table of both (the parser in `settings.rs` is checked against it by a test,
/// and `kvikpy.defaults` takes its variables from here).
pub const SETTINGS: [(&str, &str); 15] = [
    ("compat_mode", "KVIKIO_COMPAT_MODE"),
    ("num_threads", "KVIKIO_NTHREADS"),
    ("gpu_threads", "KVIKPY_GPU_THREADS"),
    ("task_size", "KVIKIO_TASK_SIZE"),
    ("gds_threshold", "KVIKIO_GDS_THRESHOLD"),
    ("bounce_buffer_size", "KVIKIO_BOUNCE_BUFFER_SIZE"),
    ("auto_direct_io_read", "KVIKIO_AUTO_DIRECT_IO_READ"),
    ("auto_direct_io_write", "KVIKIO_AUTO_DIRECT_IO_WRITE"),
    ("page_cache_dma", "KVIKPY_PAGE_CACHE_DMA"),
    ("write_sync", "KVIKPY_WRITE_SYNC"),
    ("http_max_attempts", "KVIKIO_HTTP_MAX_ATTEMPTS"),
    ("http_status_codes", "KVIKIO_HTTP_STATUS_CODES"),
    ("http_timeout", "KVIKIO_HTTP_TIMEOUT"),
    ("http_ca_bundle", "KVIKPY_HTTP_CA_BUNDLE"),
    ("checkpoint_staging", "KVIKPY_CHECKPOINT_STAGING"),
];

/// Every setting name, in documentation order (the first column of [`SETTINGS`]).
pub const SETTING_NAMES: [&str; 15] = {
    let mut names = [""; 15];
    let mut i = 0;
    while i < SETTINGS.len() {
        names[i] = SETTINGS[i].0;
        i += 1;
    }
    names
};
