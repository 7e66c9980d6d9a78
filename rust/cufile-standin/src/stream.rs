//! Stream-ordered transfers (`cuFileReadAsync`/`cuFileWriteAsync`): the file I/O runs in a
//! `cuLaunchHostFunc` callback at its place in the stream, against pinned staging memory,
//! with the device copies enqueued around it on the same stream.
//!
//! When the parameters are read: `*file_offset_p` and `*size_p` at execution time (unless the
//! stream was registered with `CU_FILE_STREAM_FIXED_FILE_OFFSET` / `..._FIXED_FILE_SIZE`, which
//! fix them at enqueue), as the real library does. For device memory, `*size_p` at enqueue
//! also sizes the staging buffer and the device copies, and `*buf_offset_p` is read at
//! enqueue (the copy's address is fixed then): a larger size at execution is cut to the
//! enqueued one. A read first copies the device range into the staging buffer, so that past
//! a short read at end of file the device bytes are written back unchanged.
//! Without a CUDA driver the transfer is done at once (there is no stream to order it on).

use std::ffi::c_void;
use std::ptr;
use std::sync::{LazyLock, Mutex, PoisonError};

use cudarc::driver::sys::{self as cu, CUdeviceptr, CUresult, CUstream};

use crate::error::Fail;
use crate::io;
use crate::memory::{self, Place};

/// `CU_FILE_STREAM_FIXED_BUF_OFFSET`: `*buf_offset_p` is read at enqueue.
pub const FIXED_BUF_OFFSET: u32 = 1;
/// `CU_FILE_STREAM_FIXED_FILE_OFFSET`: `*file_offset_p` is read at enqueue.
pub const FIXED_FILE_OFFSET: u32 = 2;
/// `CU_FILE_STREAM_FIXED_FILE_SIZE`: `*size_p` is read at enqueue.
pub const FIXED_FILE_SIZE: u32 = 4;
/// `CU_FILE_STREAM_PAGE_ALIGNED_INPUTS`: a promise of page-aligned parameters (unchecked).
pub const PAGE_ALIGNED_INPUTS: u32 = 8;
/// Every flag cufile.h defines.
pub const ALL_FLAGS: u32 =
    FIXED_BUF_OFFSET | FIXED_FILE_OFFSET | FIXED_FILE_SIZE | PAGE_ALIGNED_INPUTS;

/// Pinned staging buffers whose last use on a stream has run: freed at the next enqueue
/// (a host callback may not call CUDA) or when the driver closes.
static RETIRED: LazyLock<Mutex<Vec<usize>>> = LazyLock::new(|| Mutex::new(Vec::new()));

/// Frees the retired staging buffers.
pub fn free_retired() {
    let retired: Vec<usize> =
        std::mem::take(&mut *RETIRED.lock().unwrap_or_else(PoisonError::into_inner));
    for p in retired {
        memory::free_pinned(p);
    }
}

/// The caller's parameter pointers and what was fixed at enqueue.
pub struct Params {
    /// The registered file's descriptor.
    pub fd: i32,
    /// True for a write.
    pub write: bool,
    /// The buffer's base address.
    pub base: usize,
    /// `size_p`, `file_offset_p`, `buf_offset_p`, `bytes_p` as addresses.
    pub size_p: usize,
    /// See `size_p`.
    pub file_offset_p: usize,
    /// See `size_p`.
    pub buf_offset_p: usize,
    /// See `size_p`.
    pub bytes_p: usize,
    /// The stream's registration flags (0 when not registered).
    pub flags: u32,
}

struct Op {
    params: Params,
    /// Values fixed at enqueue by the flags.
    size: Option<usize>,
    file_offset: Option<i64>,
    /// Device path: the device address, the staging buffer and its size.
    device: usize,
    staging: usize,
    capacity: usize,
    result: isize,
}

// SAFETY helpers: the parameter pointers are the caller's, valid until the operation has
// run in stream order (the API's contract); they may be written by other stream work, hence
// volatile reads.
unsafe fn load<T: Copy>(addr: usize) -> T {
    // SAFETY: see above.
    unsafe { ptr::read_volatile(addr as *const T) }
}

impl Op {
    fn size_now(&self) -> usize {
        // SAFETY: `size_p` is valid until the operation has run.
        self.size
            .unwrap_or_else(|| unsafe { load::<usize>(self.params.size_p) })
    }

    fn file_offset_now(&self) -> i64 {
        // SAFETY: `file_offset_p` is valid until the operation has run.
        self.file_offset
            .unwrap_or_else(|| unsafe { load::<i64>(self.params.file_offset_p) })
    }

    fn finish(&self, result: isize) {
        // SAFETY: `bytes_p` is valid until the operation has run; nothing else writes it.
        unsafe { ptr::write_volatile(self.params.bytes_p as *mut isize, result) };
    }

    /// The whole transfer into or out of host memory, with every parameter read now.
    fn run_host(&self) -> isize {
        // SAFETY: `buf_offset_p` is valid until the operation has run.
        let buf_offset = unsafe { load::<i64>(self.params.buf_offset_p) };
        let (size, file_offset) = (self.size_now(), self.file_offset_now());
        if buf_offset < 0 || file_offset < 0 || size > isize::MAX as usize {
            return Fail::op(cudarc::cufile::sys::CUfileOpError::CU_FILE_INVALID_VALUE).to_ssize();
        }
        let addr = self.params.base + buf_offset as usize;
        let result = if self.params.write {
            // SAFETY: the caller's buffer is host memory valid for `size` bytes in stream order.
            unsafe { io::write(self.params.fd, addr, size, file_offset) }
        } else {
            // SAFETY: as above, writable.
            unsafe { io::read(self.params.fd, addr, size, file_offset) }
        };
        match result {
            Ok(n) => n as isize,
            Err(fail) => fail.to_ssize(),
        }
    }

    /// The file side of a device transfer, against the staging buffer.
    fn run_staged(&self) -> isize {
        let (size, file_offset) = (self.size_now().min(self.capacity), self.file_offset_now());
        if file_offset < 0 {
            return Fail::op(cudarc::cufile::sys::CUfileOpError::CU_FILE_INVALID_VALUE).to_ssize();
        }
        // SAFETY: `staging` is pinned memory of `capacity` bytes owned by this operation, and
        // no copy on the stream touches it while this callback runs.
        let staging = unsafe { std::slice::from_raw_parts_mut(self.staging as *mut u8, size) };
        let result = if self.params.write {
            io::pwrite_all(self.params.fd, staging, file_offset)
        } else {
            io::pread_full(self.params.fd, staging, file_offset)
        };
        match result {
            Ok(n) => n as isize,
            Err(fail) => fail.to_ssize(),
        }
    }
}

fn retire(op: &Op) {
    if op.staging != 0 {
        RETIRED
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(op.staging);
    }
}

/// Host callback: the whole host-memory transfer, then the result; frees the operation.
unsafe extern "C" fn host_all(data: *mut c_void) {
    // SAFETY: `data` is the Box<Op> leaked at enqueue; this is its only and last callback.
    let op = unsafe { Box::from_raw(data.cast::<Op>()) };
    let result = std::panic::catch_unwind(|| op.run_host()).unwrap_or(-1);
    op.finish(result);
}

/// Host callback: the file side of a device transfer (pread into / pwrite from staging).
/// For a write, also the last step: sets the result and retires the operation.
unsafe extern "C" fn host_file(data: *mut c_void) {
    if data.is_null() {
        return;
    }
    let write = {
        // SAFETY: `data` is the leaked Box<Op>; callbacks on one stream run one at a time,
        // in order, so nothing else touches it now.
        let op = unsafe { &mut *data.cast::<Op>() };
        op.result = std::panic::catch_unwind(|| op.run_staged()).unwrap_or(-1);
        op.params.write
    };
    if write {
        // SAFETY: this was the write's last callback; nothing refers to the Box any more.
        let op = unsafe { Box::from_raw(data.cast::<Op>()) };
        op.finish(op.result);
        retire(&op);
    }
}

/// Host callback: the last step of a device read (its copy to the device has run).
unsafe extern "C" fn host_done(data: *mut c_void) {
    // SAFETY: `data` is the leaked Box<Op>; this is its last callback.
    let op = unsafe { Box::from_raw(data.cast::<Op>()) };
    op.finish(op.result);
    retire(&op);
}

fn check(result: CUresult) -> Result<(), Fail> {
    if result == CUresult::CUDA_SUCCESS {
        Ok(())
    } else {
        Err(Fail::cuda(result as u32))
    }
}

fn launch(
    stream: CUstream,
    f: unsafe extern "C" fn(*mut c_void),
    data: *mut Op,
) -> Result<(), Fail> {
    // SAFETY: `f` only touches `data`, which stays alive until its last callback frees it.
    check(unsafe { cu::cuLaunchHostFunc(stream, Some(f), data.cast()) })
}

/// Enqueues the transfer described by `params` on `stream`.
///
/// # Safety
/// The parameter pointers and the buffer must stay valid until the operation has run in
/// stream order; `stream` must be a stream of the buffer's context (or null).
pub unsafe fn enqueue(params: Params, stream: usize) -> Result<(), Fail> {
    let stream = stream as CUstream;
    // SAFETY: the caller's pointers are valid now.
    let size =
        (params.flags & FIXED_FILE_SIZE != 0).then(|| unsafe { load::<usize>(params.size_p) });
    // SAFETY: as above.
    let file_offset = (params.flags & FIXED_FILE_OFFSET != 0)
        .then(|| unsafe { load::<i64>(params.file_offset_p) });
    let mut op = Box::new(Op {
        params,
        size,
        file_offset,
        device: 0,
        staging: 0,
        capacity: 0,
        result: 0,
    });
    if !memory::cuda_available() {
        // No driver, so no stream: the transfer happens now.
        let result = op.run_host();
        op.finish(result);
        return Ok(());
    }
    // SAFETY: `buf_offset_p` is valid now.
    let buf_offset = unsafe { load::<i64>(op.params.buf_offset_p) };
    if buf_offset < 0 {
        return Err(Fail::op(
            cudarc::cufile::sys::CUfileOpError::CU_FILE_INVALID_VALUE,
        ));
    }
    let addr = op.params.base + buf_offset as usize;
    let ctx = match memory::place(addr)? {
        Place::Host => {
            // Host memory: one callback does everything, all parameters read at execution.
            let data = Box::into_raw(op);
            if let Err(fail) = launch(stream, host_all, data) {
                // SAFETY: the callback was not enqueued, so the Box is ours again.
                drop(unsafe { Box::from_raw(data) });
                return Err(fail);
            }
            return Ok(());
        }
        Place::Device(ctx) => ctx,
    };
    let _bound = memory::bind(ctx)?;
    free_retired();
    // SAFETY: `size_p` is valid now.
    let capacity = op
        .size
        .unwrap_or_else(|| unsafe { load::<usize>(op.params.size_p) });
    op.device = addr;
    op.capacity = capacity;
    op.staging = memory::pinned(capacity)?;
    let (device, staging, write) = (op.device as CUdeviceptr, op.staging, op.params.write);
    let data = Box::into_raw(op);
    // Nothing enqueued yet: on failure the operation and its staging are ours to free.
    let first = if capacity == 0 {
        Ok(())
    } else {
        // SAFETY: `staging` holds `capacity` bytes; the device range is the caller's.
        check(unsafe { cu::cuMemcpyDtoHAsync_v2(staging as *mut c_void, device, capacity, stream) })
    };
    if let Err(fail) = first.and_then(|()| launch(stream, host_file, data)) {
        // SAFETY: no callback refers to `data` (the copy, if enqueued, does not).
        let op = unsafe { Box::from_raw(data) };
        // The copy may be pending: synchronise before freeing its destination.
        // SAFETY: `stream` is the caller's stream.
        let _ = unsafe { cu::cuStreamSynchronize(stream) };
        memory::free_pinned(op.staging);
        return Err(fail);
    }
    if write {
        return Ok(()); // host_file retires the write
    }
    // From here a callback owns `data`: on a failure it is leaked rather than freed under a
    // pending callback, and the error is returned.
    if capacity > 0 {
        // SAFETY: as for the first copy; ordered after the pread on the stream.
        check(unsafe {
            cu::cuMemcpyHtoDAsync_v2(device, staging as *const c_void, capacity, stream)
        })?;
    }
    launch(stream, host_done, data)
}
