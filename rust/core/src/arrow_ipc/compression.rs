//! IPC buffer compression (LZ4 frames, ZSTD) decoded on the host: each compressed buffer
//! starts with its uncompressed length (-1: stored as is), and decodes to exactly that
//! many bytes, or the file is malformed. Output grows with the bytes decoded, never
//! allocated up front from the declared length.

use std::io::Read;

pub use super::framing::Codec;
use super::framing::{malformed, ReadAt};
use super::plan::ReadPlan;
use crate::batch::layout_aligned;
use crate::error::Result;

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
        let mut out = Vec::new();
        let limit = declared.saturating_add(1);
        let read = match codec {
            Codec::Lz4Frame => lz4_flex::frame::FrameDecoder::new(body)
                .take(limit)
                .read_to_end(&mut out),
            Codec::Zstd => match ruzstd::decoding::StreamingDecoder::new(body) {
                Ok(decoder) => decoder.take(limit).read_to_end(&mut out),
                Err(e) => return Err(malformed(format!("{what}: ZSTD: {e}"))),
            },
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

/// Read every range of `plan` from `reader` and decode the compressed ones, laid out at
/// multiples of `align`: the bytes, and each range's offset and decoded size in them.
pub fn assemble(
    reader: &(impl ReadAt + ?Sized),
    plan: &ReadPlan,
    align: usize,
) -> Result<(Vec<u8>, Vec<usize>, Vec<usize>)> {
    let mut pieces = Vec::with_capacity(plan.ranges.len());
    for (i, &(offset, len)) in plan.ranges.iter().enumerate() {
        let len = usize::try_from(len).map_err(|_| malformed("a buffer is too large"))?;
        let raw = reader.read_at(offset, len)?;
        pieces.push(match plan.codecs[i] {
            Some(codec) => decode(codec, &raw, plan.needs[i], &format!("buffer {i}"))?,
            None => raw,
        });
    }
    let sizes: Vec<usize> = pieces.iter().map(Vec::len).collect();
    let (offsets, total) = layout_aligned(&sizes, align)?;
    let mut bytes = vec![0u8; total];
    for (piece, &at) in pieces.iter().zip(&offsets) {
        bytes[at..at + piece.len()].copy_from_slice(piece);
    }
    Ok((bytes, offsets, sizes))
}
