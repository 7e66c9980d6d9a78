//! The one request path: a [`Request`] (direction, span, offset, task size, what keeps the
//! memory alive) and the one function that completes it, [`submit`], which decides from
//! one settings snapshot whether it runs inline, on the pool, on the pool with the caller
//! helping, or ordered on a CUDA stream.

use std::sync::Arc;

use crate::cancel::{self, CancelToken};
use crate::cuda::Stream;
use crate::device_io::submit_stream_ordered;
use crate::error::{Error, Result};
use crate::file::FileHandle;
use crate::future::{run_caught, IoFuture};
use crate::settings::Settings;
use crate::source::{truncated, Keepalive, Ordered, Source};
use crate::span::Span;
use crate::tasks::{align_up, split_tasks, Task, DIRECT_IO_ALIGNMENT};
pub use crate::vocab::Direction;

mod batch;
pub use batch::{submit_batch, BatchRequest, Item, ItemSource};

/// One read or write of a file.
pub struct Request {
    /// Which way the bytes move.
    pub direction: Direction,
    /// The memory read into or written from (host or device).
    pub span: Span,
    /// Where in the file the transfer starts.
    pub file_offset: u64,
    /// The most bytes one pool task moves, and the split a named size gets; `None` for
    /// the `task_size` setting, which a lone request may cut finer to spread over the
    /// pool (see [`request_task_size`]).
    pub task_size: Option<usize>,
    /// Reads only: the span must be filled. A read that reaches the end of the file first
    /// fails with [`Error::Truncated`] (the file shrank after it was sized) instead of
    /// returning a short count.
    pub exact: bool,
    /// Kept alive until the last task has finished (the Python buffer export the span
    /// points into).
    pub keepalive: Keepalive,
}

impl Request {
    /// A read of `span.len()` bytes at `file_offset` into `span`.
    pub fn read(span: Span, file_offset: u64) -> Self {
        Self::new(Direction::Read, span, file_offset)
    }

    /// A write of all of `span` at `file_offset`.
    pub fn write(span: Span, file_offset: u64) -> Self {
        Self::new(Direction::Write, span, file_offset)
    }

    /// A request in `direction` with the default task size, not exact, keeping nothing
    /// alive.
    pub fn new(direction: Direction, span: Span, file_offset: u64) -> Self {
        Self {
            direction,
            span,
            file_offset,
            task_size: None,
            exact: false,
            keepalive: None,
        }
    }
}

/// How the caller wants a request completed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Completion {
    /// A future at once (`pread`/`pwrite`): pooled tasks all go to the pool.
    Future,
    /// The caller waits at once (blocking `read`/`write`). A request of one task runs in
    /// the calling thread (no pool hop, and for a read no `fstat`: one that reaches the
    /// end of the file comes back short); a pooled one queues all tasks but the first and
    /// runs the first itself, so the caller works instead of sleeping, and a request cut
    /// finer only to spread it over the pool (see [`spread_task_size`]) pays for one
    /// thread wake-up less. The returned future is then complete or nearly so.
    Blocking,
    /// One task covering the whole request, in the calling thread, never split
    /// (kvikio's `raw_read`/`raw_write`).
    Whole,
    /// Ordered on a CUDA stream (device memory only; kvikio's `raw_*_async`): the
    /// transfer starts after the work queued on the stream so far, work queued after it
    /// sees its bytes, and the call returns at once.
    StreamOrdered(Stream),
}

/// Smallest task a request is cut into to spread it over the pool's threads. Waking idle
/// pool threads is slow on the virtual machines measured: a lone 1 MiB read cut into four
/// 256 KiB tasks took 4x longer than one inline task when the pool was asleep (though
/// 1.4x less in a tight loop), so requests under 2 MiB stay whole.
pub(crate) const MIN_SPREAD_TASK: usize = 1 << 20;
/// Spread tasks are whole multiples of this (keeps their file offsets O_DIRECT-aligned).
const SPREAD_GRAIN: usize = 64 << 10;

/// The task size a request of `size` bytes is split with: `task_size`, or less when that
/// would leave threads idle. A 4 MiB read with 4 MiB tasks would otherwise be one task,
/// one thread's `pread` (about 7.5 GB/s on the H100 machine) while 15 threads wait; cut
/// into 1 MiB tasks it is read by four. Never below [`MIN_SPREAD_TASK`], never above
/// `task_size`, and unchanged when `task_size` is not a multiple of 4 KiB (its split
/// is then the caller's exact choice).
pub(crate) fn spread_task_size(size: usize, task_size: usize, threads: usize) -> usize {
    if threads <= 1 || task_size % DIRECT_IO_ALIGNMENT != 0 || size < 2 * MIN_SPREAD_TASK {
        return task_size;
    }
    let share = align_up(size.div_ceil(threads) as u64, SPREAD_GRAIN) as usize;
    share.max(MIN_SPREAD_TASK).min(task_size)
}

/// The task size a request of `size` bytes is split with: a `task_size` the caller
/// `named` is the split it gets (kvikio's meaning: a caller writing many pieces at once,
/// as a checkpoint save does, keeps whole tasks of the size it chose), while the
/// setting's may be cut finer to spread a lone request over the pool
/// ([`spread_task_size`]); either is raised past [`MAX_TASKS`] tasks
/// ([`bounded_task_size`]).
pub(crate) fn request_task_size(
    size: usize,
    task_size: usize,
    named: bool,
    threads: usize,
) -> usize {
    let spread = if named {
        task_size
    } else {
        spread_task_size(size, task_size, threads)
    };
    bounded_task_size(size, spread)
}

/// The most tasks one request is split into. Beyond it (256 GiB at 4 MiB tasks) tasks
/// grow instead, so that a request's bookkeeping (tasks, reporters, pool jobs) stays a
/// few megabytes whatever size a buffer claims.
pub(crate) const MAX_TASKS: usize = 1 << 16;

/// `task_size`, raised (to a multiple of 4 KiB) where `size` would need more than
/// [`MAX_TASKS`] tasks of it.
pub(crate) fn bounded_task_size(size: usize, task_size: usize) -> usize {
    if size.div_ceil(task_size) < MAX_TASKS {
        return task_size;
    }
    align_up(size.div_ceil(MAX_TASKS - 1) as u64, DIRECT_IO_ALIGNMENT) as usize
}

fn resolve_task_size(task_size: Option<usize>, settings: &Settings) -> Result<usize> {
    match task_size {
        Some(0) => Err(Error::InvalidArgument(
            "task_size must be a positive number of bytes, got 0".into(),
        )),
        Some(n) => Ok(n),
        None => Ok(settings.task_size),
    }
}

fn check_end(file_offset: u64, size: usize) -> Result<()> {
    file_offset
        .checked_add(size as u64)
        .map(|_| ())
        .ok_or_else(|| {
            Error::InvalidArgument(format!(
                "file_offset {file_offset} + size {size} overflows a 64-bit file offset"
            ))
        })
}

/// Start (or run) `request` on the file of `handle`, completed as `completion` asks,
/// under the settings snapshot `settings` (taken once by the caller).
///
/// Reads stop at end of file: the future's count is then short (0 for a read that
/// starts at or past the end), unless the request is [`Request::exact`]. Requests of at
/// most `gds_threshold` bytes run in the calling thread (the hop to the pool would cost
/// more than the I/O).
pub fn submit(
    settings: &Settings,
    handle: &FileHandle,
    request: Request,
    completion: Completion,
) -> Result<IoFuture> {
    let source = handle.get()?;
    source.check_access(request.direction)?;
    // A source that can stall (a remote file) never runs a task in the calling thread:
    // its tasks go to the pool, watching a cancel token, and the caller waits on the
    // future, which it can interrupt (see `pooled`).
    let stalls = source.may_stall();
    let task_size = resolve_task_size(request.task_size, settings)?;
    let named = request.task_size.is_some();
    let split_size =
        |size: usize, threads: usize| request_task_size(size, task_size, named, threads);
    let job = Job {
        source,
        direction: request.direction,
        span: request.span,
        exact: request.exact,
        settings: settings.clone(),
    };
    let offset = request.file_offset;
    let keepalive = request.keepalive;
    match completion {
        Completion::Whole => {
            check_end(offset, job.span.len())?;
            let whole = Task {
                file_offset: offset,
                buf_offset: 0,
                len: job.span.len(),
            };
            if stalls {
                return pooled(settings, job, vec![whole], keepalive);
            }
            return Ok(IoFuture::ready(job.run(whole), keepalive));
        }
        Completion::StreamOrdered(stream) => {
            let Span::Device(span) = job.span else {
                return Err(Error::InvalidArgument(
                    "a stream-ordered transfer needs device memory".into(),
                ));
            };
            let span = match job.direction {
                Direction::Read => span.sub(0, job.available(offset, span.len)?),
                Direction::Write => span,
            };
            let ordered = Ordered {
                source: job.source,
                direction: job.direction,
                span,
                file_offset: offset,
                stream,
            };
            return submit_stream_ordered(ordered, settings, keepalive);
        }
        Completion::Blocking => {
            // One task: run it here, without sizing the file first.
            let threads = crate::pool::threads_for(settings, job.span.ordinal());
            let spread = split_size(job.span.len(), threads);
            let mut tasks = split_tasks(offset, job.span.len(), spread);
            if let (Some(task), None, false) = (tasks.next(), tasks.clone().next(), stalls) {
                check_end(offset, job.span.len())?;
                return Ok(IoFuture::ready(job.run(task), keepalive));
            }
        }
        Completion::Future => {}
    }
    let size = match job.direction {
        Direction::Read => job.available(offset, job.span.len())?,
        Direction::Write => job.span.len(),
    };
    check_end(offset, size)?;
    let spread = split_size(size, crate::pool::threads_for(settings, job.span.ordinal()));
    let tasks: Vec<Task> = split_tasks(offset, size, spread).collect();
    if job.direction == Direction::Write && tasks.len() > 1 && settings.write_preallocate {
        job.source.prepare_write(offset, size as u64, settings);
    }
    if stalls {
        return pooled(settings, job, tasks, keepalive);
    }
    if size <= settings.gds_threshold {
        let result = tasks
            .iter()
            .try_fold(0usize, |total, &task| Ok(total + job.run(task)?));
        return Ok(IoFuture::ready(result, keepalive));
    }
    let pool = crate::pool::pool_for(settings, job.span.ordinal())?;
    let (future, reporters) = IoFuture::new(tasks.len(), keepalive);
    let job = Arc::new(job);
    let mut jobs = tasks.into_iter().zip(reporters);
    let first = match completion {
        Completion::Blocking => jobs.next(),
        _ => None,
    };
    for (task, reporter) in jobs {
        let job = Arc::clone(&job);
        pool.spawn(move || reporter.report(job.run(task)));
    }
    if let Some((task, reporter)) = first {
        reporter.report(job.run(task));
    }
    Ok(future)
}

/// Run `tasks` of a source that can stall on the pool, all watching one cancel token that
/// the future cancels ([`IoFuture::cancel`]: the caller was interrupted) and that the
/// first task to fail cancels too, so that the rest of the read stops instead of each
/// task waiting out its own timeouts: a stalled file fails in about one request's time
/// (its attempts and backoffs), whatever its number of tasks.
fn pooled(
    settings: &Settings,
    job: Job,
    tasks: Vec<Task>,
    keepalive: Keepalive,
) -> Result<IoFuture> {
    let pool = crate::pool::pool_for(settings, job.span.ordinal())?;
    let token = CancelToken::new();
    let (future, reporters) = IoFuture::cancellable(tasks.len(), keepalive, Some(token.clone()));
    let job = Arc::new(job);
    for (task, reporter) in tasks.into_iter().zip(reporters) {
        let (job, token) = (Arc::clone(&job), token.clone());
        pool.spawn(move || {
            let result = cancel::scope(&token, || job.run(task));
            let failed = result.is_err();
            // Report before cancelling, so that the future keeps this error rather than
            // a sibling's "cancelled".
            reporter.report(result);
            if failed {
                token.cancel();
            }
        });
    }
    Ok(future)
}

/// What every task of one request shares.
struct Job {
    source: Arc<dyn Source>,
    direction: Direction,
    span: Span,
    exact: bool,
    settings: Settings,
}

impl Job {
    /// Bytes of a read of `len` at `offset` that the file holds (all `len` for a local
    /// file reporting 0 bytes, which may be a device or a pseudo-file); an exact read must
    /// get them all.
    fn available(&self, offset: u64, len: usize) -> Result<usize> {
        let reported = self.source.size()?;
        if reported == 0 && !self.source.zero_size_is_empty() {
            // A device or a pseudo-file: as many as it gives, up to the span's end (each
            // task still stops where the source ends).
            return Ok(len);
        }
        let in_file = reported.saturating_sub(offset);
        let size = (len as u64).min(in_file) as usize;
        if self.exact && size < len {
            return Err(truncated(self.source.path(), offset, len, size));
        }
        Ok(size)
    }

    /// One task, to or from host or device memory; panics become errors.
    fn run(&self, task: Task) -> Result<usize> {
        run_caught(|| {
            let part = self.span.sub(task.buf_offset, task.len);
            let n = crate::device_io::transfer_span(
                &*self.source,
                self.direction,
                part,
                task.file_offset,
                &self.settings,
            )?;
            if self.exact && n < task.len {
                return Err(truncated(self.source.path(), task.file_offset, task.len, n));
            }
            Ok(n)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn a_request_never_needs_more_than_max_tasks(
            size in 0usize..(1 << 62),
            task_size in 1usize..(64 << 20),
            offset in 0u64..(1 << 40),
        ) {
            let task = bounded_task_size(size, task_size);
            prop_assert!(task >= task_size);
            // Requests that fit are split as before.
            if size.div_ceil(task_size) < MAX_TASKS {
                prop_assert_eq!(task, task_size);
            }
            // split_tasks adds at most one task for its alignment anchor.
            let count = split_tasks(offset, size, task).count();
            prop_assert!(count <= MAX_TASKS, "{} tasks of {}", count, task);
        }
    }

    proptest! {
        #[test]
        fn spread_task_size_bounds(
            size in 0usize..(1 << 34),
            task_pages in 1usize..8192,
            odd in proptest::bool::ANY,
            threads in 1usize..64,
        ) {
            let task_size = task_pages * DIRECT_IO_ALIGNMENT + usize::from(odd);
            let t = spread_task_size(size, task_size, threads);
            prop_assert!(t <= task_size);
            if t != task_size {
                // Spread: aligned, not tiny, and never more tasks than threads (+1 for
                // an unaligned start) or fewer than the plain split would give.
                prop_assert!(!odd && threads > 1);
                prop_assert_eq!(t % SPREAD_GRAIN, 0);
                prop_assert!(t >= MIN_SPREAD_TASK);
                let tasks = size.div_ceil(t);
                prop_assert!(tasks <= threads + 1 || t == MIN_SPREAD_TASK, "{} tasks", tasks);
                prop_assert!(tasks >= size.div_ceil(task_size));
            }
        }
    }

    #[test]
    fn a_named_task_size_is_the_split() {
        const MIB: usize = 1 << 20;
        // The setting's 4 MiB spreads a 4 MiB request over four threads; named, it is one
        // task, and a 16 MiB one four of 4 MiB.
        assert_eq!(request_task_size(4 * MIB, 4 * MIB, false, 16), MIB);
        assert_eq!(request_task_size(4 * MIB, 4 * MIB, true, 16), 4 * MIB);
        assert_eq!(request_task_size(16 * MIB, 4 * MIB, true, 16), 4 * MIB);
        // Named or not, a request past MAX_TASKS tasks gets larger ones.
        let huge = MAX_TASKS * 4096 * 2;
        assert!(request_task_size(huge, 4096, true, 16) > 4096);
    }

    #[test]
    fn spread_task_size_examples() {
        const MIB: usize = 1 << 20;
        // A 4 MiB read on 16 threads with 4 MiB tasks: four tasks of 1 MiB.
        assert_eq!(spread_task_size(4 * MIB, 4 * MIB, 16), MIB);
        // 1 MiB stays whole; 16 MiB on 16 threads: 1 MiB each; 64 MiB: 4 MiB each.
        assert_eq!(spread_task_size(MIB, 4 * MIB, 16), 4 * MIB);
        assert_eq!(spread_task_size(64 * MIB, 4 * MIB, 16), 4 * MIB);
        assert_eq!(spread_task_size(16 * MIB, 4 * MIB, 16), MIB);
        // Large reads keep the configured size; small ones and one thread are untouched.
        assert_eq!(spread_task_size(4096 * MIB, 4 * MIB, 16), 4 * MIB);
        assert_eq!(spread_task_size(64 << 10, 4 * MIB, 16), 4 * MIB);
        assert_eq!(spread_task_size(16 * MIB, 4 * MIB, 1), 4 * MIB);
        // A task size off the 4 KiB grid is the caller's exact choice.
        assert_eq!(spread_task_size(16 * MIB, 123_457, 16), 123_457);
    }
}
