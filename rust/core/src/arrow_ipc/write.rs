//! Arrow IPC files written from memory the engine does not own, on the host or on a GPU:
//! the framing, the schema, each record batch's header (field nodes, buffer offsets and
//! lengths) and the footer are encoded here on the host from what the Arrow C data
//! interface says of the arrays; each buffer's bytes are then written from where they lie
//! (a device buffer with kvikpy's device write, never copied through host memory whole).
//!
//! Everything is checked and encoded before the file is created, so that bad input
//! leaves nothing on disk. Buffers start at multiples of 64 bytes in the file, and the
//! padding between them is never written (a new file reads zeros there).

use std::path::Path;

use arrow_ipc::convert::IpcSchemaEncoder;
use arrow_ipc::{
    Block, Buffer, FieldNode, FooterBuilder, MessageBuilder, MessageHeader, MetadataVersion,
    RecordBatchBuilder,
};
use arrow_schema::{DataType, Field, IntervalUnit, Schema};
use flatbuffers::FlatBufferBuilder;

use super::framing::MAGIC;
use crate::error::{Error, Result};
use crate::file::FileHandle;
use crate::replace::{Replacement, Start};
use crate::request::{submit, Completion, Request};
use crate::settings::Settings;
use crate::span::{DeviceSpan, HostSpan, Span};

/// Where every buffer of the file's arrays starts, in the file and in the body.
const ALIGN: u64 = 64;
/// The end-of-stream marker written before the footer (a continuation and a 0 length).
const EOS: [u8; 8] = [0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0, 0];

/// One array as the Arrow C data interface describes it (a record batch is a struct
/// array whose children are its columns).
#[derive(Debug, Clone, Default)]
pub struct ArrayIn {
    /// Its length in elements.
    pub length: i64,
    /// Its null count (`-1`: not known).
    pub null_count: i64,
    /// Its offset into its buffers (only 0 is written).
    pub offset: i64,
    /// Its buffers' addresses in the C data interface's order (0 for an absent buffer).
    pub buffers: Vec<u64>,
    /// Its children.
    pub children: Vec<ArrayIn>,
    /// Whether it carries a dictionary (dictionary-encoded arrays are not written).
    pub has_dictionary: bool,
}

/// The memory every buffer of the arrays lies in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Memory {
    /// Host memory.
    Host,
    /// Device memory of this GPU.
    Device(usize),
}

impl Memory {
    /// Copy `out.len()` bytes at `addr` of this memory to the host (a few bytes the
    /// encoder needs: a last offset, a validity bitmap).
    ///
    /// # Safety
    /// `addr..addr + out.len()` must be readable memory of this kind (host, or the GPU
    /// named), alive until this returns.
    pub unsafe fn peek(self, addr: u64, out: &mut [u8]) -> Result<()> {
        match self {
            Memory::Host => {
                // SAFETY: (caller) `out.len()` readable host bytes at `addr`; `out` is
                // apart from them.
                unsafe {
                    std::ptr::copy_nonoverlapping(addr as *const u8, out.as_mut_ptr(), out.len())
                };
                Ok(())
            }
            // SAFETY: (caller) as above, in device memory of GPU `ordinal`.
            Memory::Device(ordinal) => unsafe {
                crate::cuda::copy_device_to_host(ordinal, out.as_mut_ptr(), addr, out.len())
            },
        }
    }

    /// Block until a producer's `event` (a raw `CUevent` of this memory's GPU, the C device
    /// interface's `sync_event`) has completed, before the arrays are read; nothing to wait
    /// for in host memory.
    ///
    /// # Safety
    /// `event` must be a live event of this memory's GPU.
    pub unsafe fn wait_for(self, event: usize) -> Result<()> {
        let Memory::Device(ordinal) = self else {
            return Ok(());
        };
        let context = crate::cuda::bind(ordinal)?;
        crate::cuda::wait_event(&context, crate::cuda::Event::from_raw(event))
    }
}

/// What the file holds at one offset: encoded bytes, or a buffer of the arrays.
#[derive(Debug, Clone)]
pub enum Piece {
    /// Framing and metadata, encoded here.
    Bytes(Vec<u8>),
    /// `len` bytes of the arrays' memory at `addr`.
    Memory {
        /// The address.
        addr: u64,
        /// The length in bytes.
        len: usize,
    },
}

/// An encoded IPC file: what to write where, and its size.
#[derive(Debug, Clone, Default)]
pub struct Encoded {
    /// `(file offset, piece)`, in file order.
    pub pieces: Vec<(u64, Piece)>,
    /// The file's size in bytes.
    pub size: u64,
}

/// Why `data_type` cannot be written by this writer, or `None` when it can.
fn unsupported(data_type: &DataType) -> Option<String> {
    match data_type {
        DataType::Null
        | DataType::Boolean
        | DataType::Utf8
        | DataType::LargeUtf8
        | DataType::Binary
        | DataType::LargeBinary => None,
        t if fixed_width(t).is_some() => None,
        DataType::List(f)
        | DataType::LargeList(f)
        | DataType::FixedSizeList(f, _)
        | DataType::Map(f, _) => unsupported(f.data_type()),
        DataType::Struct(fields) => fields.iter().find_map(|f| unsupported(f.data_type())),
        other => Some(other.to_string()),
    }
}

/// The bytes per element of a fixed-width type other than boolean.
fn fixed_width(data_type: &DataType) -> Option<u64> {
    Some(match data_type {
        DataType::Int8 | DataType::UInt8 => 1,
        DataType::Int16 | DataType::UInt16 | DataType::Float16 => 2,
        DataType::Int32
        | DataType::UInt32
        | DataType::Float32
        | DataType::Date32
        | DataType::Time32(_)
        | DataType::Decimal32(..)
        | DataType::Interval(IntervalUnit::YearMonth) => 4,
        DataType::Int64
        | DataType::UInt64
        | DataType::Float64
        | DataType::Date64
        | DataType::Time64(_)
        | DataType::Timestamp(..)
        | DataType::Duration(_)
        | DataType::Decimal64(..)
        | DataType::Interval(IntervalUnit::DayTime) => 8,
        DataType::Decimal128(..) | DataType::Interval(IntervalUnit::MonthDayNano) => 16,
        DataType::Decimal256(..) => 32,
        DataType::FixedSizeBinary(w) => u64::try_from(*w).ok()?,
        _ => return None,
    })
}

/// Fail with `UnsupportedOperation` unless every field of `schema` can be written from
/// device or host memory by this writer (dictionary, union, view and run-end encoded
/// columns cannot).
pub fn check_schema(schema: &Schema) -> Result<()> {
    for f in schema.fields() {
        if let Some(t) = unsupported(f.data_type()) {
            return Err(Error::UnsupportedOperation(format!(
                "column '{}' has Arrow type {t}, which kvikpy's IPC writer does not write \
                 from memory yet",
                f.name()
            )));
        }
    }
    Ok(())
}

fn bad(what: impl std::fmt::Display) -> Error {
    Error::InvalidArgument(format!("cannot write this table as Arrow IPC: {what}"))
}

fn padded(n: u64) -> Result<u64> {
    n.checked_next_multiple_of(ALIGN)
        .ok_or_else(|| bad("it is too large"))
}

/// Encodes an IPC file: [`FileEncoder::new`] with the schema, [`FileEncoder::batch`] for
/// each record batch, [`FileEncoder::finish`].
pub struct FileEncoder {
    schema: Schema,
    memory: Memory,
    pieces: Vec<(u64, Piece)>,
    at: u64,
    blocks: Vec<Block>,
}

/// One record batch's nodes and buffers as they are collected.
struct BatchBody {
    nodes: Vec<FieldNode>,
    buffers: Vec<Buffer>,
    memory: Vec<(u64, u64, u64)>,
    len: u64,
}

impl BatchBody {
    /// Place a buffer of `len` bytes at `addr` (nothing for an empty one).
    fn push(&mut self, addr: u64, len: u64, path: &str) -> Result<()> {
        if len > 0 && addr == 0 {
            return Err(bad(format!(
                "'{path}' has no buffer where its length needs {len} bytes"
            )));
        }
        let offset = self.len;
        self.buffers.push(Buffer::new(
            i64::try_from(offset).map_err(|_| bad("it is too large"))?,
            i64::try_from(len).map_err(|_| bad("it is too large"))?,
        ));
        if len > 0 {
            self.memory.push((offset, addr, len));
        }
        self.len = padded(
            offset
                .checked_add(len)
                .ok_or_else(|| bad("it is too large"))?,
        )?;
        Ok(())
    }
}

impl FileEncoder {
    /// Start a file of `schema`, whose arrays lie in `memory`.
    pub fn new(schema: &Schema, memory: Memory) -> Result<Self> {
        check_schema(schema)?;
        let mut me = Self {
            schema: schema.clone(),
            memory,
            pieces: Vec::new(),
            at: 0,
            blocks: Vec::new(),
        };
        let mut head = Vec::with_capacity(8);
        head.extend_from_slice(MAGIC);
        head.extend_from_slice(&[0, 0]);
        me.bytes(head);
        let mut fbb = FlatBufferBuilder::new();
        let root = IpcSchemaEncoder::new().schema_to_fb_offset(&mut fbb, schema);
        let message = message(&mut fbb, MessageHeader::Schema, root.as_union_value(), 0);
        fbb.finish(message, None);
        me.message(fbb.finished_data())?;
        Ok(me)
    }

    fn bytes(&mut self, bytes: Vec<u8>) {
        let len = bytes.len() as u64;
        self.pieces.push((self.at, Piece::Bytes(bytes)));
        self.at += len;
    }

    /// An encapsulated message: continuation, length, metadata padded so that the body
    /// after it starts at a multiple of [`ALIGN`]; returns the metadata's length.
    fn message(&mut self, metadata: &[u8]) -> Result<i32> {
        let end = self
            .at
            .checked_add(8 + metadata.len() as u64)
            .ok_or_else(|| bad("it is too large"))?;
        let total = padded(end)? - self.at;
        let meta_len = i32::try_from(total - 8).map_err(|_| bad("a header is too large"))?;
        let mut out = Vec::with_capacity(total as usize);
        out.extend_from_slice(&[0xFF; 4]);
        out.extend_from_slice(&meta_len.to_le_bytes());
        out.extend_from_slice(metadata);
        out.resize(total as usize, 0);
        self.bytes(out);
        Ok(meta_len + 8)
    }

    /// Add a record batch: `batch` is a struct array of the schema's columns; `peek`
    /// copies a few bytes of the arrays' memory to the host (a string column's last
    /// offset, the validity bitmap of an array whose null count is not known).
    pub fn batch(
        &mut self,
        batch: &ArrayIn,
        peek: &mut dyn FnMut(u64, &mut [u8]) -> Result<()>,
    ) -> Result<()> {
        let fields = self.schema.fields().clone();
        if batch.children.len() != fields.len() {
            return Err(bad(format!(
                "a record batch has {} columns where the schema has {}",
                batch.children.len(),
                fields.len()
            )));
        }
        if batch.offset != 0 || batch.null_count > 0 || batch.length < 0 {
            return Err(bad(
                "a record batch is sliced, has null rows or a negative length",
            ));
        }
        let mut body = BatchBody {
            nodes: Vec::new(),
            buffers: Vec::new(),
            memory: Vec::new(),
            len: 0,
        };
        for (field, column) in fields.iter().zip(&batch.children) {
            if column.length != batch.length {
                return Err(bad(format!(
                    "column '{}' has {} rows in a record batch of {}",
                    field.name(),
                    column.length,
                    batch.length
                )));
            }
            array(&mut body, field, column, field.name(), peek)?;
        }
        let mut fbb = FlatBufferBuilder::new();
        let nodes = fbb.create_vector(&body.nodes);
        let buffers = fbb.create_vector(&body.buffers);
        let mut rb = RecordBatchBuilder::new(&mut fbb);
        rb.add_length(batch.length);
        rb.add_nodes(nodes);
        rb.add_buffers(buffers);
        let rb = rb.finish();
        let body_len = i64::try_from(body.len).map_err(|_| bad("it is too large"))?;
        let m = message(
            &mut fbb,
            MessageHeader::RecordBatch,
            rb.as_union_value(),
            body_len,
        );
        fbb.finish(m, None);
        let start = self.at;
        let meta_len = self.message(fbb.finished_data())?;
        let body_start = self.at;
        for (offset, addr, len) in body.memory {
            let len = usize::try_from(len).map_err(|_| bad("a buffer is too large"))?;
            self.pieces
                .push((body_start + offset, Piece::Memory { addr, len }));
        }
        self.at = body_start
            .checked_add(body.len)
            .ok_or_else(|| bad("it is too large"))?;
        let start = i64::try_from(start).map_err(|_| bad("it is too large"))?;
        self.blocks.push(Block::new(start, meta_len, body_len));
        Ok(())
    }

    /// The end-of-stream marker, the footer, its length and the closing magic.
    pub fn finish(mut self) -> Result<Encoded> {
        let mut tail = EOS.to_vec();
        let mut fbb = FlatBufferBuilder::new();
        let schema = IpcSchemaEncoder::new().schema_to_fb_offset(&mut fbb, &self.schema);
        let dictionaries = fbb.create_vector::<Block>(&[]);
        let batches = fbb.create_vector(&self.blocks);
        let mut footer = FooterBuilder::new(&mut fbb);
        footer.add_version(MetadataVersion::V5);
        footer.add_schema(schema);
        footer.add_dictionaries(dictionaries);
        footer.add_recordBatches(batches);
        let footer = footer.finish();
        fbb.finish(footer, None);
        let data = fbb.finished_data();
        tail.extend_from_slice(data);
        let len = i32::try_from(data.len()).map_err(|_| bad("the footer is too large"))?;
        tail.extend_from_slice(&len.to_le_bytes());
        tail.extend_from_slice(MAGIC);
        self.bytes(tail);
        Ok(Encoded {
            pieces: self.pieces,
            size: self.at,
        })
    }

    /// The memory the arrays lie in.
    pub fn memory(&self) -> Memory {
        self.memory
    }
}

fn message<'a>(
    fbb: &mut FlatBufferBuilder<'a>,
    kind: MessageHeader,
    header: flatbuffers::WIPOffset<flatbuffers::UnionWIPOffset>,
    body_len: i64,
) -> flatbuffers::WIPOffset<arrow_ipc::Message<'a>> {
    let mut m = MessageBuilder::new(fbb);
    m.add_version(MetadataVersion::V5);
    m.add_header_type(kind);
    m.add_header(header);
    m.add_bodyLength(body_len);
    m.finish()
}

/// Bytes of a bitmap of `length` bits.
fn bitmap_len(length: u64) -> u64 {
    length.div_ceil(8)
}

/// Add `a` (of `field`, named `path` in messages) and its children to `body`.
fn array(
    body: &mut BatchBody,
    field: &Field,
    a: &ArrayIn,
    path: &str,
    peek: &mut dyn FnMut(u64, &mut [u8]) -> Result<()>,
) -> Result<()> {
    let data_type = field.data_type();
    if a.offset != 0 {
        return Err(Error::UnsupportedOperation(format!(
            "column '{path}' is a slice (offset {}), which kvikpy's IPC writer does not \
             write from memory yet",
            a.offset
        )));
    }
    if a.has_dictionary {
        return Err(bad(format!("'{path}' carries a dictionary its type lacks")));
    }
    if a.length < 0 || a.null_count < -1 || a.null_count > a.length {
        return Err(bad(format!(
            "'{path}' has length {} and null count {}",
            a.length, a.null_count
        )));
    }
    let length = a.length as u64;
    let (n_buffers, n_children) = match data_type {
        DataType::Null => (0, 0),
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Binary | DataType::LargeBinary => (3, 0),
        DataType::List(_) | DataType::LargeList(_) | DataType::Map(..) => (2, 1),
        DataType::FixedSizeList(..) => (1, 1),
        DataType::Struct(f) => (1, f.len()),
        _ => (2, 0),
    };
    if a.buffers.len() != n_buffers || a.children.len() != n_children {
        return Err(bad(format!(
            "'{path}' ({data_type}) has {} buffers and {} children where its type has {n_buffers} \
             and {n_children}",
            a.buffers.len(),
            a.children.len()
        )));
    }
    // The null count, counted from the bitmap where the producer did not know it.
    let null_count = match (a.null_count, a.buffers.first().copied()) {
        _ if matches!(data_type, DataType::Null) => a.length,
        (-1, Some(validity)) if validity != 0 && length > 0 => {
            let mut bits = vec![0u8; bitmap_len(length) as usize];
            peek(validity, &mut bits)?;
            let set: u64 = bits
                .iter()
                .enumerate()
                .map(|(i, b)| {
                    let keep = if (i as u64 + 1) * 8 > length {
                        (1u16 << (length % 8)) as u8 - 1
                    } else {
                        0xFF
                    };
                    u64::from((b & keep).count_ones())
                })
                .sum();
            (length - set) as i64
        }
        (-1, _) => 0,
        (n, _) => n,
    };
    body.nodes.push(FieldNode::new(a.length, null_count));
    if matches!(data_type, DataType::Null) {
        return Ok(());
    }
    let validity = a.buffers[0];
    if null_count > 0 {
        if validity == 0 {
            return Err(bad(format!(
                "'{path}' has {null_count} nulls but no validity bitmap"
            )));
        }
        body.push(validity, bitmap_len(length), path)?;
    } else {
        body.push(0, 0, path)?;
    }
    let overflow = || bad(format!("'{path}' is too long"));
    match data_type {
        DataType::Boolean => body.push(a.buffers[1], bitmap_len(length), path)?,
        DataType::Utf8 | DataType::Binary | DataType::LargeUtf8 | DataType::LargeBinary => {
            let width: u64 = if matches!(data_type, DataType::LargeUtf8 | DataType::LargeBinary) {
                8
            } else {
                4
            };
            let offsets = a.buffers[1];
            let values = if length > 0 {
                last_offset(offsets, length, width, path, peek)?
            } else {
                0
            };
            let offsets_len = if offsets == 0 && length == 0 {
                0
            } else {
                (length + 1).checked_mul(width).ok_or_else(overflow)?
            };
            body.push(offsets, offsets_len, path)?;
            body.push(a.buffers[2], values, path)?;
        }
        DataType::List(child) | DataType::LargeList(child) | DataType::Map(child, _) => {
            let width: u64 = if matches!(data_type, DataType::LargeList(_)) {
                8
            } else {
                4
            };
            let offsets = a.buffers[1];
            let offsets_len = if offsets == 0 && length == 0 {
                0
            } else {
                (length + 1).checked_mul(width).ok_or_else(overflow)?
            };
            body.push(offsets, offsets_len, path)?;
            let path = format!("{path}.{}", child.name());
            array(body, child, &a.children[0], &path, peek)?;
        }
        DataType::FixedSizeList(child, size) => {
            let need = length
                .checked_mul(u64::try_from(*size).map_err(|_| overflow())?)
                .ok_or_else(overflow)?;
            if (a.children[0].length as u64) < need {
                return Err(bad(format!(
                    "'{path}' holds {length} lists of {size} but its values have {} elements",
                    a.children[0].length
                )));
            }
            let path = format!("{path}.{}", child.name());
            array(body, child, &a.children[0], &path, peek)?;
        }
        DataType::Struct(fields) => {
            for (f, c) in fields.iter().zip(&a.children) {
                if c.length < a.length {
                    return Err(bad(format!(
                        "'{path}' has {} rows but its field '{}' {}",
                        a.length,
                        f.name(),
                        c.length
                    )));
                }
                let path = format!("{path}.{}", f.name());
                array(body, f, c, &path, peek)?;
            }
        }
        t => {
            let width = fixed_width(t).ok_or_else(|| {
                Error::UnsupportedOperation(format!(
                    "column '{path}' has Arrow type {t}, which kvikpy's IPC writer does not \
                     write from memory yet"
                ))
            })?;
            let len = length.checked_mul(width).ok_or_else(overflow)?;
            body.push(a.buffers[1], len, path)?;
        }
    }
    Ok(())
}

/// The last of `length + 1` offsets of `width` bytes at `offsets`: the bytes of the
/// values they index.
fn last_offset(
    offsets: u64,
    length: u64,
    width: u64,
    path: &str,
    peek: &mut dyn FnMut(u64, &mut [u8]) -> Result<()>,
) -> Result<u64> {
    if offsets == 0 {
        return Err(bad(format!("'{path}' has no offsets buffer")));
    }
    let at = length
        .checked_mul(width)
        .and_then(|o| offsets.checked_add(o))
        .ok_or_else(|| bad(format!("'{path}' is too long")))?;
    let mut raw = [0u8; 8];
    peek(at, &mut raw[..width as usize])?;
    let last = if width == 8 {
        i64::from_le_bytes(raw)
    } else {
        i64::from(i32::from_le_bytes([raw[0], raw[1], raw[2], raw[3]]))
    };
    u64::try_from(last).map_err(|_| bad(format!("'{path}' has a negative last offset {last}")))
}

/// Write `encoded` to a new file at `path`, each buffer from `memory` with kvikpy's write
/// path (device buffers by the device write, through the pinned bounce buffers, in
/// parallel on the pool), through the page cache; returns the file's size. The file is
/// written under a temporary name beside `path` and renamed over it once complete
/// ([`Replacement`]; synced first with `write_sync`): on any failure an existing file at
/// `path` is left exactly as it was, and no temporary file remains.
///
/// # Safety
/// Every [`Piece::Memory`] of `encoded` must be readable memory of its length in
/// `memory` (host, or the GPU named), unchanged until this returns.
pub unsafe fn write_file(
    path: &Path,
    encoded: &Encoded,
    memory: Memory,
    settings: &Settings,
) -> Result<u64> {
    // Through the page cache: the buffers start at multiples of 64 bytes, not of a page,
    // so direct I/O would move only their middles and write each piece in three parts,
    // which measured 2.6x slower than buffered writes for a table of 154 buffers.
    let settings = &Settings {
        auto_direct_io_write: false,
        ..settings.clone()
    };
    let replacement = Replacement::new(path, Start::Empty)?;
    let handle = FileHandle::open_with(replacement.path(), "w", settings)?;
    let mut futures = Vec::with_capacity(encoded.pieces.len());
    let mut first = None;
    for (offset, piece) in &encoded.pieces {
        let span = match (piece, memory) {
            (Piece::Bytes(b), _) => {
                // SAFETY: `b` lives in `encoded`, borrowed until every write has finished
                // (they are all waited for below); the write only reads it.
                Span::Host(unsafe { HostSpan::new(b.as_ptr().cast_mut(), b.len()) })
            }
            (Piece::Memory { addr, len }, Memory::Host) => {
                // SAFETY: the caller vouches for `len` readable bytes at `addr`, kept
                // until this returns; the write only reads them.
                Span::Host(unsafe { HostSpan::new(*addr as *mut u8, *len) })
            }
            (Piece::Memory { addr, len }, Memory::Device(ordinal)) => Span::Device(DeviceSpan {
                ptr: *addr,
                len: *len,
                ordinal,
            }),
        };
        if span.is_empty() {
            continue;
        }
        let request = Request::write(span, *offset);
        match submit(settings, &handle, request, Completion::Future) {
            Ok(f) => futures.push(f),
            Err(e) => {
                // The writes already started read `encoded` and the caller's memory:
                // they are waited for below before this returns.
                first = Some(e);
                break;
            }
        }
    }
    for f in futures {
        if let Err(e) = f.wait() {
            first.get_or_insert(e);
        }
    }
    handle.close();
    if let Some(e) = first {
        return Err(e); // `replacement` is dropped: the temporary file goes
    }
    replacement.commit(settings.write_sync)?;
    Ok(encoded.size)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    use arrow_array::{
        Array, ArrayRef, BooleanArray, Float64Array, Int32Array, ListArray, RecordBatch,
        StringArray, StructArray,
    };

    /// An [`ArrayIn`] over an arrow-rs array's own host buffers.
    fn describe(a: &dyn Array) -> ArrayIn {
        let data = a.to_data();
        let mut buffers = Vec::new();
        if !matches!(data.data_type(), DataType::Null) {
            buffers.push(data.nulls().map_or(0, |n| n.buffer().as_ptr() as u64));
        }
        for b in data.buffers() {
            buffers.push(b.as_ptr() as u64);
        }
        ArrayIn {
            length: data.len() as i64,
            null_count: data.null_count() as i64,
            offset: data.offset() as i64,
            buffers,
            children: data
                .child_data()
                .iter()
                .map(|c| describe(arrow_array::make_array(c.clone()).as_ref()))
                .collect(),
            has_dictionary: false,
        }
    }

    fn host_peek(addr: u64, out: &mut [u8]) -> Result<()> {
        // SAFETY: the tests pass addresses of live arrow-rs buffers.
        unsafe { std::ptr::copy_nonoverlapping(addr as *const u8, out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    /// The bytes of the file `encoded` describes (host memory).
    fn assemble_host(encoded: &Encoded) -> Vec<u8> {
        let mut out = vec![0u8; encoded.size as usize];
        for (offset, piece) in &encoded.pieces {
            let at = *offset as usize;
            match piece {
                Piece::Bytes(b) => out[at..at + b.len()].copy_from_slice(b),
                Piece::Memory { addr, len } => {
                    host_peek(*addr, &mut out[at..at + len]).unwrap();
                }
            }
        }
        out
    }

    fn sample() -> RecordBatch {
        let ints: ArrayRef = Arc::new(Int32Array::from(vec![Some(1), None, Some(3), Some(4)]));
        let floats: ArrayRef = Arc::new(Float64Array::from(vec![0.5, 1.5, 2.5, 3.5]));
        let text: ArrayRef = Arc::new(StringArray::from(vec![
            Some("a"),
            Some("bcd"),
            None,
            Some(""),
        ]));
        let flags: ArrayRef = Arc::new(BooleanArray::from(vec![true, false, true, true]));
        let lists: ArrayRef = Arc::new(ListArray::from_iter_primitive::<
            arrow_array::types::Int32Type,
            _,
            _,
        >(vec![
            Some(vec![Some(1), Some(2)]),
            None,
            Some(vec![]),
            Some(vec![Some(3)]),
        ]));
        let inner = StructArray::from(vec![(
            Arc::new(Field::new("x", DataType::Int32, true)),
            Arc::clone(&ints),
        )]);
        RecordBatch::try_from_iter(vec![
            ("ints", ints),
            ("floats", floats),
            ("text", text),
            ("flags", flags),
            ("lists", lists),
            ("inner", Arc::new(inner) as ArrayRef),
        ])
        .unwrap()
    }

    fn encode(batches: &[RecordBatch]) -> Result<Vec<u8>> {
        let schema = batches[0].schema();
        let mut enc = FileEncoder::new(&schema, Memory::Host)?;
        for b in batches {
            let s = StructArray::from(b.clone());
            enc.batch(&describe(&s), &mut host_peek)?;
        }
        Ok(assemble_host(&enc.finish()?))
    }

    #[test]
    fn a_written_file_reads_back_equal_in_arrow_rs() {
        let batch = sample();
        let bytes = encode(&[batch.clone(), batch.clone()]).unwrap();
        let reader =
            arrow_ipc::reader::FileReader::try_new(std::io::Cursor::new(bytes), None).unwrap();
        let got: Vec<RecordBatch> = reader.map(|b| b.unwrap()).collect();
        assert_eq!(got.len(), 2);
        for g in got {
            assert_eq!(g, batch);
        }
    }

    #[test]
    fn dictionaries_and_slices_are_refused_before_anything_is_encoded() {
        let dict = arrow_array::DictionaryArray::<arrow_array::types::Int32Type>::from_iter([
            "a", "b", "a",
        ]);
        let schema = Schema::new(vec![Field::new("d", dict.data_type().clone(), false)]);
        let err = FileEncoder::new(&schema, Memory::Host).err().unwrap();
        assert!(matches!(err, Error::UnsupportedOperation(ref m) if m.contains("'d'")));
        let batch = sample().slice(1, 2);
        let err = encode(&[batch]).unwrap_err();
        assert!(matches!(err, Error::UnsupportedOperation(ref m) if m.contains("slice")));
    }

    #[test]
    fn lying_structure_is_an_error_not_a_panic() {
        let batch = sample();
        let schema = batch.schema();
        let s = StructArray::from(batch);
        let good = describe(&s);
        let mut enc = FileEncoder::new(&schema, Memory::Host).unwrap();
        let mut wrong = good.clone();
        wrong.children.pop();
        assert!(enc.batch(&wrong, &mut host_peek).is_err());
        let mut wrong = good.clone();
        wrong.children[0].buffers.push(0);
        assert!(enc.batch(&wrong, &mut host_peek).is_err());
        let mut wrong = good.clone();
        wrong.children[1].null_count = 99;
        assert!(enc.batch(&wrong, &mut host_peek).is_err());
        let mut wrong = good;
        wrong.children[1].buffers[1] = 0;
        assert!(enc.batch(&wrong, &mut host_peek).is_err());
    }

    #[test]
    fn unknown_null_counts_are_counted_from_the_bitmap() {
        let batch = sample();
        let schema = batch.schema();
        let s = StructArray::from(batch.clone());
        let mut d = describe(&s);
        d.children[0].null_count = -1;
        let mut enc = FileEncoder::new(&schema, Memory::Host).unwrap();
        enc.batch(&d, &mut host_peek).unwrap();
        let bytes = assemble_host(&enc.finish().unwrap());
        let mut reader =
            arrow_ipc::reader::FileReader::try_new(std::io::Cursor::new(bytes), None).unwrap();
        let got = reader.next().unwrap().unwrap();
        assert_eq!(got.column(0).null_count(), 1);
        assert_eq!(got, batch);
    }
}
