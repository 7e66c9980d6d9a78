//! The plan for decoding a read's compressed IPC buffers on the GPU: where each buffer's
//! decoded bytes go in the table's allocation, and which pieces of the buffers as read
//! (8-byte length prefix first) a batched GPU decoder (nvCOMP) turns into which bytes.
//!
//! The host reads each ZSTD buffer's length prefix and frame header, and each LZ4 buffer
//! whole (its frame is walked to find the blocks). Every decoded length is checked before
//! anything is allocated: against the bytes the type and row count need, against the
//! frame's own header, and against what the compressed bytes can decode to at most, so a
//! lying length cannot make the allocation larger than its buffer could fill. A buffer the
//! GPU cannot decode (an LZ4 frame of linked blocks, as pyarrow writes them above 64 KiB;
//! a ZSTD frame without its content size or over nvCOMP's 2 GiB; a dictionary) is decoded
//! on the host here and
//! copied into place.

use super::compression::{
    check_declared, decode, labels, zstd_content_size, zstd_frame_into, DecodeBudget,
};
use super::framing::{malformed, Codec, ReadAt};
use super::lz4::lz4_frame;
use super::plan::Layout;
use super::plan::ReadPlan;
use crate::error::Result;

/// The longest ZSTD frame header: magic, descriptor, window, 4-byte dictionary id, 8-byte
/// content size.
const ZSTD_HEADER_MAX: usize = 4 + 1 + 1 + 4 + 8;
/// The largest ZSTD frame nvCOMP decodes (compressed or not); larger ones decode on the
/// host.
const ZSTD_GPU_MAX: u64 = (1 << 31) - 1;

/// How a piece of a buffer as read becomes bytes of the decoded buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Step {
    /// Copied as it is (stored uncompressed).
    Copy,
    /// One ZSTD frame.
    Zstd,
    /// One raw LZ4 block (a block of an LZ4 frame).
    Lz4,
}

/// One piece of work for the GPU: `src_len` bytes at `src` of range `range` as read
/// become exactly `dst_len` bytes at `dst` of its decoded buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Piece {
    /// The range (an index into [`ReadPlan::ranges`]).
    pub range: usize,
    /// What to do.
    pub step: Step,
    /// Offset in the range as read (its length prefix included).
    pub src: u64,
    /// Bytes read.
    pub src_len: u64,
    /// Offset in the range's decoded bytes.
    pub dst: u64,
    /// Bytes the piece decodes to, exactly.
    pub dst_len: u64,
}

/// A read's compressed buffers planned for decoding on the GPU.
#[derive(Debug, Clone)]
pub struct GpuDecodePlan {
    /// Each range's decoded size.
    pub sizes: Vec<u64>,
    /// Each range's place in the table's allocation (multiples of the alignment).
    pub offsets: Vec<usize>,
    /// The allocation's size.
    pub total: usize,
    /// The GPU's work, ZSTD frames, LZ4 blocks and copies.
    pub pieces: Vec<Piece>,
    /// Ranges decoded on the host (the GPU cannot take them): each range and its bytes,
    /// to be copied into place.
    pub host: Vec<(usize, Vec<u8>)>,
    /// Each range's name in messages: the record batch, column and buffer.
    pub labels: Vec<String>,
}

/// A [`Piece`] at absolute places: `src_len` bytes at `src` become exactly `dst_len`
/// bytes at `dst` (addresses in memory, or file and allocation offsets).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Placed {
    /// What to do.
    pub step: Step,
    /// Where the piece's bytes are read from.
    pub src: u64,
    /// Bytes read.
    pub src_len: u64,
    /// Where its decoded bytes go.
    pub dst: u64,
    /// Bytes it decodes to, exactly.
    pub dst_len: u64,
    /// Its range (an index into [`ReadPlan::ranges`]), for messages.
    pub range: usize,
}

impl Piece {
    /// This piece placed where its range's bytes as read start (`src`) and where its
    /// range's decoded bytes start (`dst`).
    pub fn at(&self, src: u64, dst: u64) -> Placed {
        Placed {
            step: self.step,
            src: src + self.src,
            src_len: self.src_len,
            dst: dst + self.dst,
            dst_len: self.dst_len,
            range: self.range,
        }
    }
}

/// Do on the host what the GPU decoder would do with `pieces`: each piece read from
/// `source` (its range's bytes as read at `sources[range]`) and decoded into exactly its
/// bytes of `out` (its range's decoded bytes at `places[range]`). The fallback where no GPU
/// decoder can (nvCOMP missing or failing); errors name the buffer (`labels`).
pub(super) fn decode_pieces_on_host(
    pieces: &[Piece],
    source: &[u8],
    sources: &[usize],
    out: &mut [u8],
    places: &[usize],
    labels: &[String],
) -> Result<()> {
    for piece in pieces {
        let what = labels.get(piece.range).map_or("a buffer", String::as_str);
        let outside = || malformed(format!("{what}: a piece outside its buffer"));
        let span = |base: usize, at: u64, len: u64| -> Option<std::ops::Range<usize>> {
            let start = base.checked_add(usize::try_from(at).ok()?)?;
            Some(start..start.checked_add(usize::try_from(len).ok()?)?)
        };
        let p = piece.at(0, 0);
        let src = span(sources[piece.range], p.src, p.src_len)
            .and_then(|r| source.get(r))
            .ok_or_else(outside)?;
        let dst = span(places[piece.range], p.dst, p.dst_len)
            .and_then(|r| out.get_mut(r))
            .ok_or_else(outside)?;
        let got = match piece.step {
            Step::Copy if src.len() == dst.len() => {
                dst.copy_from_slice(src);
                Ok(dst.len())
            }
            Step::Copy => Ok(src.len()),
            Step::Zstd => zstd_frame_into(src, dst).map_err(|e| e.to_string()),
            Step::Lz4 => lz4_flex::block::decompress_into(src, dst).map_err(|e| e.to_string()),
        };
        match got {
            Ok(n) if n == dst.len() => {}
            Ok(n) => {
                return Err(malformed(format!(
                    "{what}: a {:?} piece decodes to {n} bytes where {} are expected",
                    piece.step,
                    dst.len()
                )))
            }
            Err(e) => return Err(malformed(format!("{what}: {:?} data: {e}", piece.step))),
        }
    }
    Ok(())
}

/// Plan decoding the ranges of `plan` (read as they are in the file) on the GPU, each
/// decoded buffer at a multiple of `align` in one allocation. Reads the length prefixes
/// and frame headers (LZ4 buffers whole) from `reader`.
pub fn plan_gpu_decode(
    reader: &(impl ReadAt + ?Sized),
    plan: &ReadPlan,
    align: usize,
) -> Result<GpuDecodePlan> {
    let labels = labels(plan);
    let values = plan.is_tensor_values();
    let mut sizes = Vec::with_capacity(plan.ranges.len());
    let mut pieces = Vec::new();
    let mut host = Vec::new();
    let mut budget = DecodeBudget::new();
    for (i, &(offset, len)) in plan.ranges.iter().enumerate() {
        let what = &labels[i];
        let need = plan.needs[i];
        let Some(codec) = plan.codecs[i] else {
            sizes.push(len);
            pieces.push(Piece {
                range: i,
                step: Step::Copy,
                src: 0,
                src_len: len,
                dst: 0,
                dst_len: len,
            });
            continue;
        };
        let (size, work) = plan_buffer(reader, codec, (offset, len), need, i, what, &mut budget)?;
        let (size, work) = if values[i] && size > need {
            // Tensor values declared with padding keep only the bytes their rows need,
            // so that the next batch's can follow them: decoded on the host and cut.
            let whole = match work {
                Work::Host(bytes) => bytes,
                Work::Gpu(_) => {
                    let whole =
                        usize::try_from(len).map_err(|_| malformed("a buffer is too large"))?;
                    decode(codec, &reader.read_at(offset, whole)?, need, what)?
                }
            };
            let cut = usize::try_from(need).map_err(|_| malformed("a buffer is too large"))?;
            (need, Work::Host(whole[..cut.min(whole.len())].to_vec()))
        } else {
            (size, work)
        };
        sizes.push(size);
        match work {
            Work::Gpu(p) => pieces.extend(p),
            Work::Host(bytes) => host.push((i, bytes)),
        }
    }
    let Layout { offsets, total } = plan.layout(&sizes, align)?;
    Ok(GpuDecodePlan {
        sizes,
        offsets,
        total,
        pieces,
        host,
        labels,
    })
}

enum Work {
    Gpu(Vec<Piece>),
    Host(Vec<u8>),
}

/// One compressed buffer's decoded size and how it decodes.
fn plan_buffer(
    reader: &(impl ReadAt + ?Sized),
    codec: Codec,
    (offset, len): (u64, u64),
    need: u64,
    range: usize,
    what: &str,
    budget: &mut DecodeBudget,
) -> Result<(u64, Work)> {
    let whole = usize::try_from(len).map_err(|_| malformed(format!("{what} is too large")))?;
    if len < 8 {
        // Too short for a prefix: the host decoder says what is wrong (or that it is empty).
        let bytes = decode(codec, &reader.read_at(offset, whole)?, need, what)?;
        return Ok((bytes.len() as u64, Work::Host(bytes)));
    }
    let head_len = match codec {
        Codec::Zstd => whole.min(8 + ZSTD_HEADER_MAX),
        Codec::Lz4Frame => whole,
    };
    let head = reader.read_at(offset, head_len)?;
    let Some((prefix, body)) = head.split_first_chunk::<8>() else {
        return Err(malformed(format!(
            "{what}: a compressed buffer of {len} bytes"
        )));
    };
    let declared = i64::from_le_bytes(*prefix);
    let body_len = len - 8;
    if declared == -1 {
        if body_len < need {
            return Err(malformed(format!(
                "{what}: a buffer of {body_len} bytes where {need} are needed"
            )));
        }
        let copy = Piece {
            range,
            step: Step::Copy,
            src: 8,
            src_len: body_len,
            dst: 0,
            dst_len: body_len,
        };
        return Ok((body_len, Work::Gpu(vec![copy])));
    }
    let declared = u64::try_from(declared)
        .map_err(|_| malformed(format!("{what}: uncompressed length {declared}")))?;
    // The same checks as the host decoder's, before anything is allocated or decoded.
    check_declared(codec, declared, body, body_len, need, what)?;
    budget.take(declared)?;
    let on_host = |head: Vec<u8>| -> Result<(u64, Work)> {
        let raw = if head.len() == whole {
            head
        } else {
            reader.read_at(offset, whole)?
        };
        let bytes = decode(codec, &raw, need, what)?;
        Ok((bytes.len() as u64, Work::Host(bytes)))
    };
    if declared == 0 {
        return on_host(head);
    }
    match codec {
        Codec::Zstd => {
            // One frame of the declared size goes to nvCOMP; anything else (no content
            // size, several frames) decodes on the host.
            if zstd_content_size(body) != Some(declared) {
                return on_host(head);
            }
            if declared > ZSTD_GPU_MAX || body_len > ZSTD_GPU_MAX {
                return on_host(head);
            }
            let piece = Piece {
                range,
                step: Step::Zstd,
                src: 8,
                src_len: body_len,
                dst: 0,
                dst_len: declared,
            };
            Ok((declared, Work::Gpu(vec![piece])))
        }
        Codec::Lz4Frame => {
            let Some(frame) = lz4_frame(body) else {
                return on_host(head);
            };
            let n = frame.blocks.len() as u64;
            // Every block but the last decodes to the full block size (as LZ4's encoder
            // writes them); anything else decodes on the host.
            let full = n.saturating_sub(1).saturating_mul(frame.block_max);
            let fits = n > 0 && declared > full && declared - full <= frame.block_max;
            if (frame.linked && n > 1) || !fits {
                return on_host(head);
            }
            let mut out = Vec::with_capacity(frame.blocks.len());
            for (k, &(at, src_len, stored)) in frame.blocks.iter().enumerate() {
                let dst = k as u64 * frame.block_max;
                let dst_len = if k + 1 == frame.blocks.len() {
                    declared - full
                } else {
                    frame.block_max
                };
                if stored && src_len != dst_len {
                    return on_host(head);
                }
                out.push(Piece {
                    range,
                    step: if stored { Step::Copy } else { Step::Lz4 },
                    src: 8 + at,
                    src_len,
                    dst,
                    dst_len,
                });
            }
            Ok((declared, Work::Gpu(out)))
        }
    }
}

#[cfg(test)]
pub(super) mod tests {
    //! The GPU plan run with a host stand-in for nvCOMP (its contract: a ZSTD frame or a
    //! raw LZ4 block in, exactly its decoded bytes out) gives the host decoder's bytes.

    use std::io::Write;

    use arrow_schema::Schema;
    use lz4_flex::frame::{BlockMode, BlockSize, FrameEncoder, FrameInfo};
    use proptest::prelude::*;

    use super::super::compression::{decode_to_host, ZSTD_MAGIC, ZSTD_MAX_RATIO};
    use super::*;

    /// The host route's table: its bytes and each range's offset in them.
    fn host_decoded(file: &[u8], plan: &ReadPlan) -> (Vec<u8>, Vec<usize>) {
        let mut decoded = decode_to_host(file, plan, 64).unwrap();
        let bytes = decoded.memory.host_bytes_mut().unwrap().to_vec();
        (bytes, decoded.offsets)
    }

    /// nvCOMP's contract on the host: each piece decodes to exactly `dst_len` bytes.
    fn stand_in(piece: &Piece, src: &[u8]) -> Vec<u8> {
        match piece.step {
            Step::Copy => src.to_vec(),
            Step::Zstd => zstd::stream::decode_all(src).unwrap(),
            Step::Lz4 => lz4_flex::block::decompress(src, piece.dst_len as usize).unwrap(),
        }
    }

    /// The allocation the GPU path fills: pieces decoded in place, host ranges copied.
    fn run(file: &[u8], plan: &ReadPlan, gpu: &GpuDecodePlan) -> Vec<u8> {
        let mut out = vec![0u8; gpu.total];
        for p in &gpu.pieces {
            let (offset, _) = plan.ranges[p.range];
            let start = (offset + p.src) as usize;
            let bytes = stand_in(p, &file[start..start + p.src_len as usize]);
            assert_eq!(bytes.len() as u64, p.dst_len, "{p:?}");
            assert!(p.dst + p.dst_len <= gpu.sizes[p.range]);
            let at = gpu.offsets[p.range] + p.dst as usize;
            out[at..at + bytes.len()].copy_from_slice(&bytes);
        }
        for (r, bytes) in &gpu.host {
            let at = gpu.offsets[*r];
            out[at..at + bytes.len()].copy_from_slice(bytes);
        }
        out
    }

    /// A ZSTD frame with its content size, of raw and RLE blocks (as a ZSTD encoder
    /// writes them for data it cannot shrink and for runs).
    /// `data` compressed by the ZSTD library into a frame that does not record its size.
    fn zstd_frame_without_size(data: &[u8]) -> Vec<u8> {
        let mut encoder = zstd::stream::write::Encoder::new(Vec::new(), 1).unwrap();
        encoder.include_contentsize(false).unwrap();
        encoder.write_all(data).unwrap();
        encoder.finish().unwrap()
    }

    fn zstd_frame(data: &[u8]) -> Vec<u8> {
        let mut out = ZSTD_MAGIC.to_le_bytes().to_vec();
        out.push(0b1110_0000); // 8-byte content size, single segment
        out.extend_from_slice(&(data.len() as u64).to_le_bytes());
        let chunks: Vec<&[u8]> = data.chunks(128 << 10).collect();
        if chunks.is_empty() {
            out.extend_from_slice(&[1, 0, 0]);
        }
        for (i, c) in chunks.iter().enumerate() {
            let last = u32::from(i + 1 == chunks.len());
            let rle = c.iter().all(|&b| b == c[0]);
            let header = (c.len() as u32) << 3 | u32::from(rle) << 1 | last;
            out.extend_from_slice(&header.to_le_bytes()[..3]);
            if rle {
                out.push(c[0]);
            } else {
                out.extend_from_slice(c);
            }
        }
        out
    }

    fn lz4_frame_of(data: &[u8], linked: bool, size: BlockSize, content: bool) -> Vec<u8> {
        let mut info = FrameInfo::new().block_size(size).block_mode(if linked {
            BlockMode::Linked
        } else {
            BlockMode::Independent
        });
        if content {
            info = info.content_size(Some(data.len() as u64));
        }
        let mut out = Vec::new();
        let mut w = FrameEncoder::with_frame_info(info, &mut out);
        w.write_all(data).unwrap();
        w.finish().unwrap();
        out
    }

    #[derive(Debug, Clone)]
    pub(in crate::arrow_ipc) enum Form {
        Plain,
        Stored,
        Zstd,
        ZstdNoSize,
        Lz4 {
            linked: bool,
            big: bool,
            content: bool,
        },
    }

    fn encode(data: &[u8], form: &Form) -> (Option<Codec>, Vec<u8>) {
        let prefixed = |declared: i64, body: Vec<u8>| {
            let mut out = declared.to_le_bytes().to_vec();
            out.extend(body);
            out
        };
        let n = data.len() as i64;
        match form {
            Form::Plain => (None, data.to_vec()),
            Form::Stored => (Some(Codec::Zstd), prefixed(-1, data.to_vec())),
            Form::Zstd => (Some(Codec::Zstd), prefixed(n, zstd_frame(data))),
            Form::ZstdNoSize => (
                Some(Codec::Zstd),
                prefixed(n, zstd_frame_without_size(data)),
            ),
            Form::Lz4 {
                linked,
                big,
                content,
            } => {
                let size = if *big {
                    BlockSize::Max256KB
                } else {
                    BlockSize::Max64KB
                };
                (
                    Some(Codec::Lz4Frame),
                    prefixed(n, lz4_frame_of(data, *linked, size, *content)),
                )
            }
        }
    }

    /// A "file" of the buffers one after another, and the plan reading them all.
    pub(in crate::arrow_ipc) fn file_and_plan(buffers: &[(Vec<u8>, Form)]) -> (Vec<u8>, ReadPlan) {
        let mut file = vec![0u8; 16];
        let (mut ranges, mut codecs, mut needs) = (Vec::new(), Vec::new(), Vec::new());
        for (data, form) in buffers {
            let (codec, bytes) = encode(data, form);
            ranges.push((file.len() as u64, bytes.len() as u64));
            codecs.push(codec);
            needs.push(data.len() as u64 / 2);
            file.extend(bytes);
        }
        let plan = ReadPlan {
            schema: Schema::empty(),
            ranges,
            codecs,
            needs,
            batches: Vec::new(),
            total_batches: 0,
            built: Vec::new(),
        };
        (file, plan)
    }

    pub(in crate::arrow_ipc) fn data(len: usize, seed: u8, runs: bool) -> Vec<u8> {
        (0..len)
            .map(|i| {
                if runs {
                    (i / 1000) as u8 ^ seed
                } else {
                    (i as u32).wrapping_mul(2_654_435_761).to_le_bytes()[3] ^ seed
                }
            })
            .collect()
    }

    fn form() -> impl Strategy<Value = Form> {
        prop_oneof![
            Just(Form::Plain),
            Just(Form::Stored),
            Just(Form::Zstd),
            Just(Form::ZstdNoSize),
            (any::<bool>(), any::<bool>(), any::<bool>()).prop_map(|(linked, big, content)| {
                Form::Lz4 {
                    linked,
                    big,
                    content,
                }
            }),
        ]
    }

    #[test]
    fn gpu_plan_equals_host_decode() {
        let forms = [
            Form::Plain,
            Form::Stored,
            Form::Zstd,
            Form::ZstdNoSize,
            Form::Lz4 {
                linked: false,
                big: false,
                content: false,
            },
            Form::Lz4 {
                linked: true,
                big: false,
                content: true,
            },
            Form::Lz4 {
                linked: true,
                big: false,
                content: false,
            },
        ];
        let buffers: Vec<(Vec<u8>, Form)> = forms
            .iter()
            .enumerate()
            .flat_map(|(i, f)| {
                [1, 1000, 300_000]
                    .iter()
                    .map(move |&n| (data(n, i as u8, n > 1000), f.clone()))
            })
            .collect();
        let (file, plan) = file_and_plan(&buffers);
        let gpu = plan_gpu_decode(file.as_slice(), &plan, 64).unwrap();
        let (host, offsets) = host_decoded(file.as_slice(), &plan);
        assert_eq!(gpu.offsets, offsets);
        assert_eq!(run(&file, &plan, &gpu), host);
        // ZSTD frames with their size and independent LZ4 blocks go to the GPU, many
        // blocks for the large LZ4 buffer; linked LZ4 blocks and ZSTD frames without a
        // size decode on the host (a linked frame of one block on the GPU).
        let steps = |r: usize| -> Vec<Step> {
            gpu.pieces
                .iter()
                .filter(|p| p.range == r)
                .map(|p| p.step)
                .collect()
        };
        assert_eq!(steps(8), vec![Step::Zstd]);
        assert_eq!(steps(14).len(), 5); // 300 000 bytes in 64 KiB blocks
        assert!(steps(14).iter().all(|&s| s == Step::Lz4));
        let on_host: Vec<usize> = gpu.host.iter().map(|h| h.0).collect();
        assert!(on_host.contains(&11) && on_host.contains(&17) && on_host.contains(&20));
        // Linked, but of one block each.
        assert_eq!((steps(18).len(), steps(19).len()), (1, 1));
    }

    #[test]
    fn lying_lengths_are_refused_before_allocating() {
        let payload = data(5000, 3, true);
        let frame = zstd_frame(&payload);
        let with_need = |declared: i64, body: &[u8], need: u64| {
            let mut file = vec![0u8; 8];
            file.extend(declared.to_le_bytes());
            file.extend_from_slice(body);
            let plan = ReadPlan {
                schema: Schema::empty(),
                ranges: vec![(8, (8 + body.len()) as u64)],
                codecs: vec![Some(Codec::Zstd)],
                needs: vec![need],
                batches: Vec::new(),
                total_batches: 0,
                built: Vec::new(),
            };
            plan_gpu_decode(file.as_slice(), &plan, 64)
        };
        let with = |declared: i64, body: &[u8]| with_need(declared, body, 4000);
        assert_eq!(with(5000, &frame).unwrap().total, 5000);
        // Far past what the column needs: refused before anything is decoded.
        let err = with(1 << 40, &frame).unwrap_err().to_string();
        assert!(
            err.contains("buffer 0") && err.contains("refused before decoding"),
            "{err}"
        );
        // Less than the frame's own content size.
        let err = with_need(4500, &frame, 0).unwrap_err().to_string();
        assert!(err.contains("its Zstd frame 5000"), "{err}");
        // More than a frame of its size can hold, the need unknown.
        let err = with_need(1 << 40, &frame, 0).unwrap_err().to_string();
        assert!(err.contains("can hold"), "{err}");
        assert!(with(50, &frame)
            .unwrap_err()
            .to_string()
            .contains("4000 are needed"));
        assert!(with(-2, &frame).is_err());
        // A frame whose own header lies about a size its bytes cannot hold.
        let mut huge = ZSTD_MAGIC.to_le_bytes().to_vec();
        huge.push(0b1110_0000);
        huge.extend_from_slice(&(1u64 << 40).to_le_bytes());
        huge.extend_from_slice(&[1, 0, 0]);
        let err = with_need(1 << 40, &huge, 0).unwrap_err().to_string();
        assert!(err.contains("can hold"), "{err}");
    }

    #[test]
    fn frame_headers() {
        assert_eq!(zstd_content_size(&zstd_frame(b"abc")), Some(3));
        assert_eq!(
            zstd_content_size(&[0x28, 0xB5, 0x2F, 0xFD, 0x20, 7]),
            Some(7)
        );
        assert_eq!(
            zstd_content_size(&[0x28, 0xB5, 0x2F, 0xFD, 0x40, 0, 1, 0]),
            Some(257)
        );
        assert_eq!(zstd_content_size(&[0x28, 0xB5, 0x2F, 0xFD, 0x00, 0]), None);
        assert_eq!(zstd_content_size(b"no"), None);
        let f = lz4_frame(&lz4_frame_of(
            &data(200_000, 1, false),
            false,
            BlockSize::Max64KB,
            true,
        ))
        .unwrap();
        assert_eq!(
            (f.blocks.len(), f.block_max, f.linked),
            (4, 64 << 10, false)
        );
        assert_eq!(f.content_size, Some(200_000));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn any_mix_of_buffers_decodes_as_on_the_host(
            specs in prop::collection::vec((0usize..200_000, any::<u8>(), any::<bool>(), form()), 1..6),
        ) {
            let buffers: Vec<(Vec<u8>, Form)> =
                specs.into_iter().map(|(n, s, r, f)| (data(n, s, r), f)).collect();
            let (file, plan) = file_and_plan(&buffers);
            let gpu = plan_gpu_decode(file.as_slice(), &plan, 64).unwrap();
            let (host, offsets) = host_decoded(file.as_slice(), &plan);
            prop_assert_eq!(&gpu.offsets, &offsets);
            prop_assert_eq!(run(&file, &plan, &gpu), host);
        }

        #[test]
        fn malformed_headers_never_panic_nor_overallocate(
            zstd in any::<bool>(),
            declared in prop_oneof![Just(-1i64), 0i64..100_000, any::<i64>()],
            flips in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 0..4),
            cut in any::<prop::sample::Index>(),
            n in 0usize..100_000,
        ) {
            let payload = data(n, 9, true);
            let mut body = if zstd {
                zstd_frame(&payload)
            } else {
                lz4_frame_of(&payload, false, BlockSize::Max64KB, false)
            };
            for (at, v) in flips {
                if !body.is_empty() {
                    let i = at.index(body.len());
                    body[i] = v;
                }
            }
            body.truncate(cut.index(body.len() + 1));
            let mut file = declared.to_le_bytes().to_vec();
            file.extend_from_slice(&body);
            let plan = ReadPlan {
                schema: Schema::empty(),
                ranges: vec![(0, file.len() as u64)],
                codecs: vec![Some(if zstd { Codec::Zstd } else { Codec::Lz4Frame })],
                needs: vec![0],
                batches: Vec::new(),
                total_batches: 0,
                built: Vec::new(),
            };
            if let Ok(gpu) = plan_gpu_decode(file.as_slice(), &plan, 64) {
                let bound = (body.len() as u64).saturating_mul(ZSTD_MAX_RATIO).max(4 << 20);
                prop_assert!(gpu.sizes[0] <= bound);
                for p in &gpu.pieces {
                    prop_assert!(p.src + p.src_len <= file.len() as u64);
                    prop_assert!(p.dst + p.dst_len <= gpu.sizes[0]);
                }
            }
        }
    }
}
