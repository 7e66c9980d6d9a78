//! Batch requests: many reads, each a byte range of some file into a destination span of
//! its own (host memory, or GPU memory of any device), completed as one request.
//!
//! Items are cut into pieces of at most one segment (about two per pool thread, at most
//! one bounce buffer), so that one large item is still read by many threads. A piece that
//! large is a task of its own and moves as a single read's task does
//! ([`transfer_span`]: the source's direct device path or the double-buffered bounce
//! ring). Smaller neighbouring pieces on one device are grouped into one task that reads
//! them one after another into one pinned bounce buffer and moves each run of pieces that
//! are neighbours in memory with one DMA, so thousands of small files cost tens of DMAs
//! rather than one each. Each item's outcome is reported separately, so that a caller can
//! fail the whole request on the first error or name the items that failed.

use std::ops::Range;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use rayon::prelude::*;

use crate::cancel::{self, CancelToken};
use crate::device_io::transfer_span;
use crate::error::{Error, Result};
use crate::file::FileHandle;
use crate::future::run_caught;
use crate::ring::{staging_capacity, Ring};
use crate::settings::Settings;
use crate::source::{self, truncated, Source};
use crate::span::{HostSpan, Span};
use crate::tasks::DIRECT_IO_ALIGNMENT;
use crate::vocab::Direction;

/// Smallest segment: below it, the per-segment DMA and its wait cost more than they save.
const MIN_SEGMENT: usize = 256 << 10;
/// Pieces from this size on are tasks of their own, moved through the single-read
/// pipeline (large enough for a DMA of their own; see `device_io`'s chunk sizes).
const ALONE: usize = 4 << 20;

/// Where the items of a [`BatchRequest`] read from.
pub enum ItemSource {
    /// A source already open, shared by its items (one file's ranges, a checkpoint's
    /// files).
    Open(Arc<dyn Source>),
    /// A file opened, read and closed by each task that reads it; with its size where
    /// the caller knows it (a whole file it sized: a URL then opens without a second size
    /// request, pinned to the version it was sized at).
    Path {
        /// The file's path or URL.
        path: PathBuf,
        /// Its size in bytes, if known.
        size: Option<u64>,
        /// The version it was sized at (a URL's `ETag`, see [`Source::version`]), if any.
        version: Option<String>,
    },
}

impl ItemSource {
    fn open(&self, settings: &Settings) -> Result<Arc<dyn Source>> {
        match self {
            Self::Open(source) => Ok(Arc::clone(source)),
            Self::Path {
                path,
                size: Some(size),
                version,
            } => source::open_sized(path, Some(*size), version.as_deref(), settings),
            Self::Path {
                path, size: None, ..
            } => FileHandle::open_with(path, "r", settings)?.get(),
        }
    }

    fn path(&self) -> String {
        match self {
            Self::Open(source) => source.path().to_string_lossy().into_owned(),
            Self::Path { path, .. } => path.to_string_lossy().into_owned(),
        }
    }
}

/// One read of a batch: `dest.len()` bytes of source `source` (an index into
/// [`BatchRequest::sources`]) from `file_offset`.
#[derive(Debug, Clone, Copy)]
pub struct Item {
    /// Which of the request's sources the bytes come from.
    pub source: usize,
    /// Where in that source they start.
    pub file_offset: u64,
    /// Where they land; its length is the item's.
    pub dest: Span,
}

/// Many reads completed as one request (see the module documentation).
pub struct BatchRequest {
    /// The files the items read.
    pub sources: Vec<ItemSource>,
    /// The reads, best in destination order (neighbours are grouped into one task).
    pub items: Vec<Item>,
    /// The first failure stops the reads not yet started (the caller fails the whole
    /// batch on it); otherwise every item is attempted.
    pub fail_fast: bool,
    /// The bytes between items that follow each other in memory belong to the request
    /// (a new allocation with alignment gaps): a task may write across them, moving
    /// neighbouring items with one DMA. Never for memory the caller owns.
    pub gaps_writable: bool,
}

/// The segment size for `total` bytes on `threads` threads: about two segments per thread,
/// at least [`MIN_SEGMENT`], at most one bounce buffer.
pub fn segment_size(total: usize, threads: usize, bounce_buffer_size: usize) -> usize {
    let share = total.div_ceil(2 * threads.max(1));
    share.max(MIN_SEGMENT).min(bounce_buffer_size.max(1))
}

/// A piece of an item: at most one segment of it.
#[derive(Debug, Clone, Copy)]
struct Piece {
    item: usize,
    offset: u64,
    dest: Span,
    /// Where the piece sits in its task's bounce buffer (gathered tasks).
    at: usize,
}

impl Piece {
    fn len(&self) -> usize {
        self.dest.len()
    }
}

/// The one GPU every device destination of `items` lies on (whose pool then runs the
/// batch), or `None` when they lie on several, or none does.
fn one_device(items: &[Item]) -> Option<usize> {
    let mut devices = items.iter().filter_map(|i| Span::ordinal(&i.dest));
    let first = devices.next()?;
    devices.all(|d| d == first).then_some(first)
}

/// The address of a span's first byte.
fn address(span: &Span) -> u64 {
    match span {
        Span::Host(h) => h.as_ptr() as u64,
        Span::Device(d) => d.ptr,
    }
}

/// The bytes between the end of `before` and the start of `after` when `after` follows
/// it in the same memory, else `None`.
fn gap(before: &Piece, after: &Piece) -> Option<u64> {
    let end = address(&before.dest).checked_add(before.len() as u64)?;
    let start = address(&after.dest);
    (Span::ordinal(&before.dest) == Span::ordinal(&after.dest) && start >= end).then(|| start - end)
}

/// Cut every item into pieces of at most `cap` bytes (an empty item is one empty piece,
/// so that its file is still opened and its failure reported).
fn pieces(items: &[Item], cap: usize) -> Vec<Piece> {
    let mut out = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let len = item.dest.len();
        let mut done = 0usize;
        loop {
            let n = cap.min(len - done);
            out.push(Piece {
                item: i,
                offset: item.file_offset + done as u64,
                dest: item.dest.sub(done, n),
                at: 0,
            });
            done += n;
            if done >= len {
                break;
            }
        }
    }
    out
}

/// Whether a piece is a task of its own, moved as a single read's task is.
fn alone(piece: &Piece, cap: usize) -> bool {
    piece.len() >= ALONE.min(cap)
}

/// Group consecutive pieces into tasks of at most `cap` staged bytes, all in one memory
/// (the host, or one device), and set where each sits in its task's bounce buffer: right
/// after the previous one or, with `gaps_writable`, as far after it as it is in memory
/// (then a run of neighbours moves with one DMA). A piece of [`alone`] size is a task
/// by itself.
fn segments(pieces: &mut [Piece], cap: usize, gaps_writable: bool) -> Vec<Range<usize>> {
    let mut out = Vec::new();
    let mut start = 0usize;
    let mut used = 0usize;
    for i in 0..pieces.len() {
        let piece = pieces[i];
        let mut at = 0usize;
        if i > start {
            let before = &pieces[i - 1];
            let joins = !alone(&piece, cap) && !alone(before, cap);
            let same = Span::ordinal(&before.dest) == Span::ordinal(&piece.dest);
            at = match gap(before, &piece) {
                Some(g) if gaps_writable && g < cap as u64 => used + g as usize,
                _ => used,
            };
            if !joins || !same || at + piece.len() > cap {
                out.push(start..i);
                start = i;
                at = 0;
            }
        }
        pieces[i].at = at;
        used = at + piece.len();
    }
    if start < pieces.len() {
        out.push(start..pieces.len());
    }
    out
}

/// Whether `after` is staged right where it lies relative to `before` in memory, so that
/// one DMA moves both (and whatever lies between them).
fn one_dma(before: &Piece, after: &Piece) -> bool {
    gap(before, after)
        .is_some_and(|g| Some(after.at) == (before.at + before.len()).checked_add(g as usize))
}

/// Read every item of `request` under `settings`, in parallel on the pool; blocks until
/// all are done, watching the caller's cancellation (an interrupted call fails at once
/// with a cancellation error). Returns each item's error, `None` where it succeeded.
/// `progress` counts the bytes of finished tasks.
pub fn submit_batch(
    settings: &Settings,
    request: BatchRequest,
    progress: Option<&AtomicU64>,
) -> Result<Vec<Option<Error>>> {
    let BatchRequest {
        sources,
        items,
        fail_fast,
        gaps_writable,
    } = request;
    let mut total = 0usize;
    for (i, item) in items.iter().enumerate() {
        if item.source >= sources.len() {
            return Err(Error::InvalidArgument(format!(
                "item {i} reads file {} of a batch of {} files",
                item.source,
                sources.len()
            )));
        }
        if item
            .file_offset
            .checked_add(item.dest.len() as u64)
            .is_none()
        {
            return Err(Error::InvalidArgument(format!(
                "item {i}: file offset {} + length {} overflows a 64-bit file offset",
                item.file_offset,
                item.dest.len()
            )));
        }
        total = total.checked_add(item.dest.len()).ok_or_else(|| {
            Error::InvalidArgument("the batch's total size overflows the address space".into())
        })?;
    }
    for source in &sources {
        if let ItemSource::Open(source) = source {
            source.check_access(Direction::Read)?;
        }
    }
    let device = one_device(&items);
    let threads = crate::pool::threads_for(settings, device);
    let mut cap = segment_size(total, threads, settings.bounce_buffer_size);
    if let Some(budget) = settings.staging.budget() {
        // A checkpoint load's gathered segment fits its staging budget (see `gather`).
        cap = cap.min(budget.slot_bytes(1, DIRECT_IO_ALIGNMENT));
    }
    let mut work = pieces(&items, cap);
    let errors: Vec<Mutex<Option<Error>>> = items.iter().map(|_| Mutex::new(None)).collect();
    let batch = Batch {
        settings,
        sources: &sources,
        items: &items,
        errors: &errors,
        progress,
        stop: None,
    };
    if let Some(outcome) = batch.device_batch(&work) {
        outcome?;
        if let Some(progress) = progress {
            progress.fetch_add(total as u64, Ordering::Relaxed);
        }
        return Ok(batch.into_errors());
    }
    let segments = segments(&mut work, cap, gaps_writable);
    let pool = crate::pool::pool_for(settings, device)?;
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
    let batch = Batch {
        stop: fail_fast.then_some(&stop),
        ..batch
    };
    pool.install(|| {
        segments.par_iter().for_each(|range| {
            let part = &work[range.clone()];
            if carried.cancelled() {
                return; // skipped: the whole batch fails
            }
            if let Err(e) = carried.run(|| run_caught(|| batch.segment(part, cap))) {
                // The task as a whole failed (its DMA, a panic): blame each of its
                // items that has no error of its own.
                for p in part {
                    batch.record(p, e.clone());
                }
            }
        })
    });
    if outer.cancelled() {
        // Interrupted: no item's outcome is worth reporting (nor the time to build it).
        return Err(cancel::error(&batch.what()));
    }
    Ok(batch.into_errors())
}

/// Everything a batch's tasks share.
struct Batch<'a> {
    settings: &'a Settings,
    sources: &'a [ItemSource],
    items: &'a [Item],
    errors: &'a [Mutex<Option<Error>>],
    /// Bytes of pieces finished so far, for a caller's progress bar.
    progress: Option<&'a AtomicU64>,
    /// Cancelled by the first failure, for a batch that fails as a whole.
    stop: Option<&'a CancelToken>,
}

impl Batch<'_> {
    fn into_errors(self) -> Vec<Option<Error>> {
        self.errors
            .iter()
            .map(|m| m.lock().unwrap_or_else(|p| p.into_inner()).take())
            .collect()
    }

    fn record(&self, piece: &Piece, e: Error) {
        let mut slot = self.errors[piece.item]
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
        match self.sources {
            [one] => one.path(),
            many => format!("a batch of {} files", many.len()),
        }
    }

    /// The piece's source, opened (or shared).
    fn open(&self, piece: &Piece) -> Result<Arc<dyn Source>> {
        self.sources[self.items[piece.item].source].open(self.settings)
    }

    /// A batch of one open file into one device: that file's own batch transfers
    /// (cuFile's batch API), where it has them; `None` otherwise.
    fn device_batch(&self, work: &[Piece]) -> Option<Result<()>> {
        let [ItemSource::Open(file)] = self.sources else {
            return None;
        };
        let first = Span::ordinal(&work.first()?.dest)?;
        let mut reads = Vec::with_capacity(work.len());
        for p in work {
            match p.dest {
                Span::Device(d) if d.ordinal == first => reads.push((p.offset, d)),
                _ => return None,
            }
        }
        let counts = match file.device_batch(&reads, self.settings)? {
            Ok(counts) => counts,
            Err(e) => return Some(Err(e)),
        };
        for (p, got) in work.iter().zip(counts) {
            let failed = match got {
                Ok(n) if n == p.len() => None,
                Ok(n) => Some(truncated(file.path(), p.offset, p.len(), n)),
                Err(e) => Some(e),
            };
            if let Some(e) = failed {
                self.record(p, e);
            }
        }
        Some(Ok(()))
    }

    /// Read `len` bytes of the piece from `file` into `span` (the piece's destination,
    /// or its place in a bounce buffer); a short read is a truncation.
    fn read_from(
        &self,
        file: &Arc<dyn Source>,
        piece: &Piece,
        span: Span,
        settings: &Settings,
    ) -> Result<()> {
        let got = transfer_span(&**file, Direction::Read, span, piece.offset, settings)?;
        if got == piece.len() {
            return Ok(());
        }
        Err(truncated(file.path(), piece.offset, piece.len(), got))
    }

    fn segment(&self, part: &[Piece], cap: usize) -> Result<()> {
        let result = self.segment_inner(part, cap);
        if let Some(progress) = self.progress {
            let bytes: usize = part.iter().map(Piece::len).sum();
            progress.fetch_add(bytes as u64, Ordering::Relaxed);
        }
        result
    }

    fn segment_inner(&self, part: &[Piece], cap: usize) -> Result<()> {
        let Some(first) = part.first() else {
            return Ok(());
        };
        match Span::ordinal(&first.dest) {
            Some(ordinal) if part.len() > 1 || !alone(first, cap) => self.gather(part, ordinal),
            _ => {
                // Host memory, or a piece as large as a single read's task: each piece
                // straight into its destination.
                for p in part {
                    if cancel::cancelled() {
                        break; // the whole batch fails (see `submit_batch`)
                    }
                    let outcome = self
                        .open(p)
                        .and_then(|file| self.read_from(&file, p, p.dest, self.settings));
                    if let Err(e) = outcome {
                        self.record(p, e);
                    }
                }
                Ok(())
            }
        }
    }

    /// Read a task's pieces into one pinned bounce buffer, then move each run of
    /// neighbours in memory with one DMA. Pieces of files whose source has its own batch
    /// transfers (cuFile) go straight to the device instead; failed pieces move nothing.
    fn gather(&self, part: &[Piece], ordinal: usize) -> Result<()> {
        let context = crate::cuda::bind(ordinal)?;
        let lane = crate::cuda::thread_stream(&context)?;
        let extent = part.last().map_or(0, |p| p.at + p.len());
        // A checkpoint load's gather takes a buffer for its extent, not a full one, so
        // that its staging budget counts what it uses.
        let sized = match self.settings.staging.budget() {
            Some(_) => extent,
            None => staging_capacity(self.settings),
        };
        let mut ring = Ring::pinned_for(lane, 1, self.settings, sized)?;
        // The ring holds the task's staging reservation, if any: the reads below reserve
        // nothing more (see `crate::staging`).
        let settings = &*self.settings.unbudgeted();
        let staged = ring.stage(0, 0, extent);
        // Pieces that need no upload: read straight to the device, or failed.
        let mut moved = vec![false; part.len()];
        for (k, p) in part.iter().enumerate() {
            if cancel::cancelled() {
                return Err(cancel::error(&self.what()));
            }
            let outcome = self.open(p).and_then(|file| {
                let Span::Device(device) = p.dest else {
                    return Err(Error::InvalidArgument(
                        "a gathered batch task holds device pieces only".into(),
                    ));
                };
                match file.device_batch(&[(p.offset, device)], settings) {
                    Some(counts) => {
                        moved[k] = true;
                        let got = counts?.pop().unwrap_or(Ok(0))?;
                        if got == p.len() {
                            return Ok(());
                        }
                        Err(truncated(file.path(), p.offset, p.len(), got))
                    }
                    None => {
                        let to = Span::Host(staged.sub(p.at, p.len()));
                        self.read_from(&file, p, to, settings)
                    }
                }
            });
            if let Err(e) = outcome {
                moved[k] = true;
                self.record(p, e);
            }
        }
        let mut k = 0;
        while k < part.len() {
            if moved[k] {
                k += 1;
                continue;
            }
            let mut end = k + 1;
            while end < part.len() && !moved[end] && one_dma(&part[end - 1], &part[end]) {
                end += 1;
            }
            let (head, tail) = (&part[k], &part[end - 1]);
            let len = tail.at + tail.len() - head.at;
            let from: HostSpan = staged.sub(head.at, len);
            // SAFETY: `from` lies in the ring's pinned buffer, held until the ring has
            // drained below; the destination run starts at the head piece's device
            // address and is `len` bytes long: the pieces' own spans and, only where the
            // request said its gaps are writable, the bytes between them.
            unsafe { ring.upload(0, address(&head.dest), from.as_ptr(), len)? };
            k = end;
        }
        ring.drain()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::span::DeviceSpan;
    use proptest::prelude::*;

    /// Device items laid end to end (with `gap` bytes between them) from address 4096.
    fn items(sizes: &[usize], gap: u64) -> Vec<Item> {
        let mut at = 4096u64;
        sizes
            .iter()
            .map(|&len| {
                let item = Item {
                    source: 0,
                    file_offset: 7,
                    dest: Span::Device(DeviceSpan {
                        ptr: at,
                        len,
                        ordinal: 0,
                    }),
                };
                at += len as u64 + gap;
                item
            })
            .collect()
    }

    proptest! {
        #[test]
        fn segments_cover_every_item_once_within_the_cap(
            sizes in proptest::collection::vec(0usize..(3 << 20), 0..300),
            cap in (1usize << 10)..(8 << 20),
            gap in 0u64..64,
            gaps_writable in proptest::bool::ANY,
        ) {
            let its = items(&sizes, gap);
            let mut work = pieces(&its, cap);
            // Pieces tile every item, in order, none over the cap.
            let mut at = 0usize;
            let mut item = 0usize;
            for p in &work {
                prop_assert!(p.len() <= cap);
                if p.item != item {
                    prop_assert_eq!(at, sizes[item]);
                    item = p.item;
                    at = 0;
                }
                prop_assert_eq!(p.offset, 7 + at as u64);
                at += p.len();
            }
            let segs = segments(&mut work, cap, gaps_writable);
            let mut next = 0;
            for seg in &segs {
                prop_assert_eq!(seg.start, next);
                prop_assert!(seg.end > seg.start);
                let part = &work[seg.clone()];
                let last = part.last().unwrap();
                prop_assert!(last.at + last.len() <= cap, "staged within one buffer");
                for pair in part.windows(2) {
                    prop_assert!(pair[1].at >= pair[0].at + pair[0].len(), "no overlap");
                    // Neighbours in memory move with one DMA exactly when allowed.
                    let joined = one_dma(&pair[0], &pair[1]);
                    prop_assert_eq!(joined, gap == 0 || gaps_writable);
                }
                if part.len() > 1 {
                    prop_assert!(part.iter().all(|p| !alone(p, cap)));
                }
                next = seg.end;
            }
            prop_assert_eq!(next, work.len());
        }

    }

    proptest! {
        // Few cases: each writes files and reads them back.
        #![proptest_config(ProptestConfig::with_cases(48))]

        #[test]
        fn scattered_reads_land_every_item_in_host_memory(
            sizes in proptest::collection::vec(1usize..200_000, 1..4),
            picks in proptest::collection::vec(
                (0usize..4, 0.0f64..1.0, 0.0f64..1.0, 0usize..300, proptest::bool::ANY),
                0..40,
            ),
            bounce in prop_oneof![Just(64usize << 10), Just(1usize << 20)],
            threads in 1usize..5,
            seed in 0u64..1000,
        ) {
            let dir = tempfile::tempdir().unwrap();
            let mut files = Vec::new();
            for (f, &size) in sizes.iter().enumerate() {
                let bytes: Vec<u8> = (0..size).map(|i| (i * 31 + f * 7 + 1) as u8).collect();
                let path = dir.path().join(format!("f{f}"));
                std::fs::write(&path, &bytes).unwrap();
                files.push((path, bytes));
            }
            let settings = Settings {
                num_threads: threads,
                bounce_buffer_size: bounce,
                ..Settings::default()
            };
            // Odd files shared (opened once), even ones opened by each task.
            let sources: Vec<ItemSource> = files
                .iter()
                .enumerate()
                .map(|(f, (path, _))| {
                    if f % 2 == 1 {
                        let handle = FileHandle::open_with(path, "r", &settings).unwrap();
                        ItemSource::Open(handle.get().unwrap())
                    } else {
                        ItemSource::Path { path: path.clone(), size: None, version: None }
                    }
                })
                .collect();
            // Each pick: a range inside its file (or one running past its end), placed in
            // the destination after a gap, in shuffled order.
            let mut wanted = Vec::new();
            let mut at = 0usize;
            for &(f, start, share, gap, past_end) in &picks {
                let f = f % files.len();
                let size = files[f].1.len();
                let offset = ((size as f64) * start) as usize;
                let mut len = (((size - offset) as f64) * share) as usize;
                if past_end {
                    len = size - offset + 1;
                }
                at += gap;
                wanted.push((f, offset, len, at, past_end));
                at += len;
            }
            let mut order: Vec<usize> = (0..wanted.len()).collect();
            let mut state = seed;
            for i in (1..order.len()).rev() {
                state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1);
                order.swap(i, (state >> 33) as usize % (i + 1));
            }
            let mut dest = vec![0xEEu8; at];
            let whole = HostSpan::from_slice(&mut dest);
            let items: Vec<Item> = order
                .iter()
                .map(|&k| {
                    let (f, offset, len, at, _) = wanted[k];
                    Item { source: f, file_offset: offset as u64, dest: Span::Host(whole.sub(at, len)) }
                })
                .collect();
            let request = BatchRequest { sources, items, fail_fast: false, gaps_writable: false };
            let progress = AtomicU64::new(0);
            let errors = submit_batch(&settings, request, Some(&progress)).unwrap();
            prop_assert_eq!(errors.len(), wanted.len());
            prop_assert_eq!(progress.load(Ordering::Relaxed) as usize,
                            wanted.iter().map(|w| w.2).sum::<usize>());
            let mut covered = vec![false; dest.len()];
            for (&k, error) in order.iter().zip(&errors) {
                let (f, offset, len, at, past_end) = wanted[k];
                for c in &mut covered[at..at + len] {
                    *c = true;
                }
                if past_end {
                    prop_assert!(matches!(error, Some(Error::Truncated(_))), "{:?}", error);
                    let have = len - 1;
                    prop_assert_eq!(&dest[at..at + have], &files[f].1[offset..offset + have]);
                } else {
                    prop_assert!(error.is_none(), "{:?}", error);
                    prop_assert_eq!(&dest[at..at + len], &files[f].1[offset..offset + len]);
                }
            }
            // Nothing outside the items was written.
            for (i, c) in covered.iter().enumerate() {
                if !c {
                    prop_assert_eq!(dest[i], 0xEE);
                }
            }
        }

        #[test]
        fn segment_size_is_bounded(total in 0usize..(1 << 40), threads in 1usize..64,
                                   bounce in (1usize << 20)..(64 << 20)) {
            let s = segment_size(total, threads, bounce);
            prop_assert!(s <= bounce);
            prop_assert!(s >= MIN_SEGMENT.min(bounce));
        }
    }
}
