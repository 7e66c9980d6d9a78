//! Whether cuFile (GPUDirect Storage) could be used on this system, as kvikio's AUTO mode
//! decides it: libcufile loads, `/run/udev` is readable, and this is not WSL.

use std::sync::OnceLock;

/// Cached answer of the probe; the system does not change under a running process.
pub fn cufile_usable() -> bool {
    static USABLE: OnceLock<bool> = OnceLock::new();
    *USABLE.get_or_init(|| libcufile_loads() && udev_readable() && !is_wsl())
}

fn libcufile_loads() -> bool {
    for name in [c"libcufile.so.0", c"libcufile.so.1", c"libcufile.so"] {
        // SAFETY: `name` is a NUL-terminated C string; dlopen has no other preconditions.
        let handle = unsafe { libc::dlopen(name.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL) };
        if !handle.is_null() {
            // SAFETY: `handle` came from a successful dlopen and is closed exactly once.
            unsafe { libc::dlclose(handle) };
            return true;
        }
    }
    false
}

fn udev_readable() -> bool {
    std::fs::read_dir("/run/udev").is_ok()
}

fn is_wsl() -> bool {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.to_ascii_lowercase().contains("microsoft"))
        .unwrap_or(false)
}
