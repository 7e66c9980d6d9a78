//! IPC buffer compression (LZ4 frames, ZSTD) decoded on the host: each compressed buffer
//! starts with its uncompressed length (-1: stored as is), and decodes to exactly that
//! many bytes, or the file is malformed. The declared length is checked before anything
//! is allocated or decoded ([`check_declared`]: against what the column needs, the
//! frame's own content size and what its compressed bytes can hold; [`DecodeBudget`]:
//! the whole call against the machine's memory), then each buffer decodes into a
//! destination of exactly that size, which never grows. Errors name the buffer: its
//! record batch, column and position.

use std::cell::RefCell;
use std::io::Read;

use arrow_schema::DataType;
use rayon::prelude::*;

pub use super::framing::Codec;
use super::framing::{malformed, ReadAt};
use super::lz4::{lz4_frame, Lz4Frame};
use super::plan::Layout;
use super::plan::{Column, ReadPlan};
use super::runs::{coalesce, Runs};
use crate::allocation::{Allocation, Placement};
use crate::error::{Error, Result};

/// The most bytes one byte of a ZSTD frame can decode to: a block of at most 128 KiB
/// takes at least 4 bytes (a 3-byte header and one byte repeated).
pub(super) const ZSTD_MAX_RATIO: u64 = 32 * 1024;
/// The most bytes one byte of an LZ4 frame decodes to: a match of n bytes takes at least
/// n / 255 bytes of length.
const LZ4_MAX_RATIO: u64 = 256;
/// Room for a frame's fixed overhead in the ratio bounds.
const FRAME_SLACK: u64 = 1 << 10;
pub(super) const ZSTD_MAGIC: u32 = 0xFD2F_B528;

/// The most bytes a buffer may declare where its column needs `need` (more than 0): the
/// format lets writers pad buffers (to 8 or 64 bytes) and keep a little more; twice the
/// need is far beyond any writer's padding, and far below a decompression bomb's claim.
fn need_limit(need: u64) -> u64 {
    need.saturating_mul(2).saturating_add(64)
}

/// Check a compressed buffer's declared uncompressed length `declared` before anything is
/// allocated or decoded: at least what its column needs (`need`), at most twice that (when
/// the need is known: variable-length data is sized by offsets not yet read), agreeing with
/// the content size its frame states (`frame`: the frame's first bytes, all of it for
/// LZ4), and no more than its `body_len` compressed bytes can hold.
pub fn check_declared(
    codec: Codec,
    declared: u64,
    frame: &[u8],
    body_len: u64,
    need: u64,
    what: &str,
) -> Result<()> {
    if declared < need {
        return Err(malformed(format!(
            "{what}: a buffer of {declared} bytes where {need} are needed"
        )));
    }
    if need > 0 && declared > need_limit(need) {
        return Err(malformed(format!(
            "{what}: says it holds {declared} bytes uncompressed where its column needs \
             {need}; refused before decoding"
        )));
    }
    // An LZ4 frame walked whole fills the buffer, so its content size is the buffer's; a
    // ZSTD buffer may hold several frames, so its first frame must not hold more.
    let content = match codec {
        Codec::Zstd => zstd_content_size(frame).filter(|&c| c > declared),
        Codec::Lz4Frame => lz4_frame(frame)
            .and_then(|f| f.content_size)
            .filter(|&c| c != declared),
    };
    if let Some(content) = content {
        return Err(malformed(format!(
            "{what}: says it holds {declared} bytes uncompressed, its {codec:?} frame \
             {content}"
        )));
    }
    let ratio = match codec {
        Codec::Zstd => ZSTD_MAX_RATIO,
        Codec::Lz4Frame => LZ4_MAX_RATIO,
    };
    if declared > body_len.saturating_mul(ratio).saturating_add(FRAME_SLACK) {
        return Err(malformed(format!(
            "{what}: says it holds {declared} bytes uncompressed, more than its {body_len} \
             compressed bytes can hold"
        )));
    }
    Ok(())
}

/// The bytes one call may decode in all: the machine's physical memory. Every declared
/// length is counted against it before the table's memory is allocated.
pub struct DecodeBudget {
    left: u64,
    limit: u64,
}

impl DecodeBudget {
    /// A budget of this machine's physical memory.
    pub fn new() -> Self {
        let limit = physical_memory();
        Self { left: limit, limit }
    }

    /// Count `bytes` more against the budget.
    pub fn take(&mut self, bytes: u64) -> Result<()> {
        if bytes > self.left {
            return Err(malformed(format!(
                "its compressed buffers say they hold more than this machine's {} bytes of \
                 memory once decoded; refused before decoding",
                self.limit
            )));
        }
        self.left -= bytes;
        Ok(())
    }
}

impl Default for DecodeBudget {
    fn default() -> Self {
        Self::new()
    }
}

/// This machine's physical memory in bytes (`u64::MAX` where it cannot be told).
fn physical_memory() -> u64 {
    // SAFETY: sysconf has no memory preconditions.
    let pages = unsafe { libc::sysconf(libc::_SC_PHYS_PAGES) };
    // SAFETY: as above.
    let size = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    match (u64::try_from(pages), u64::try_from(size)) {
        (Ok(p), Ok(s)) if p > 0 && s > 0 => p.saturating_mul(s),
        _ => u64::MAX,
    }
}

/// The content size a ZSTD frame's header states (None: a header without one, with a
/// dictionary, or not a ZSTD frame header at all; the host then decodes it).
pub fn zstd_content_size(frame: &[u8]) -> Option<u64> {
    let magic = u32::from_le_bytes(*frame.first_chunk::<4>()?);
    let descriptor = *frame.get(4)?;
    if magic != ZSTD_MAGIC || descriptor & 0b1000 != 0 || descriptor & 0b11 != 0 {
        return None;
    }
    let single_segment = descriptor & 0b10_0000 != 0;
    let at = 5 + usize::from(!single_segment);
    let size_bytes = match descriptor >> 6 {
        0 if single_segment => 1,
        0 => return None,
        1 => 2,
        2 => 4,
        _ => 8,
    };
    let field = frame.get(at..at + size_bytes)?;
    let mut le = [0u8; 8];
    le[..size_bytes].copy_from_slice(field);
    let value = u64::from_le_bytes(le);
    Some(if size_bytes == 2 { value + 256 } else { value })
}

thread_local! {
    /// Each thread's ZSTD decoding context, made at its first use (tens of KiB of tables).
    static ZSTD: RefCell<Option<zstd::bulk::Decompressor<'static>>> = const { RefCell::new(None) };
}

/// Decode the ZSTD frames of `body` into `out` (a slice, or a `Vec`'s spare capacity) in
/// one call, which fails if they hold more bytes than it has room for.
fn zstd_in_place<C: zstd::zstd_safe::WriteBuf + ?Sized>(
    body: &[u8],
    out: &mut C,
) -> std::io::Result<usize> {
    ZSTD.with(|cell| {
        let mut slot = cell.borrow_mut();
        let context = match &mut *slot {
            Some(context) => context,
            None => slot.insert(zstd::bulk::Decompressor::new()?),
        };
        context.decompress_to_buffer(body, out)
    })
}

/// Decode the ZSTD frame `body` into `out`: the bytes written, at most `out.len()`.
pub(super) fn zstd_frame_into(body: &[u8], out: &mut [u8]) -> std::io::Result<usize> {
    zstd_in_place(body, out)
}

/// How many bytes `body` decodes to with `codec`, counting at most `limit` (so a buffer
/// that holds more than it says is told apart after one byte more), into no memory.
fn decoded_len(codec: Codec, body: &[u8], limit: u64) -> std::io::Result<u64> {
    let mut sink = std::io::sink();
    match codec {
        Codec::Lz4Frame => std::io::copy(
            &mut lz4_flex::frame::FrameDecoder::new(body).take(limit),
            &mut sink,
        ),
        Codec::Zstd => std::io::copy(
            &mut zstd::stream::read::Decoder::with_buffer(body)?.take(limit),
            &mut sink,
        ),
    }
}

/// Decode `body` with `codec` into `slot`: whether it fills it exactly.
fn decode_exact(codec: Codec, body: &[u8], slot: &mut [u8]) -> bool {
    match codec {
        Codec::Zstd => zstd_in_place(body, slot).is_ok_and(|n| n == slot.len()),
        Codec::Lz4Frame => match lz4_frame(body) {
            Some(frame) if !frame.checksums => lz4_blocks_in_place(body, &frame, slot),
            // Checksummed or unusual frames: the frame decoder checks them.
            _ => {
                let mut frame = lz4_flex::frame::FrameDecoder::new(body);
                frame.read_exact(slot).is_ok() && frame.read(&mut [0u8; 1]).is_ok_and(|n| n == 0)
            }
        },
    }
}

/// The error of a buffer that does not decode to the `declared` bytes it says it holds:
/// what it decodes to instead (counted up to one byte more, into no memory), or why it
/// does not decode.
fn mismatch(codec: Codec, body: &[u8], declared: u64, what: &str) -> Error {
    match decoded_len(codec, body, declared.saturating_add(1)) {
        Ok(n) if n > declared => malformed(format!(
            "{what}: says it holds {declared} bytes uncompressed, decodes to more"
        )),
        Ok(n) if n < declared => malformed(format!(
            "{what}: says it holds {declared} bytes uncompressed, decodes to {n}"
        )),
        Ok(_) => malformed(format!(
            "{what}: {codec:?} data decode differently each time"
        )),
        Err(e) => malformed(format!("{what}: {codec:?} data: {e}")),
    }
}

/// Decode one compressed buffer (`raw`, its 8-byte length prefix first) that must hold at
/// least `need` bytes once decoded: its declared length checked first
/// ([`check_declared`]), then decoded into exactly that many bytes.
pub fn decode(codec: Codec, raw: &[u8], need: u64, what: &str) -> Result<Vec<u8>> {
    if raw.is_empty() {
        return if need == 0 {
            Ok(Vec::new())
        } else {
            Err(malformed(format!(
                "{what}: an empty buffer where {need} bytes are needed"
            )))
        };
    }
    let (prefix, body) = raw.split_first_chunk::<8>().ok_or_else(|| {
        malformed(format!(
            "{what}: a compressed buffer of {} bytes",
            raw.len()
        ))
    })?;
    let declared = i64::from_le_bytes(*prefix);
    if declared == -1 {
        if (body.len() as u64) < need {
            return Err(malformed(format!(
                "{what}: a buffer of {} bytes where {need} are needed",
                body.len()
            )));
        }
        return Ok(body.to_vec());
    }
    let declared = u64::try_from(declared)
        .map_err(|_| malformed(format!("{what}: uncompressed length {declared}")))?;
    check_declared(codec, declared, body, body.len() as u64, need, what)?;
    let size = usize::try_from(declared)
        .map_err(|_| malformed(format!("{what}: uncompressed length {declared}")))?;
    let mut out = Vec::new();
    out.try_reserve_exact(size).map_err(|_| {
        Error::OutOfMemory(format!(
            "{what}: could not allocate the {declared} bytes it says it holds uncompressed"
        ))
    })?;
    out.resize(size, 0);
    if !decode_exact(codec, body, &mut out) {
        return Err(mismatch(codec, body, declared, what));
    }
    Ok(out)
}

/// One range of a compressed plan, read, on its way to its place in the table's memory.
enum Piece<'a> {
    /// An uncompressed range: goes in as it is.
    Plain(&'a [u8]),
    /// A buffer stored uncompressed (declared length -1, prefix first): its body goes in.
    Stored(&'a [u8]),
    /// A compressed buffer (`raw`, its length prefix first) whose declared length passed
    /// [`check_declared`]: decoded straight into its place of exactly that size.
    InPlace {
        codec: Codec,
        raw: &'a [u8],
        declared: usize,
    },
}

impl Piece<'_> {
    /// The bytes it takes in place.
    fn size(&self) -> usize {
        match self {
            Piece::Plain(bytes) => bytes.len(),
            Piece::Stored(raw) => raw.len() - 8,
            Piece::InPlace { declared, .. } => *declared,
        }
    }
}

/// A compressed plan's ranges, read and sized, laid out at multiples of an alignment:
/// [`Assembly::decode_into`] then decodes them into one allocation of
/// [`total`](Self::total) bytes, with no copy of the decoded table in between.
struct Assembly<'a> {
    pieces: Vec<Piece<'a>>,
    labels: Vec<String>,
    /// Each range's offset in the allocation.
    offsets: Vec<usize>,
    /// Each range's size once decoded.
    sizes: Vec<usize>,
    /// The allocation's size.
    total: usize,
}

/// The bytes of a plan's ranges: neighbouring buffers of a record batch body read as one
/// run (one read each, which the request path spreads over the I/O threads), and each
/// range's run and offset in it.
struct RangesRead {
    runs: Vec<Vec<u8>>,
    place: Vec<(usize, u64)>,
}

impl RangesRead {
    /// Read `plan`'s ranges from `reader`.
    fn of(reader: &(impl ReadAt + ?Sized), plan: &ReadPlan) -> Result<Self> {
        // IPC pads every buffer to a multiple of 8 bytes: neighbours join a run.
        let Runs { runs, place } = coalesce(&plan.ranges, 8);
        let runs = runs
            .into_iter()
            .map(|(offset, len)| {
                let len = usize::try_from(len).map_err(|_| malformed("a buffer is too large"))?;
                reader.read_at(offset, len)
            })
            .collect::<Result<_>>()?;
        Ok(Self { runs, place })
    }

    /// The bytes of range `i` (`len` long).
    fn range(&self, i: usize, len: u64) -> &[u8] {
        let (run, at) = self.place[i];
        &self.runs[run][at as usize..(at + len) as usize]
    }
}

/// Size every range of `plan` (read into `read`) once decoded: a compressed buffer by the
/// length it declares, checked ([`check_declared`], and the whole plan against a
/// [`DecodeBudget`]) before anything is allocated or decoded.
fn prepare<'a>(read: &'a RangesRead, plan: &'a ReadPlan, align: usize) -> Result<Assembly<'a>> {
    let labels = labels(plan);
    let mut pieces = Vec::with_capacity(plan.ranges.len());
    let mut budget = DecodeBudget::new();
    for (i, &(_, len)) in plan.ranges.iter().enumerate() {
        let raw = read.range(i, len);
        let need = plan.needs[i];
        let what = &labels[i];
        let piece = match (plan.codecs[i], declared(raw)) {
            (None, _) => Piece::Plain(raw),
            (Some(_), Some(-1)) => {
                let body = (raw.len() - 8) as u64;
                if body < need {
                    return Err(malformed(format!(
                        "{what}: a buffer of {body} bytes where {need} are needed"
                    )));
                }
                Piece::Stored(raw)
            }
            (Some(codec), Some(n)) => {
                let n = u64::try_from(n)
                    .map_err(|_| malformed(format!("{what}: uncompressed length {n}")))?;
                let body = &raw[8..];
                check_declared(codec, n, body, body.len() as u64, need, what)?;
                budget.take(n)?;
                let declared = usize::try_from(n)
                    .map_err(|_| malformed(format!("{what}: uncompressed length {n}")))?;
                Piece::InPlace {
                    codec,
                    raw,
                    declared,
                }
            }
            (Some(_), None) if need == 0 && raw.is_empty() => Piece::Plain(raw),
            (Some(_), None) => {
                return Err(malformed(format!(
                    "{what}: a compressed buffer of {} bytes{}",
                    raw.len(),
                    if need > 0 {
                        format!(" where {need} bytes are needed")
                    } else {
                        String::new()
                    }
                )))
            }
        };
        pieces.push(piece);
    }
    // The values of a column a tensor can view keep only the bytes their rows need (a
    // writer may declare a padded buffer), so that the next batch's can follow them.
    let values = plan.is_tensor_values();
    let sizes: Vec<usize> = pieces
        .iter()
        .enumerate()
        .map(|(r, p)| {
            let need = usize::try_from(plan.needs[r]).unwrap_or(usize::MAX);
            if values[r] {
                p.size().min(need)
            } else {
                p.size()
            }
        })
        .collect();
    let Layout { offsets, total } =
        plan.layout(&sizes.iter().map(|&s| s as u64).collect::<Vec<_>>(), align)?;
    Ok(Assembly {
        pieces,
        labels,
        offsets,
        sizes,
        total,
    })
}

/// The length a compressed buffer's prefix declares (`None`: shorter than the prefix).
fn declared(raw: &[u8]) -> Option<i64> {
    raw.first_chunk::<8>().map(|p| i64::from_le_bytes(*p))
}

/// `work` on the I/O pool when it has more than one thing to do and the pool more than
/// one thread, else in the calling thread (rayon's iterators run there inline).
fn on_pool<T: Send>(items: usize, work: impl FnOnce() -> Result<T> + Send) -> Result<T> {
    let threads = crate::settings::current().map_or(1, |s| s.num_threads);
    if threads > 1 && items > 1 {
        crate::pool::pool(threads)?.install(work)
    } else {
        work()
    }
}

impl Assembly<'_> {
    /// Decode every range into its place in `out` (exactly [`total`](Self::total) bytes;
    /// the gaps between ranges are zeroed), the buffers in parallel on the I/O pool.
    pub fn decode_into(self, out: &mut [u8]) -> Result<()> {
        if out.len() != self.total {
            return Err(Error::InvalidArgument(format!(
                "a decoded table takes {} bytes, not {}",
                self.total,
                out.len()
            )));
        }
        // The layout places ranges column by column, not in range order: cut `out` in
        // the order of the places, then hand each range its slot.
        let mut order: Vec<usize> = (0..self.offsets.len()).collect();
        order.sort_unstable_by_key(|&r| self.offsets[r]);
        let mut placed: Vec<Option<&mut [u8]>> = (0..self.offsets.len()).map(|_| None).collect();
        let mut rest = out;
        let mut at = 0;
        for r in order {
            let (offset, size) = (self.offsets[r], self.sizes[r]);
            let gap_len = offset.checked_sub(at).ok_or_else(|| {
                Error::InvalidArgument("two decoded buffers overlap in the table".into())
            })?;
            let (gap, tail) = rest.split_at_mut(gap_len);
            gap.fill(0);
            let (slot, tail) = tail.split_at_mut(size);
            placed[r] = Some(slot);
            rest = tail;
            at = offset + size;
        }
        rest.fill(0);
        let slots: Vec<&mut [u8]> = placed.into_iter().flatten().collect();
        let labels = &self.labels;
        let compressed = self
            .pieces
            .iter()
            .filter(|p| matches!(p, Piece::InPlace { .. }))
            .count();
        on_pool(compressed, || {
            self.pieces
                .into_par_iter()
                .zip(slots)
                .enumerate()
                .try_for_each(|(i, (piece, slot))| fill(piece, slot, &labels[i]))
        })
    }
}

/// Put `piece` into `slot` (its size), decoding it there if it is compressed.
/// The slot may be shorter than the piece (a padded buffer of tensor values keeps the
/// bytes its rows need): then only its first bytes land there.
fn fill(piece: Piece<'_>, slot: &mut [u8], what: &str) -> Result<()> {
    let take = slot.len();
    match piece {
        Piece::Plain(bytes) => slot.copy_from_slice(&bytes[..take]),
        Piece::Stored(raw) => slot.copy_from_slice(&raw[8..8 + take]),
        Piece::InPlace {
            codec,
            raw,
            declared,
        } => {
            let body = &raw[8..];
            if declared > take {
                // Decoded whole (the size it declares, checked), then cut to the slot.
                let mut whole = vec![0u8; declared];
                if !decode_exact(codec, body, &mut whole) {
                    return Err(mismatch(codec, body, declared as u64, what));
                }
                slot.copy_from_slice(&whole[..take]);
            } else if !decode_exact(codec, body, slot) {
                return Err(mismatch(codec, body, take as u64, what));
            }
        }
    }
    Ok(())
}

/// Decode the blocks of LZ4 `frame` (walked from `body`) one after another into `slot`,
/// each straight into its place: a block of a linked frame refers to the 64 KiB decoded
/// before it, which lie just before its place. Whether they fill `slot` exactly.
fn lz4_blocks_in_place(body: &[u8], frame: &Lz4Frame, slot: &mut [u8]) -> bool {
    const WINDOW: usize = 64 << 10;
    let mut at = 0;
    for &(offset, len, stored) in &frame.blocks {
        let input = &body[offset as usize..(offset + len) as usize];
        let (done, rest) = slot.split_at_mut(at);
        let room = rest.len().min(frame.block_max as usize);
        let out = &mut rest[..room];
        let written = if stored {
            if input.len() > room {
                return false;
            }
            out[..input.len()].copy_from_slice(input);
            Ok(input.len())
        } else if frame.linked {
            let window = &done[done.len().saturating_sub(WINDOW)..];
            lz4_flex::block::decompress_into_with_dict(input, out, window)
        } else {
            lz4_flex::block::decompress_into(input, out)
        };
        match written {
            Ok(n) => at += n,
            Err(_) => return false,
        }
    }
    at == slot.len()
}

/// A compressed plan decoded on the host.
pub struct Decoded {
    /// The decoded table's memory (ordinary host memory).
    pub memory: Allocation,
    /// Each range's offset in it.
    pub offsets: Vec<usize>,
    /// Each range's decoded size.
    pub sizes: Vec<usize>,
}

/// Read every range of `plan` from `reader` and decode the compressed ones straight into
/// one new allocation of ordinary host memory, laid out at multiples of `align`.
pub fn decode_to_host(
    reader: &(impl ReadAt + ?Sized),
    plan: &ReadPlan,
    align: usize,
) -> Result<Decoded> {
    let read = RangesRead::of(reader, plan)?;
    let assembly = prepare(&read, plan, align)?;
    let (offsets, sizes) = (assembly.offsets.clone(), assembly.sizes.clone());
    let mut memory = Allocation::new(Placement::Host, assembly.total, false)?;
    let bytes = memory
        .host_bytes_mut()
        .ok_or_else(|| Error::InvalidArgument("host memory expected".into()))?;
    assembly.decode_into(bytes)?;
    Ok(Decoded {
        memory,
        offsets,
        sizes,
    })
}

/// Each range's name: the record batch, the column path and the buffer's position.
pub fn labels(plan: &ReadPlan) -> Vec<String> {
    fn walk(column: &Column, path: &str, batch: usize, out: &mut [String]) {
        for (k, b) in column.buffers.iter().enumerate() {
            if let Some(slot) = b.and_then(|i| out.get_mut(i)) {
                if slot.is_empty() {
                    *slot = format!("record batch {batch}, column '{path}', buffer {k}");
                }
            }
        }
        for (i, c) in column.children.iter().enumerate() {
            let name = match &column.data_type {
                DataType::Struct(fields) => fields.get(i).map(|f| f.name().clone()),
                DataType::List(f)
                | DataType::LargeList(f)
                | DataType::FixedSizeList(f, _)
                | DataType::Map(f, _) => Some(f.name().clone()),
                _ => None,
            };
            let name = name.unwrap_or_else(|| i.to_string());
            walk(c, &format!("{path}.{name}"), batch, out);
        }
        if let Some(d) = &column.dictionary {
            walk(d, &format!("{path} (dictionary)"), batch, out);
        }
    }
    let mut out = vec![String::new(); plan.ranges.len()];
    for (b, batch) in plan.batches.iter().enumerate() {
        for (c, column) in batch.columns.iter().enumerate() {
            let name = plan
                .schema
                .fields()
                .get(c)
                .map_or_else(|| c.to_string(), |f| f.name().clone());
            walk(column, &name, b, &mut out);
        }
    }
    for (i, l) in out.iter_mut().enumerate() {
        if l.is_empty() {
            *l = format!("buffer {i}");
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// `parts` compressed with `codec`, one frame each, after a prefix declaring `declared`;
    /// LZ4 frames of 64 KiB blocks, independent, linked, or independent with checksums
    /// (`lz4` 0, 1, 2).
    fn buffer_of(codec: Codec, declared: i64, parts: &[&[u8]], lz4: u8) -> Vec<u8> {
        use lz4_flex::frame::{BlockMode, BlockSize, FrameEncoder, FrameInfo};
        let mut raw = declared.to_le_bytes().to_vec();
        for part in parts {
            match codec {
                Codec::Zstd => raw.extend_from_slice(&zstd::bulk::compress(part, 1).unwrap()),
                Codec::Lz4Frame => {
                    use std::io::Write;
                    let info = FrameInfo::new()
                        .block_size(BlockSize::Max64KB)
                        .block_mode(if lz4 == 1 {
                            BlockMode::Linked
                        } else {
                            BlockMode::Independent
                        })
                        .block_checksums(lz4 == 2)
                        .content_checksum(lz4 == 2);
                    let mut w = FrameEncoder::with_frame_info(info, Vec::new());
                    w.write_all(part).unwrap();
                    raw.extend_from_slice(&w.finish().unwrap());
                }
            }
        }
        raw
    }

    fn buffer(codec: Codec, declared: i64, parts: &[&[u8]]) -> Vec<u8> {
        buffer_of(codec, declared, parts, 1)
    }

    /// What [`fill`] leaves in a slot of `declared` bytes (0xEE before), or its error.
    fn filled(codec: Codec, raw: Vec<u8>, declared: usize) -> Result<Vec<u8>> {
        let mut slot = vec![0xEE; declared];
        let piece = Piece::InPlace {
            codec,
            raw: &raw,
            declared,
        };
        fill(piece, &mut slot, "record batch 0, column 'x', buffer 1").map(|()| slot)
    }

    #[test]
    fn buffers_decode_in_place_or_say_how_they_misstate_their_length() {
        // Over 64 KiB and repetitive: LZ4 blocks refer back across block boundaries.
        let data: Vec<u8> = (0..200_000u32).map(|i| (i / 3 % 253) as u8).collect();
        let n = data.len();
        for lz4 in 0..3 {
            let raw = buffer_of(Codec::Lz4Frame, n as i64, &[&data], lz4);
            let decoded = filled(Codec::Lz4Frame, raw.clone(), n).unwrap();
            assert_eq!(decoded, data, "LZ4 kind {lz4}");
            // A damaged header checksum (after the prefix, magic and descriptor) is refused.
            let mut damaged = raw;
            damaged[8 + 6] ^= 1;
            assert!(
                filled(Codec::Lz4Frame, damaged, n).is_err(),
                "LZ4 kind {lz4}"
            );
        }
        for codec in [Codec::Zstd, Codec::Lz4Frame] {
            let raw = buffer(codec, n as i64, &[&data]);
            assert_eq!(filled(codec, raw, n).unwrap(), data, "{codec:?}");
            for declared in [n - 1, n + 1] {
                let raw = buffer(codec, declared as i64, &[&data]);
                let Err(Error::InvalidArgument(m)) = filled(codec, raw, declared) else {
                    panic!("{codec:?} {declared}: decoded");
                };
                let says = format!("says it holds {declared} bytes uncompressed, decodes to");
                assert!(m.contains(says.as_str()), "{m}");
                assert!(m.contains("record batch 0, column 'x', buffer 1"), "{m}");
            }
        }
        // Two ZSTD frames in one buffer fill it with both.
        let raw = buffer(Codec::Zstd, 2 * n as i64, &[&data, &data]);
        assert_eq!(
            filled(Codec::Zstd, raw, 2 * n).unwrap(),
            [&data[..], &data[..]].concat()
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(300))]

        /// Whatever length a buffer declares and whatever it holds, `decode` returns
        /// exactly the bytes it holds or an error, and never more bytes than the checks
        /// allow: twice the column's need (when known), and what its compressed bytes can
        /// hold.
        #[test]
        fn decode_is_bounded_by_need_and_frame(
            zstd in any::<bool>(),
            size in 0usize..100_000,
            seed in prop::collection::vec(any::<u8>(), 1..64),
            lie in prop_oneof![Just(None), (0u64..(1u64 << 62)).prop_map(Some)],
            need in prop_oneof![Just(0u64), 1u64..200_000],
        ) {
            let codec = if zstd { Codec::Zstd } else { Codec::Lz4Frame };
            let data: Vec<u8> = seed.iter().cycle().take(size).copied().collect();
            let declared = lie.unwrap_or(size as u64);
            let raw = buffer(codec, declared as i64, &[&data]);
            if let Ok(out) = decode(codec, &raw, need, "b") {
                prop_assert_eq!(&out, &data);
                prop_assert_eq!(out.len() as u64, declared);
                prop_assert!(need == 0 || declared <= 2 * need + 64);
                let held = (raw.len() - 8) as u64;
                let ratio = if zstd { ZSTD_MAX_RATIO } else { LZ4_MAX_RATIO };
                prop_assert!(declared <= held * ratio + FRAME_SLACK);
            }
        }

        /// Decoding in place agrees with decoding as a stream on any bytes: the same
        /// decoded bytes, or an error from both.
        #[test]
        fn in_place_agrees_with_the_stream(
            zstd in any::<bool>(),
            declared in prop_oneof![0usize..2048, 60_000usize..200_000],
            body in prop::collection::vec(any::<u8>(), 0..256),
            valid in any::<bool>(),
            lz4 in 0u8..3,
        ) {
            let codec = if zstd { Codec::Zstd } else { Codec::Lz4Frame };
            let raw = if valid {
                let data: Vec<u8> = body.iter().cycle().take(declared).copied().collect();
                let mut raw = buffer_of(codec, declared as i64, &[&data], lz4);
                if let Some(b) = body.first() {
                    let at = 8 + usize::from(*b) % (raw.len() - 8);
                    raw[at] ^= body.len() as u8; // damaged when body.len() is not 0 mod 256
                }
                raw
            } else {
                let mut raw = (declared as i64).to_le_bytes().to_vec();
                raw.extend_from_slice(&body);
                raw
            };
            let streamed = decode(codec, &raw, 0, "b");
            match (filled(codec, raw, declared), streamed) {
                (Ok(a), Ok(b)) => prop_assert_eq!(a, b),
                (Err(_), Err(_)) => {}
                (a, b) => prop_assert!(false, "in place {:?}, stream {:?}", a.map(|v| v.len()), b.map(|v| v.len())),
            }
        }
    }
}
