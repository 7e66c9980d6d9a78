//! Whether cuFile can be used on this system (the library, the nvidia-fs module, WSL),
//! and whether a compat mode resolves to POSIX here.

use std::sync::OnceLock;

use crate::settings::CompatMode;

use super::library::api;

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
