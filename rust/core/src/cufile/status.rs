//! cuFile's status codes: their names and meanings, and a status as an engine error.

use crate::error::{Error, Result};

use super::library::Status;

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
