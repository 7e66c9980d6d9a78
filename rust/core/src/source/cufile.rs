//! The cuFile source (GPUDirect Storage): a local file registered with cuFile, chosen at
//! open by kvikio's `compat_mode` rule. Device transfers of at least `gds_threshold`
//! bytes move their page-aligned middle with `cuFileRead`/`cuFileWrite` and their edges
//! through the bounce ring; host memory, small transfers and edges go through the POSIX
//! file kept inside. Stream-ordered transfers use `cuFileReadAsync`/`cuFileWriteAsync`,
//! and device batches cuFile's batch API.

use std::ffi::c_void;
use std::os::fd::RawFd;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use cudarc::cufile::sys as cf;

use super::posix::PosixFile;
use super::{Direct, Keepalive, Ordered, Source, Target};
use crate::cuda::{self, Lane};
use crate::cufile::{self as driver, InFlight, RawEvent};
use crate::error::{Error, Result};
use crate::future::{run_caught, IoFuture};
use crate::settings::{CompatMode, Settings};
use crate::span::{DeviceSpan, HostSpan};
use crate::tasks::aligned_split;
use crate::vocab::Direction;
use crate::vocab::OpenFlags;

/// cuFile moves whole pages: the middle of a transfer between the first and last page
/// boundary goes through it, the edges through the bounce ring.
const PAGE: usize = 4096;
/// Requests per cuFile batch (cuFile's default `max_batch_io_size`).
const BATCH_MAX: usize = 128;
/// How long one batch may run before it is reported as stuck.
const BATCH_TIMEOUT: Duration = Duration::from_secs(600);

/// kvikio's decision: `ON` declines, `OFF` opens through cuFile or fails with cuFile's
/// message, `AUTO` opens through cuFile where the system allows it and the file
/// registers, and declines (POSIX takes the file) otherwise. Each outcome leaves its
/// reason in the target's notes.
pub fn open(target: &Target<'_>) -> Option<Result<Arc<dyn Source>>> {
    let mode = match target.compat_mode {
        CompatMode::On => {
            target.note("compat_mode is ON".into());
            return None;
        }
        CompatMode::Off => "compat_mode is OFF",
        CompatMode::Auto => "compat_mode is AUTO",
    };
    let auto = target.compat_mode == CompatMode::Auto;
    if auto {
        if let Some(why) = driver::system_refusal() {
            target.note(format!("{mode} and cuFile is not usable here: {why}"));
            return None;
        }
    }
    // The library and driver first: a file opened "w" is not truncated for nothing.
    if let Err(e) = driver::contained(|| driver::ready().map(|_| ())) {
        return refuse(target, mode, &e);
    }
    let posix = match PosixFile::open(target.path, target.flags) {
        Ok(posix) => posix,
        Err(e) => return Some(Err(e)),
    };
    match driver::contained(|| register(&posix)) {
        Ok(handle) => {
            let library = driver::api().map(|a| a.standin.is_some()).unwrap_or(false);
            let through = if library {
                " (the test stand-in library)"
            } else {
                ""
            };
            target.note(format!(
                "{mode} and the file is registered with cuFile{through}"
            ));
            Some(Ok(Arc::new(CuFileSource { posix, handle })))
        }
        Err(e) => refuse(target, mode, &e),
    }
}

/// AUTO declines with the reason; OFF fails with cuFile's message.
fn refuse(target: &Target<'_>, mode: &str, e: &Error) -> Option<Result<Arc<dyn Source>>> {
    if target.compat_mode == CompatMode::Auto {
        target.note(format!("{mode} and cuFile refused the file: {}", cause(e)));
        return None;
    }
    Some(Err(Error::CuFile(format!(
        "compat_mode is OFF, so '{}' must go through cuFile (GPUDirect Storage), but {}; \
         set compat_mode to AUTO to use POSIX where cuFile cannot be used, or ON to always \
         use POSIX",
        target.path.display(),
        cause(e)
    ))))
}

fn cause(e: &Error) -> String {
    match e {
        Error::CuFile(m) => m.clone(),
        other => other.to_string(),
    }
}

/// Register the file's O_DIRECT descriptor (cuFile's direct path needs it), or its
/// buffered one where the file system refuses O_DIRECT.
fn register(posix: &PosixFile) -> Result<usize> {
    let fd = posix.direct_fd().unwrap_or_else(|| posix.buffered_fd());
    driver::register_handle(fd)
}

/// A file registered with cuFile, with its POSIX descriptors for everything cuFile does
/// not move.
#[derive(Debug)]
pub struct CuFileSource {
    posix: PosixFile,
    /// The `CUfileHandle_t`.
    handle: usize,
}

impl Drop for CuFileSource {
    fn drop(&mut self) {
        // Before the descriptors close (fields drop after this).
        driver::deregister_handle(self.handle);
    }
}

impl CuFileSource {
    fn cu_handle(&self) -> cf::CUfileHandle_t {
        self.handle as cf::CUfileHandle_t
    }

    fn failure(&self, call: &str, n: isize, offset: u64) -> Error {
        if n == -1 {
            let e = std::io::Error::last_os_error();
            return Error::os(
                if call == "cuFileRead" {
                    "cuFileRead"
                } else {
                    "cuFileWrite"
                },
                self.path(),
                e,
            );
        }
        Error::CuFile(format!(
            "{call} of '{}' at offset {offset} failed: {}",
            self.path().display(),
            driver::message(n.unsigned_abs() as u32)
        ))
    }

    /// Move all of `span` at `offset` with `cuFileRead`/`cuFileWrite`, summing short
    /// counts; a read stops early only at the end of the file.
    fn direct(&self, direction: Direction, span: DeviceSpan, offset: u64) -> Result<usize> {
        let api = driver::ready()?;
        let _call = InFlight::begin()?;
        let (call, rw) = match direction {
            Direction::Read => ("cuFileRead", api.read),
            Direction::Write => ("cuFileWrite", api.write),
        };
        let mut done = 0usize;
        while done < span.len {
            let at = offset + done as u64;
            // SAFETY: `span` is live device memory of the bound context for `span.len`
            // bytes; cuFile reads or writes `span.len - done` bytes from `done` on.
            let n = unsafe {
                rw(
                    self.cu_handle(),
                    span.ptr as *mut c_void,
                    span.len - done,
                    at as i64,
                    done as i64,
                )
            };
            if n < 0 {
                return Err(self.failure(call, n, at));
            }
            if n == 0 {
                if direction == Direction::Write {
                    return Err(Error::CuFile(format!(
                        "cuFileWrite of '{}' at offset {at} wrote nothing",
                        self.path().display()
                    )));
                }
                break; // end of file
            }
            done += n as usize;
        }
        Ok(done)
    }

    /// One batch of at most [`BATCH_MAX`] reads; each read's count or error.
    fn batch_once(
        &self,
        api: &driver::Api,
        reads: &[(u64, DeviceSpan)],
    ) -> Result<Vec<Result<usize>>> {
        let Some((setup, submit, status, destroy)) = api.batch else {
            return Err(Error::CuFile("libcufile has no batch API".into()));
        };
        let mut handle: cf::CUfileBatchHandle_t = std::ptr::null_mut();
        // SAFETY: `handle` is a valid out-pointer.
        driver::check("cuFileBatchIOSetUp", unsafe {
            setup(&mut handle, reads.len() as u32)
        })?;
        let mut params: Vec<cf::CUfileIOParams> = reads
            .iter()
            .enumerate()
            .map(|(i, (offset, span))| cf::CUfileIOParams {
                mode: cf::CUfileBatchMode_t::CUFILE_BATCH,
                u: cf::CUfileIOParams__bindgen_ty_1 {
                    batch: cf::CUfileIOParams__bindgen_ty_1__bindgen_ty_1 {
                        devPtr_base: span.ptr as *mut c_void,
                        file_offset: *offset as i64,
                        devPtr_offset: 0,
                        size: span.len,
                    },
                },
                fh: self.cu_handle(),
                opcode: cf::CUfileOpcode_t::CUFILE_READ,
                cookie: i as *mut c_void,
            })
            .collect();
        let mut results: Vec<Option<Result<usize>>> = vec![None; reads.len()];
        let outcome = (|| -> Result<()> {
            // SAFETY: `handle` is live; `params` stays alive until the batch is destroyed
            // below, after every request has completed or failed.
            driver::check("cuFileBatchIOSubmit", unsafe {
                submit(handle, params.len() as u32, params.as_mut_ptr(), 0)
            })?;
            let mut events = vec![
                RawEvent {
                    cookie: std::ptr::null_mut(),
                    status: 0,
                    ret: 0,
                };
                reads.len()
            ];
            let mut left = reads.len();
            let deadline = Instant::now() + BATCH_TIMEOUT;
            while left > 0 {
                let mut nr = left as u32;
                let mut timeout = libc::timespec {
                    tv_sec: 1,
                    tv_nsec: 0,
                };
                // SAFETY: `events` has room for `nr` entries; all pointers are valid.
                driver::check("cuFileBatchIOGetStatus", unsafe {
                    status(handle, 1, &mut nr, events.as_mut_ptr(), &mut timeout)
                })?;
                for ev in &events[..(nr as usize).min(events.len())] {
                    let i = ev.cookie as usize;
                    let Some(slot) = results.get_mut(i) else {
                        continue;
                    };
                    let (offset, span) = reads[i];
                    let done = match ev.status {
                        s if s == cf::CUfileStatus_t::CUFILE_COMPLETE as u32 => Ok(ev.ret),
                        s if s == cf::CUfileStatus_t::CUFILE_FAILED as u32
                            || s == cf::CUfileStatus_t::CUFILE_CANCELED as u32
                            || s == cf::CUfileStatus_t::CUFILE_INVALID as u32
                            || s == cf::CUfileStatus_t::CUFILE_TIMEOUT as u32 =>
                        {
                            Err(Error::CuFile(format!(
                                "cuFile batch read of {} bytes at offset {offset} of '{}' \
                                 failed (status {s}, result {})",
                                span.len,
                                self.path().display(),
                                ev.ret as isize
                            )))
                        }
                        _ => continue, // still waiting or pending
                    };
                    if slot.is_none() {
                        left -= 1;
                    }
                    *slot = Some(done);
                }
                if left > 0 && Instant::now() > deadline {
                    return Err(Error::CuFile(format!(
                        "cuFile batch of '{}' did not complete in {} s",
                        self.path().display(),
                        BATCH_TIMEOUT.as_secs()
                    )));
                }
            }
            Ok(())
        })();
        // SAFETY: created above, destroyed once; no request of it is still running
        // unless it timed out, where cuFile cancels it on destroy.
        unsafe { destroy(handle) };
        drop(params);
        outcome?;
        Ok(results
            .into_iter()
            .map(|r| r.unwrap_or_else(|| Err(Error::CuFile("lost batch result".into()))))
            .collect())
    }
}

impl Source for CuFileSource {
    fn name(&self) -> &'static str {
        "cufile"
    }

    fn path(&self) -> &Path {
        self.posix.path()
    }

    fn flags(&self) -> OpenFlags {
        self.posix.flags()
    }

    fn size(&self) -> Result<u64> {
        self.posix.size()
    }

    fn zero_size_is_empty(&self) -> bool {
        self.posix.zero_size_is_empty()
    }

    fn special_kind(&self) -> Result<Option<&'static str>> {
        self.posix.special_kind()
    }

    fn read_host(&self, span: HostSpan, offset: u64, settings: &Settings) -> Result<usize> {
        self.posix.read_host(span, offset, settings)
    }

    fn write_host(&self, span: HostSpan, offset: u64, settings: &Settings) -> Result<usize> {
        self.posix.write_host(span, offset, settings)
    }

    fn descriptor(&self) -> Option<RawFd> {
        self.posix.descriptor()
    }

    fn status_flags(&self) -> Result<i32> {
        self.posix.status_flags()
    }

    fn direct_io_supported(&self) -> bool {
        self.posix.direct_io_supported()
    }

    fn device_direct(
        &self,
        direction: Direction,
        span: DeviceSpan,
        offset: u64,
        settings: &Settings,
        _lane: Lane<'_>,
    ) -> Result<Direct> {
        if span.len < settings.gds_threshold.max(1) {
            return Ok(Direct::NotUsed);
        }
        let split = aligned_split(offset, span.len, PAGE);
        if split.middle == 0 {
            return Ok(Direct::NotUsed);
        }
        if split.head == 0 && split.tail == 0 {
            return Ok(Direct::Complete(
                self.device_aligned(direction, span, offset)?,
            ));
        }
        // The unaligned edges go back to the device pipeline (the bounce ring, over the
        // POSIX reads and writes this source delegates to).
        Ok(Direct::Edges {
            head: split.head,
            middle: split.middle,
        })
    }

    fn device_aligned(&self, direction: Direction, span: DeviceSpan, offset: u64) -> Result<usize> {
        driver::contained(|| self.direct(direction, span, offset))
    }

    fn stream_ordered(
        &self,
        ordered: &Ordered,
        settings: &Settings,
        keepalive: Keepalive,
    ) -> std::result::Result<Result<IoFuture>, Keepalive> {
        let Ok(api) = driver::ready() else {
            return Err(keepalive);
        };
        let rw = match ordered.direction {
            Direction::Read => api.read_async,
            Direction::Write => api.write_async,
        };
        let (Some(rw), Some(_)) = (rw, api.stream_register) else {
            return Err(keepalive); // a libcufile before 1.6: the engine's own path
        };
        Ok(driver::contained(|| {
            self.start_async(rw, ordered, settings, keepalive)
        }))
    }

    fn device_batch(
        &self,
        reads: &[(u64, DeviceSpan)],
        _settings: &Settings,
    ) -> Option<Result<Vec<Result<usize>>>> {
        let api = driver::ready().ok()?;
        api.batch?;
        let ordinal = reads.first()?.1.ordinal;
        Some(driver::contained(|| {
            let _context = cuda::bind(ordinal)?;
            let _call = InFlight::begin()?;
            let mut out = Vec::with_capacity(reads.len());
            for chunk in reads.chunks(BATCH_MAX) {
                out.extend(self.batch_once(api, chunk)?);
            }
            Ok(out)
        }))
    }
}

/// The parameters of one `cuFile*Async` call, which cuFile reads when the stream reaches
/// the call and writes the count into: kept at a fixed address until completion.
struct AsyncParams {
    size: usize,
    file_offset: i64,
    dev_offset: i64,
    bytes: isize,
}

// SAFETY: the raw handle and the heap parameters are only touched by cuFile (through the
// stream) and by the one task that owns them after completion.
unsafe impl Send for AsyncParams {}

impl CuFileSource {
    /// Queue `cuFileReadAsync`/`cuFileWriteAsync` on the stream (registering the stream
    /// with cuFile first where kvikpy has not), then a marker after it; a pool task waits
    /// for the marker and reports the count. The caller never blocks.
    fn start_async(
        &self,
        rw: driver::RwAsync,
        ordered: &Ordered,
        settings: &Settings,
        keepalive: Keepalive,
    ) -> Result<IoFuture> {
        let span = ordered.span;
        let stream = ordered.stream;
        let call = InFlight::begin()?;
        let context = cuda::bind(span.ordinal)?;
        if !driver::stream_known(stream.as_raw()) {
            // A stream the user registered already is accepted; any other refusal shows
            // up in the async call itself.
            let _ = driver::register_stream_raw(stream.as_raw(), 0);
        }
        let mut params = Box::new(AsyncParams {
            size: span.len,
            file_offset: ordered.file_offset as i64,
            dev_offset: 0,
            bytes: 0,
        });
        let name = match ordered.direction {
            Direction::Read => "cuFileReadAsync",
            Direction::Write => "cuFileWriteAsync",
        };
        let p = &mut *params;
        let (size, file_offset, dev_offset, bytes): (*mut usize, *mut i64, *mut i64, *mut isize) = (
            &mut p.size,
            &mut p.file_offset,
            &mut p.dev_offset,
            &mut p.bytes,
        );
        // SAFETY: the parameters live on the heap until the task below has seen the
        // stream pass the call; `span` is live device memory kept by `keepalive`.
        let status = unsafe {
            rw(
                self.cu_handle(),
                span.ptr as *mut c_void,
                size,
                file_offset,
                dev_offset,
                bytes,
                stream.as_raw() as *mut c_void,
            )
        };
        driver::check(name, status)?;
        let marker = match cuda::Counter::acquire(span.ordinal)? {
            Some(counter) => {
                counter.enqueue_write(&context, stream, 1)?;
                Marker::Counter(counter)
            }
            None => Marker::Event(cuda::StreamEvent::record(span.ordinal, stream)?),
        };
        drop(context);
        let path = self.path().to_path_buf();
        let offset = ordered.file_offset;
        let job = move || -> Result<usize> {
            match &marker {
                Marker::Counter(counter) => counter.wait_for(1),
                Marker::Event(event) => event.synchronize()?,
            }
            let n = params.bytes;
            drop(call);
            if n < 0 {
                return Err(Error::CuFile(format!(
                    "{name} of '{}' at offset {offset} failed: {}",
                    path.display(),
                    driver::message(n.unsigned_abs() as u32)
                )));
            }
            Ok(n as usize)
        };
        let pool = crate::pool::pool_for(settings, Some(span.ordinal))?;
        let (future, reporter) = IoFuture::single(keepalive);
        pool.spawn(move || reporter.report(run_caught(job)));
        Ok(future)
    }
}

/// What a stream-ordered cuFile call's task waits on.
enum Marker {
    /// A host counter the stream writes (no driver call while waiting).
    Counter(cuda::Counter),
    /// An event, where the device cannot write host counters.
    Event(cuda::StreamEvent),
}
