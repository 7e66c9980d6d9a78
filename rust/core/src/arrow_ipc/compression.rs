//! IPC buffer compression (LZ4 frames, ZSTD) decoded on the host: each compressed buffer
//! starts with its uncompressed length (-1: stored as is), and decodes to exactly that
//! many bytes, or the file is malformed. Output grows with the bytes decoded, never
//! allocated up front from the declared length. Errors name the buffer: its record batch,
//! column and position.

use std::io::Read;

use arrow_schema::DataType;
use rayon::prelude::*;

pub use super::framing::Codec;
use super::framing::{malformed, ReadAt};
use super::plan::{Column, ReadPlan};
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
    let labels = labels(plan);
    let mut raws = Vec::with_capacity(plan.ranges.len());
    for &(offset, len) in &plan.ranges {
        let len = usize::try_from(len).map_err(|_| malformed("a buffer is too large"))?;
        raws.push(reader.read_at(offset, len)?);
    }
    let decode_one = |(i, raw): (usize, Vec<u8>)| -> Result<Vec<u8>> {
        match plan.codecs[i] {
            Some(codec) => decode(codec, &raw, plan.needs[i], &labels[i]),
            None => Ok(raw),
        }
    };
    // The buffers decode independently: on the I/O pool, one buffer per task.
    let threads = crate::settings::current().map_or(1, |s| s.num_threads);
    let pieces: Vec<Vec<u8>> = if threads > 1 && plan.codecs.iter().flatten().nth(1).is_some() {
        crate::pool::pool(threads)?.install(|| {
            raws.into_par_iter()
                .enumerate()
                .map(decode_one)
                .collect::<Result<_>>()
        })?
    } else {
        raws.into_iter()
            .enumerate()
            .map(decode_one)
            .collect::<Result<_>>()?
    };
    let sizes: Vec<usize> = pieces.iter().map(Vec::len).collect();
    let (offsets, total) = layout_aligned(&sizes, align)?;
    let mut bytes = vec![0u8; total];
    for (piece, &at) in pieces.iter().zip(&offsets) {
        bytes[at..at + piece.len()].copy_from_slice(piece);
    }
    Ok((bytes, offsets, sizes))
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
