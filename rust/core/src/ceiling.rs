//! Reference measurements for benchmarks: how fast plain `pread` from native threads can
//! move a file into memory, the ceiling every kvikpy read is compared against.

use std::time::Instant;

use crate::bounce::{BounceAllocator, PageAlignedAllocator};
use crate::error::{Error, Result};
use crate::source::posix::{pread_direct, pread_full, PosixFile};
use crate::source::Source;
use crate::span::HostSpan;
use crate::tasks::{split_tasks, DIRECT_IO_ALIGNMENT};
use crate::vocab::OpenFlags;

/// Result of one ceiling run.
#[derive(Debug, Clone, Copy)]
pub struct Ceiling {
    /// Seconds from the first `pread` to the last byte.
    pub seconds: f64,
    /// Bytes read.
    pub bytes: u64,
    /// Sum of all bytes read (so callers can verify the data).
    pub byte_sum: u64,
}

/// Read all of `path` with `threads` native threads, each `pread`ing `piece`-byte pieces
/// (through the O_DIRECT descriptor when `direct`) into one page-aligned buffer of
/// `allocator`'s memory (pinned memory for the GPU ceilings).
pub fn pread_ceiling(
    path: &str,
    threads: usize,
    piece: usize,
    direct: bool,
    allocator: &dyn BounceAllocator,
) -> Result<Ceiling> {
    if threads == 0 || piece == 0 || (direct && piece % DIRECT_IO_ALIGNMENT != 0) {
        return Err(Error::InvalidArgument(format!(
            "need threads > 0 and piece > 0 (a multiple of {DIRECT_IO_ALIGNMENT} with \
             direct I/O), got {threads} threads and {piece}-byte pieces"
        )));
    }
    // The ceiling is plain `pread` by definition: the POSIX source, whatever the settings.
    let file = PosixFile::open(std::path::Path::new(path), OpenFlags::parse("r")?)?;
    let size = file.size()? as usize;
    let fd = if direct {
        file.direct_fd().ok_or_else(|| {
            Error::InvalidArgument(format!("'{path}' is on a filesystem without O_DIRECT"))
        })?
    } else {
        file.buffered_fd()
    };
    let capacity = size
        .next_multiple_of(DIRECT_IO_ALIGNMENT)
        .max(DIRECT_IO_ALIGNMENT);
    let memory = allocator.allocate(capacity)?;
    // SAFETY: `memory` holds `capacity` bytes, exclusively ours until deallocated below.
    let whole = unsafe { HostSpan::new(memory.as_ptr(), capacity) };
    // Fault every page in before the clock starts: the ceiling is about moving bytes, and
    // a reused buffer (as in any steady-state read) has its pages mapped already.
    // SAFETY: `whole` is the fresh allocation of `capacity` bytes.
    unsafe { std::ptr::write_bytes(whole.as_ptr(), 0, capacity) };
    let tasks: Vec<_> = split_tasks(0, size, piece).collect();
    let started = Instant::now();
    let outcome: Result<()> = std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let (tasks, file) = (&tasks, &file);
                scope.spawn(move || -> Result<()> {
                    for task in tasks.iter().skip(t).step_by(threads) {
                        let len = if direct {
                            task.len.next_multiple_of(DIRECT_IO_ALIGNMENT)
                        } else {
                            task.len
                        };
                        let part = whole.sub(task.buf_offset, len);
                        let got = if direct {
                            pread_direct(fd, part, task.file_offset, DIRECT_IO_ALIGNMENT)
                        } else {
                            pread_full(fd, part, task.file_offset)
                        };
                        got.map_err(|e| Error::os("pread", file.path(), e))?;
                    }
                    Ok(())
                })
            })
            .collect();
        workers
            .into_iter()
            .try_for_each(|w| w.join().unwrap_or_else(|p| Err(Error::from_panic(p))))
    });
    let seconds = started.elapsed().as_secs_f64();
    // SAFETY: the threads have finished; `whole` covers the allocation and `size <= capacity`.
    let bytes = unsafe { std::slice::from_raw_parts(whole.as_ptr(), size) };
    let byte_sum = bytes.iter().map(|&b| u64::from(b)).sum();
    // SAFETY: allocated above with this allocator and size; no longer used.
    unsafe { allocator.deallocate(memory, capacity) };
    outcome?;
    Ok(Ceiling {
        seconds,
        bytes: size as u64,
        byte_sum,
    })
}

/// The page-cache copy wall: every file of `paths` read with `threads` native threads,
/// each `pread`ing `piece`-byte pieces (the pieces of all files dealt out in turn) into a
/// `piece`-byte buffer of `allocator`'s memory that the thread owns and reuses, as kvikpy's
/// I/O threads do with their pinned buffers, but with no DMA after the copy. The result's
/// `byte_sum` samples one byte a page: the bytes at file offsets that are multiples of
/// 4096, summed over the files (a check that costs no memory traffic of its own).
pub fn copy_wall(
    paths: &[String],
    threads: usize,
    piece: usize,
    allocator: &dyn BounceAllocator,
) -> Result<Ceiling> {
    const PAGE: usize = 4096;
    if threads == 0 || piece == 0 || piece % PAGE != 0 {
        return Err(Error::InvalidArgument(format!(
            "need threads > 0 and a piece that is a multiple of {PAGE} bytes, got {threads} \
             threads and {piece}-byte pieces"
        )));
    }
    let flags = OpenFlags::parse("r")?;
    let files = paths
        .iter()
        .map(|p| PosixFile::open(std::path::Path::new(p), flags))
        .collect::<Result<Vec<_>>>()?;
    let mut pieces = Vec::new();
    let mut bytes = 0u64;
    for (i, file) in files.iter().enumerate() {
        let size = file.size()? as usize;
        bytes += size as u64;
        pieces.extend(split_tasks(0, size, piece).map(|t| (i, t.file_offset, t.len)));
    }
    // Deal the pieces out file by file in turn, as reads onto several GPUs interleave.
    pieces.sort_by_key(|&(i, offset, _)| (offset, i));
    let buffers = (0..threads)
        .map(|_| allocator.allocate(piece))
        .collect::<Result<Vec<_>>>()?;
    let spans: Vec<HostSpan> = buffers
        .iter()
        // SAFETY: each buffer holds `piece` bytes, exclusively its thread's until freed.
        .map(|b| unsafe { HostSpan::new(b.as_ptr(), piece) })
        .collect();
    for span in &spans {
        // SAFETY: the span is the fresh allocation of `piece` bytes; fault it in before
        // the clock starts, as a reused staging buffer is.
        unsafe { std::ptr::write_bytes(span.as_ptr(), 0, piece) };
    }
    let started = Instant::now();
    let outcome: Result<u64> = std::thread::scope(|scope| {
        let workers: Vec<_> = spans
            .iter()
            .enumerate()
            .map(|(t, &span)| {
                let (pieces, files) = (&pieces, &files);
                scope.spawn(move || -> Result<u64> {
                    let mut sum = 0u64;
                    for &(i, offset, len) in pieces.iter().skip(t).step_by(threads) {
                        let part = span.sub(0, len);
                        let file = &files[i];
                        pread_full(file.buffered_fd(), part, offset)
                            .map_err(|e| Error::os("pread", file.path(), e))?;
                        for at in (0..len).step_by(PAGE) {
                            // SAFETY: `at < len <= piece`, inside this thread's buffer,
                            // which only this thread touches.
                            sum += u64::from(unsafe { part.as_ptr().wrapping_add(at).read() });
                        }
                    }
                    Ok(sum)
                })
            })
            .collect();
        workers.into_iter().try_fold(0u64, |total, w| {
            Ok(total + w.join().unwrap_or_else(|p| Err(Error::from_panic(p)))?)
        })
    });
    let seconds = started.elapsed().as_secs_f64();
    for buffer in buffers {
        // SAFETY: allocated above with this allocator and size; the threads have finished.
        unsafe { allocator.deallocate(buffer, piece) };
    }
    Ok(Ceiling {
        seconds,
        bytes,
        byte_sum: outcome?,
    })
}

/// Run `measure` on ordinary page-aligned memory, or on pinned memory of the calling
/// thread's current device when `pinned` (the GPU ceilings).
pub fn with_memory<T>(
    pinned: bool,
    measure: impl FnOnce(&dyn BounceAllocator) -> Result<T>,
) -> Result<T> {
    if !pinned {
        return measure(&PageAlignedAllocator);
    }
    crate::cuda::ensure_driver()?;
    let ordinal = crate::cuda::current_device()?;
    measure(&crate::cuda::PinnedAllocator { ordinal })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn host_ceiling(path: &str, threads: usize, piece: usize, direct: bool) -> Result<Ceiling> {
        with_memory(false, |m| pread_ceiling(path, threads, piece, direct, m))
    }

    #[test]
    fn reads_every_byte_once() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f");
        let data: Vec<u8> = (0..1_000_003u32).map(|i| (i * 7 + 3) as u8).collect();
        std::fs::write(&p, &data).unwrap();
        let want: u64 = data.iter().map(|&b| u64::from(b)).sum();
        for (threads, piece) in [(1, 4096), (3, 65536), (8, 1 << 20)] {
            let c = host_ceiling(p.to_str().unwrap(), threads, piece, false).unwrap();
            assert_eq!((c.bytes, c.byte_sum), (data.len() as u64, want));
            assert!(c.seconds > 0.0);
        }
        if let Ok(c) = host_ceiling(p.to_str().unwrap(), 2, 1 << 20, true) {
            assert_eq!(c.byte_sum, want);
        }
        assert!(host_ceiling(p.to_str().unwrap(), 0, 4096, false).is_err());
    }

    #[test]
    fn the_copy_wall_reads_every_piece_of_every_file() {
        let dir = tempfile::tempdir().unwrap();
        let mut paths = Vec::new();
        let mut want = 0u64;
        for (k, n) in [1_000_003usize, 40_000, 0].into_iter().enumerate() {
            let p = dir.path().join(format!("f{k}"));
            let data: Vec<u8> = (0..n).map(|i| (i * 7 + 3 + k) as u8).collect();
            want += data
                .iter()
                .step_by(4096)
                .map(|&b| u64::from(b))
                .sum::<u64>();
            std::fs::write(&p, &data).unwrap();
            paths.push(p.to_str().unwrap().to_owned());
        }
        for (threads, piece) in [(1, 4096), (3, 65536), (8, 1 << 20)] {
            let c = with_memory(false, |m| copy_wall(&paths, threads, piece, m)).unwrap();
            assert_eq!((c.bytes, c.byte_sum), (1_040_003, want));
        }
        assert!(copy_wall(&paths, 2, 1000, &PageAlignedAllocator).is_err());
        assert!(copy_wall(&paths, 0, 4096, &PageAlignedAllocator).is_err());
    }
}
