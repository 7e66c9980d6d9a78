//! Failures and how they leave the library: as a `CUfileError_t` (`err`, `cu_err`) or as
//! the `ssize_t` of `cuFileRead`/`cuFileWrite` (-1 with `errno` set for a system error, the
//! negated `CUfileOpError` otherwise), as cufile.h documents for the real library.

use cudarc::cufile::sys::{CUfileError_t, CUfileOpError};

/// `CUfileError_t` as it crosses the C ABI: two 32-bit enums. Built from plain integers so
/// that a CUDA driver result is passed through without converting between two Rust enums;
/// the layout is checked against cudarc's `CUfileError_t` below.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RawError {
    /// A `CUfileOpError` value.
    pub err: u32,
    /// A `CUresult` value, meaningful when `err` is `CU_FILE_CUDA_DRIVER_ERROR`.
    pub cu_err: u32,
}

const _: () = assert!(std::mem::size_of::<RawError>() == std::mem::size_of::<CUfileError_t>());
const _: () = assert!(std::mem::align_of::<RawError>() == std::mem::align_of::<CUfileError_t>());

impl RawError {
    /// `CU_FILE_SUCCESS`.
    pub const SUCCESS: RawError = RawError { err: 0, cu_err: 0 };
}

/// Why an operation failed: a cuFile error, a CUDA driver error, or a system error (errno).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Fail {
    /// The `CUfileOpError` reported.
    pub op: CUfileOpError,
    /// The CUDA driver's `CUresult` (0 unless `op` is `CU_FILE_CUDA_DRIVER_ERROR`).
    pub cu: u32,
    /// The `errno` of a failed system call (0 when none).
    pub errno: i32,
}

impl Fail {
    /// A cuFile error.
    pub fn op(op: CUfileOpError) -> Fail {
        Fail {
            op,
            cu: 0,
            errno: 0,
        }
    }

    /// A CUDA driver error (`CU_FILE_CUDA_DRIVER_ERROR` carrying the driver's result).
    pub fn cuda(cu: u32) -> Fail {
        Fail {
            op: CUfileOpError::CU_FILE_CUDA_DRIVER_ERROR,
            cu,
            errno: 0,
        }
    }

    /// A failed system call: `errno` is set again when the failure is reported.
    pub fn os(errno: i32) -> Fail {
        Fail {
            op: CUfileOpError::CU_FILE_IO_ERROR,
            cu: 0,
            errno,
        }
    }

    /// A cuFile error that also leaves `errno` set (e.g. a closed descriptor: EBADF).
    pub fn op_errno(op: CUfileOpError, errno: i32) -> Fail {
        Fail { op, cu: 0, errno }
    }

    /// The failure of the last system call on this thread.
    pub fn last_os() -> Fail {
        Fail::os(
            std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EIO),
        )
    }

    /// As the `CUfileError_t` of the API's status-returning functions.
    pub fn to_raw(self) -> RawError {
        if self.errno != 0 {
            set_errno(self.errno);
        }
        RawError {
            err: self.op as u32,
            cu_err: self.cu,
        }
    }

    /// As the `ssize_t` of `cuFileRead`/`cuFileWrite`: -1 with errno for a system error,
    /// the negated `CUfileOpError` otherwise.
    pub fn to_ssize(self) -> isize {
        if self.errno != 0 && self.op == CUfileOpError::CU_FILE_IO_ERROR {
            set_errno(self.errno);
            -1
        } else {
            if self.errno != 0 {
                set_errno(self.errno);
            }
            -(self.op as isize)
        }
    }
}

/// Sets this thread's `errno`.
pub fn set_errno(value: i32) {
    // SAFETY: takes no arguments; returns the calling thread's errno location.
    let location = unsafe { libc::__errno_location() };
    // SAFETY: that location is valid to write for the life of the thread.
    unsafe { *location = value };
}

/// A status result as `CUfileError_t`.
pub fn status(result: Result<(), Fail>) -> RawError {
    match result {
        Ok(()) => RawError::SUCCESS,
        Err(fail) => fail.to_raw(),
    }
}
