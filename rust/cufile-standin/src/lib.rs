//! kvikpy's test stand-in for NVIDIA's libcufile (GPUDirect Storage): the subset of the
//! cuFile C API that kvikpy calls, with cufile.h's signatures and return conventions and
//! real effects. Files are read and written with `pread`/`pwrite` on the registered
//! descriptor; device memory is reached through a host staging buffer and the CUDA driver
//! (no DMA between storage and the GPU: this is not GDS). Registrations are kept in tables
//! and checked; batch and stream-ordered calls complete for real.
//!
//! It is loaded only when asked for (`KVIKPY_CUFILE_LIBRARY=/path/libcufile_standin.so`),
//! never in place of a real libcufile otherwise; `kvikpy_cufile_standin()` says what it is.
//! Every export catches panics: none crosses into the caller.

// The exports carry cufile.h's names.
#![allow(non_snake_case)]

use std::ffi::{c_char, c_int, c_long, c_uint, c_void};
use std::mem::offset_of;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::Duration;

use cudarc::cufile::sys::{
    timespec, CUfileDescr_t, CUfileDrvProps_t, CUfileIOEvents_t,
    CUfileIOParams__bindgen_ty_1__bindgen_ty_1, CUfileIOParams_t, CUfileOpError, CUstream,
};

mod batch;
mod error;
mod io;
mod memory;
mod state;
mod stream;
#[cfg(test)]
mod tests;

pub use error::RawError;
use error::{status, Fail};

/// What `cuFileGetVersion` reports: the cuFile API level the stand-in follows (that of
/// libcufile 1.15, found on kvikpy's GPU machines), as major * 1000 + minor * 10.
pub const API_VERSION: c_int = 1150;

const SELF_DESCRIPTION: &std::ffi::CStr = c"kvikpy cuFile stand-in: a test double of libcufile (pread/pwrite and CUDA driver copies through host staging; no GPUDirect Storage)";

/// Reads a `T` at `offset` bytes into the caller's struct at `base`, as raw bits (the
/// caller's enum values need not be valid Rust enums).
///
/// # Safety
/// `base + offset` must be readable for `size_of::<T>()` bytes holding a valid `T`.
unsafe fn field<S, T: Copy>(base: *const S, offset: usize) -> T {
    // SAFETY: see the function's contract.
    unsafe {
        base.cast::<u8>()
            .wrapping_add(offset)
            .cast::<T>()
            .read_unaligned()
    }
}

fn guard<T>(fallback: T, f: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(fallback)
}

const INTERNAL: RawError = RawError {
    err: CUfileOpError::CU_FILE_INTERNAL_ERROR as u32,
    cu_err: 0,
};

fn invalid() -> Fail {
    Fail::op(CUfileOpError::CU_FILE_INVALID_VALUE)
}

/// Says that this library is kvikpy's stand-in, not NVIDIA's libcufile (a symbol the real
/// library does not have).
#[no_mangle]
pub extern "C" fn kvikpy_cufile_standin() -> *const c_char {
    SELF_DESCRIPTION.as_ptr()
}

/// Opens the driver (counted: each open needs a close). Always succeeds.
#[no_mangle]
pub extern "C" fn cuFileDriverOpen() -> RawError {
    guard(INTERNAL, || {
        let mut state = state::lock();
        if state.open_count == 0 {
            state.props = state::default_props();
        }
        state.open_count += 1;
        RawError::SUCCESS
    })
}

fn driver_close() -> RawError {
    guard(INTERNAL, || {
        status((|| {
            let mut state = state::lock_open()?;
            state.open_count -= 1;
            if state.open_count == 0 {
                state.clear();
                drop(state);
                stream::free_retired();
            }
            Ok(())
        })())
    })
}

/// Closes the driver once; the last close forgets every registration.
#[no_mangle]
pub extern "C" fn cuFileDriverClose() -> RawError {
    driver_close()
}

/// As `cuFileDriverClose` (cufile.h maps that name to this one).
#[no_mangle]
pub extern "C" fn cuFileDriverClose_v2() -> RawError {
    driver_close()
}

/// How many opens of the driver are not yet closed.
#[no_mangle]
pub extern "C" fn cuFileUseCount() -> c_long {
    guard(0, || state::lock().open_count as c_long)
}

/// Writes [`API_VERSION`] to `version`; needs no open driver.
///
/// # Safety
/// `version` must be null or point to a writable int.
#[no_mangle]
pub unsafe extern "C" fn cuFileGetVersion(version: *mut c_int) -> RawError {
    guard(INTERNAL, || {
        if version.is_null() {
            return invalid().to_raw();
        }
        // SAFETY: the caller gives a writable int.
        unsafe { version.write(API_VERSION) };
        RawError::SUCCESS
    })
}

/// Copies the driver's properties to `props`.
///
/// # Safety
/// `props` must be null or point to a writable `CUfileDrvProps_t`.
#[no_mangle]
pub unsafe extern "C" fn cuFileDriverGetProperties(props: *mut CUfileDrvProps_t) -> RawError {
    guard(INTERNAL, || {
        status((|| {
            let state = state::lock_open()?;
            if props.is_null() {
                return Err(invalid());
            }
            // SAFETY: the caller gives a writable CUfileDrvProps_t.
            unsafe { props.write(state.props) };
            Ok(())
        })())
    })
}

fn set_props(f: impl FnOnce(&mut CUfileDrvProps_t) -> Result<(), Fail>) -> RawError {
    guard(INTERNAL, || {
        status((|| {
            let mut state = state::lock_open()?;
            f(&mut state.props)
        })())
    })
}

fn kib_u32(value: usize) -> Result<c_uint, Fail> {
    if value == 0 {
        return Err(invalid());
    }
    c_uint::try_from(value).map_err(|_| Fail::op(CUfileOpError::CU_FILE_DRIVER_UNSUPPORTED_LIMIT))
}

/// Sets poll mode (`dcontrolflags` bit `CU_FILE_USE_POLL_MODE`) and its threshold (KiB).
#[no_mangle]
pub extern "C" fn cuFileDriverSetPollMode(poll: bool, poll_threshold_size: usize) -> RawError {
    set_props(|props| {
        let bit = 1 << state::CONTROL_USE_POLL_MODE;
        if poll {
            props.nvfs.dcontrolflags |= bit;
        } else {
            props.nvfs.dcontrolflags &= !bit;
        }
        props.nvfs.poll_thresh_size = poll_threshold_size;
        Ok(())
    })
}

/// Sets `nvfs.max_direct_io_size` (KiB, not 0).
#[no_mangle]
pub extern "C" fn cuFileDriverSetMaxDirectIOSize(max_direct_io_size: usize) -> RawError {
    set_props(|props| {
        if max_direct_io_size == 0 {
            return Err(invalid());
        }
        props.nvfs.max_direct_io_size = max_direct_io_size;
        Ok(())
    })
}

/// Sets `max_device_cache_size` (KiB, not 0, at most `UINT_MAX`).
#[no_mangle]
pub extern "C" fn cuFileDriverSetMaxCacheSize(max_cache_size: usize) -> RawError {
    set_props(|props| {
        props.max_device_cache_size = kib_u32(max_cache_size)?;
        Ok(())
    })
}

/// Sets `max_device_pinned_mem_size` (KiB, not 0, at most `UINT_MAX`).
#[no_mangle]
pub extern "C" fn cuFileDriverSetMaxPinnedMemSize(max_pinned_size: usize) -> RawError {
    set_props(|props| {
        props.max_device_pinned_mem_size = kib_u32(max_pinned_size)?;
        Ok(())
    })
}

/// Registers a file: `descr` must be `CU_FILE_HANDLE_TYPE_OPAQUE_FD` with an open regular
/// file's descriptor, not already registered. The descriptor stays the caller's to close.
///
/// # Safety
/// `fh` must be null or writable; `descr` null or a readable `CUfileDescr_t`.
#[no_mangle]
pub unsafe extern "C" fn cuFileHandleRegister(
    fh: *mut *mut c_void,
    descr: *mut CUfileDescr_t,
) -> RawError {
    guard(INTERNAL, || {
        status((|| {
            let mut state = state::lock_open()?;
            if fh.is_null() || descr.is_null() {
                return Err(invalid());
            }
            // The type as the caller's raw integer: an out-of-range value is no Rust enum.
            // SAFETY: `descr` is readable; `type_` is a 32-bit enum.
            let kind: u32 = unsafe { field(descr, offset_of!(CUfileDescr_t, type_)) };
            match kind {
                1 => {}
                2 => return Err(Fail::op(CUfileOpError::CU_FILE_PLATFORM_NOT_SUPPORTED)),
                3 => return Err(Fail::op(CUfileOpError::CU_FILE_IO_NOT_SUPPORTED)),
                _ => return Err(invalid()),
            }
            // SAFETY: for OPAQUE_FD the union `handle` holds the descriptor, an int.
            let fd: c_int = unsafe { field(descr, offset_of!(CUfileDescr_t, handle)) };
            // SAFETY: an all-zero `stat` is a valid value to be overwritten.
            let mut st: libc::stat = unsafe { std::mem::zeroed() };
            // SAFETY: `st` is a writable stat buffer; a bad descriptor only fails.
            if fd < 0 || unsafe { libc::fstat(fd, &mut st) } != 0 {
                return Err(Fail::op_errno(
                    CUfileOpError::CU_FILE_INVALID_VALUE,
                    libc::EBADF,
                ));
            }
            if st.st_mode & libc::S_IFMT != libc::S_IFREG {
                return Err(Fail::op(CUfileOpError::CU_FILE_INVALID_FILE_TYPE));
            }
            if state.handles.values().any(|entry| entry.fd == fd) {
                return Err(Fail::op(CUfileOpError::CU_FILE_HANDLE_ALREADY_REGISTERED));
            }
            let id = state.new_id();
            let io_fd = buffered_twin(fd);
            state.handles.insert(id, state::FileEntry { fd, io_fd });
            // SAFETY: `fh` is writable.
            unsafe { fh.write(id as *mut c_void) };
            Ok(())
        })())
    })
}

/// Forgets a registered file (an unknown handle is ignored: the function returns nothing).
#[no_mangle]
pub extern "C" fn cuFileHandleDeregister(fh: *mut c_void) {
    guard((), || {
        if let Some(entry) = state::lock().handles.remove(&(fh as usize)) {
            if entry.io_fd != entry.fd {
                // SAFETY: `io_fd` was opened by `buffered_twin` and is closed once, here.
                unsafe { libc::close(entry.io_fd) };
            }
        }
    })
}

/// `fd`, or where it was opened with O_DIRECT, the same file reopened without it (through
/// `/proc/self/fd`); `fd` itself if the reopening fails.
fn buffered_twin(fd: c_int) -> c_int {
    // SAFETY: F_GETFL on a descriptor checked open by fstat; no memory is involved.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags < 0 || flags & libc::O_DIRECT == 0 {
        return fd;
    }
    let Ok(path) = std::ffi::CString::new(format!("/proc/self/fd/{fd}")) else {
        return fd;
    };
    let access = flags & libc::O_ACCMODE;
    // SAFETY: `path` is NUL-terminated; no O_CREAT, so no mode argument is read.
    let twin = unsafe { libc::open(path.as_ptr(), access | libc::O_CLOEXEC) };
    if twin < 0 {
        fd
    } else {
        twin
    }
}

/// Registers a buffer by its base address (bookkeeping only: nothing is pinned).
#[no_mangle]
pub extern "C" fn cuFileBufRegister(
    buf_ptr_base: *const c_void,
    length: usize,
    _flags: c_int,
) -> RawError {
    guard(INTERNAL, || {
        status((|| {
            let mut state = state::lock_open()?;
            if buf_ptr_base.is_null() || length == 0 {
                return Err(invalid());
            }
            let base = buf_ptr_base as usize;
            if state.buffers.contains_key(&base) {
                return Err(Fail::op(CUfileOpError::CU_FILE_MEMORY_ALREADY_REGISTERED));
            }
            state.buffers.insert(base, length);
            Ok(())
        })())
    })
}

/// Deregisters a buffer registered with `cuFileBufRegister`.
#[no_mangle]
pub extern "C" fn cuFileBufDeregister(buf_ptr_base: *const c_void) -> RawError {
    guard(INTERNAL, || {
        status((|| {
            let mut state = state::lock_open()?;
            match state.buffers.remove(&(buf_ptr_base as usize)) {
                Some(_) => Ok(()),
                None => Err(Fail::op(CUfileOpError::CU_FILE_MEMORY_NOT_REGISTERED)),
            }
        })())
    })
}

/// The checked target of a synchronous transfer: descriptor and buffer address.
fn target(
    fh: *mut c_void,
    base: usize,
    size: usize,
    file_offset: i64,
    buf_offset: i64,
) -> Result<(i32, usize), Fail> {
    let fd = state::lock_open()?.file(fh as usize)?.io_fd;
    if base == 0 || file_offset < 0 || buf_offset < 0 || size > isize::MAX as usize {
        return Err(invalid());
    }
    let addr = base.checked_add(buf_offset as usize).ok_or_else(invalid)?;
    addr.checked_add(size).ok_or_else(invalid)?;
    Ok((fd, addr))
}

fn ssize(result: Result<usize, Fail>) -> isize {
    match result {
        Ok(n) => n as isize,
        Err(fail) => fail.to_ssize(),
    }
}

const INTERNAL_SSIZE: isize = -(CUfileOpError::CU_FILE_INTERNAL_ERROR as isize);

/// Reads `size` bytes at `file_offset` into `buf_ptr_base + buf_ptr_offset` (host or device
/// memory). Returns the bytes read (fewer only at end of file), -1 with errno for a system
/// error, or a negated `CUfileOpError`.
///
/// # Safety
/// The buffer range must be writable memory (host, or a live device allocation).
#[no_mangle]
pub unsafe extern "C" fn cuFileRead(
    fh: *mut c_void,
    buf_ptr_base: *mut c_void,
    size: usize,
    file_offset: libc::off_t,
    buf_ptr_offset: libc::off_t,
) -> isize {
    guard(INTERNAL_SSIZE, || {
        ssize(
            target(fh, buf_ptr_base as usize, size, file_offset, buf_ptr_offset).and_then(
                |(fd, addr)| {
                    // SAFETY: the caller gives a writable buffer range.
                    unsafe { io::read(fd, addr, size, file_offset) }
                },
            ),
        )
    })
}

/// Writes `size` bytes from `buf_ptr_base + buf_ptr_offset` (host or device memory) at
/// `file_offset`. Returns the bytes written, -1 with errno, or a negated `CUfileOpError`.
///
/// # Safety
/// The buffer range must be readable memory (host, or a live device allocation).
#[no_mangle]
pub unsafe extern "C" fn cuFileWrite(
    fh: *mut c_void,
    buf_ptr_base: *const c_void,
    size: usize,
    file_offset: libc::off_t,
    buf_ptr_offset: libc::off_t,
) -> isize {
    guard(INTERNAL_SSIZE, || {
        ssize(
            target(fh, buf_ptr_base as usize, size, file_offset, buf_ptr_offset).and_then(
                |(fd, addr)| {
                    // SAFETY: the caller gives a readable buffer range.
                    unsafe { io::write(fd, addr, size, file_offset) }
                },
            ),
        )
    })
}

#[allow(clippy::too_many_arguments)]
unsafe fn enqueue(
    write: bool,
    fh: *mut c_void,
    base: *mut c_void,
    size_p: *mut usize,
    file_offset_p: *mut libc::off_t,
    buf_offset_p: *mut libc::off_t,
    bytes_p: *mut isize,
    stream: CUstream,
) -> RawError {
    guard(INTERNAL, || {
        status((|| {
            let (fd, flags) = {
                let state = state::lock_open()?;
                let fd = state.file(fh as usize)?.io_fd;
                (
                    fd,
                    state.streams.get(&(stream as usize)).copied().unwrap_or(0),
                )
            };
            if base.is_null()
                || size_p.is_null()
                || file_offset_p.is_null()
                || buf_offset_p.is_null()
                || bytes_p.is_null()
            {
                return Err(invalid());
            }
            let params = stream::Params {
                fd,
                write,
                base: base as usize,
                size_p: size_p as usize,
                file_offset_p: file_offset_p as usize,
                buf_offset_p: buf_offset_p as usize,
                bytes_p: bytes_p as usize,
                flags,
            };
            // SAFETY: the caller keeps the pointers valid until the operation has run.
            unsafe { stream::enqueue(params, stream as usize) }
        })())
    })
}

/// Enqueues a read on `stream`: at its turn, reads `*size_p` bytes at `*file_offset_p` into
/// `buf_ptr_base + *buf_ptr_offset_p` and stores the result (as `cuFileRead`'s) in
/// `*bytes_read_p`. See the `stream` module for when each parameter is read.
///
/// # Safety
/// Every pointer and the buffer must stay valid until the read has run on the stream.
#[no_mangle]
pub unsafe extern "C" fn cuFileReadAsync(
    fh: *mut c_void,
    buf_ptr_base: *mut c_void,
    size_p: *mut usize,
    file_offset_p: *mut libc::off_t,
    buf_ptr_offset_p: *mut libc::off_t,
    bytes_read_p: *mut isize,
    stream: CUstream,
) -> RawError {
    // SAFETY: forwarded under the same contract.
    unsafe {
        enqueue(
            false,
            fh,
            buf_ptr_base,
            size_p,
            file_offset_p,
            buf_ptr_offset_p,
            bytes_read_p,
            stream,
        )
    }
}

/// Enqueues a write on `stream`, as `cuFileReadAsync` in the other direction.
///
/// # Safety
/// Every pointer and the buffer must stay valid until the write has run on the stream.
#[no_mangle]
pub unsafe extern "C" fn cuFileWriteAsync(
    fh: *mut c_void,
    buf_ptr_base: *mut c_void,
    size_p: *mut usize,
    file_offset_p: *mut libc::off_t,
    buf_ptr_offset_p: *mut libc::off_t,
    bytes_written_p: *mut isize,
    stream: CUstream,
) -> RawError {
    // SAFETY: forwarded under the same contract.
    unsafe {
        enqueue(
            true,
            fh,
            buf_ptr_base,
            size_p,
            file_offset_p,
            buf_ptr_offset_p,
            bytes_written_p,
            stream,
        )
    }
}

/// Registers a stream with `CU_FILE_STREAM_*` flags (optional, as for the real library: an
/// unregistered stream works with flags 0). Registering again replaces the flags.
#[no_mangle]
pub extern "C" fn cuFileStreamRegister(stream: CUstream, flags: c_uint) -> RawError {
    guard(INTERNAL, || {
        status((|| {
            let mut state = state::lock_open()?;
            if flags & !stream::ALL_FLAGS != 0 {
                return Err(invalid());
            }
            state.streams.insert(stream as usize, flags);
            Ok(())
        })())
    })
}

/// Deregisters a registered stream (an unknown stream is `CU_FILE_INVALID_VALUE`).
#[no_mangle]
pub extern "C" fn cuFileStreamDeregister(stream: CUstream) -> RawError {
    guard(INTERNAL, || {
        status((|| {
            let mut state = state::lock_open()?;
            state
                .streams
                .remove(&(stream as usize))
                .map(|_| ())
                .ok_or_else(invalid)
        })())
    })
}

/// Sets up a batch of capacity `nr` (1 to `max_batch_io_size`).
///
/// # Safety
/// `batch_idp` must be null or writable.
#[no_mangle]
pub unsafe extern "C" fn cuFileBatchIOSetUp(batch_idp: *mut *mut c_void, nr: c_uint) -> RawError {
    guard(INTERNAL, || {
        status((|| {
            let mut state = state::lock_open()?;
            if batch_idp.is_null() || nr == 0 || nr > state.props.max_batch_io_size {
                return Err(invalid());
            }
            let id = state.new_id();
            state
                .batches
                .insert(id, Arc::new(batch::Batch::new(nr as usize)));
            // SAFETY: `batch_idp` is writable.
            unsafe { batch_idp.write(id as *mut c_void) };
            Ok(())
        })())
    })
}

fn find_batch(handle: *mut c_void) -> Result<Arc<batch::Batch>, Fail> {
    state::lock_open()?
        .batches
        .get(&(handle as usize))
        .cloned()
        .ok_or_else(invalid)
}

/// Submits `nr` entries; they run on a thread, in order. Every entry is checked first
/// (mode `CUFILE_BATCH`, a known opcode and handle, non-negative offsets); none starts unless
/// all pass. More entries than the batch has room for: `CU_FILE_BATCH_FULL`.
///
/// # Safety
/// `iocbp` must point to `nr` readable entries whose buffers stay valid until collected.
#[no_mangle]
pub unsafe extern "C" fn cuFileBatchIOSubmit(
    batch_idp: *mut c_void,
    nr: c_uint,
    iocbp: *mut CUfileIOParams_t,
    _flags: c_uint,
) -> RawError {
    guard(INTERNAL, || {
        status((|| {
            let batch = find_batch(batch_idp)?;
            if nr == 0 {
                return Ok(());
            }
            if iocbp.is_null() {
                return Err(invalid());
            }
            let mut entries = Vec::with_capacity(nr as usize);
            let state = state::lock_open()?;
            for i in 0..nr as usize {
                let p = iocbp.wrapping_add(i);
                // Enums read as the caller's raw integers (an out-of-range value is no Rust enum).
                // SAFETY: `mode` is a 32-bit enum field of a readable entry.
                let mode: u32 = unsafe { field(p, offset_of!(CUfileIOParams_t, mode)) };
                // SAFETY: as above for `opcode`.
                let opcode: u32 = unsafe { field(p, offset_of!(CUfileIOParams_t, opcode)) };
                // SAFETY: the entry is readable; `u.batch` is the union's only member.
                let io: CUfileIOParams__bindgen_ty_1__bindgen_ty_1 =
                    unsafe { field(p, offset_of!(CUfileIOParams_t, u)) };
                // SAFETY: `fh` is a pointer field of a readable entry.
                let fh: *mut c_void = unsafe { field(p, offset_of!(CUfileIOParams_t, fh)) };
                // SAFETY: as above for `cookie`.
                let cookie: *mut c_void = unsafe { field(p, offset_of!(CUfileIOParams_t, cookie)) };
                if mode != 1
                    || opcode > 1
                    || io.devPtr_base.is_null()
                    || io.file_offset < 0
                    || io.devPtr_offset < 0
                {
                    return Err(invalid());
                }
                let fd = state.file(fh as usize)?.io_fd;
                let addr = (io.devPtr_base as usize)
                    .checked_add(io.devPtr_offset as usize)
                    .ok_or_else(invalid)?;
                entries.push(batch::Entry {
                    fd,
                    write: opcode == 1,
                    addr,
                    size: io.size,
                    file_offset: io.file_offset,
                    cookie: cookie as usize,
                });
            }
            drop(state);
            // SAFETY: the caller keeps the buffers valid until their events are collected.
            unsafe { batch.submit(entries) }
        })())
    })
}

/// Collects finished entries: waits until `min_nr` are ready (no more than are outstanding)
/// or `timeout` passes (null: no limit), then writes up to `*nr` events and sets `*nr`.
///
/// # Safety
/// `nr` must be null or a readable and writable uint; `iocbp` room for `*nr` events;
/// `timeout` null or readable.
#[no_mangle]
pub unsafe extern "C" fn cuFileBatchIOGetStatus(
    batch_idp: *mut c_void,
    min_nr: c_uint,
    nr: *mut c_uint,
    iocbp: *mut CUfileIOEvents_t,
    timeout: *mut timespec,
) -> RawError {
    guard(INTERNAL, || {
        status((|| {
            let batch = find_batch(batch_idp)?;
            if nr.is_null() {
                return Err(invalid());
            }
            // SAFETY: `nr` is readable.
            let max = unsafe { nr.read() };
            if min_nr > max || (max > 0 && iocbp.is_null()) {
                return Err(invalid());
            }
            let limit = if timeout.is_null() {
                None
            } else {
                // SAFETY: `timeout` is readable.
                let t = unsafe { timeout.read() };
                if t.tv_sec < 0 || !(0..1_000_000_000).contains(&t.tv_nsec) {
                    return Err(invalid());
                }
                Some(Duration::new(t.tv_sec as u64, t.tv_nsec as u32))
            };
            let events = batch.collect(min_nr as usize, max as usize, limit);
            for (i, event) in events.iter().enumerate() {
                // SAFETY: `iocbp` has room for `max` >= events.len() events; the status is
                // written as a valid CUfileStatus_t.
                unsafe {
                    iocbp.wrapping_add(i).write(CUfileIOEvents_t {
                        cookie: event.cookie as *mut c_void,
                        status: event.status,
                        ret: event.ret,
                    })
                };
            }
            // SAFETY: `nr` is writable.
            unsafe { nr.write(events.len() as c_uint) };
            Ok(())
        })())
    })
}

/// Cancels the entries of a batch not yet started (they complete as `CUFILE_CANCELED`).
#[no_mangle]
pub extern "C" fn cuFileBatchIOCancel(batch_idp: *mut c_void) -> RawError {
    guard(INTERNAL, || {
        status(find_batch(batch_idp).map(|batch| batch.cancel()))
    })
}

/// Destroys a batch (entries not yet started are cancelled; an unknown handle is ignored).
#[no_mangle]
pub extern "C" fn cuFileBatchIODestroy(batch_idp: *mut c_void) {
    guard((), || {
        if let Some(batch) = state::lock().batches.remove(&(batch_idp as usize)) {
            batch.cancel();
        }
    })
}
