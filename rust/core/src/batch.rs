//! Batch reads: many files, or many byte ranges of one file, into one allocation in one
//! pass on the pool.
//!
//! Elements are laid end to end in the destination. Neighbouring small elements are
//! grouped into segments; a pool task reads a segment's elements one after another
//! (opening and closing each file itself) and, for GPU memory, gathers them in one pinned
//! bounce buffer and moves the whole segment with one DMA, so thousands of small files
//! cost tens of DMAs rather than one each. An element larger than a segment is cut into
//! segment-sized pieces (each opening the file itself), so that one large file is still
//! read by many threads. Each element's outcome is reported separately, so a
//! caller can fail the batch on the first error or skip the failed elements.

use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rayon::prelude::*;

use crate::cancel::{self, CancelToken};
use crate::error::{Error, Result};
use crate::file::FileHandle;
use crate::future::run_caught;
use crate::memory::{DeviceSpan, HostSpan, Span};
use crate::ring::Ring;
use crate::settings::Settings;
use crate::source::{self, truncated, unsized_file, Source};

/// Smallest segment: below it, the per-segment DMA and its wait cost more than they save.
const MIN_SEGMENT: usize = 256 << 10;

/// Where one element of a batch comes from.
#[derive(Debug, Clone)]
pub enum Origin {
    /// A file from this byte offset (0 for a whole file): opened, read and closed by the
    /// task that reads it.
    File(PathBuf, u64),
    /// Bytes at this offset of the batch's shared file (`read_ranges`).
    Range(u64),
}

/// One element: its origin, its length, and where it lands in the destination.
#[derive(Debug, Clone)]
pub struct Element {
    /// The file, or the offset in the batch's shared file, the bytes come from.
    pub origin: Origin,
    /// How many bytes the element reads.
    pub len: usize,
    /// Byte offset in the destination where the element's bytes land.
    pub dst: usize,
}

/// The sizes of `paths` (regular files only), looked up in parallel on the pool; each
/// failure names its path.
fn file_sizes(settings: &Settings, paths: &[PathBuf]) -> Result<Vec<Result<u64>>> {
    let pool = crate::pool::pool(settings.num_threads)?;
    let carried = cancel::carry();
    let sizes = pool.install(|| {
        paths
            .par_iter()
            .map(|path| {
                if source::is_remote(path) {
                    // A URL: its size, asked of the server (cancellably, as the caller is).
                    carried.run(|| source::open_sized(path, None, settings)?.size())
                } else if carried.cancelled() {
                    Err(cancel::error(&path.to_string_lossy()))
                } else {
                    regular_file_size(path)
                }
            })
            .collect()
    });
    if carried.cancelled() {
        return Err(cancel::error(&format!("a batch of {} files", paths.len())));
    }
    Ok(sizes)
}

fn regular_file_size(path: &PathBuf) -> Result<u64> {
    let meta = std::fs::metadata(path).map_err(|e| Error::os("stat", path, e))?;
    if meta.is_dir() {
        let err = std::io::Error::from_raw_os_error(libc::EISDIR);
        return Err(Error::os("read", path, err));
    }
    if !meta.is_file() {
        return Err(Error::InvalidArgument(format!(
            "'{}' is not a regular file (a device, pipe or socket has no fixed size to \
             batch); read it with CuFile",
            path.display()
        )));
    }
    if meta.len() == 0 && has_content(path) {
        return Err(unsized_file(path, "a batch"));
    }
    Ok(meta.len())
}

/// Whether a file that reports 0 bytes yields a byte when read (pseudo-files do); one
/// open and a 1-byte read, asked only of files that report 0 bytes.
fn has_content(path: &PathBuf) -> bool {
    use std::io::Read;
    std::fs::File::open(path)
        .and_then(|mut f| f.read(&mut [0u8; 1]))
        .is_ok_and(|n| n > 0)
}

/// A batch laid out and ready to read: its elements end to end, the files that failed
/// to be sized (with `skip`), and the file shared by range elements.
#[derive(Debug)]
pub struct Plan {
    /// Elements to read, in destination order.
    elements: Vec<Element>,
    /// For each element, its index among the batch's inputs.
    indices: Vec<usize>,
    /// Where each input starts in the destination, and the total after the last.
    offsets: Vec<usize>,
    /// Each input's length (less than the gap to the next start where elements are
    /// aligned).
    lengths: Vec<usize>,
    /// Inputs that failed before any read (only with `skip`), by index.
    failures: Vec<(usize, Error)>,
    /// The file of `Origin::Range` elements.
    shared: Option<FileHandle>,
    /// Without `skip`, the first failure (in input order) fails the whole batch.
    skip: bool,
}

/// What reading a [`Plan`] gives: every input's start in the destination plus the total
/// (`inputs + 1` offsets), and the failed inputs by index, in input order (empty unless
/// the batch skips failures).
#[derive(Debug)]
pub struct Outcome {
    /// `inputs + 1` byte offsets: input `i` starts at `offsets[i]`; unless the batch
    /// aligns its elements, it is `offsets[i]..offsets[i + 1]`.
    pub offsets: Vec<usize>,
    /// Each input's length in bytes.
    pub lengths: Vec<usize>,
    /// The inputs that failed, by index, in input order; they are empty in the
    /// destination.
    pub failures: Vec<(usize, Error)>,
}

/// Plan reading the whole files `paths` into one allocation. With `skip`, a file that
/// cannot be sized becomes an empty element listed in the outcome; without it, the
/// first such file (in `paths` order) is the error.
pub fn plan_files(settings: &Settings, paths: Vec<PathBuf>, skip: bool) -> Result<Plan> {
    let sizes = file_sizes(settings, &paths)?;
    let mut failures = Vec::new();
    let mut inputs = Vec::with_capacity(paths.len());
    for (i, (path, size)) in paths.into_iter().zip(sizes).enumerate() {
        let size = size.and_then(|s| {
            usize::try_from(s)
                .map_err(|_| Error::InvalidArgument(format!("'{}' is too large", path.display())))
        });
        match size {
            Ok(len) => inputs.push(Some((Origin::File(path, 0), len))),
            Err(e) if skip => {
                failures.push((i, e));
                inputs.push(None); // an empty element
            }
            Err(e) => return Err(e),
        }
    }
    Plan::new(inputs, None, failures, skip, 1)
}

/// Where a [`plan_file_ranges`] element starts: from the start of its file, or this many
/// bytes before its end (a suffix).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Start {
    /// This byte offset from the start of the file.
    Offset(u64),
    /// This many bytes before the end of the file (the whole file if it is shorter).
    Suffix(u64),
}

/// Plan reading a byte range of each of many files (a zarr store's chunks) into one
/// allocation, each element starting at a multiple of `align` bytes. A range is cut at
/// its file's end, as a read past the end of a file would be: one starting past the end
/// is empty, one without a `size` runs to the end. With `skip`, a file that cannot be
/// sized becomes an empty element listed in the outcome; without it, the first such file
/// (in input order) is the error.
pub fn plan_file_ranges(
    settings: &Settings,
    ranges: Vec<(PathBuf, Start, Option<u64>)>,
    skip: bool,
    align: usize,
) -> Result<Plan> {
    if !align.is_power_of_two() {
        return Err(Error::InvalidArgument(format!(
            "the alignment of batch elements must be a power of two, got {align}"
        )));
    }
    let paths: Vec<PathBuf> = ranges.iter().map(|(p, _, _)| p.clone()).collect();
    let sizes = file_sizes(settings, &paths)?;
    let mut failures = Vec::new();
    let mut inputs = Vec::with_capacity(ranges.len());
    for (i, ((path, start, size), file_size)) in ranges.into_iter().zip(sizes).enumerate() {
        let clamped = file_size.and_then(|file_size| {
            let offset = match start {
                Start::Offset(o) => o.min(file_size),
                Start::Suffix(n) => file_size.saturating_sub(n),
            };
            let len = size.map_or(file_size - offset, |s| s.min(file_size - offset));
            let len = usize::try_from(len).map_err(|_| {
                Error::InvalidArgument(format!("'{}' is too large", path.display()))
            })?;
            Ok((offset, len))
        });
        match clamped {
            Ok((offset, len)) => inputs.push(Some((Origin::File(path, offset), len))),
            Err(e) if skip => {
                failures.push((i, e));
                inputs.push(None);
            }
            Err(e) => return Err(e),
        }
    }
    Plan::new(inputs, None, failures, skip, align)
}

/// Plan reading `ranges` (`(offset, size)` pairs) of the file at `path` into one
/// allocation. Every range must lie inside the file; one that does not is an
/// [`Error::InvalidArgument`] naming it.
pub fn plan_ranges(settings: &Settings, path: &Path, ranges: &[(u64, u64)]) -> Result<Plan> {
    plan_ranges_aligned(settings, path, ranges, 1)
}

/// [`plan_ranges`] with each range starting at a multiple of `align` (a power of two)
/// in the destination (an Arrow IPC table's buffers).
pub fn plan_ranges_aligned(
    settings: &Settings,
    path: &Path,
    ranges: &[(u64, u64)],
    align: usize,
) -> Result<Plan> {
    let handle = FileHandle::open_with(path, "r", settings)?;
    let file_size = handle.get()?.size_for("read_ranges", settings)?;
    let mut inputs = Vec::with_capacity(ranges.len());
    for (i, &(offset, size)) in ranges.iter().enumerate() {
        if offset.checked_add(size).is_none_or(|end| end > file_size) {
            return Err(Error::InvalidArgument(format!(
                "range {i} (offset {offset}, size {size}) ends past the end of '{}', which \
                 has {file_size} bytes; every range must lie inside the file",
                source::redact(&path.display().to_string())
            )));
        }
        let len = usize::try_from(size)
            .map_err(|_| Error::InvalidArgument(format!("range {i} is too large")))?;
        inputs.push(Some((Origin::Range(offset), len)));
    }
    Plan::new(inputs, Some(handle), Vec::new(), false, align)
}

impl Plan {
    fn new(
        inputs: Vec<Option<(Origin, usize)>>,
        shared: Option<FileHandle>,
        failures: Vec<(usize, Error)>,
        skip: bool,
        align: usize,
    ) -> Result<Self> {
        let lengths: Vec<usize> = inputs
            .iter()
            .map(|input| input.as_ref().map_or(0, |(_, len)| *len))
            .collect();
        let (mut offsets, total) = layout_aligned(&lengths, align)?;
        let (indices, elements) = inputs
            .into_iter()
            .zip(&offsets)
            .enumerate()
            .filter_map(|(i, (input, &dst))| {
                input.map(|(origin, len)| (i, Element { origin, len, dst }))
            })
            .unzip();
        offsets.push(total);
        Ok(Self {
            elements,
            indices,
            offsets,
            lengths,
            failures,
            shared,
            skip,
        })
    }

    /// The bytes the batch reads: the size its destination needs.
    pub fn total(&self) -> usize {
        self.offsets.last().copied().unwrap_or(0)
    }

    /// Read every element into `dest` (at least [`Plan::total`] bytes), in parallel on
    /// the pool; blocks until all are done. Without `skip`, the first failed input (in
    /// input order) is the error.
    pub fn read(
        self,
        settings: &Settings,
        dest: Span,
        progress: Option<&AtomicU64>,
    ) -> Result<Outcome> {
        if dest.len() < self.total() {
            return Err(Error::InvalidArgument(format!(
                "a batch of {} bytes cannot be read into {} bytes",
                self.total(),
                dest.len()
            )));
        }
        let errors = read_elements(
            settings,
            self.shared.as_ref(),
            &self.elements,
            dest,
            progress,
            !self.skip,
        )?;
        let mut failures = self.failures;
        for (i, e) in self.indices.into_iter().zip(errors) {
            if let Some(e) = e {
                failures.push((i, e));
            }
        }
        failures.sort_by_key(|(i, _)| *i);
        if !self.skip {
            // The first failure in input order, past the elements that were stopped
            // because of it (a batch that fails stops its other reads).
            let first = failures
                .iter()
                .position(|(_, e)| !cancel::is_cancellation(e))
                .unwrap_or(0);
            if let Some((_, e)) = failures.into_iter().nth(first) {
                return Err(e);
            }
            failures = Vec::new();
        }
        Ok(Outcome {
            offsets: self.offsets,
            lengths: self.lengths,
            failures,
        })
    }
}

/// Lay `sizes` end to end: each element's start, and the total.
pub fn layout(sizes: &[usize]) -> Result<(Vec<usize>, usize)> {
    layout_aligned(sizes, 1)
}

/// Lay `sizes` one after another, each starting at a multiple of `align` (a power of
/// two): each element's start, and the total (the end of the last element).
pub fn layout_aligned(sizes: &[usize], align: usize) -> Result<(Vec<usize>, usize)> {
    let overflow =
        || Error::InvalidArgument("the batch's total size overflows the address space".into());
    let mut starts = Vec::with_capacity(sizes.len());
    let mut total = 0usize;
    for &len in sizes {
        let start = total
            .checked_next_multiple_of(align.max(1))
            .ok_or_else(overflow)?;
        starts.push(start);
        total = start.checked_add(len).ok_or_else(overflow)?;
    }
    Ok((starts, total))
}

/// The segment size for `total` bytes on `threads` threads: about two segments per thread,
/// at least [`MIN_SEGMENT`], at most one bounce buffer.
pub fn segment_size(total: usize, threads: usize, bounce_buffer_size: usize) -> usize {
    let share = total.div_ceil(2 * threads.max(1));
    share.max(MIN_SEGMENT).min(bounce_buffer_size.max(1))
}

/// Group consecutive lengths (in destination order) into segments of at most `cap`
/// bytes; a length over `cap` is a segment by itself.
pub fn segments(lengths: &[usize], cap: usize) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let mut start = 0usize;
    let mut bytes = 0usize;
    for (i, &len) in lengths.iter().enumerate() {
        if i > start && bytes + len > cap {
            out.push(start..i);
            start = i;
            bytes = 0;
        }
        bytes += len;
    }
    if start < lengths.len() {
        out.push(start..lengths.len());
    }
    out
}

/// A piece of an element: elements larger than a segment are cut into segment-sized
/// pieces so that one large file is still read by many threads.
#[derive(Debug, Clone)]
struct Piece {
    element: usize,
    offset: u64,
    len: usize,
    dst: usize,
}

fn pieces(elements: &[Element], cap: usize) -> Vec<Piece> {
    let mut out = Vec::with_capacity(elements.len());
    for (i, e) in elements.iter().enumerate() {
        let base = match e.origin {
            Origin::File(_, offset) | Origin::Range(offset) => offset,
        };
        let mut done = 0usize;
        loop {
            let len = cap.min(e.len - done);
            out.push(Piece {
                element: i,
                offset: base + done as u64,
                len,
                dst: e.dst + done,
            });
            done += len;
            if done >= e.len {
                break;
            }
        }
    }
    out
}

/// Read every element into `dest` (one allocation at least as long as the elements'
/// total), in parallel on the pool; blocks until all are done. Returns each element's
/// error, `None` where it succeeded. `shared` is the file of `Origin::Range` elements.
fn read_elements(
    settings: &Settings,
    shared: Option<&FileHandle>,
    elements: &[Element],
    dest: Span,
    progress: Option<&AtomicU64>,
    fail_fast: bool,
) -> Result<Vec<Option<Error>>> {
    let shared = shared.map(FileHandle::get).transpose()?;
    if let Some(file) = &shared {
        file.check_access(crate::request::Direction::Read)?;
    }
    let total: usize = elements.iter().map(|e| e.len).sum();
    let cap = segment_size(total, settings.num_threads, settings.bounce_buffer_size);
    let work = pieces(elements, cap);
    // Each piece's length plus the alignment gap before it, so that a segment's span in
    // the destination (what a bounce buffer stages) stays within the cap.
    let mut end = 0usize;
    let lengths: Vec<usize> = work
        .iter()
        .map(|p| {
            let span = p.dst + p.len - end.min(p.dst);
            end = p.dst + p.len;
            span
        })
        .collect();
    let errors: Vec<Mutex<Option<Error>>> = elements.iter().map(|_| Mutex::new(None)).collect();
    if let (Some(file), Span::Device(device)) = (&shared, dest) {
        // The shared file's own batch transfers (cuFile's batch API), where it has them.
        let reads: Vec<(u64, DeviceSpan)> = work
            .iter()
            .map(|p| (p.offset, device.sub(p.dst, p.len)))
            .collect();
        if let Some(outcome) = file.device_batch(&reads, settings) {
            let counts = outcome?;
            for (p, got) in work.iter().zip(counts) {
                let failed = match got {
                    Ok(n) if n == p.len => None,
                    Ok(n) => Some(truncated(file.path(), p.offset, p.len, n)),
                    Err(e) => Some(e),
                };
                if let Some(e) = failed {
                    let mut slot = errors[p.element].lock().unwrap_or_else(|x| x.into_inner());
                    slot.get_or_insert(e);
                }
            }
            if let Some(progress) = progress {
                progress.fetch_add(total as u64, Ordering::Relaxed);
            }
            return Ok(errors
                .into_iter()
                .map(|m| m.into_inner().unwrap_or_else(|p| p.into_inner()))
                .collect());
        }
    }
    let pool = crate::pool::pool(settings.num_threads)?;
    let segments = segments(&lengths, cap);
    // Pieces watch the caller's cancellation (a pooled call that was interrupted) and,
    // with `fail_fast`, the batch's first error: those not yet read are skipped, remote
    // ones stop waiting for their server (a stalled file fails the batch in one
    // request's time, not once per piece).
    let outer = cancel::carry();
    let stop = CancelToken::new();
    let carried = if fail_fast {
        outer.and(&stop)
    } else {
        outer.clone()
    };
    let job = Job {
        settings,
        shared: shared.as_ref(),
        elements,
        dest,
        errors: &errors,
        progress,
        stop: fail_fast.then_some(&stop),
    };
    pool.install(|| {
        segments.par_iter().for_each(|range| {
            let part = &work[range.clone()];
            if carried.cancelled() {
                return; // skipped: the whole batch fails below
            }
            if let Err(e) = carried.run(|| run_caught(|| job.segment(part))) {
                // The segment as a whole failed (its DMA, a panic): blame each of its
                // elements that has no error of its own.
                for p in part {
                    job.record(p, e.clone());
                }
            }
        })
    });
    if outer.cancelled() {
        // Interrupted: no element's outcome is worth reporting (nor the time to build it).
        return Err(cancel::error(&job.what()));
    }
    Ok(errors
        .into_iter()
        .map(|m| m.into_inner().unwrap_or_else(|p| p.into_inner()))
        .collect())
}

/// Everything a segment task needs.
struct Job<'a> {
    settings: &'a Settings,
    shared: Option<&'a Arc<dyn Source>>,
    elements: &'a [Element],
    dest: Span,
    errors: &'a [Mutex<Option<Error>>],
    /// Bytes of pieces finished so far, for a caller's progress bar.
    progress: Option<&'a AtomicU64>,
    /// Cancelled by the first failure, for a batch that fails as a whole.
    stop: Option<&'a CancelToken>,
}

impl Job<'_> {
    fn record(&self, piece: &Piece, e: Error) {
        let mut slot = self.errors[piece.element]
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        let real = !cancel::is_cancellation(&e);
        slot.get_or_insert(e);
        drop(slot);
        if let (Some(stop), true) = (self.stop, real) {
            stop.cancel();
        }
    }

    /// What the batch reads, for the error of a cancelled one.
    fn what(&self) -> String {
        self.shared.map_or_else(
            || format!("a batch of {} files", self.elements.len()),
            |f| f.path().to_string_lossy().into_owned(),
        )
    }

    /// Open the piece's file (or share the batch's).
    fn open_piece(&self, piece: &Piece) -> Result<Arc<dyn Source>> {
        let element = &self.elements[piece.element];
        match &element.origin {
            // A whole file, sized when the batch was planned: a remote one opens with no
            // second size request. A range of one (at an offset) is opened as any file is.
            Origin::File(path, 0) => {
                source::open_sized(path, Some(element.len as u64), self.settings)
            }
            Origin::File(path, _) => FileHandle::open_with(path, "r", self.settings)?.get(),
            Origin::Range(_) => Ok(Arc::clone(self.shared.ok_or_else(|| {
                Error::InvalidArgument("a range element needs the batch's file".into())
            })?)),
        }
    }

    /// Open the piece's file (or share the batch's) and read its bytes into `span`.
    fn read_piece(&self, piece: &Piece, span: HostSpan) -> Result<()> {
        self.read_piece_from(&self.open_piece(piece)?, piece, span)
    }

    /// Read the piece's bytes from `file` into `span`.
    fn read_piece_from(&self, file: &Arc<dyn Source>, piece: &Piece, span: HostSpan) -> Result<()> {
        let got = file.read_host(span, piece.offset, self.settings)?;
        if got == piece.len {
            return Ok(());
        }
        Err(truncated(file.path(), piece.offset, piece.len, got))
    }

    fn segment(&self, part: &[Piece]) -> Result<()> {
        let result = self.segment_inner(part);
        if let Some(progress) = self.progress {
            let bytes: usize = part.iter().map(|p| p.len).sum();
            progress.fetch_add(bytes as u64, Ordering::Relaxed);
        }
        result
    }

    fn segment_inner(&self, part: &[Piece]) -> Result<()> {
        let (Some(first), Some(last)) = (part.first(), part.last()) else {
            return Ok(());
        };
        match self.dest {
            Span::Host(host) => {
                for p in part {
                    if cancel::cancelled() {
                        break; // the whole batch fails (see `read_elements`)
                    }
                    if let Err(e) = self.read_piece(p, host.sub(p.dst, p.len)) {
                        self.record(p, e);
                    }
                }
                Ok(())
            }
            Span::Device(device) => self.gather(part, device, first.dst, last.dst + last.len),
        }
    }

    /// Read a segment's pieces into one pinned bounce buffer, then move it in one DMA.
    /// Pieces of files whose source has its own batch transfers (cuFile) go straight to
    /// the device instead, and the rest is then moved piece by piece.
    fn gather(&self, part: &[Piece], device: DeviceSpan, start: usize, end: usize) -> Result<()> {
        let context = crate::cuda::bind(device.ordinal)?;
        let lane = crate::cuda::thread_stream(&context)?;
        let mut ring = Ring::pinned(lane, 1, self.settings)?;
        let staged = ring.stage(0, 0, end - start);
        let mut direct = vec![false; part.len()];
        for (k, p) in part.iter().enumerate() {
            if cancel::cancelled() {
                return Err(cancel::error(&self.what()));
            }
            let outcome = self.open_piece(p).and_then(|file| {
                let reads = [(p.offset, device.sub(p.dst, p.len))];
                match file.device_batch(&reads, self.settings) {
                    Some(counts) => {
                        direct[k] = true;
                        let got = counts?.pop().unwrap_or(Ok(0))?;
                        if got == p.len {
                            return Ok(());
                        }
                        Err(truncated(file.path(), p.offset, p.len, got))
                    }
                    None => self.read_piece_from(&file, p, staged.sub(p.dst - start, p.len)),
                }
            });
            if let Err(e) = outcome {
                self.record(p, e);
            }
        }
        if !direct.iter().any(|&d| d) {
            // SAFETY: `staged` lies in the ring's pinned buffer, held until the ring has
            // drained below; the destination `start..end` lies inside `device`.
            unsafe { ring.upload(0, device.ptr + start as u64, staged.as_ptr(), end - start)? };
            return ring.drain();
        }
        for (p, _) in part.iter().zip(&direct).filter(|(_, &d)| !d) {
            let from = staged.sub(p.dst - start, p.len);
            // SAFETY: as above, for this piece's part of the buffer and the destination.
            unsafe { ring.upload(0, device.ptr + p.dst as u64, from.as_ptr(), p.len)? };
        }
        ring.drain()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn elements(sizes: &[usize]) -> Vec<Element> {
        let (starts, _) = layout(sizes).unwrap();
        sizes
            .iter()
            .zip(starts)
            .map(|(&len, dst)| Element {
                origin: Origin::Range(7),
                len,
                dst,
            })
            .collect()
    }

    proptest! {
        #[test]
        fn segments_cover_every_element_once_within_the_cap(
            sizes in proptest::collection::vec(0usize..(3 << 20), 0..300),
            cap in (1usize << 10)..(8 << 20),
        ) {
            let els = elements(&sizes);
            let work = pieces(&els, cap);
            // Pieces tile every element, in order, none over the cap.
            let mut at = 0usize;
            for p in &work {
                prop_assert_eq!(p.dst, at);
                prop_assert!(p.len <= cap);
                let e = &els[p.element];
                prop_assert_eq!(p.offset, 7 + (p.dst - e.dst) as u64);
                at += p.len;
            }
            prop_assert_eq!(at, sizes.iter().sum::<usize>());
            let lengths: Vec<usize> = work.iter().map(|p| p.len).collect();
            let segs = segments(&lengths, cap);
            let mut next = 0;
            for seg in &segs {
                prop_assert_eq!(seg.start, next);
                prop_assert!(seg.end > seg.start);
                let bytes: usize = lengths[seg.clone()].iter().sum();
                prop_assert!(bytes <= cap);
                next = seg.end;
            }
            prop_assert_eq!(next, lengths.len());
        }

        #[test]
        fn segment_size_is_bounded(total in 0usize..(1 << 40), threads in 1usize..64,
                                   bounce in (1usize << 20)..(64 << 20)) {
            let s = segment_size(total, threads, bounce);
            prop_assert!(s <= bounce);
            prop_assert!(s >= MIN_SEGMENT.min(bounce));
        }
    }

    #[test]
    fn layout_lays_elements_end_to_end() {
        assert_eq!(layout(&[3, 0, 5]).unwrap(), (vec![0, 3, 3], 8));
        assert!(layout(&[usize::MAX, 1]).is_err());
    }

    #[test]
    fn aligned_layout_starts_each_element_on_a_multiple() {
        assert_eq!(
            layout_aligned(&[3, 0, 5, 16], 16).unwrap(),
            (vec![0, 16, 16, 32], 48)
        );
        assert_eq!(layout_aligned(&[], 16).unwrap(), (vec![], 0));
        assert!(layout_aligned(&[usize::MAX - 2, 1], 16).is_err());
    }
}
