//! The read plan of a safetensors load, computed once and with no I/O: reads merged where
//! they follow each other both in a file and in their destination ([`merge`]), pieces
//! of tensors laid end to end at an alignment ([`pack`]), and reads grouped into staging
//! windows of bounded size ([`windows`]). Every offset and length is checked: an end past
//! 2**64 is an [`Error::InvalidArgument`], never a wrap or a panic.

use std::ops::Range;

use crate::error::{Error, Result};

/// One read: `length` bytes of file `file` at `file_offset`, into destination `dest` (an
/// opaque key: one buffer, or one device's allocation) at `at` (an offset or an address
/// in that destination).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Read {
    /// The file, as an index the caller chose.
    pub file: usize,
    /// Where the bytes start in the file.
    pub file_offset: u64,
    /// How many bytes.
    pub length: u64,
    /// The destination, as a key the caller chose: reads into two keys never merge.
    pub dest: u64,
    /// Where the bytes land in the destination.
    pub at: u64,
}

/// A stretch of a file: `length` bytes of file `file` at `file_offset` (a piece of a
/// tensor to [`pack`], or a read to group into [`windows`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    /// The file, as an index the caller chose.
    pub file: usize,
    /// Where the bytes start in the file.
    pub file_offset: u64,
    /// How many bytes.
    pub length: u64,
}

/// Which order [`merge`] takes the reads in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Order {
    /// As given: only reads next to each other in the input can merge.
    Given,
    /// Sorted by file, then file offset (stable: ties keep their input order).
    ByFile,
}

/// One read of a [`Merged`] plan and the input reads it covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Run {
    /// The merged read: the first input read's file, offset, destination and place, and
    /// the lengths of all of them.
    pub read: Read,
    /// The positions in [`Merged::order`] of the input reads it covers.
    pub members: Range<usize>,
}

/// Reads merged by [`merge`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Merged {
    /// Input indices in the order they were merged.
    pub order: Vec<usize>,
    /// The merged reads, each covering consecutive entries of `order`.
    pub runs: Vec<Run>,
}

impl Merged {
    /// The input indices run `k` covers, in merge order.
    pub fn members(&self, k: usize) -> &[usize] {
        &self.order[self.runs[k].members.clone()]
    }
}

/// Pieces laid end to end by [`pack`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Packed {
    /// Each piece's place in the packed destination (a multiple of the alignment).
    pub places: Vec<u64>,
    /// The reads that fill the places (destination key 0), merged; their members are
    /// indices of pieces (a piece of no bytes has no read).
    pub reads: Merged,
    /// The bytes the packed destination spans.
    pub total: u64,
}

/// One staging window of [`windows`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window {
    /// The file it reads.
    pub file: usize,
    /// Where it starts in the file (its first read's offset).
    pub offset: u64,
    /// How many bytes it reads, gaps between its reads included.
    pub length: u64,
    /// Whether it is one read longer than the bound (read straight into its destination).
    pub alone: bool,
    /// The positions in [`Windows::order`] of the reads it holds.
    pub members: Range<usize>,
}

/// Reads grouped by [`windows`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Windows {
    /// Input indices in file order (by file, then offset, then length; stable).
    pub order: Vec<usize>,
    /// The windows, in file order, each holding consecutive entries of `order`.
    pub windows: Vec<Window>,
}

impl Windows {
    /// The input indices window `k` holds, in file order.
    pub fn members(&self, k: usize) -> &[usize] {
        &self.order[self.windows[k].members.clone()]
    }
}

/// `start + length`, or an `InvalidArgument` naming input `i` (a `kind`) and `what`
/// `start` is when it passes 2**64.
fn end_of(kind: &str, i: usize, what: &str, start: u64, length: u64) -> Result<u64> {
    start.checked_add(length).ok_or_else(|| {
        Error::InvalidArgument(format!(
            "{kind} {i}: {what} {start} + length {length} overflows 64 bits"
        ))
    })
}

/// Check that every read ends within 2**64, both in its file and in its destination.
fn check_reads(reads: &[Read]) -> Result<()> {
    for (i, r) in reads.iter().enumerate() {
        end_of("read", i, "file offset", r.file_offset, r.length)?;
        end_of("read", i, "destination offset", r.at, r.length)?;
    }
    Ok(())
}

/// `reads` merged: taken in `order` (as given, or sorted by file then offset), each read
/// that follows the one before it both in the same file (contiguous offsets) and in the
/// same destination (contiguous places) made one run with it. Every input read is in
/// exactly one run. An offset or place plus length past 2**64 is an `InvalidArgument`.
pub fn merge(reads: &[Read], order: Order) -> Result<Merged> {
    check_reads(reads)?;
    let mut sequence: Vec<usize> = (0..reads.len()).collect();
    if order == Order::ByFile {
        sequence.sort_by_key(|&i| (reads[i].file, reads[i].file_offset));
    }
    Ok(merge_checked(reads, sequence))
}

/// The one merge: `reads` (already checked) taken in the order of `sequence`.
fn merge_checked(reads: &[Read], sequence: Vec<usize>) -> Merged {
    let mut runs: Vec<Run> = Vec::new();
    for (k, &i) in sequence.iter().enumerate() {
        let r = reads[i];
        if let Some(last) = runs.last_mut() {
            let l = last.read;
            // The sums cannot overflow: each run lies within the span of checked reads.
            if l.file == r.file
                && l.dest == r.dest
                && l.file_offset.checked_add(l.length) == Some(r.file_offset)
                && l.at.checked_add(l.length) == Some(r.at)
            {
                if let Some(length) = l.length.checked_add(r.length) {
                    last.read.length = length;
                    last.members.end = k + 1;
                    continue;
                }
            }
        }
        runs.push(Run {
            read: r,
            members: k..k + 1,
        });
    }
    Merged {
        order: sequence,
        runs,
    }
}

/// `pieces` laid end to end in one destination, each at the next multiple of `align`
/// (the first at 0): each piece's place, the merged reads that fill the places, and the
/// bytes in all. An `align` of 0, or a place, file offset or total past 2**64, is an
/// `InvalidArgument`.
pub fn pack(pieces: &[Piece], align: u64) -> Result<Packed> {
    if align == 0 {
        return Err(Error::InvalidArgument(
            "the alignment of packed pieces must be at least 1".into(),
        ));
    }
    let too_large = |i: usize| {
        Error::InvalidArgument(format!(
            "piece {i}: the packed pieces span more than 2**64 bytes"
        ))
    };
    let mut places = Vec::with_capacity(pieces.len());
    let mut reads = Vec::new();
    let mut owners = Vec::new();
    let mut end = 0u64;
    for (i, p) in pieces.iter().enumerate() {
        end_of("piece", i, "file offset", p.file_offset, p.length)?;
        let place = end
            .div_ceil(align)
            .checked_mul(align)
            .ok_or_else(|| too_large(i))?;
        places.push(place);
        if p.length > 0 {
            reads.push(Read {
                file: p.file,
                file_offset: p.file_offset,
                length: p.length,
                dest: 0,
                at: place,
            });
            owners.push(i);
        }
        end = place.checked_add(p.length).ok_or_else(|| too_large(i))?;
    }
    // Every read is checked: its file end above, its place end by `end`.
    let mut merged = merge_checked(&reads, (0..reads.len()).collect());
    for i in &mut merged.order {
        *i = owners[*i];
    }
    Ok(Packed {
        places,
        reads: merged,
        total: end,
    })
}

/// The staging windows that read `reads`, in file order (by file, then offset, then
/// length; ties keep their input order). Each window covers consecutive reads of one
/// file, reading through gaps of fewer than `gap` bytes between the end so far and the
/// next read, and spans at most `bound` bytes; a read longer than `bound` is a window of
/// its own (`alone`), which closes the window before it. Every read is in exactly one
/// window. A file offset plus length past 2**64 is an `InvalidArgument`.
pub fn windows(reads: &[Piece], bound: u64, gap: u64) -> Result<Windows> {
    let ends = reads
        .iter()
        .enumerate()
        .map(|(i, r)| end_of("read", i, "file offset", r.file_offset, r.length))
        .collect::<Result<Vec<u64>>>()?;
    let mut order: Vec<usize> = (0..reads.len()).collect();
    order.sort_by_key(|&i| (reads[i].file, reads[i].file_offset, reads[i].length));
    let mut out: Vec<Window> = Vec::new();
    // The open window: its file, first position in `order`, start and end in the file.
    let mut open: Option<(usize, usize, u64, u64)> = None;
    let close = |open: &mut Option<(usize, usize, u64, u64)>, out: &mut Vec<Window>, k: usize| {
        if let Some((file, first, start, end)) = open.take() {
            out.push(Window {
                file,
                offset: start,
                length: end - start, // a window's end is never before its start
                alone: false,
                members: first..k,
            });
        }
    };
    for (k, &i) in order.iter().enumerate() {
        let (r, r_end) = (reads[i], ends[i]);
        if r.length > bound {
            close(&mut open, &mut out, k);
            out.push(Window {
                file: r.file,
                offset: r.file_offset,
                length: r.length,
                alone: true,
                members: k..k + 1,
            });
            continue;
        }
        if let Some((file, _, start, end)) = &mut open {
            // `r.file_offset - end < gap`, where a read that starts before the end (the
            // difference negative) is always within the gap. The new end is at least
            // the old one, itself at least the start.
            let near = end
                .checked_add(gap)
                .is_none_or(|limit| r.file_offset < limit);
            let new_end = (*end).max(r_end);
            if *file == r.file && near && new_end - *start <= bound {
                *end = new_end;
                continue;
            }
        }
        close(&mut open, &mut out, k);
        open = Some((r.file, k, r.file_offset, r_end));
    }
    close(&mut open, &mut out, order.len());
    Ok(Windows {
        order,
        windows: out,
    })
}
