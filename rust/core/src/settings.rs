//! Process-wide settings with kvikio's names, environment variables and parsing rules.
//!
//! Settings are read from the environment on first use. A malformed variable is an error
//! naming the variable (never a silent fallback); it is not cached, so fixing
//! `os.environ` and retrying works. Every operation snapshots the settings once when it
//! starts, so changing them mid-flight never tears an operation.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicPtr, Ordering};
use std::sync::{Mutex, RwLock};

use crate::error::{Error, Result};
use crate::fork::ForkLocal;
pub use crate::vocab::{SETTINGS, SETTING_NAMES};

/// Whether kvikpy may use cuFile (GPUDirect Storage) or must use POSIX I/O.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompatMode {
    /// Always use cuFile; fail if it cannot be used.
    Off,
    /// Always use POSIX I/O with bounce buffers.
    On,
    /// Use cuFile when the system supports it, otherwise POSIX.
    Auto,
}

impl CompatMode {
    /// The canonical upper-case spelling (`"OFF"`, `"ON"`, `"AUTO"`).
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Off => "OFF",
            Self::On => "ON",
            Self::Auto => "AUTO",
        }
    }

    /// Parse kvikio's spellings, case-insensitively: `ON`/`TRUE`/`YES`/`1`,
    /// `OFF`/`FALSE`/`NO`/`0`, `AUTO`.
    pub fn parse(text: &str) -> Option<Self> {
        match text.trim().to_ascii_lowercase().as_str() {
            "on" | "true" | "yes" | "1" => Some(Self::On),
            "off" | "false" | "no" | "0" => Some(Self::Off),
            "auto" => Some(Self::Auto),
            _ => None,
        }
    }
}

/// How reads choose between the page cache and O_DIRECT (`auto_direct_io_read`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DirectIoRead {
    /// `False`: every read goes through the page cache.
    Buffered,
    /// `True`: the aligned middle of each task goes by O_DIRECT (kvikio's meaning).
    Direct,
    /// `"auto"`, the default: each task's aligned middle by residency, the cached parts
    /// through the page cache and the rest by O_DIRECT (see `source::residency`).
    ByResidency,
}

impl DirectIoRead {
    /// `True` as [`Self::Direct`], `False` as [`Self::Buffered`].
    pub fn forced(direct: bool) -> Self {
        if direct {
            Self::Direct
        } else {
            Self::Buffered
        }
    }
}

/// A setting's value as seen from outside the engine.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SettingValue {
    /// A switch (`auto_direct_io_read` when forced, `auto_direct_io_write`, `page_cache_dma`,
    /// `write_sync`).
    Bool(bool),
    /// A count or a size in bytes (`num_threads`, `gpu_threads`, `task_size`,
    /// `gds_threshold`, `bounce_buffer_size`).
    Int(u64),
    /// `compat_mode`.
    Mode(CompatMode),
    /// `http_status_codes`.
    Codes(StatusCodes),
    /// A path, or none (`http_ca_bundle`); see [`intern_path`].
    Path(Option<&'static Path>),
    /// The word `auto` (`auto_direct_io_read` by residency).
    Auto,
}

/// The most threads the default thread count picks; more do not add PCIe or page-cache
/// bandwidth on the machines measured (16 threads already reach the pinned H2D ceiling).
pub(crate) const MAX_DEFAULT_THREADS: usize = 16;

/// The fewest threads the automatic `gpu_threads` gives a GPU's pool.
pub(crate) const MIN_AUTO_GPU_THREADS: usize = 4;

/// The most I/O threads `num_threads` (and `KVIKIO_NTHREADS`) accept. Each thread can
/// hold two pinned bounce buffers (32 MiB at the default `bounce_buffer_size`), so this
/// many already pin up to 32 GiB; reads saturate PCIe and NVMe queues with far fewer (16
/// threads reach the pinned host-to-device ceiling on an H100), and a value beyond it is
/// almost surely a typo that would start a million threads and hang.
pub(crate) const MAX_NUM_THREADS: usize = 1024;

/// The default `checkpoint_staging`: two 256 MiB staging windows per GPU.
pub const DEFAULT_CHECKPOINT_STAGING: usize = 512 << 20;

/// The smallest `checkpoint_staging`: 2 MiB, two staging windows of 1 MiB.
pub const MIN_CHECKPOINT_STAGING: usize = 2 << 20;

/// The longest `http_timeout`, in seconds (136 years): a deadline this far off is no
/// limit, and one further would overflow the clock arithmetic of the HTTP client.
pub(crate) const MAX_HTTP_TIMEOUT: u64 = u32::MAX as u64;

fn too_many_threads(n: u64) -> String {
    format!(
        "num_threads must be at most {MAX_NUM_THREADS} (kvikpy's limit: each I/O thread may \
         pin two bounce buffers, and more threads add no bandwidth), got {n}; use a value \
         such as {}",
        default_num_threads()
    )
}

/// A snapshot of all settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Settings {
    /// Whether cuFile may be used (kvikpy accepts and reports it; every path is POSIX).
    pub compat_mode: CompatMode,
    /// Threads of the I/O pool, 1 to [`MAX_NUM_THREADS`]; with `gpu_threads` 0, also the
    /// most threads of each GPU's pool.
    pub num_threads: usize,
    /// kvikpy's own: threads of each GPU's pool (device transfers), 1 to
    /// [`MAX_NUM_THREADS`]; 0 (the default) chooses ([`Settings::gpu_pool_threads`]) and
    /// bounds the GPU threads moving bytes at once ([`Settings::copy_budget`]).
    pub gpu_threads: usize,
    /// The largest piece of a request one pool task handles, in bytes.
    pub task_size: usize,
    /// Non-blocking requests up to this many bytes run in the calling thread.
    pub gds_threshold: usize,
    /// The size of each pooled aligned staging buffer, in bytes.
    pub bounce_buffer_size: usize,
    /// Whether reads go through the page cache, by O_DIRECT, or by residency.
    pub auto_direct_io_read: DirectIoRead,
    /// Write the aligned part of each task with O_DIRECT.
    pub auto_direct_io_write: bool,
    /// kvikpy's own: DMA device reads of page-cache-resident ranges straight from the
    /// cached pages (pinned in place) instead of copying them through bounce buffers.
    pub page_cache_dma: bool,
    /// kvikpy's own: a file a writer replaces whole (`write_ipc`, `kvikpy.write`) reaches
    /// the disk (`fsync` of the file and its directory) before the call returns.
    pub write_sync: bool,
    /// Attempts of one HTTP request (remote files), the first included, at least 1.
    pub http_max_attempts: usize,
    /// HTTP status codes answered by a retry (with backoff) rather than an error.
    pub http_status_codes: StatusCodes,
    /// The longest one HTTP request may take, in seconds, at least 1.
    pub http_timeout: u64,
    /// kvikpy's own: the CA bundle (a PEM file or a directory of them) HTTPS requests
    /// trust instead of the public roots; `None` leaves the choice to the conventional
    /// variables (see `source::remote::tls`). Interned ([`intern_path`]), so that
    /// `Settings` stays `Copy`.
    pub http_ca_bundle: Option<&'static Path>,
    /// kvikpy's own: the GPU memory, in bytes, a checkpoint load may hold per device
    /// beyond the tensors it fills (the staging windows of `load_into`, its dtype
    /// conversions, the rounds a process group exchanges at once), at least
    /// [`MIN_CHECKPOINT_STAGING`]. A tensor larger than what staging allows is read
    /// straight into its target instead, so a small budget never refuses a load.
    pub checkpoint_staging: usize,
    /// kvikpy's own, environment only (`KVIKPY_WRITE_CHUNK_SIZE`, bytes): the piece of a
    /// device write one pinned bounce buffer carries per `pwrite`; 0 (the default) lets
    /// the device pipeline choose. A tuning knob for benchmarks, not a named setting.
    pub write_chunk_size: usize,
    /// kvikpy's own, environment only (`KVIKPY_READ_CHUNK_SIZE`, bytes): the piece of a
    /// device read one pinned bounce buffer carries, each task then reading into two
    /// buffers in turn; 0 (the default) lets the device pipeline choose. A tuning knob
    /// for benchmarks, not a named setting.
    pub read_chunk_size: usize,
    /// kvikpy's own, environment only (`KVIKPY_WRITE_PREALLOCATE`, on by default): before
    /// a write of several tasks that extends a file written with O_DIRECT, allocate its
    /// range with `fallocate`, so the tasks' direct writes land inside the file's size on
    /// allocated blocks (which ext4 and XFS run in parallel; extending ones they
    /// serialise). On the H100 machine's ext4 a 2 GiB write from the GPU at 16 threads
    /// went from 1.78 to 1.89 GB/s (kvikio 1.79 at its best task size). A write that fails
    /// leaves the file at its new size. Not a named setting.
    pub write_preallocate: bool,
    /// The staging budget of the checkpoint load this snapshot was taken for, if any
    /// (see [`crate::staging`]): not a setting, but what the load's requests carry to
    /// the places they take bounce buffers. Attached by [`current`] on a thread that
    /// entered a load's budget.
    pub staging: crate::staging::Staging,
}

/// The interned paths (a forked child starts a new list: the parent's lock may be held
/// by a thread the child does not have; the paths themselves stay valid).
static PATHS: ForkLocal<Mutex<Vec<&'static Path>>> = ForkLocal::new(|| Mutex::new(Vec::new()));

/// `path` as a `&'static Path`: each distinct path is leaked once and reused, so that a
/// path can live in the `Copy` [`Settings`] (a process sets few distinct CA bundles).
pub fn intern_path(path: &Path) -> &'static Path {
    let mut paths = PATHS.get().lock().unwrap_or_else(|e| e.into_inner());
    if let Some(&known) = paths.iter().find(|&&p| p == path) {
        return known;
    }
    let leaked: &'static Path = Box::leak(PathBuf::from(path).into_boxed_path());
    paths.push(leaked);
    leaked
}

impl Default for Settings {
    fn default() -> Self {
        Self {
            compat_mode: CompatMode::Auto,
            num_threads: default_num_threads(),
            gpu_threads: 0,
            task_size: 4 << 20,
            gds_threshold: 16 << 10,
            bounce_buffer_size: 16 << 20,
            auto_direct_io_read: DirectIoRead::ByResidency,
            auto_direct_io_write: true,
            page_cache_dma: true,
            write_sync: false,
            http_max_attempts: 3,
            http_status_codes: StatusCodes::KVIKIO_DEFAULT,
            http_timeout: 60,
            http_ca_bundle: None,
            checkpoint_staging: DEFAULT_CHECKPOINT_STAGING,
            write_chunk_size: 0,
            read_chunk_size: 0,
            write_preallocate: true,
            staging: crate::staging::Staging::default(),
        }
    }
}

/// kvikpy's default thread count: the CPUs this process may run on (affinity and cgroup
/// quota aware), capped at [`MAX_DEFAULT_THREADS`]. kvikio defaults to 1 thread, which
/// leaves most of a machine's read bandwidth unused.
pub fn default_num_threads() -> usize {
    available_cpus().clamp(1, MAX_DEFAULT_THREADS)
}

/// The CPUs this process may run on (affinity and cgroup quota aware), at least 1;
/// asked once (the answer reads cgroup files), since every device transfer sizes its
/// work by it.
pub fn available_cpus() -> usize {
    static CPUS: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *CPUS.get_or_init(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
}

/// A thread count from the environment variable `var` (text `v`): from `min` to
/// [`MAX_NUM_THREADS`], else [`Error::MalformedEnv`] saying `expected`.
fn env_threads(var: &'static str, v: &str, min: u64, expected: &'static str) -> Result<usize> {
    let n = env_int(var, v, min)?;
    if n > MAX_NUM_THREADS as u64 {
        return Err(Error::MalformedEnv {
            var,
            value: v.to_string(),
            expected,
        });
    }
    Ok(n as usize)
}

impl Settings {
    /// Bytes of one bounce buffer's payload: `bounce_buffer_size` rounded up to whole
    /// O_DIRECT blocks (4 KiB), for the pinned buffers of device transfers and the host
    /// buffers of O_DIRECT reads alike.
    pub fn bounce_capacity(&self) -> usize {
        crate::tasks::align_up(
            self.bounce_buffer_size as u64,
            crate::tasks::DIRECT_IO_ALIGNMENT,
        ) as usize
    }

    /// This snapshot without its staging budget: what a task that holds a reservation
    /// passes to the transfers below it, so that none of them waits on the budget while
    /// the task holds bytes of it (see [`crate::staging`]).
    pub fn unbudgeted(&self) -> std::borrow::Cow<'_, Settings> {
        if self.staging.budget().is_none() {
            return std::borrow::Cow::Borrowed(self);
        }
        std::borrow::Cow::Owned(Settings {
            staging: crate::staging::Staging::default(),
            ..self.clone()
        })
    }

    /// The defaults, overridden by any `KVIKIO_*` variable found through `getenv`.
    pub(crate) fn from_env_with(getenv: impl Fn(&str) -> Option<String>) -> Result<Self> {
        let mut s = Self::default();
        if let Some(v) = getenv("KVIKIO_COMPAT_MODE") {
            s.compat_mode = CompatMode::parse(&v).ok_or(Error::MalformedEnv {
                var: "KVIKIO_COMPAT_MODE",
                value: v.clone(),
                expected: "ON, OFF or AUTO (or true/false, yes/no, 1/0)",
            })?;
        }
        if let Some(v) = getenv("KVIKIO_NTHREADS") {
            s.num_threads = env_threads(
                "KVIKIO_NTHREADS",
                &v,
                1,
                "a number of threads from 1 to 1024 (kvikpy's limit: each I/O thread may pin \
                 two bounce buffers, and more threads add no bandwidth)",
            )?;
        }
        if let Some(v) = getenv("KVIKPY_GPU_THREADS") {
            s.gpu_threads = env_threads(
                "KVIKPY_GPU_THREADS",
                &v,
                0,
                "a number of threads per GPU from 1 to 1024, or 0 to let kvikpy choose",
            )?;
        }
        if let Some(v) = getenv("KVIKIO_TASK_SIZE") {
            s.task_size = env_int("KVIKIO_TASK_SIZE", &v, 1)? as usize;
        }
        if let Some(v) = getenv("KVIKIO_GDS_THRESHOLD") {
            s.gds_threshold = env_int("KVIKIO_GDS_THRESHOLD", &v, 0)? as usize;
        }
        if let Some(v) = getenv("KVIKIO_BOUNCE_BUFFER_SIZE") {
            s.bounce_buffer_size = env_int("KVIKIO_BOUNCE_BUFFER_SIZE", &v, 1)? as usize;
        }
        if let Some(v) = getenv("KVIKIO_AUTO_DIRECT_IO_READ") {
            s.auto_direct_io_read = if v.trim().eq_ignore_ascii_case("auto") {
                DirectIoRead::ByResidency
            } else {
                let malformed = |_| Error::MalformedEnv {
                    var: "KVIKIO_AUTO_DIRECT_IO_READ",
                    value: v.clone(),
                    expected: "auto (reads by residency, as when unset), or a boolean: \
                               true/false, on/off, yes/no or 1/0",
                };
                DirectIoRead::forced(env_bool("KVIKIO_AUTO_DIRECT_IO_READ", &v).map_err(malformed)?)
            };
        }
        if let Some(v) = getenv("KVIKIO_AUTO_DIRECT_IO_WRITE") {
            s.auto_direct_io_write = env_bool("KVIKIO_AUTO_DIRECT_IO_WRITE", &v)?;
        }
        if let Some(v) = getenv("KVIKPY_PAGE_CACHE_DMA") {
            s.page_cache_dma = env_bool("KVIKPY_PAGE_CACHE_DMA", &v)?;
        }
        if let Some(v) = getenv("KVIKPY_WRITE_SYNC") {
            s.write_sync = env_bool("KVIKPY_WRITE_SYNC", &v)?;
        }
        if let Some(v) = getenv("KVIKPY_WRITE_CHUNK_SIZE") {
            s.write_chunk_size = env_int("KVIKPY_WRITE_CHUNK_SIZE", &v, 0)? as usize;
        }
        if let Some(v) = getenv("KVIKPY_READ_CHUNK_SIZE") {
            s.read_chunk_size = env_int("KVIKPY_READ_CHUNK_SIZE", &v, 0)? as usize;
        }
        if let Some(v) = getenv("KVIKPY_WRITE_PREALLOCATE") {
            s.write_preallocate = env_bool("KVIKPY_WRITE_PREALLOCATE", &v)?;
        }
        if let Some(v) = getenv("KVIKIO_HTTP_MAX_ATTEMPTS") {
            s.http_max_attempts = env_int("KVIKIO_HTTP_MAX_ATTEMPTS", &v, 1)? as usize;
        }
        if let Some(v) = getenv("KVIKIO_HTTP_TIMEOUT") {
            s.http_timeout = env_int("KVIKIO_HTTP_TIMEOUT", &v, 1)?;
            if s.http_timeout > MAX_HTTP_TIMEOUT {
                return Err(Error::MalformedEnv {
                    var: "KVIKIO_HTTP_TIMEOUT",
                    value: v.clone(),
                    expected: "a number of seconds from 1 to 4294967295",
                });
            }
        }
        if let Some(v) = getenv("KVIKPY_CHECKPOINT_STAGING") {
            let n = env_int("KVIKPY_CHECKPOINT_STAGING", &v, 0)?;
            s.checkpoint_staging = usize::try_from(n)
                .ok()
                .filter(|&n| n >= MIN_CHECKPOINT_STAGING)
                .ok_or_else(|| Error::MalformedEnv {
                    var: "KVIKPY_CHECKPOINT_STAGING",
                    value: v.clone(),
                    expected: "a number of bytes from 2097152 (2 MiB) up",
                })?;
        }
        if let Some(v) = getenv("KVIKPY_HTTP_CA_BUNDLE").filter(|v| !v.is_empty()) {
            s.http_ca_bundle = Some(intern_path(Path::new(&v)));
        }
        if let Some(v) = getenv("KVIKIO_HTTP_STATUS_CODES") {
            // kvikio: an empty variable means the default list.
            if !v.is_empty() {
                s.http_status_codes = StatusCodes::parse(&v).ok_or(Error::MalformedEnv {
                    var: "KVIKIO_HTTP_STATUS_CODES",
                    value: v.clone(),
                    expected: "comma-separated HTTP status codes from 100 to 599 (e.g. \
                               429,500,503), at most 32",
                })?;
            }
        }
        Ok(s)
    }

    /// The defaults overridden by the process environment.
    pub(crate) fn from_env() -> Result<Self> {
        Self::from_env_with(|name| std::env::var(name).ok())
    }

    /// The GPU threads one process may keep moving bytes between files and pinned memory
    /// at once, for all its GPUs together, when `gpu_threads` is automatic (0):
    /// `max(16, cpus)` for one process, whose GPUs share it; for the `processes` processes
    /// of one job on this host (`LOCAL_WORLD_SIZE`, as torchrun sets it; each reads onto
    /// its own GPU, in whole chunks) `max(16, cpus / 2)` divided among them; at least
    /// [`MIN_AUTO_GPU_THREADS`];
    /// `None` when `gpu_threads` is set (each GPU's pool then runs all its threads). The
    /// GPUs in use at a moment share it equally ([`crate::pool::copy_turn`]), and while
    /// two or more share it their reads move in 1 MiB pieces (see
    /// [`crate::device_io`]'s `SHARED_PIECE`).
    ///
    /// Measured on hosts with 4 GPUs and 64 cores (warm files, 2 GiB per GPU, one
    /// process): with 4 MiB pieces, 16 threads per GPU read 73.6 GB/s onto 4 H200s and 8
    /// per GPU 95.9 (the buffers in use outgrow the CPU's cache); with 1 MiB pieces, 16
    /// per GPU read 96.0-99.1 onto 4 H100s or H200s in three runs, where 8 per GPU with 4
    /// MiB pieces read 77.7-94.4; at this budget onto 4 H100s, 81.4 against 64.2 at the
    /// budget of `max(16, cpus / 2)` in one run, 87.8 in another. Native threads copying
    /// from the page cache with no DMA: 64 threads through 1 MiB buffers 90-128 GB/s, 32
    /// through 4 MiB ones 73-109.
    pub fn copy_budget(&self, cpus: usize, processes: usize) -> Option<usize> {
        if self.gpu_threads > 0 {
            return None;
        }
        let host = match processes {
            0 | 1 => MAX_DEFAULT_THREADS.max(cpus),
            _ => MAX_DEFAULT_THREADS.max(cpus / 2) / processes,
        };
        Some(host.max(MIN_AUTO_GPU_THREADS))
    }

    /// Threads of each GPU's pool: `gpu_threads` when set, else `num_threads`, at most
    /// the [`Settings::copy_budget`] of the process.
    pub fn gpu_pool_threads(&self, cpus: usize, processes: usize) -> usize {
        match self.copy_budget(cpus, processes) {
            None => self.gpu_threads,
            Some(budget) => self.num_threads.min(budget).max(1),
        }
    }

    /// The value of the setting `name`.
    pub fn get(&self, name: &str) -> Result<SettingValue> {
        Ok(match name {
            "compat_mode" => SettingValue::Mode(self.compat_mode),
            "num_threads" => SettingValue::Int(self.num_threads as u64),
            "gpu_threads" => SettingValue::Int(self.gpu_threads as u64),
            "task_size" => SettingValue::Int(self.task_size as u64),
            "gds_threshold" => SettingValue::Int(self.gds_threshold as u64),
            "bounce_buffer_size" => SettingValue::Int(self.bounce_buffer_size as u64),
            "auto_direct_io_read" => match self.auto_direct_io_read {
                DirectIoRead::Buffered => SettingValue::Bool(false),
                DirectIoRead::Direct => SettingValue::Bool(true),
                DirectIoRead::ByResidency => SettingValue::Auto,
            },
            "auto_direct_io_write" => SettingValue::Bool(self.auto_direct_io_write),
            "page_cache_dma" => SettingValue::Bool(self.page_cache_dma),
            "write_sync" => SettingValue::Bool(self.write_sync),
            "http_max_attempts" => SettingValue::Int(self.http_max_attempts as u64),
            "http_status_codes" => SettingValue::Codes(self.http_status_codes),
            "http_timeout" => SettingValue::Int(self.http_timeout),
            "http_ca_bundle" => SettingValue::Path(self.http_ca_bundle),
            "checkpoint_staging" => SettingValue::Int(self.checkpoint_staging as u64),
            _ => return Err(Error::UnknownSetting(name.to_string())),
        })
    }

    /// Set `name` to `value`, validating both; on error `self` is unchanged.
    pub(crate) fn set(&mut self, name: &str, value: SettingValue) -> Result<()> {
        let invalid = |expected| Error::InvalidSetting {
            name: name.to_string(),
            value: describe(value),
            expected,
        };
        match (name, value) {
            ("compat_mode", SettingValue::Mode(m)) => self.compat_mode = m,
            ("compat_mode", SettingValue::Bool(b)) => {
                self.compat_mode = if b { CompatMode::On } else { CompatMode::Off }
            }
            ("compat_mode", _) => {
                return Err(invalid("a CompatMode, a bool, or 'ON'/'OFF'/'AUTO'"))
            }
            ("http_max_attempts" | "http_timeout", SettingValue::Int(n)) => {
                if n == 0 {
                    return Err(invalid("a positive integer"));
                }
                if name == "http_timeout" {
                    if n > MAX_HTTP_TIMEOUT {
                        return Err(invalid("a number of seconds from 1 to 4294967295"));
                    }
                    self.http_timeout = n;
                } else {
                    self.http_max_attempts =
                        usize::try_from(n).map_err(|_| invalid("an integer that fits in usize"))?;
                }
            }
            ("http_max_attempts" | "http_timeout", _) => return Err(invalid("a positive integer")),
            ("http_status_codes", SettingValue::Codes(codes)) => self.http_status_codes = codes,
            ("http_status_codes", _) => {
                return Err(invalid("a list of HTTP status codes (at most 32)"))
            }
            ("num_threads" | "task_size" | "bounce_buffer_size", SettingValue::Int(n)) => {
                if n == 0 {
                    return Err(invalid("a positive integer"));
                }
                if name == "num_threads" && n > MAX_NUM_THREADS as u64 {
                    return Err(Error::InvalidArgument(too_many_threads(n)));
                }
                let n = usize::try_from(n).map_err(|_| invalid("an integer that fits in usize"))?;
                match name {
                    "num_threads" => self.num_threads = n,
                    "task_size" => self.task_size = n,
                    _ => self.bounce_buffer_size = n,
                }
            }
            ("gpu_threads", SettingValue::Int(n)) => {
                if n > MAX_NUM_THREADS as u64 {
                    return Err(invalid(
                        "a number of threads per GPU from 1 to 1024, or 0 to let kvikpy choose",
                    ));
                }
                self.gpu_threads = n as usize;
            }
            ("gpu_threads", _) => return Err(invalid("a non-negative integer")),
            ("checkpoint_staging", SettingValue::Int(n)) if n >= MIN_CHECKPOINT_STAGING as u64 => {
                self.checkpoint_staging =
                    usize::try_from(n).map_err(|_| invalid("an integer that fits in usize"))?
            }
            ("checkpoint_staging", _) => {
                return Err(invalid("a number of bytes from 2097152 (2 MiB) up"))
            }
            ("gds_threshold", SettingValue::Int(n)) => {
                self.gds_threshold =
                    usize::try_from(n).map_err(|_| invalid("an integer that fits in usize"))?
            }
            ("num_threads" | "task_size" | "bounce_buffer_size", _) => {
                return Err(invalid("a positive integer"))
            }
            ("gds_threshold", _) => return Err(invalid("a non-negative integer")),
            ("auto_direct_io_read", SettingValue::Bool(b)) => {
                self.auto_direct_io_read = DirectIoRead::forced(b)
            }
            ("auto_direct_io_read", SettingValue::Auto) => {
                self.auto_direct_io_read = DirectIoRead::ByResidency
            }
            ("auto_direct_io_read", _) => return Err(invalid("True, False or 'auto'")),
            ("auto_direct_io_write", SettingValue::Bool(b)) => self.auto_direct_io_write = b,
            ("page_cache_dma", SettingValue::Bool(b)) => self.page_cache_dma = b,
            ("write_sync", SettingValue::Bool(b)) => self.write_sync = b,
            ("auto_direct_io_write" | "page_cache_dma" | "write_sync", _) => {
                return Err(invalid("a bool"))
            }
            ("http_ca_bundle", SettingValue::Path(path)) => {
                let path = path.filter(|p| !p.as_os_str().is_empty());
                if let Some(p) = path {
                    if std::fs::metadata(p).is_err() {
                        return Err(invalid(
                            "the path of an existing PEM file or directory of CA \
                             certificates, or None",
                        ));
                    }
                }
                self.http_ca_bundle = path;
            }
            ("http_ca_bundle", _) => {
                return Err(invalid(
                    "the path of a PEM file or directory of CA certificates, or None",
                ))
            }
            _ => return Err(Error::UnknownSetting(name.to_string())),
        }
        Ok(())
    }
}

fn describe(value: SettingValue) -> String {
    match value {
        SettingValue::Bool(b) => if b { "True" } else { "False" }.to_string(),
        SettingValue::Int(n) => n.to_string(),
        SettingValue::Mode(m) => m.as_str().to_string(),
        SettingValue::Codes(c) => format!("{:?}", c.as_slice()),
        SettingValue::Path(Some(p)) => format!("'{}'", p.display()),
        SettingValue::Path(None) => "None".to_string(),
        SettingValue::Auto => "'auto'".to_string(),
    }
}

/// A list of HTTP status codes kept in order, with a fixed capacity so that [`Settings`]
/// stays `Copy` (every operation snapshots it).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct StatusCodes {
    codes: [u16; StatusCodes::CAPACITY],
    len: u8,
}

impl StatusCodes {
    /// The most codes a list holds (HTTP defines about 60; a retry list names a few).
    pub(crate) const CAPACITY: usize = 32;

    /// kvikio's default: 429, 500, 502, 503, 504.
    pub(crate) const KVIKIO_DEFAULT: Self = {
        let mut codes = [0u16; Self::CAPACITY];
        codes[0] = 429;
        codes[1] = 500;
        codes[2] = 502;
        codes[3] = 503;
        codes[4] = 504;
        Self { codes, len: 5 }
    };

    /// Whether `code` is an HTTP status code (100 to 599): the one rule for both the
    /// setting and `KVIKIO_HTTP_STATUS_CODES`.
    pub fn is_status(code: u16) -> bool {
        (100..=599).contains(&code)
    }

    /// The list of `codes`, in order; `None` for more than [`StatusCodes::CAPACITY`] codes
    /// or for a number that is no HTTP status code ([`StatusCodes::is_status`]).
    pub fn new(codes: &[u16]) -> Option<Self> {
        if codes.len() > Self::CAPACITY || !codes.iter().all(|&c| Self::is_status(c)) {
            return None;
        }
        let mut list = Self {
            codes: [0; Self::CAPACITY],
            len: codes.len() as u8,
        };
        list.codes[..codes.len()].copy_from_slice(codes);
        Some(list)
    }

    /// Parse kvikio's `KVIKIO_HTTP_STATUS_CODES` format: 3-digit integers separated by
    /// commas, spaces allowed around them.
    pub fn parse(text: &str) -> Option<Self> {
        let codes = text
            .split(',')
            .map(|item| {
                let item = item.trim();
                (item.len() == 3 && item.bytes().all(|b| b.is_ascii_digit()))
                    .then(|| item.parse::<u16>().ok())
                    .flatten()
            })
            .collect::<Option<Vec<u16>>>()?;
        Self::new(&codes)
    }

    /// The codes, in order.
    pub fn as_slice(&self) -> &[u16] {
        &self.codes[..usize::from(self.len)]
    }

    /// Whether `status` is in the list.
    pub fn contains(&self, status: u16) -> bool {
        self.as_slice().contains(&status)
    }
}

impl std::fmt::Debug for StatusCodes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list().entries(self.as_slice()).finish()
    }
}

fn env_int(var: &'static str, text: &str, min: u64) -> Result<u64> {
    let expected = if min == 0 {
        "a non-negative integer number of bytes or threads, digits only (e.g. 4194304)"
    } else {
        "a positive integer number of bytes or threads, digits only (e.g. 4194304)"
    };
    let malformed = || Error::MalformedEnv {
        var,
        value: text.to_string(),
        expected,
    };
    let trimmed = text.trim();
    // `u64::from_str` accepts a leading '+'; kvikio's parser does not, so neither do we.
    if trimmed.is_empty() || !trimmed.bytes().all(|b| b.is_ascii_digit()) {
        return Err(malformed());
    }
    let n: u64 = trimmed.parse().map_err(|_| malformed())?;
    if n < min {
        return Err(malformed());
    }
    Ok(n)
}

fn env_bool(var: &'static str, text: &str) -> Result<bool> {
    match text.trim().to_ascii_lowercase().as_str() {
        "true" | "on" | "yes" | "1" => Ok(true),
        "false" | "off" | "no" | "0" => Ok(false),
        _ => Err(Error::MalformedEnv {
            var,
            value: text.to_string(),
            expected: "a boolean: true/false, on/off, yes/no or 1/0",
        }),
    }
}

type Global = RwLock<Option<Settings>>;

/// The settings, replaced in a forked child by a copy taken just before the fork (the
/// inherited lock may be held by a thread that does not exist in the child).
static GLOBAL: ForkLocal<Global> = ForkLocal::new(|| RwLock::new(None));

/// The settings as they are before a fork, for the child: made by [`prepare_fork`],
/// taken by [`enter_child`], freed by [`parent_after_fork`].
static FOR_CHILD: AtomicPtr<Global> = AtomicPtr::new(std::ptr::null_mut());

/// Before a fork (in the forking thread): copy the settings for the child.
pub(crate) fn prepare_fork() {
    let copy = GLOBAL
        .get()
        .read()
        .unwrap_or_else(|e| e.into_inner())
        .clone();
    let fresh = Box::into_raw(Box::new(RwLock::new(copy)));
    let old = FOR_CHILD.swap(fresh, Ordering::AcqRel);
    if !old.is_null() {
        // SAFETY: made by `Box::into_raw` here and taken out of the slot, so owned here.
        drop(unsafe { Box::from_raw(old) });
    }
}

/// After a fork, in the parent: free the copy the child took.
pub(crate) fn parent_after_fork() {
    let copy = FOR_CHILD.swap(std::ptr::null_mut(), Ordering::AcqRel);
    if !copy.is_null() {
        // SAFETY: made by `Box::into_raw` in `prepare_fork` and taken out of the slot.
        drop(unsafe { Box::from_raw(copy) });
    }
}

/// In a forked child: use the copy taken before the fork (the inherited lock is leaked).
/// Only atomic operations, so async-signal-safe. Without a copy (another thread's fork
/// raced this one's), the settings are loaded again from the environment.
pub(crate) fn enter_child() {
    PATHS.forget();
    let copy = FOR_CHILD.swap(std::ptr::null_mut(), Ordering::AcqRel);
    if copy.is_null() {
        GLOBAL.forget();
    } else {
        // SAFETY: made by `Box::into_raw` in `prepare_fork`; ownership moves to GLOBAL.
        GLOBAL.replace_leaking(unsafe { Box::from_raw(copy) });
    }
}

/// The current process-wide settings (loaded from the environment on first use).
///
/// On a thread inside a checkpoint load ([`crate::staging::enter`]), the snapshot carries
/// the load's staging budget.
pub fn current() -> Result<Settings> {
    let mut s = process_wide()?;
    s.staging = crate::staging::entered().into();
    Ok(s)
}

fn process_wide() -> Result<Settings> {
    let global = GLOBAL.get();
    if let Some(s) = &*global.read().unwrap_or_else(|e| e.into_inner()) {
        return Ok(s.clone());
    }
    let mut guard = global.write().unwrap_or_else(|e| e.into_inner());
    if let Some(s) = &*guard {
        return Ok(s.clone());
    }
    let s = Settings::from_env()?;
    *guard = Some(s.clone());
    Ok(s)
}

/// Apply every `(name, value)` pair, all or nothing.
pub fn set_many(pairs: &[(&str, SettingValue)]) -> Result<()> {
    let base = process_wide()?;
    let mut guard = GLOBAL.get().write().unwrap_or_else(|e| e.into_inner());
    let mut next = guard.clone().unwrap_or(base);
    for (name, value) in pairs {
        next.set(name, *value)?;
    }
    *guard = Some(next);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    #[test]
    fn a_snapshot_carries_the_budget_entered_on_its_thread() {
        // A snapshot on this thread carries the entered budget, and only then.
        let depth = crate::staging::enter(7);
        let s = current().unwrap();
        assert_eq!(s.staging.budget().map(|b| b.usage().limit), Some(7));
        assert!(s.unbudgeted().staging.budget().is_none());
        crate::staging::leave(depth);
        assert!(current().unwrap().staging.budget().is_none());
    }

    fn env(pairs: &[(&str, &str)]) -> Result<Settings> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        Settings::from_env_with(|k| map.get(k).cloned())
    }

    #[test]
    fn gpu_threads_share_a_budget_of_the_cpus() {
        let s = Settings {
            num_threads: 16,
            ..Settings::default()
        };
        // The measured host (64 cores): 16 threads per GPU, 64 busy at once in all (four
        // GPUs at 16 each, in small pieces).
        assert_eq!(s.gpu_pool_threads(64, 1), 16);
        assert_eq!(s.copy_budget(64, 1), Some(64));
        // Four processes of one job on it (torchrun): 8 each.
        assert_eq!(s.gpu_pool_threads(64, 4), 8);
        assert_eq!(s.copy_budget(64, 4), Some(8));
        // A 16-core machine: 16, never held back; many processes on few cores keep 4.
        assert_eq!(s.gpu_pool_threads(16, 1), 16);
        assert_eq!(s.copy_budget(16, 1), Some(16));
        assert_eq!(s.gpu_pool_threads(16, 8), MIN_AUTO_GPU_THREADS);
        // num_threads caps the automatic choice; gpu_threads overrides it, unbudgeted.
        let two = Settings {
            num_threads: 2,
            ..s.clone()
        };
        assert_eq!(two.gpu_pool_threads(16, 8), 2);
        let fixed = Settings {
            gpu_threads: 24,
            ..s.clone()
        };
        assert_eq!(fixed.gpu_pool_threads(64, 4), 24);
        assert_eq!(fixed.copy_budget(64, 4), None);
        assert_eq!(env(&[("KVIKPY_GPU_THREADS", "6")]).unwrap().gpu_threads, 6);
        assert!(env(&[("KVIKPY_GPU_THREADS", "2000")]).is_err());
        let mut t = s.clone();
        assert!(t.set("gpu_threads", SettingValue::Int(5000)).is_err());
        assert_eq!(t, s, "a refused value changes nothing");
        t.set("gpu_threads", SettingValue::Int(3)).unwrap();
        assert_eq!(t.get("gpu_threads").unwrap(), SettingValue::Int(3));
    }

    proptest::proptest! {
        #[test]
        fn gpu_threads_stay_in_bounds(
            num_threads in 1usize..=MAX_NUM_THREADS,
            processes in 0usize..64,
            cpus in 1usize..1024,
        ) {
            let s = Settings { num_threads, ..Settings::default() };
            let n = s.gpu_pool_threads(cpus, processes);
            proptest::prop_assert!(n >= 1 && n <= num_threads);
            proptest::prop_assert!(n >= MIN_AUTO_GPU_THREADS.min(num_threads));
            let budget = s.copy_budget(cpus, processes).unwrap();
            // The processes of a job together stay within the host's budget unless the
            // floor lifts them; a pool never has more threads than may copy at once.
            let host = if processes > 1 { MAX_DEFAULT_THREADS.max(cpus / 2) } else { MAX_DEFAULT_THREADS.max(cpus) };
            proptest::prop_assert!(budget * processes.max(1) <= host || budget == MIN_AUTO_GPU_THREADS);
            proptest::prop_assert!(n <= budget);
        }
    }

    #[test]
    fn defaults_match_kvikio_except_threads() {
        let s = env(&[]).unwrap();
        assert_eq!(s.compat_mode, CompatMode::Auto);
        assert_eq!(s.task_size, 4 << 20);
        assert_eq!(s.gds_threshold, 16 << 10);
        assert_eq!(s.bounce_buffer_size, 16 << 20);
        assert_eq!(s.auto_direct_io_read, DirectIoRead::ByResidency);
        assert!(s.auto_direct_io_write);
        assert!((1..=MAX_DEFAULT_THREADS).contains(&s.num_threads));
    }

    #[test]
    fn write_tuning_knobs_come_from_the_environment_only() {
        let s = env(&[]).unwrap();
        assert_eq!((s.write_chunk_size, s.write_preallocate), (0, true));
        let s = env(&[
            ("KVIKPY_WRITE_CHUNK_SIZE", "4194304"),
            ("KVIKPY_WRITE_PREALLOCATE", "no"),
        ])
        .unwrap();
        assert_eq!((s.write_chunk_size, s.write_preallocate), (4 << 20, false));
        assert!(env(&[("KVIKPY_WRITE_CHUNK_SIZE", "4 MiB")]).is_err());
        assert!(env(&[("KVIKPY_WRITE_PREALLOCATE", "maybe")]).is_err());
        assert!(!SETTING_NAMES.contains(&"write_chunk_size"));
        let s = env(&[("KVIKPY_READ_CHUNK_SIZE", "1048576")]).unwrap();
        assert_eq!(
            (s.read_chunk_size, env(&[]).unwrap().read_chunk_size),
            (1 << 20, 0)
        );
        assert!(env(&[("KVIKPY_READ_CHUNK_SIZE", "-1")]).is_err());
        assert!(!SETTING_NAMES.contains(&"read_chunk_size"));
    }

    #[test]
    fn compat_mode_spellings() {
        for (text, mode) in [
            ("ON", CompatMode::On),
            ("yes", CompatMode::On),
            ("True", CompatMode::On),
            ("1", CompatMode::On),
            ("off", CompatMode::Off),
            ("NO", CompatMode::Off),
            ("false", CompatMode::Off),
            ("0", CompatMode::Off),
            (" auto ", CompatMode::Auto),
        ] {
            assert_eq!(
                env(&[("KVIKIO_COMPAT_MODE", text)]).unwrap().compat_mode,
                mode
            );
        }
        let err = env(&[("KVIKIO_COMPAT_MODE", "maybe")]).unwrap_err();
        assert!(err.to_string().contains("KVIKIO_COMPAT_MODE"), "{err}");
    }

    #[test]
    fn malformed_sizes_name_the_variable() {
        for bad in ["4MiB", "", "-1", "+5", "1.5", "0x10", "four"] {
            let err = env(&[("KVIKIO_TASK_SIZE", bad)]).unwrap_err();
            assert!(
                matches!(
                    err,
                    Error::MalformedEnv {
                        var: "KVIKIO_TASK_SIZE",
                        ..
                    }
                ),
                "{bad}"
            );
        }
        assert!(env(&[("KVIKIO_NTHREADS", "0")]).is_err());
        assert_eq!(
            env(&[("KVIKIO_GDS_THRESHOLD", "0")]).unwrap().gds_threshold,
            0
        );
        assert_eq!(env(&[("KVIKIO_NTHREADS", " 8 ")]).unwrap().num_threads, 8);
        assert_eq!(
            env(&[("KVIKIO_NTHREADS", "1024")]).unwrap().num_threads,
            MAX_NUM_THREADS
        );
        let err = env(&[("KVIKIO_NTHREADS", "1025")]).unwrap_err();
        assert!(err.to_string().contains("1 to 1024"), "{err}");
        assert_eq!(
            env(&[("KVIKIO_TASK_SIZE", "1048576")]).unwrap().task_size,
            1 << 20
        );
    }

    #[test]
    fn http_settings_parse_like_kvikio() {
        let s = env(&[]).unwrap();
        assert_eq!(s.http_max_attempts, 3);
        assert_eq!(s.http_timeout, 60);
        assert_eq!(s.http_status_codes.as_slice(), &[429, 500, 502, 503, 504]);
        let s = env(&[
            ("KVIKIO_HTTP_MAX_ATTEMPTS", "5"),
            ("KVIKIO_HTTP_TIMEOUT", "2"),
            ("KVIKIO_HTTP_STATUS_CODES", " 503 ,429"),
        ])
        .unwrap();
        assert_eq!((s.http_max_attempts, s.http_timeout), (5, 2));
        assert_eq!(s.http_status_codes.as_slice(), &[503, 429]);
        assert_eq!(
            env(&[("KVIKIO_HTTP_STATUS_CODES", "")])
                .unwrap()
                .http_status_codes,
            StatusCodes::KVIKIO_DEFAULT
        );
        for bad in [
            "5O3", "50", "5030", "503,", ",503", "503;429", "abc", "042", "099", "600", "999",
        ] {
            let err = env(&[("KVIKIO_HTTP_STATUS_CODES", bad)]).unwrap_err();
            assert!(
                err.to_string().contains("KVIKIO_HTTP_STATUS_CODES"),
                "{bad}"
            );
        }
        assert!(env(&[("KVIKIO_HTTP_MAX_ATTEMPTS", "0")]).is_err());
        assert!(env(&[("KVIKIO_HTTP_TIMEOUT", "0")]).is_err());
        assert!(env(&[("KVIKIO_HTTP_TIMEOUT", "4294967296")]).is_err());
        assert!(Settings::default()
            .set("http_timeout", SettingValue::Int(1 << 63))
            .is_err());
        let mut s = Settings::default();
        assert!(s.set("http_timeout", SettingValue::Int(0)).is_err());
        assert!(s.set("http_max_attempts", SettingValue::Int(0)).is_err());
        assert!(s.set("http_status_codes", SettingValue::Int(1)).is_err());
        // One rule for the setting and the variable: HTTP status codes are 100 to 599.
        assert!(StatusCodes::new(&[42]).is_none() && StatusCodes::new(&[1000]).is_none());
        assert!(StatusCodes::new(&[100, 599]).is_some());
        assert_eq!(
            env(&[("KVIKIO_HTTP_STATUS_CODES", "100,599")])
                .unwrap()
                .http_status_codes
                .as_slice(),
            &[100, 599]
        );
        let codes = StatusCodes::new(&[500]).unwrap();
        s.set("http_status_codes", SettingValue::Codes(codes))
            .unwrap();
        assert!(s.http_status_codes.contains(500) && !s.http_status_codes.contains(503));
        assert!(StatusCodes::new(&[500; 33]).is_none());
    }

    #[test]
    fn ca_bundle_setting() {
        assert_eq!(env(&[]).unwrap().http_ca_bundle, None);
        assert_eq!(
            env(&[("KVIKPY_HTTP_CA_BUNDLE", "")])
                .unwrap()
                .http_ca_bundle,
            None
        );
        let s = env(&[("KVIKPY_HTTP_CA_BUNDLE", "/etc/ca.pem")]).unwrap();
        assert_eq!(s.http_ca_bundle, Some(Path::new("/etc/ca.pem")));
        assert!(std::ptr::eq(
            intern_path(Path::new("/etc/ca.pem")),
            intern_path(Path::new("/etc/ca.pem"))
        ));
        let mut s = Settings::default();
        let dir = tempfile::tempdir().unwrap();
        let here = intern_path(dir.path());
        s.set("http_ca_bundle", SettingValue::Path(Some(here)))
            .unwrap();
        assert_eq!(
            s.get("http_ca_bundle").unwrap(),
            SettingValue::Path(Some(here))
        );
        let missing = intern_path(&dir.path().join("missing.pem"));
        let err = s
            .set("http_ca_bundle", SettingValue::Path(Some(missing)))
            .unwrap_err();
        assert!(err.to_string().contains("missing.pem"), "{err}");
        assert_eq!(s.http_ca_bundle, Some(here));
        assert!(s.set("http_ca_bundle", SettingValue::Int(1)).is_err());
        s.set("http_ca_bundle", SettingValue::Path(None)).unwrap();
        assert_eq!(s.http_ca_bundle, None);
    }

    #[test]
    fn bools_parse_like_kvikio() {
        let read =
            |text| env(&[("KVIKIO_AUTO_DIRECT_IO_READ", text)]).map(|s| s.auto_direct_io_read);
        assert_eq!(read("on").unwrap(), DirectIoRead::Direct);
        assert_eq!(read("0").unwrap(), DirectIoRead::Buffered);
        assert_eq!(read(" Auto ").unwrap(), DirectIoRead::ByResidency);
        assert!(read("").is_err() && read("automatic").is_err());
        assert!(
            !env(&[("KVIKIO_AUTO_DIRECT_IO_WRITE", "No")])
                .unwrap()
                .auto_direct_io_write
        );
        assert!(env(&[("KVIKIO_AUTO_DIRECT_IO_WRITE", "2")]).is_err());
    }

    #[test]
    fn set_validates_and_leaves_settings_unchanged_on_error() {
        let mut s = Settings::default();
        let before = s.clone();
        assert!(s.set("num_threads", SettingValue::Int(0)).is_err());
        let err = s
            .set("num_threads", SettingValue::Int(1_000_000))
            .unwrap_err();
        assert!(err.to_string().contains("at most 1024"), "{err}");
        assert!(s.set("num_threads", SettingValue::Int(u64::MAX)).is_err());
        assert!(s.set("task_size", SettingValue::Bool(true)).is_err());
        assert!(s.set("auto_direct_io_read", SettingValue::Int(1)).is_err());
        assert!(s.set("auto_direct_io_write", SettingValue::Auto).is_err());
        assert!(matches!(
            s.set("nope", SettingValue::Int(1)),
            Err(Error::UnknownSetting(_))
        ));
        assert_eq!(s, before);
        s.set("compat_mode", SettingValue::Bool(true)).unwrap();
        assert_eq!(s.compat_mode, CompatMode::On);
        s.set("gds_threshold", SettingValue::Int(0)).unwrap();
        assert_eq!(s.get("gds_threshold").unwrap(), SettingValue::Int(0));
        for name in SETTING_NAMES {
            assert!(s.get(name).is_ok());
        }
        assert_eq!(SETTING_NAMES.len(), SETTINGS.len());
        assert_eq!(s.get("auto_direct_io_read").unwrap(), SettingValue::Auto);
        for (value, mode) in [
            (SettingValue::Bool(true), DirectIoRead::Direct),
            (SettingValue::Bool(false), DirectIoRead::Buffered),
            (SettingValue::Auto, DirectIoRead::ByResidency),
        ] {
            s.set("auto_direct_io_read", value).unwrap();
            assert_eq!(s.auto_direct_io_read, mode);
            assert_eq!(s.get("auto_direct_io_read").unwrap(), value);
        }
    }

    #[test]
    fn checkpoint_staging_is_at_least_two_mib() {
        let mut s = Settings::default();
        assert_eq!(s.checkpoint_staging, 512 << 20);
        s.set("checkpoint_staging", SettingValue::Int(2 << 20))
            .unwrap();
        assert_eq!(
            s.get("checkpoint_staging").unwrap(),
            SettingValue::Int(2 << 20)
        );
        for bad in [
            SettingValue::Int((2 << 20) - 1),
            SettingValue::Int(0),
            SettingValue::Bool(true),
        ] {
            assert!(s.set("checkpoint_staging", bad).is_err());
            assert_eq!(s.checkpoint_staging, 2 << 20, "a refused value changed it");
        }
        let low = env(&[("KVIKPY_CHECKPOINT_STAGING", "1048576")]);
        assert!(
            matches!(low, Err(Error::MalformedEnv { expected, .. }) if expected.contains("2 MiB"))
        );
        let read = env(&[("KVIKPY_CHECKPOINT_STAGING", "1073741824")]).unwrap();
        assert_eq!(read.checkpoint_staging, 1 << 30);
    }

    #[test]
    fn every_setting_is_read_from_its_variable_in_the_table() {
        // A value no setting accepts, and one each accepts that differs from its default.
        for (name, var) in SETTINGS {
            let malformed = env(&[(var, "not-a-value-%%")]);
            match malformed {
                // Any text names a path: the bundle is checked when a remote file opens.
                Ok(read) if name == "http_ca_bundle" => {
                    assert_ne!(read, Settings::default(), "{var} was not read");
                }
                Err(Error::MalformedEnv { var: named, .. }) => assert_eq!(named, var, "{name}"),
                Err(Error::Config(message)) => assert!(message.contains(var), "{name}: {message}"),
                other => panic!("{name}: {var}=not-a-value-%% gave {other:?}"),
            }
            let good = match name {
                "compat_mode" => "ON",
                "num_threads" | "gpu_threads" => "3",
                "task_size" | "gds_threshold" | "bounce_buffer_size" => "8192",
                "auto_direct_io_read" | "auto_direct_io_write" | "page_cache_dma" => "false",
                "write_sync" => "true",
                "checkpoint_staging" => "8388608",
                "http_max_attempts" | "http_timeout" => "7",
                "http_status_codes" => "418",
                "http_ca_bundle" => "/",
                other => panic!("a setting the test does not know: {other}"),
            };
            let read = env(&[(var, good)]).unwrap_or_else(|e| panic!("{var}={good}: {e}"));
            assert_ne!(
                read.get(name).unwrap(),
                Settings::default().get(name).unwrap(),
                "{var}={good} did not change {name}"
            );
        }
    }
}
