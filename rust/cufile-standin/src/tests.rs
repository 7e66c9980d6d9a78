//! Tests of the exports called directly (nothing loaded): host memory and real temporary
//! files. The driver state is process-wide, so the tests run one at a time.

use std::ffi::{c_uint, c_void, CStr};
use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::ptr;
use std::sync::{Mutex, MutexGuard, PoisonError};

use cudarc::cufile::sys::{
    timespec, CUfileBatchMode_t, CUfileDescr_t, CUfileDescr_t__bindgen_ty_1, CUfileDrvProps_t,
    CUfileFileHandleType, CUfileIOEvents_t, CUfileIOParams__bindgen_ty_1,
    CUfileIOParams__bindgen_ty_1__bindgen_ty_1, CUfileIOParams_t, CUfileOpError as E,
    CUfileOpcode_t, CUfileStatus_t,
};

use crate::*;

static SERIAL: Mutex<()> = Mutex::new(());

/// Holds the test lock with the driver closed at the start and at the end.
struct Session(#[allow(dead_code)] MutexGuard<'static, ()>);

impl Session {
    fn closed() -> Session {
        let guard = SERIAL.lock().unwrap_or_else(PoisonError::into_inner);
        close_all();
        Session(guard)
    }

    fn open() -> Session {
        let session = Session::closed();
        assert_eq!(cuFileDriverOpen(), RawError::SUCCESS);
        session
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        close_all();
    }
}

fn close_all() {
    while cuFileUseCount() > 0 {
        assert_eq!(cuFileDriverClose_v2(), RawError::SUCCESS);
    }
}

fn err(e: E) -> RawError {
    RawError {
        err: e as u32,
        cu_err: 0,
    }
}

fn data(n: usize, seed: u8) -> Vec<u8> {
    (0..n)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect()
}

fn file_with(bytes: &[u8]) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("data.bin");
    File::create(&path)
        .expect("create")
        .write_all(bytes)
        .expect("write");
    (dir, path)
}

fn descr(fd: i32) -> CUfileDescr_t {
    CUfileDescr_t {
        type_: CUfileFileHandleType::CU_FILE_HANDLE_TYPE_OPAQUE_FD,
        handle: CUfileDescr_t__bindgen_ty_1 { fd },
        fs_ops: ptr::null(),
    }
}

fn register(fd: i32) -> Result<*mut c_void, RawError> {
    let mut handle = ptr::null_mut();
    let mut d = descr(fd);
    // SAFETY: both pointers are valid locals.
    let status = unsafe { cuFileHandleRegister(&mut handle, &mut d) };
    if status == RawError::SUCCESS {
        Ok(handle)
    } else {
        Err(status)
    }
}

fn read(fh: *mut c_void, buf: &mut [u8], size: usize, file_offset: i64, buf_offset: i64) -> isize {
    assert!(buf_offset as usize + size <= buf.len());
    // SAFETY: the range is inside `buf`.
    unsafe { cuFileRead(fh, buf.as_mut_ptr().cast(), size, file_offset, buf_offset) }
}

fn write(fh: *mut c_void, buf: &[u8], file_offset: i64, buf_offset: i64) -> isize {
    let size = buf.len() - buf_offset as usize;
    // SAFETY: the range is inside `buf`.
    unsafe { cuFileWrite(fh, buf.as_ptr().cast(), size, file_offset, buf_offset) }
}

fn errno() -> i32 {
    std::io::Error::last_os_error().raw_os_error().unwrap_or(0)
}

#[test]
fn says_it_is_the_standin() {
    // SAFETY: the export returns a static NUL-terminated string.
    let text = unsafe { CStr::from_ptr(kvikpy_cufile_standin()) }
        .to_str()
        .expect("utf-8");
    assert!(
        text.contains("kvikpy") && text.contains("stand-in"),
        "{text}"
    );
}

#[test]
fn everything_needs_an_open_driver() {
    let _s = Session::closed();
    let not_open = err(E::CU_FILE_DRIVER_NOT_INITIALIZED);
    let mut props = std::mem::MaybeUninit::<CUfileDrvProps_t>::uninit();
    // SAFETY: `props` is writable.
    let result = unsafe { cuFileDriverGetProperties(props.as_mut_ptr()) };
    assert_eq!(result, not_open);
    assert_eq!(cuFileDriverSetPollMode(true, 4), not_open);
    assert_eq!(cuFileDriverSetMaxCacheSize(1024), not_open);
    let (_dir, path) = file_with(b"0123456789abcdef");
    let f = File::open(&path).expect("open");
    assert_eq!(register(f.as_raw_fd()), Err(not_open));
    let mut buf = vec![0u8; 16];
    assert_eq!(
        read(16 as *mut c_void, &mut buf, 16, 0, 0),
        -(E::CU_FILE_DRIVER_NOT_INITIALIZED as isize)
    );
    assert_eq!(cuFileBufRegister(buf.as_ptr().cast(), 16, 0), not_open);
    let mut batch = ptr::null_mut();
    // SAFETY: `batch` is writable.
    assert_eq!(unsafe { cuFileBatchIOSetUp(&mut batch, 4) }, not_open);
    assert_eq!(cuFileStreamRegister(ptr::null_mut(), 0), not_open);
    assert_eq!(cuFileDriverClose(), not_open);
    // The version needs no open driver.
    let mut version = 0;
    // SAFETY: `version` is writable.
    assert_eq!(unsafe { cuFileGetVersion(&mut version) }, RawError::SUCCESS);
    assert_eq!(version, API_VERSION);
}

#[test]
fn opens_are_counted_and_the_last_close_forgets_registrations() {
    let _s = Session::open();
    assert_eq!(cuFileUseCount(), 1);
    assert_eq!(cuFileDriverOpen(), RawError::SUCCESS);
    assert_eq!(cuFileUseCount(), 2);
    let (_dir, path) = file_with(&data(100, 1));
    let f = File::open(&path).expect("open");
    let fh = register(f.as_raw_fd()).expect("register");
    assert_eq!(cuFileDriverClose(), RawError::SUCCESS);
    let mut buf = vec![0u8; 100];
    assert_eq!(read(fh, &mut buf, 100, 0, 0), 100, "still open once");
    assert_eq!(cuFileDriverClose_v2(), RawError::SUCCESS);
    assert_eq!(cuFileUseCount(), 0);
    assert_eq!(cuFileDriverOpen(), RawError::SUCCESS);
    assert_eq!(
        read(fh, &mut buf, 100, 0, 0),
        -(E::CU_FILE_HANDLE_NOT_REGISTERED as isize)
    );
}

#[test]
fn properties_defaults_and_setters() {
    let _s = Session::open();
    let get = || {
        let mut props = std::mem::MaybeUninit::<CUfileDrvProps_t>::uninit();
        // SAFETY: `props` is writable.
        let result = unsafe { cuFileDriverGetProperties(props.as_mut_ptr()) };
        assert_eq!(result, RawError::SUCCESS);
        // SAFETY: written by the call above.
        unsafe { props.assume_init() }
    };
    let props = get();
    assert_eq!(
        (props.nvfs.major_version, props.nvfs.minor_version),
        (state::STANDIN_MAJOR, state::STANDIN_MINOR)
    );
    assert_eq!(props.nvfs.dcontrolflags & 1, 0, "poll mode off");
    assert_ne!(props.nvfs.dcontrolflags & 2, 0, "compat mode allowed");
    assert_eq!(props.max_batch_io_size, 128);
    assert_eq!(cuFileDriverSetPollMode(true, 64), RawError::SUCCESS);
    assert_eq!(cuFileDriverSetMaxDirectIOSize(2048), RawError::SUCCESS);
    assert_eq!(cuFileDriverSetMaxCacheSize(4096), RawError::SUCCESS);
    assert_eq!(cuFileDriverSetMaxPinnedMemSize(8192), RawError::SUCCESS);
    let props = get();
    assert_eq!(props.nvfs.dcontrolflags & 1, 1);
    assert_eq!(props.nvfs.poll_thresh_size, 64);
    assert_eq!(props.nvfs.max_direct_io_size, 2048);
    assert_eq!(props.max_device_cache_size, 4096);
    assert_eq!(props.max_device_pinned_mem_size, 8192);
    assert_eq!(
        cuFileDriverSetMaxCacheSize(0),
        err(E::CU_FILE_INVALID_VALUE)
    );
    assert_eq!(
        cuFileDriverSetMaxPinnedMemSize(1 << 40),
        err(E::CU_FILE_DRIVER_UNSUPPORTED_LIMIT)
    );
    assert_eq!(cuFileDriverSetPollMode(false, 4), RawError::SUCCESS);
    assert_eq!(get().nvfs.dcontrolflags & 1, 0);
    // SAFETY: null is refused, not written.
    let result = unsafe { cuFileDriverGetProperties(ptr::null_mut()) };
    assert_eq!(result, err(E::CU_FILE_INVALID_VALUE));
    // A fresh open (after the last close) starts from the defaults again.
    close_all();
    assert_eq!(cuFileDriverOpen(), RawError::SUCCESS);
    assert_eq!(get().max_device_cache_size, 131_072);
}

#[test]
fn handle_registration_errors() {
    let _s = Session::open();
    let (dir, path) = file_with(&data(10, 2));
    let f = File::open(&path).expect("open");
    // Other handle types are refused.
    let mut d = descr(f.as_raw_fd());
    d.type_ = CUfileFileHandleType::CU_FILE_HANDLE_TYPE_USERSPACE_FS;
    let mut fh = ptr::null_mut();
    // SAFETY: valid locals.
    let result = unsafe { cuFileHandleRegister(&mut fh, &mut d) };
    assert_eq!(result, err(E::CU_FILE_IO_NOT_SUPPORTED));
    // A closed descriptor: EBADF, like the real library.
    let closed = File::open(&path).expect("open").as_raw_fd();
    assert_eq!(register(closed), Err(err(E::CU_FILE_INVALID_VALUE)));
    assert_eq!(errno(), libc::EBADF);
    assert_eq!(register(-1), Err(err(E::CU_FILE_INVALID_VALUE)));
    // Not a regular file.
    let d_fd = File::open(dir.path()).expect("open dir");
    assert_eq!(
        register(d_fd.as_raw_fd()),
        Err(err(E::CU_FILE_INVALID_FILE_TYPE))
    );
    // Registered twice.
    let fh = register(f.as_raw_fd()).expect("register");
    assert!(!fh.is_null());
    assert_eq!(
        register(f.as_raw_fd()),
        Err(err(E::CU_FILE_HANDLE_ALREADY_REGISTERED))
    );
    // Deregistered: unknown from then on; registering the descriptor again works.
    cuFileHandleDeregister(fh);
    let mut buf = vec![0u8; 10];
    assert_eq!(
        read(fh, &mut buf, 10, 0, 0),
        -(E::CU_FILE_HANDLE_NOT_REGISTERED as isize)
    );
    cuFileHandleDeregister(fh); // unknown: ignored
    let again = register(f.as_raw_fd()).expect("register again");
    assert_ne!(again, fh, "handles are never reused");
    assert_eq!(
        read(ptr::null_mut(), &mut buf, 10, 0, 0),
        -(E::CU_FILE_HANDLE_NOT_REGISTERED as isize)
    );
    assert_eq!(
        read(again.wrapping_byte_add(1), &mut buf, 10, 0, 0),
        -(E::CU_FILE_HANDLE_NOT_REGISTERED as isize)
    );
}

#[test]
fn buffer_registration_bookkeeping() {
    let _s = Session::open();
    let buf = vec![0u8; 4096];
    let p = buf.as_ptr().cast::<c_void>();
    assert_eq!(cuFileBufRegister(p, 4096, 0), RawError::SUCCESS);
    assert_eq!(
        cuFileBufRegister(p, 4096, 0),
        err(E::CU_FILE_MEMORY_ALREADY_REGISTERED)
    );
    assert_eq!(
        cuFileBufRegister(ptr::null(), 4096, 0),
        err(E::CU_FILE_INVALID_VALUE)
    );
    assert_eq!(
        cuFileBufRegister(p.wrapping_byte_add(8), 0, 0),
        err(E::CU_FILE_INVALID_VALUE)
    );
    assert_eq!(cuFileBufDeregister(p), RawError::SUCCESS);
    assert_eq!(
        cuFileBufDeregister(p),
        err(E::CU_FILE_MEMORY_NOT_REGISTERED)
    );
}

#[test]
fn reads_and_writes_with_offsets_and_end_of_file() {
    let _s = Session::open();
    let content = data(100_000, 3);
    let (_dir, path) = file_with(&content);
    let f = File::options()
        .read(true)
        .write(true)
        .open(&path)
        .expect("open");
    let fh = register(f.as_raw_fd()).expect("register");
    // Whole file, then a range into a buffer offset.
    let mut buf = vec![0xAAu8; 100_000];
    assert_eq!(read(fh, &mut buf, 100_000, 0, 0), 100_000);
    assert_eq!(buf, content);
    let mut buf = vec![0xAAu8; 5000];
    assert_eq!(read(fh, &mut buf, 3000, 12_345, 1000), 3000);
    assert_eq!(&buf[1000..4000], &content[12_345..15_345]);
    assert!(
        buf[..1000].iter().chain(&buf[4000..]).all(|&b| b == 0xAA),
        "nothing outside the range"
    );
    // Short at end of file; nothing past it; zero bytes.
    let mut buf = vec![0xAAu8; 1000];
    assert_eq!(read(fh, &mut buf, 1000, 99_500, 0), 500);
    assert_eq!(&buf[..500], &content[99_500..]);
    assert!(buf[500..].iter().all(|&b| b == 0xAA));
    assert_eq!(read(fh, &mut buf, 1000, 200_000, 0), 0);
    assert_eq!(read(fh, &mut buf, 0, 0, 0), 0);
    // Bad arguments.
    assert_eq!(
        read(fh, &mut buf, 10, -1, 0),
        -(E::CU_FILE_INVALID_VALUE as isize)
    );
    // SAFETY: a null buffer is refused before any access.
    let result = unsafe { cuFileRead(fh, ptr::null_mut(), 10, 0, 0) };
    assert_eq!(result, -(E::CU_FILE_INVALID_VALUE as isize));
    // Writes from a buffer offset, extending the file; read back.
    let new = data(70_000, 9);
    assert_eq!(write(fh, &new, 90_000, 10_000), 60_000);
    let mut back = vec![0u8; 150_000];
    assert_eq!(read(fh, &mut back, 150_000, 0, 0), 150_000);
    assert_eq!(&back[..90_000], &content[..90_000]);
    assert_eq!(&back[90_000..], &new[10_000..]);
    assert_eq!(std::fs::metadata(&path).expect("stat").len(), 150_000);
}

#[test]
fn system_errors_are_minus_one_with_errno() {
    let _s = Session::open();
    let (_dir, path) = file_with(&data(100, 4));
    let reader = File::open(&path).expect("open");
    let fh = register(reader.as_raw_fd()).expect("register");
    assert_eq!(write(fh, &data(10, 5), 0, 0), -1);
    assert_eq!(errno(), libc::EBADF);
    let writer = File::options().write(true).open(&path).expect("open");
    let wh = register(writer.as_raw_fd()).expect("register");
    let mut buf = vec![0u8; 10];
    assert_eq!(read(wh, &mut buf, 10, 0, 0), -1);
    assert_eq!(errno(), libc::EBADF);
}

fn io_params(
    fh: *mut c_void,
    write: bool,
    base: *mut u8,
    size: usize,
    file_offset: i64,
    buf_offset: i64,
    cookie: usize,
) -> CUfileIOParams_t {
    CUfileIOParams_t {
        mode: CUfileBatchMode_t::CUFILE_BATCH,
        u: CUfileIOParams__bindgen_ty_1 {
            batch: CUfileIOParams__bindgen_ty_1__bindgen_ty_1 {
                devPtr_base: base.cast(),
                file_offset,
                devPtr_offset: buf_offset,
                size,
            },
        },
        fh,
        opcode: if write {
            CUfileOpcode_t::CUFILE_WRITE
        } else {
            CUfileOpcode_t::CUFILE_READ
        },
        cookie: cookie as *mut c_void,
    }
}

fn collect(
    batch: *mut c_void,
    min_nr: c_uint,
    max: c_uint,
    timeout: Option<timespec>,
) -> Result<Vec<CUfileIOEvents_t>, RawError> {
    let mut events = Vec::with_capacity(max as usize);
    let mut nr = max;
    let mut t = timeout;
    let tp = t.as_mut().map_or(ptr::null_mut(), |t| t as *mut timespec);
    // SAFETY: `events` has room for `max` events; `nr` and `t` are valid locals.
    let status = unsafe { cuFileBatchIOGetStatus(batch, min_nr, &mut nr, events.as_mut_ptr(), tp) };
    if status != RawError::SUCCESS {
        return Err(status);
    }
    // SAFETY: the call wrote `nr` events.
    unsafe { events.set_len(nr as usize) };
    Ok(events)
}

#[test]
fn batch_reads_complete_with_their_cookies() {
    let _s = Session::open();
    let content = data(1 << 20, 6);
    let (_dir, path) = file_with(&content);
    let f = File::open(&path).expect("open");
    let fh = register(f.as_raw_fd()).expect("register");
    let mut batch = ptr::null_mut();
    // SAFETY: `batch` is writable.
    let result = unsafe { cuFileBatchIOSetUp(&mut batch, 4) };
    assert_eq!(result, RawError::SUCCESS);
    let mut buf = vec![0u8; 4 * 65_536];
    let ranges = [
        (0i64, 65_536usize),
        (300_000, 65_536),
        ((1 << 20) - 1000, 65_536),
        (2 << 20, 100),
    ];
    let mut params: Vec<CUfileIOParams_t> = ranges
        .iter()
        .enumerate()
        .map(|(i, &(off, size))| {
            io_params(
                fh,
                false,
                buf.as_mut_ptr(),
                size,
                off,
                (i * 65_536) as i64,
                100 + i,
            )
        })
        .collect();
    // SAFETY: four valid entries over `buf`, which outlives the batch.
    let result = unsafe { cuFileBatchIOSubmit(batch, 4, params.as_mut_ptr(), 0) };
    assert_eq!(result, RawError::SUCCESS);
    // Full: nothing collected yet.
    // SAFETY: as above.
    let result = unsafe { cuFileBatchIOSubmit(batch, 1, params.as_mut_ptr(), 0) };
    assert_eq!(result, err(E::CU_FILE_BATCH_FULL));
    let mut events = collect(batch, 4, 4, None).expect("status");
    events.sort_by_key(|e| e.cookie as usize);
    let got: Vec<(usize, CUfileStatus_t, usize)> = events
        .iter()
        .map(|e| (e.cookie as usize, e.status, e.ret))
        .collect();
    let ok = CUfileStatus_t::CUFILE_COMPLETE;
    assert_eq!(
        got,
        vec![
            (100, ok, 65_536),
            (101, ok, 65_536),
            (102, ok, 1000),
            (103, ok, 0)
        ]
    );
    assert_eq!(&buf[..65_536], &content[..65_536]);
    assert_eq!(&buf[65_536..131_072], &content[300_000..365_536]);
    assert_eq!(&buf[131_072..132_072], &content[(1 << 20) - 1000..]);
    // Collected: room again; nothing left, so a wait for more returns at once with none.
    assert!(collect(batch, 1, 4, None).expect("status").is_empty());
    // SAFETY: as above.
    let result = unsafe { cuFileBatchIOSubmit(batch, 2, params.as_mut_ptr(), 0) };
    assert_eq!(result, RawError::SUCCESS);
    let first = collect(
        batch,
        1,
        1,
        Some(timespec {
            tv_sec: 10,
            tv_nsec: 0,
        }),
    )
    .expect("status");
    assert_eq!(first.len(), 1);
    let rest = collect(
        batch,
        1,
        4,
        Some(timespec {
            tv_sec: 10,
            tv_nsec: 0,
        }),
    )
    .expect("status");
    assert_eq!(rest.len(), 1);
    assert_eq!(cuFileBatchIOCancel(batch), RawError::SUCCESS);
    cuFileBatchIODestroy(batch);
    assert!(matches!(collect(batch, 0, 4, None), Err(e) if e == err(E::CU_FILE_INVALID_VALUE)));
}

#[test]
fn batch_errors_and_failed_entries() {
    let _s = Session::open();
    let (_dir, path) = file_with(&data(4096, 7));
    let f = File::open(&path).expect("open");
    let fh = register(f.as_raw_fd()).expect("register");
    let mut batch = ptr::null_mut();
    // SAFETY: `batch` is writable.
    let result = unsafe { cuFileBatchIOSetUp(&mut batch, 0) };
    assert_eq!(result, err(E::CU_FILE_INVALID_VALUE));
    // SAFETY: as above.
    let result = unsafe { cuFileBatchIOSetUp(&mut batch, 129) };
    assert_eq!(result, err(E::CU_FILE_INVALID_VALUE));
    // SAFETY: as above.
    let result = unsafe { cuFileBatchIOSetUp(&mut batch, 2) };
    assert_eq!(result, RawError::SUCCESS);
    let mut buf = vec![0u8; 4096];
    // SAFETY: an unknown batch is refused before the entries are read.
    let result = unsafe { cuFileBatchIOSubmit(16 as *mut c_void, 1, ptr::null_mut(), 0) };
    assert_eq!(result, err(E::CU_FILE_INVALID_VALUE));
    // An unknown file handle in an entry: nothing is submitted.
    let mut bad = [
        io_params(fh, false, buf.as_mut_ptr(), 10, 0, 0, 1),
        io_params(0x999 as *mut c_void, false, buf.as_mut_ptr(), 10, 0, 0, 2),
    ];
    // SAFETY: two valid entries.
    let result = unsafe { cuFileBatchIOSubmit(batch, 2, bad.as_mut_ptr(), 0) };
    assert_eq!(result, err(E::CU_FILE_HANDLE_NOT_REGISTERED));
    assert!(collect(batch, 0, 2, None).expect("status").is_empty());
    // A write through a read-only descriptor fails in its event (ret: -1 as ssize_t).
    let mut failing = [io_params(fh, true, buf.as_mut_ptr(), 10, 0, 0, 7)];
    // SAFETY: one valid entry.
    let result = unsafe { cuFileBatchIOSubmit(batch, 1, failing.as_mut_ptr(), 0) };
    assert_eq!(result, RawError::SUCCESS);
    let events = collect(batch, 1, 2, None).expect("status");
    assert_eq!(events.len(), 1);
    assert_eq!(
        (
            events[0].cookie as usize,
            events[0].status,
            events[0].ret as isize
        ),
        (7, CUfileStatus_t::CUFILE_FAILED, -1)
    );
    // More events asked for at least than room given: refused.
    assert!(matches!(collect(batch, 3, 2, None), Err(e) if e == err(E::CU_FILE_INVALID_VALUE)));
    cuFileBatchIODestroy(batch);
    assert_eq!(cuFileBatchIOCancel(batch), err(E::CU_FILE_INVALID_VALUE));
}

#[test]
fn async_calls_complete_and_streams_keep_flags() {
    let _s = Session::open();
    let content = data(10_000, 8);
    let (_dir, path) = file_with(&content);
    let f = File::options()
        .read(true)
        .write(true)
        .open(&path)
        .expect("open");
    let fh = register(f.as_raw_fd()).expect("register");
    let stream = 0x5000 as cudarc::cufile::sys::CUstream;
    assert_eq!(
        cuFileStreamRegister(stream, 16),
        err(E::CU_FILE_INVALID_VALUE)
    );
    assert_eq!(cuFileStreamRegister(stream, 15), RawError::SUCCESS);
    assert_eq!(state::lock().streams.get(&0x5000), Some(&15));
    assert_eq!(cuFileStreamDeregister(stream), RawError::SUCCESS);
    assert_eq!(
        cuFileStreamDeregister(stream),
        err(E::CU_FILE_INVALID_VALUE)
    );
    if memory::cuda_available() {
        return; // a real stream is needed from here: covered by the GPU tests
    }
    // Without a CUDA driver the transfer happens at once (no stream to order it on).
    let mut buf = vec![0u8; 8000];
    let (mut size, mut file_offset, mut buf_offset, mut done) =
        (6000usize, 5000i64, 100i64, 0isize);
    // SAFETY: every pointer is a valid local; the range is inside `buf`.
    let status = unsafe {
        cuFileReadAsync(
            fh,
            buf.as_mut_ptr().cast(),
            &mut size,
            &mut file_offset,
            &mut buf_offset,
            &mut done,
            ptr::null_mut(),
        )
    };
    assert_eq!(status, RawError::SUCCESS);
    assert_eq!(done, 5000, "short at end of file");
    assert_eq!(&buf[100..5100], &content[5000..]);
    let (mut size, mut file_offset, mut buf_offset) = (50usize, 20_000i64, 0i64);
    // SAFETY: as above.
    let status = unsafe {
        cuFileWriteAsync(
            fh,
            buf.as_mut_ptr().cast(),
            &mut size,
            &mut file_offset,
            &mut buf_offset,
            &mut done,
            ptr::null_mut(),
        )
    };
    assert_eq!(status, RawError::SUCCESS);
    assert_eq!(done, 50);
    assert_eq!(std::fs::metadata(&path).expect("stat").len(), 20_050);
    // SAFETY: null parameter pointers are refused before use.
    let status = unsafe {
        cuFileReadAsync(
            fh,
            buf.as_mut_ptr().cast(),
            ptr::null_mut(),
            &mut file_offset,
            &mut buf_offset,
            &mut done,
            ptr::null_mut(),
        )
    };
    assert_eq!(status, err(E::CU_FILE_INVALID_VALUE));
    // SAFETY: as above; the handle is checked first.
    let status = unsafe {
        cuFileReadAsync(
            ptr::null_mut(),
            buf.as_mut_ptr().cast(),
            &mut size,
            &mut file_offset,
            &mut buf_offset,
            &mut done,
            ptr::null_mut(),
        )
    };
    assert_eq!(status, err(E::CU_FILE_HANDLE_NOT_REGISTERED));
}
