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

/// Every setting name, in documentation order.
pub const SETTING_NAMES: [&str; 14] = [
    "compat_mode",
    "num_threads",
    "gpu_threads",
    "task_size",
    "gds_threshold",
    "bounce_buffer_size",
    "auto_direct_io_read",
    "auto_direct_io_write",
    "page_cache_dma",
    "write_sync",
    "http_max_attempts",
    "http_status_codes",
    "http_timeout",
    "http_ca_bundle",
];
