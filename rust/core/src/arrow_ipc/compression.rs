//! IPC buffer compression (LZ4 frames, ZSTD) decoded on the host: each compressed buffer
//! starts with its uncompressed length (-1: stored as is), and decodes to exactly that
//! many bytes, or the file is malformed. Output grows with the bytes decoded, never
//! allocated up front from the declared length. Errors name the buffer: its record batch,
//! column and position.

use std::cell::RefCell;
use std::io::Read;

use arrow_schema::DataType;
use rayon::prelude::*;

pub use super::framing::Codec;
use super::framing::{malformed, ReadAt};
use super::lz4::{lz4_frame, Lz4Frame};
use super::plan::{Column, ReadPlan};
use super::runs::{coalesce, Runs};
use crate::allocation::{Allocation, Placement};
use crate::batch::layout_aligned;
use crate::error::{Error, Result};

/// Decoded bytes reserved up front per compressed byte (at least [`TRUSTED_MIN`], for a
/// buffer or for a whole table): declared lengths within it are taken at their word (and
/// checked as they decode), larger ones are decoded first and sized by what they hold.
pub(super) const TRUSTED_RATIO: u64 = 64;
const TRUSTED_MIN: u64 = 1 << 20;

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

/// Decode `body` with `codec` as a stream, reading at most `limit` bytes into `out`.
fn decode_stream(
    codec: Codec,
    body: &[u8],
    limit: u64,
    out: &mut Vec<u8>,
) -> std::io::Result<usize> {
    match codec {
        Codec::Lz4Frame => lz4_flex::frame::FrameDecoder::new(body)
            .take(limit)
            .read_to_end(out),
        Codec::Zstd => zstd::stream::read::Decoder::with_buffer(body)?
            .take(limit)
            .read_to_end(out),
    }
}

/// Decode one compressed buffer (`raw`, its 8-byte length prefix first) that must hold at
/// least `need` bytes once decoded.
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
    let out = if declared == -1 {
        body.to_vec()
    } else {
        let declared = u64::try_from(declared)
            .map_err(|_| malformed(format!("{what}: uncompressed length {declared}")))?;
        // The declared length is the file's word: memory is reserved up front for it only
        // up to a bound set by the compressed size; beyond, the output grows as it decodes.
        let bound = trusted(body.len() as u64);
        let mut out = Vec::with_capacity(declared.min(bound) as usize);
        // Past `declared`, one byte more is enough to tell that the buffer lied.
        let limit = declared.saturating_add(1);
        let read = if codec == Codec::Zstd && declared <= bound {
            // Reserved in full: decoded in place in one call. A buffer that holds more
            // than it declares (or is not ZSTD) is decoded again as a stream, which says
            // how it differs.
            zstd_in_place(body, &mut out).or_else(|_| {
                out.clear();
                decode_stream(codec, body, limit, &mut out)
            })
        } else {
            decode_stream(codec, body, limit, &mut out)
        };
        read.map_err(|e| malformed(format!("{what}: {codec:?} data: {e}")))?;
        if out.len() as u64 != declared {
            return Err(malformed(format!(
                "{what}: says it holds {declared} bytes uncompressed, decodes to {}",
                out.len()
            )));
        }
        out
    };
    if (out.len() as u64) < need {
        return Err(malformed(format!(
            "{what}: a buffer of {} bytes where {need} are needed",
            out.len()
        )));
    }
    Ok(out)
}

/// One range of a compressed plan, read, on its way to its place in the table's memory.
enum Piece<'a> {
    /// An uncompressed range: goes in as it is.
    Plain(&'a [u8]),
    /// A buffer already decoded (one declaring a length past the budget, decoded as it
    /// grew): goes in as it is.
    Ready(Vec<u8>),
    /// A buffer stored uncompressed (declared length -1, prefix first): its body goes in.
    Stored(&'a [u8]),
    /// A compressed buffer (`raw`, its length prefix first) declaring `declared` bytes
    /// within the budget: decoded straight into its place.
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
            Piece::Ready(bytes) => bytes.len(),
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
    needs: &'a [u64],
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

/// Size every range of `plan` (read into `read`) once decoded: from the length a
/// compressed buffer declares while the declared lengths stay within [`TRUSTED_RATIO`]
/// times the plan's compressed bytes (each checked again as it decodes), else by decoding
/// it now.
fn prepare<'a>(read: &'a RangesRead, plan: &'a ReadPlan, align: usize) -> Result<Assembly<'a>> {
    let labels = labels(plan);
    let mut pieces = Vec::with_capacity(plan.ranges.len());
    let mut later = Vec::new();
    // Declared lengths are taken at their word up to this many bytes for the whole plan.
    let compressed = plan
        .ranges
        .iter()
        .fold(0u64, |sum, r| sum.saturating_add(r.1));
    let mut budget = trusted(compressed);
    for (i, &(_, len)) in plan.ranges.iter().enumerate() {
        let raw = read.range(i, len);
        let need = plan.needs[i];
        let piece = match (plan.codecs[i], declared(raw)) {
            (None, _) => Piece::Plain(raw),
            (Some(_), Some(-1)) if (raw.len() - 8) as u64 >= need => Piece::Stored(raw),
            (Some(codec), Some(n)) if n >= 0 && (n as u64) >= need && (n as u64) <= budget => {
                budget -= n as u64;
                Piece::InPlace {
                    codec,
                    raw,
                    declared: n as usize,
                }
            }
            // Decoded below: its size is what it decodes to (or its error says why not).
            (Some(codec), _) => {
                later.push((i, codec, raw));
                Piece::Ready(Vec::new())
            }
        };
        pieces.push(piece);
    }
    let decoded: Vec<(usize, Vec<u8>)> = on_pool(later.len(), || {
        later
            .into_par_iter()
            .map(|(i, codec, raw)| Ok((i, decode(codec, raw, plan.needs[i], &labels[i])?)))
            .collect::<Result<_>>()
    })?;
    for (i, bytes) in decoded {
        pieces[i] = Piece::Ready(bytes);
    }
    let sizes: Vec<usize> = pieces.iter().map(Piece::size).collect();
    let (offsets, total) = layout_aligned(&sizes, align)?;
    Ok(Assembly {
        pieces,
        labels,
        needs: &plan.needs,
        offsets,
        sizes,
        total,
    })
}

/// The length a compressed buffer's prefix declares (`None`: shorter than the prefix).
fn declared(raw: &[u8]) -> Option<i64> {
    raw.first_chunk::<8>().map(|p| i64::from_le_bytes(*p))
}

/// The most bytes `body` compressed bytes are taken to hold up front.
fn trusted(body: u64) -> u64 {
    body.saturating_mul(TRUSTED_RATIO).max(TRUSTED_MIN)
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
        let mut slots = Vec::with_capacity(self.pieces.len());
        let mut rest = out;
        let mut at = 0;
        for (&offset, &size) in self.offsets.iter().zip(&self.sizes) {
            let (gap, tail) = rest.split_at_mut(offset - at);
            gap.fill(0);
            let (slot, tail) = tail.split_at_mut(size);
            slots.push(slot);
            rest = tail;
            at = offset + size;
        }
        rest.fill(0);
        let (labels, needs) = (&self.labels, self.needs);
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
                .try_for_each(|(i, (piece, slot))| fill(piece, slot, needs[i], &labels[i]))
        })
    }
}

/// Put `piece` into `slot` (its size), decoding it there if it is compressed.
fn fill(piece: Piece<'_>, slot: &mut [u8], need: u64, what: &str) -> Result<()> {
    let (codec, raw) = match piece {
        Piece::Plain(bytes) => {
            slot.copy_from_slice(bytes);
            return Ok(());
        }
        Piece::Ready(bytes) => {
            slot.copy_from_slice(&bytes);
            return Ok(());
        }
        Piece::Stored(raw) => {
            slot.copy_from_slice(&raw[8..]);
            return Ok(());
        }
        Piece::InPlace { codec, raw, .. } => (codec, raw),
    };
    let body = &raw[8..];
    let exact = match codec {
        Codec::Zstd => zstd_in_place(body, slot).is_ok_and(|n| n == slot.len()),
        Codec::Lz4Frame => match lz4_frame(body) {
            Some(frame) if !frame.checksums => lz4_blocks_in_place(body, &frame, slot),
            // Checksummed or unusual frames: the frame decoder checks them.
            _ => {
                let mut frame = lz4_flex::frame::FrameDecoder::new(body);
                frame.read_exact(slot).is_ok() && frame.read(&mut [0u8; 1]).is_ok_and(|n| n == 0)
            }
        },
    };
    if exact {
        return Ok(());
    }
    // The buffer is not what it declares: decoding it as a stream says how it differs.
    decode(codec, raw, need, what)?;
    Err(malformed(format!(
        "{what}: {codec:?} data decode differently each time"
    )))
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
        fill(piece, &mut slot, 0, "record batch 0, column 'x', buffer 1").map(|()| slot)
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
