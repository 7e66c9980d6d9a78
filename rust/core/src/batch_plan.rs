//! Batch reads: many files, or many byte ranges of one file, into one allocation.
//!
//! This module plans: it sizes the files (in parallel on the pool), lays the elements
//! end to end (each at a multiple of an alignment, if asked) and reports each input's
//! place, length and outcome. The reads themselves are one batch request
//! ([`crate::request::submit_batch`]), the request path's form for many reads, which cuts,
//! groups and schedules them and reports each element's outcome, so that a caller can
//! fail the batch on the first error or skip the failed elements.

use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;

use rayon::prelude::*;

use crate::cancel;
use crate::error::{Error, Result};
use crate::file::FileHandle;
use crate::request::{submit_batch, BatchRequest, Item, ItemSource};
use crate::settings::Settings;
use crate::source::{self, unsized_file};
use crate::span::Span;

/// Where one element of a batch comes from.
#[derive(Debug, Clone)]
pub(crate) enum Origin {
    /// A file from this byte offset (0 for a whole file): opened, read and closed by the
    /// task that reads it; with the version it was sized at (a URL's `ETag`), if any.
    File(PathBuf, u64, Option<String>),
    /// Bytes at this offset of the batch's shared file (`read_ranges`).
    Range(u64),
}

/// One element: its origin, its length, and where it lands in the destination.
#[derive(Debug, Clone)]
pub(crate) struct Element {
    /// The file, or the offset in the batch's shared file, the bytes come from.
    pub origin: Origin,
    /// How many bytes the element reads.
    pub len: usize,
    /// Byte offset in the destination where the element's bytes land.
    pub dst: usize,
}

/// A file's size, and the version it was sized at (a URL's `ETag`), if any.
type Sized = (u64, Option<String>);

/// The sizes of `paths` (regular files only), looked up in parallel on the pool, each
/// with the version it was sized at; each failure names its path.
fn file_sizes(settings: &Settings, paths: &[PathBuf]) -> Result<Vec<Result<Sized>>> {
    let pool = crate::pool::pool(settings.num_threads)?;
    let carried = cancel::carry();
    let sizes = pool.install(|| {
        paths
            .par_iter()
            .map(|path| {
                if source::is_remote(path) {
                    // A URL: its size, asked of the server (cancellably, as the caller is).
                    carried.run(|| {
                        let file = source::open_sized(path, None, None, settings)?;
                        Ok((file.size()?, file.version().map(str::to_string)))
                    })
                } else if carried.cancelled() {
                    Err(cancel::error(&path.to_string_lossy()))
                } else {
                    Ok((regular_file_size(path)?, None))
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
        let size = size.and_then(|(s, version)| {
            let len = usize::try_from(s).map_err(|_| {
                Error::InvalidArgument(format!("'{}' is too large", path.display()))
            })?;
            Ok((len, version))
        });
        match size {
            Ok((len, version)) => inputs.push(Some((Origin::File(path, 0, version), len))),
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
        let clamped = file_size.and_then(|(file_size, version)| {
            let offset = match start {
                Start::Offset(o) => o.min(file_size),
                Start::Suffix(n) => file_size.saturating_sub(n),
            };
            let len = size.map_or(file_size - offset, |s| s.min(file_size - offset));
            let len = usize::try_from(len).map_err(|_| {
                Error::InvalidArgument(format!("'{}' is too large", path.display()))
            })?;
            Ok((offset, len, version))
        });
        match clamped {
            Ok((offset, len, version)) => {
                inputs.push(Some((Origin::File(path, offset, version), len)))
            }
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
/// allocation, end to end. Every range must lie inside the file; one that does not is an
/// [`Error::InvalidArgument`] naming it.
pub fn plan_ranges(settings: &Settings, path: &Path, ranges: &[(u64, u64)]) -> Result<Plan> {
    let lens = ranges
        .iter()
        .enumerate()
        .map(|(i, &(_, size))| usize::try_from(size).map_err(|_| too_large(i)))
        .collect::<Result<Vec<usize>>>()?;
    let (starts, total) = layout_aligned(&lens, 1)?;
    let handle = FileHandle::open_with(path, "r", settings)?;
    let file_size = handle.get()?.size_for("read_ranges", settings)?;
    plan_ranges_placed(handle, file_size, ranges, &starts, total)
}

fn too_large(i: usize) -> Error {
    Error::InvalidArgument(format!("range {i} is too large"))
}

/// Byte ranges of the open file `handle` (of `file_size` bytes) into one destination of
/// `total` bytes, range `i` (`(file offset, length)`) at `starts[i]`, as the caller laid
/// them out (end to end for [`plan_ranges`]; an Arrow IPC table's
/// [`crate::arrow_ipc::Layout`], read through the handle its metadata came from); every
/// range must lie inside the file and inside the destination, and no two may overlap
/// there.
pub(crate) fn plan_ranges_placed(
    handle: FileHandle,
    file_size: u64,
    ranges: &[(u64, u64)],
    starts: &[usize],
    total: usize,
) -> Result<Plan> {
    if starts.len() != ranges.len() {
        return Err(Error::InvalidArgument(format!(
            "{} places for {} ranges",
            starts.len(),
            ranges.len()
        )));
    }
    let mut inputs = Vec::with_capacity(ranges.len());
    for (i, &(offset, size)) in ranges.iter().enumerate() {
        if offset.checked_add(size).is_none_or(|end| end > file_size) {
            return Err(Error::InvalidArgument(format!(
                "range {i} (offset {offset}, size {size}) ends past the end of '{}', which \
                 has {file_size} bytes; every range must lie inside the file",
                source::redact(&handle.path().display().to_string())
            )));
        }
        let len = usize::try_from(size).map_err(|_| too_large(i))?;
        inputs.push(Some((Origin::Range(offset), len)));
    }
    // The places, in order, must not overlap or pass the destination's end.
    let mut order: Vec<usize> = (0..ranges.len()).collect();
    order.sort_unstable_by_key(|&i| starts[i]);
    let mut end = 0usize;
    for i in order {
        let len = ranges[i].1 as usize; // checked above
        let fits = starts[i] >= end && starts[i].checked_add(len).is_some_and(|e| e <= total);
        if !fits {
            return Err(Error::InvalidArgument(format!(
                "range {i} placed at {} ({len} bytes) overlaps another or passes the end of \
                 its destination of {total} bytes",
                starts[i]
            )));
        }
        end = starts[i] + len;
    }
    Plan::with_offsets(
        inputs,
        Some(handle),
        Vec::new(),
        false,
        starts.to_vec(),
        total,
    )
}

/// Each input's length (0 for one that failed before any read).
fn lengths_of(inputs: &[Option<(Origin, usize)>]) -> Vec<usize> {
    inputs
        .iter()
        .map(|input| input.as_ref().map_or(0, |(_, len)| *len))
        .collect()
}

impl Plan {
    fn new(
        inputs: Vec<Option<(Origin, usize)>>,
        shared: Option<FileHandle>,
        failures: Vec<(usize, Error)>,
        skip: bool,
        align: usize,
    ) -> Result<Self> {
        let (offsets, total) = layout_aligned(&lengths_of(&inputs), align)?;
        Self::with_offsets(inputs, shared, failures, skip, offsets, total)
    }

    /// A plan whose input `i` lands at `offsets[i]` of a destination of `total` bytes.
    fn with_offsets(
        inputs: Vec<Option<(Origin, usize)>>,
        shared: Option<FileHandle>,
        failures: Vec<(usize, Error)>,
        skip: bool,
        mut offsets: Vec<usize>,
        total: usize,
    ) -> Result<Self> {
        let lengths = lengths_of(&inputs);
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

    /// The plan's elements as the items of one batch request into `dest`: each file its
    /// own source (opened by the task that reads it), or the shared file for ranges.
    fn items(&mut self, dest: Span) -> Result<(Vec<ItemSource>, Vec<Item>)> {
        let mut sources = Vec::new();
        if let Some(file) = &self.shared {
            sources.push(ItemSource::Open(file.get()?));
        }
        let mut items = Vec::with_capacity(self.elements.len());
        for element in self.elements.drain(..) {
            let (source, file_offset) = match element.origin {
                Origin::Range(offset) => (0, offset),
                Origin::File(path, offset, version) => {
                    // A whole file, sized when the batch was planned: a remote one opens
                    // with no second size request, pinned to the version sized.
                    let size = (offset == 0).then_some(element.len as u64);
                    sources.push(ItemSource::Path {
                        path,
                        size,
                        version,
                    });
                    (sources.len() - 1, offset)
                }
            };
            items.push(Item {
                source,
                file_offset,
                dest: dest.sub(element.dst, element.len),
            });
        }
        Ok((sources, items))
    }

    /// The bytes the batch reads: the size its destination needs.
    pub fn total(&self) -> usize {
        self.offsets.last().copied().unwrap_or(0)
    }

    /// Read every element into `dest` (at least [`Plan::total`] bytes), in parallel on
    /// the pool; blocks until all are done. Without `skip`, the first failed input (in
    /// input order) is the error.
    pub fn read(
        mut self,
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
        let (sources, items) = self.items(dest)?;
        let request = BatchRequest {
            sources,
            items,
            fail_fast: !self.skip,
            gaps_writable: true,
        };
        let errors = submit_batch(settings, request, progress)?;
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
#[cfg(test)]
pub(crate) fn layout(sizes: &[usize]) -> Result<(Vec<usize>, usize)> {
    layout_aligned(sizes, 1)
}

/// Lay `sizes` one after another, each starting at a multiple of `align` (a power of
/// two): each element's start, and the total (the end of the last element).
pub(crate) fn layout_aligned(sizes: &[usize], align: usize) -> Result<(Vec<usize>, usize)> {
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

#[cfg(test)]
mod tests {
    use super::*;

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
