//! Reads and writes of host memory: settings snapshot, EOF clamping, task splitting,
//! inline-or-pool dispatch, and opportunistic O_DIRECT for the aligned middle of each task.

use std::any::Any;
use std::io;
use std::sync::Arc;

use crate::bounce::host_pool;
use crate::error::{Error, Result};
use crate::file::{FileHandle, OpenFile};
use crate::future::{run_caught, IoFuture};
use crate::memory::{HostSpan, Span};
use crate::posix::{pread_direct, pread_full, pwrite_full};
use crate::settings::{self, Settings};
use crate::tasks::{align_down, align_up, aligned_split, split_tasks, DIRECT_IO_ALIGNMENT};

/// Which way bytes move.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// File to memory.
    Read,
    /// Memory to file.
    Write,
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

/// Smallest task a request is cut into to spread it over the pool's threads. Waking idle
/// pool threads is slow on the virtual machines measured: a lone 1 MiB read cut into four
/// 256 KiB tasks took 4x longer than one inline task when the pool was asleep (though
/// 1.4x less in a tight loop), so requests under 2 MiB stay whole.
pub const MIN_SPREAD_TASK: usize = 1 << 20;
/// Spread tasks are whole multiples of this (keeps their file offsets O_DIRECT-aligned).
const SPREAD_GRAIN: usize = 64 << 10;

/// The task size a request of `size` bytes is split with: `task_size`, or less when that
/// would leave threads idle. A 4 MiB read with 4 MiB tasks would otherwise be one task,
/// one thread's `pread` (about 7.5 GB/s on the H100 machine) while 15 threads wait; cut
/// into 1 MiB tasks it is read by four. Never below [`MIN_SPREAD_TASK`], never above
/// `task_size`, and unchanged when `task_size` is not a multiple of 4 KiB (its split
/// is then the caller's exact choice).
pub fn spread_task_size(size: usize, task_size: usize, threads: usize) -> usize {
    if threads <= 1 || task_size % DIRECT_IO_ALIGNMENT != 0 || size < 2 * MIN_SPREAD_TASK {
        return task_size;
    }
    let share = align_up(size.div_ceil(threads) as u64, SPREAD_GRAIN) as usize;
    share.max(MIN_SPREAD_TASK).min(task_size)
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

/// Start moving `span.len()` bytes between `span` and the file at `file_offset`.
///
/// Reads stop at end of file: the future's count is then short, and 0 for a read that
/// starts at or past the end. `keepalive` is held until the last task has finished.
/// Requests of at most `gds_threshold` bytes run in the calling thread (the hop to the
/// pool would cost more than the I/O); everything else runs on the pool. Blocking
/// callers use [`run_if_single_task`] first, then [`submit_with`] with [`Caller::Helps`].
pub fn submit(
    handle: &FileHandle,
    direction: Direction,
    span: Span,
    file_offset: u64,
    task_size: Option<usize>,
    keepalive: Option<Box<dyn Any + Send>>,
) -> Result<IoFuture> {
    let settings = settings::current()?;
    submit_with(
        &settings,
        handle,
        direction,
        span,
        file_offset,
        task_size,
        keepalive,
        Caller::Returns,
    )
}

/// Who runs a pooled request's first task.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Caller {
    /// The caller gets a future at once (`pread`/`pwrite`): every task goes to the pool.
    Returns,
    /// The caller waits for the result at once (blocking `read`/`write`): it queues all
    /// tasks but the first, then runs the first itself, so it works instead of sleeping,
    /// and a request cut finer only to spread it over the pool (see
    /// [`spread_task_size`]) pays for one thread wake-up less.
    Helps,
}

/// [`submit`] with an explicit settings snapshot instead of the process-wide settings,
/// and a choice of who runs the first task.
#[allow(clippy::too_many_arguments)]
pub fn submit_with(
    settings: &Settings,
    handle: &FileHandle,
    direction: Direction,
    span: Span,
    file_offset: u64,
    task_size: Option<usize>,
    keepalive: Option<Box<dyn Any + Send>>,
    caller: Caller,
) -> Result<IoFuture> {
    let settings = *settings;
    let task_size = resolve_task_size(task_size, &settings)?;
    let file = handle.get()?;
    let size = match direction {
        Direction::Read => {
            file.check_readable()?;
            let file_size = file.size()?;
            (span.len() as u64).min(file_size.saturating_sub(file_offset)) as usize
        }
        Direction::Write => {
            file.check_writable()?;
            span.len()
        }
    };
    check_end(file_offset, size)?;
    let task_size = spread_task_size(size, task_size, settings.num_threads);
    let tasks: Vec<_> = split_tasks(file_offset, size, task_size).collect();
    if size <= settings.gds_threshold {
        let result = run_caught(|| {
            tasks.iter().try_fold(0usize, |total, t| {
                let part = span.sub(t.buf_offset, t.len);
                Ok(total + run_task(&file, direction, part, t.file_offset, &settings)?)
            })
        });
        return Ok(IoFuture::ready(result, keepalive));
    }
    let pool = crate::pool::pool(settings.num_threads)?;
    let (future, reporters) = IoFuture::new(tasks.len(), keepalive);
    let mut jobs = tasks.into_iter().zip(reporters);
    let first = if caller == Caller::Helps {
        jobs.next()
    } else {
        None
    };
    for (task, reporter) in jobs {
        let file = Arc::clone(&file);
        let part = span.sub(task.buf_offset, task.len);
        pool.spawn(move || {
            let result =
                run_caught(|| run_task(&file, direction, part, task.file_offset, &settings));
            reporter.report(result);
        });
    }
    if let Some((task, reporter)) = first {
        let part = span.sub(task.buf_offset, task.len);
        let result = run_caught(|| run_task(&file, direction, part, task.file_offset, &settings));
        reporter.report(result);
    }
    Ok(future)
}

/// Run a blocking request in the calling thread if it is a single task, returning its byte
/// count; `None` when it needs the pool (then use [`submit`] and wait). This is the
/// small-request fast path: no future, no pool hop, no `fstat` (a read that reaches the
/// end of the file simply comes back short).
pub fn run_if_single_task(
    handle: &FileHandle,
    direction: Direction,
    span: Span,
    file_offset: u64,
    task_size: Option<usize>,
) -> Result<Option<usize>> {
    let settings = settings::current()?;
    run_if_single_task_with(&settings, handle, direction, span, file_offset, task_size)
}

/// [`run_if_single_task`] with an explicit settings snapshot.
pub fn run_if_single_task_with(
    settings: &Settings,
    handle: &FileHandle,
    direction: Direction,
    span: Span,
    file_offset: u64,
    task_size: Option<usize>,
) -> Result<Option<usize>> {
    let task_size = resolve_task_size(task_size, settings)?;
    let task_size = spread_task_size(span.len(), task_size, settings.num_threads);
    if split_tasks(file_offset, span.len(), task_size)
        .nth(1)
        .is_some()
    {
        return Ok(None);
    }
    run_whole_with(settings, handle, direction, span, file_offset).map(Some)
}

/// Run the whole request as one task in the calling thread (kvikio's `raw_read` and
/// `raw_write`: no pool, no splitting).
pub fn run_whole(
    handle: &FileHandle,
    direction: Direction,
    span: Span,
    file_offset: u64,
) -> Result<usize> {
    run_whole_with(&settings::current()?, handle, direction, span, file_offset)
}

fn run_whole_with(
    settings: &Settings,
    handle: &FileHandle,
    direction: Direction,
    span: Span,
    file_offset: u64,
) -> Result<usize> {
    let file = handle.get()?;
    match direction {
        Direction::Read => file.check_readable()?,
        Direction::Write => file.check_writable()?,
    }
    check_end(file_offset, span.len())?;
    run_task(&file, direction, span, file_offset, settings)
}

/// One task, to or from host or device memory.
fn run_task(
    file: &OpenFile,
    direction: Direction,
    span: Span,
    offset: u64,
    settings: &Settings,
) -> Result<usize> {
    match span {
        Span::Host(host) => transfer(file, direction, host, offset, settings),
        Span::Device(device) => {
            crate::device_io::transfer_device(file, direction, device, offset, settings)
        }
    }
}

/// One host task: the whole span through the page cache, or, when direct I/O is enabled
/// for this direction and the file has an O_DIRECT descriptor, the unaligned edges through
/// the page cache and the aligned middle through O_DIRECT.
pub(crate) fn transfer(
    file: &OpenFile,
    direction: Direction,
    span: HostSpan,
    offset: u64,
    settings: &Settings,
) -> Result<usize> {
    let wants_direct = match direction {
        Direction::Read => settings.auto_direct_io_read,
        Direction::Write => settings.auto_direct_io_write,
    };
    let mut split = aligned_split(offset, span.len(), DIRECT_IO_ALIGNMENT);
    // Only asked for when wanted: the O_DIRECT descriptor is opened on first use.
    let direct_fd = (wants_direct && split.middle > 0)
        .then(|| file.direct_fd())
        .flatten();
    let Some(direct_fd) = direct_fd else {
        return buffered(file, direction, span, offset);
    };
    if direction == Direction::Read {
        // An O_DIRECT read moves whole blocks: at the end of the file it may write the
        // block's zeros past the bytes it reports into the destination, which must stay
        // untouched past EOF. So only blocks wholly inside the file go through O_DIRECT;
        // the rest is read through the page cache, which stops exactly at EOF.
        let whole_blocks_end = align_down(file.size()?, DIRECT_IO_ALIGNMENT);
        let middle_start = offset + split.head as u64;
        let inside = whole_blocks_end.saturating_sub(middle_start) as usize;
        if inside < split.middle {
            split.tail += split.middle - inside;
            split.middle = inside;
        }
        if split.middle == 0 {
            return buffered(file, direction, span, offset);
        }
    }
    let parts = [
        (0, split.head, false),
        (split.head, split.middle, true),
        (split.head + split.middle, split.tail, false),
    ];
    let mut done = 0;
    for (at, len, direct) in parts {
        if len == 0 {
            continue;
        }
        let part = span.sub(at, len);
        let part_offset = offset + at as u64;
        let n = if direct {
            direct_part(file, direct_fd, direction, part, part_offset, settings)?
        } else {
            buffered(file, direction, part, part_offset)?
        };
        done += n;
        if n < len {
            break; // end of file
        }
    }
    Ok(done)
}

fn buffered(file: &OpenFile, direction: Direction, span: HostSpan, offset: u64) -> Result<usize> {
    let fd = file.buffered_fd();
    match direction {
        Direction::Read => pread_full(fd, span, offset).map_err(|e| os(file, "pread", e)),
        Direction::Write => pwrite_full(fd, span, offset).map_err(|e| os(file, "pwrite", e)),
    }
}

fn os(file: &OpenFile, op: &'static str, e: io::Error) -> Error {
    Error::os(op, file.path(), e)
}

/// The aligned middle of a task through O_DIRECT: straight into the user's memory when it
/// is aligned too, else staged through a pooled aligned bounce buffer. A filesystem that
/// opens O_DIRECT but rejects the transfer (EINVAL) falls back to the page cache.
fn direct_part(
    file: &OpenFile,
    fd: i32,
    direction: Direction,
    span: HostSpan,
    offset: u64,
    settings: &Settings,
) -> Result<usize> {
    let attempt = if span.as_ptr() as usize % DIRECT_IO_ALIGNMENT == 0 {
        match direction {
            Direction::Read => pread_direct(fd, span, offset, DIRECT_IO_ALIGNMENT),
            Direction::Write => pwrite_full(fd, span, offset),
        }
    } else {
        staged(fd, direction, span, offset, settings)?
    };
    match attempt {
        Ok(n) => Ok(n),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => buffered(file, direction, span, offset),
        Err(e) => Err(os(
            file,
            match direction {
                Direction::Read => "pread (O_DIRECT)",
                Direction::Write => "pwrite (O_DIRECT)",
            },
            e,
        )),
    }
}

/// O_DIRECT through a bounce buffer, one buffer-full at a time. The outer `Result` is the
/// engine's (no buffer could be had); the inner one is the system call's.
fn staged(
    fd: i32,
    direction: Direction,
    span: HostSpan,
    offset: u64,
    settings: &Settings,
) -> Result<io::Result<usize>> {
    // Always the configured size: the pool keeps one size, so varying it would free and
    // reallocate buffers on every call.
    let buffer_size = align_up(settings.bounce_buffer_size as u64, DIRECT_IO_ALIGNMENT) as usize;
    let chunk_size = buffer_size.min(span.len());
    let mut bounce = host_pool().acquire(buffer_size)?;
    let staging = HostSpan::from_slice(bounce.as_mut_slice());
    let mut done = 0usize;
    while done < span.len() {
        let len = chunk_size.min(span.len() - done);
        let dst = span.sub(done, len);
        let stage = staging.sub(0, len);
        let at = offset + done as u64;
        let n = match direction {
            Direction::Read => match pread_direct(fd, stage, at, DIRECT_IO_ALIGNMENT) {
                Ok(n) => {
                    copy(stage, dst, n);
                    n
                }
                Err(e) => return Ok(Err(e)),
            },
            Direction::Write => {
                copy(dst, stage, len);
                match pwrite_full(fd, stage, at) {
                    Ok(n) => n,
                    Err(e) => return Ok(Err(e)),
                }
            }
        };
        done += n;
        if n < len {
            break;
        }
    }
    Ok(Ok(done))
}

fn copy(from: HostSpan, to: HostSpan, len: usize) {
    assert!(len <= from.len() && len <= to.len());
    // SAFETY: both spans are valid for `len` bytes (checked above) and never overlap: one
    // is a pool-owned bounce buffer, the other user memory.
    unsafe { std::ptr::copy_nonoverlapping(from.as_ptr(), to.as_ptr(), len) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

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
