//! The framing of Arrow IPC data: the file format's magic and footer, and the stream
//! format's length-prefixed messages; what comes out is each message's metadata (a
//! verified flatbuffer, owned) and where its body lies in the file.

use arrow_ipc::{root_as_footer, root_as_message, Message, MessageHeader};

use crate::error::{Error, Result};

/// The magic at the start (padded to 8 bytes) and end of an IPC file.
pub const MAGIC: &[u8; 6] = b"ARROW1";
/// The marker before each message's length since format version 0.15.
const CONTINUATION: u32 = 0xFFFF_FFFF;
/// How many bytes a stream scan reads at once, so that the headers of small messages come
/// in one read (one request for remote files).
const WINDOW: usize = 1 << 16;

/// Reads bytes of the file being parsed.
pub trait ReadAt {
    /// The file's size in bytes.
    fn size(&self) -> u64;
    /// Exactly `len` bytes at `offset` (the caller keeps `offset + len` inside the file).
    fn read_at(&self, offset: u64, len: usize) -> Result<Vec<u8>>;
}

impl ReadAt for [u8] {
    fn size(&self) -> u64 {
        self.len() as u64
    }
    fn read_at(&self, offset: u64, len: usize) -> Result<Vec<u8>> {
        let start = usize::try_from(offset).map_err(|_| malformed("an offset is too large"))?;
        let end = start
            .checked_add(len)
            .ok_or_else(|| malformed("a length overflows"))?;
        self.get(start..end)
            .map(<[u8]>::to_vec)
            .ok_or_else(|| malformed(format!("bytes {start}..{end} lie past its end")))
    }
}

/// The error of a file that is not valid Arrow IPC data.
pub fn malformed(what: impl std::fmt::Display) -> Error {
    Error::InvalidArgument(format!(
        "not a valid Arrow IPC file or stream: {what}; check that the file is complete and \
         was written by an Arrow IPC writer"
    ))
}

/// Which of the two IPC formats a file is in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// The random-access file format (Feather v2, `.arrow`): magic, messages, footer.
    File,
    /// The streaming format: a schema message, then dictionary and record batch messages.
    Stream,
}

/// One message: its metadata flatbuffer (verified when it was read) and its body's place.
#[derive(Debug, Clone)]
pub struct MessageRef {
    /// The `Message` flatbuffer.
    pub metadata: Vec<u8>,
    /// Where the body starts in the file.
    pub body_offset: u64,
    /// The body's length in bytes.
    pub body_len: u64,
}

impl MessageRef {
    /// The message, parsed (verified again: cheap, and keeps this type free of lifetimes).
    pub fn message(&self) -> Result<Message<'_>> {
        root_as_message(&self.metadata).map_err(|e| malformed(format!("a message: {e}")))
    }
}

/// The messages of an IPC file or stream, in file order.
#[derive(Debug)]
pub struct Messages {
    /// The format found.
    pub format: Format,
    /// The schema flatbuffer: the footer (file format) or the first message (stream).
    pub schema: SchemaBytes,
    /// Dictionary batches and record batches in the order they come.
    pub messages: Vec<(Kind, MessageRef)>,
}

/// Where the schema lies: inside a footer or inside a schema message.
#[derive(Debug)]
pub enum SchemaBytes {
    /// A `Footer` flatbuffer.
    Footer(Vec<u8>),
    /// A `Message` flatbuffer whose header is the schema.
    Message(Vec<u8>),
}

impl SchemaBytes {
    /// The schema table.
    pub fn schema(&self) -> Result<arrow_ipc::Schema<'_>> {
        match self {
            SchemaBytes::Footer(bytes) => root_as_footer(bytes)
                .map_err(|e| malformed(format!("the footer: {e}")))?
                .schema()
                .ok_or_else(|| malformed("the footer has no schema")),
            SchemaBytes::Message(bytes) => root_as_message(bytes)
                .map_err(|e| malformed(format!("the schema message: {e}")))?
                .header_as_schema()
                .ok_or_else(|| malformed("the first message is not a schema")),
        }
    }
}

/// What a body message holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// A dictionary batch.
    Dictionary,
    /// A record batch.
    RecordBatch,
}

fn i32_at(bytes: &[u8], at: usize) -> Result<i32> {
    bytes
        .get(at..at + 4)
        .and_then(|b| b.try_into().ok())
        .map(i32::from_le_bytes)
        .ok_or_else(|| malformed("a length prefix is cut short"))
}

/// Read the messages of the IPC file or stream behind `reader`.
pub fn scan(reader: &(impl ReadAt + ?Sized)) -> Result<Messages> {
    let size = reader.size();
    if size >= 8 && reader.read_at(0, 6)?.as_slice() == MAGIC {
        scan_file(reader, size)
    } else {
        scan_stream(reader, size)
    }
}

/// A length from the file as a `usize` no larger than `limit`.
fn bounded(value: i64, limit: u64, what: &str) -> Result<usize> {
    u64::try_from(value)
        .ok()
        .filter(|&v| v <= limit)
        .and_then(|v| usize::try_from(v).ok())
        .ok_or_else(|| malformed(format!("{what} is {value}, beyond the {limit} bytes there")))
}

fn scan_file(reader: &(impl ReadAt + ?Sized), size: u64) -> Result<Messages> {
    // magic (8 with padding) ... footer, footer length (4), magic (6)
    if size < 8 + 10 {
        return Err(malformed(format!("a file of {size} bytes is too short")));
    }
    let tail = reader.read_at(size - 10, 10)?;
    if &tail[4..] != MAGIC {
        return Err(malformed(
            "the file does not end with the ARROW1 magic (cut short?)",
        ));
    }
    let footer_len = bounded(i64::from(i32_at(&tail, 0)?), size - 18, "the footer length")?;
    let footer_start = size - 10 - footer_len as u64;
    let footer = reader.read_at(footer_start, footer_len)?;
    let parsed = root_as_footer(&footer).map_err(|e| malformed(format!("the footer: {e}")))?;
    let mut blocks = Vec::new();
    for (kind, list) in [
        (Kind::Dictionary, parsed.dictionaries()),
        (Kind::RecordBatch, parsed.recordBatches()),
    ] {
        for block in list.iter().flatten() {
            blocks.push((kind, *block));
        }
    }
    let mut messages = Vec::with_capacity(blocks.len());
    for (i, (kind, block)) in blocks.into_iter().enumerate() {
        let offset = bounded(block.offset(), footer_start, "a block's offset")? as u64;
        let room = footer_start - offset;
        let meta_len = bounded(
            i64::from(block.metaDataLength()),
            room,
            "a block's metadata length",
        )?;
        let body_len = bounded(
            block.bodyLength(),
            room - meta_len as u64,
            "a block's body length",
        )?;
        let header = reader.read_at(offset, meta_len)?;
        let (metadata, _) = split_prefix(&header, 0)
            .ok_or_else(|| malformed(format!("block {i}'s message has no valid length prefix")))?;
        let message = check_message(&metadata, kind)?;
        if message.bodyLength() != body_len as i64 {
            return Err(malformed(format!(
                "block {i} says its body has {body_len} bytes, its message {}",
                message.bodyLength()
            )));
        }
        messages.push((
            kind,
            MessageRef {
                metadata,
                body_offset: offset + meta_len as u64,
                body_len: body_len as u64,
            },
        ));
    }
    Ok(Messages {
        format: Format::File,
        schema: SchemaBytes::Footer(footer),
        messages,
    })
}

/// The flatbuffer after a message's length prefix in `bytes` (which start at the prefix),
/// and the prefix's size; `None` if the prefix says more than `bytes` hold. A length of
/// 0 (end of stream) gives an empty flatbuffer.
fn split_prefix(bytes: &[u8], _at: usize) -> Option<(Vec<u8>, usize)> {
    let first = u32::from_le_bytes(bytes.get(0..4)?.try_into().ok()?);
    let (len, prefix) = if first == CONTINUATION {
        (
            i32::from_le_bytes(bytes.get(4..8)?.try_into().ok()?),
            8usize,
        )
    } else {
        (first as i32, 4usize)
    };
    let len = usize::try_from(len).ok()?;
    Some((
        bytes.get(prefix..prefix.checked_add(len)?)?.to_vec(),
        prefix,
    ))
}

/// Verify a message flatbuffer and check it is a `kind` message.
fn check_message(metadata: &[u8], kind: Kind) -> Result<Message<'_>> {
    let message = root_as_message(metadata).map_err(|e| malformed(format!("a message: {e}")))?;
    let found = message.header_type();
    let ok = match kind {
        Kind::Dictionary => found == MessageHeader::DictionaryBatch,
        Kind::RecordBatch => found == MessageHeader::RecordBatch,
    };
    if !ok {
        return Err(malformed(format!(
            "a {kind:?} block holds a {:?} message",
            found.variant_name().unwrap_or("unknown")
        )));
    }
    Ok(message)
}

/// Bytes of the reader served from one read-ahead window where they fit.
struct Window<'r, R: ReadAt + ?Sized> {
    reader: &'r R,
    start: u64,
    bytes: Vec<u8>,
}

impl<R: ReadAt + ?Sized> Window<'_, R> {
    /// `len` bytes at `offset`, which the caller keeps inside the file.
    fn get(&mut self, offset: u64, len: usize) -> Result<Vec<u8>> {
        let inside = offset
            .checked_sub(self.start)
            .and_then(|rel| usize::try_from(rel).ok())
            .and_then(|rel| Some(rel..rel.checked_add(len)?))
            .filter(|r| r.end <= self.bytes.len());
        if let Some(r) = inside {
            return Ok(self.bytes[r].to_vec());
        }
        let size = self.reader.size();
        let want = len
            .max(WINDOW)
            .min(usize::try_from(size - offset).unwrap_or(usize::MAX));
        self.bytes = self.reader.read_at(offset, want)?;
        self.start = offset;
        Ok(self.bytes[..len].to_vec())
    }
}

fn scan_stream(reader: &(impl ReadAt + ?Sized), size: u64) -> Result<Messages> {
    let mut window = Window {
        reader,
        start: 0,
        bytes: Vec::new(),
    };
    let mut pos = 0u64;
    let mut schema = None;
    let mut messages = Vec::new();
    let mut ended = false;
    while size - pos >= 4 {
        let head = window.get(pos, (size - pos).min(8) as usize)?;
        let first = u32::from_le_bytes([head[0], head[1], head[2], head[3]]);
        let (len, prefix) = if first == CONTINUATION {
            if head.len() < 8 {
                return Err(malformed(format!("the message at byte {pos} is cut short")));
            }
            (i32_at(&head, 4)?, 8u64)
        } else {
            (first as i32, 4u64)
        };
        if len == 0 {
            ended = true;
            break; // end-of-stream marker
        }
        let room = size - pos - prefix;
        let len = bounded(
            i64::from(len),
            room,
            &format!("the length of the message at byte {pos}"),
        )?;
        let metadata = window.get(pos + prefix, len)?;
        let message = root_as_message(&metadata)
            .map_err(|e| malformed(format!("the message at byte {pos}: {e}")))?;
        let body_len = bounded(
            message.bodyLength(),
            room - len as u64,
            &format!("the body length of the message at byte {pos}"),
        )? as u64;
        let body_offset = pos + prefix + len as u64;
        let kind = match message.header_type() {
            MessageHeader::Schema if schema.is_none() => None,
            MessageHeader::DictionaryBatch if schema.is_some() => Some(Kind::Dictionary),
            MessageHeader::RecordBatch if schema.is_some() => Some(Kind::RecordBatch),
            other => {
                return Err(malformed(format!(
                    "the message at byte {pos} is a {} message{}",
                    other.variant_name().unwrap_or("unknown"),
                    if schema.is_none() {
                        " where the schema should come first"
                    } else {
                        ""
                    }
                )))
            }
        };
        match kind {
            None => schema = Some(SchemaBytes::Message(metadata)),
            Some(kind) => messages.push((
                kind,
                MessageRef {
                    metadata,
                    body_offset,
                    body_len,
                },
            )),
        }
        pos = body_offset + body_len;
    }
    // A clean end falls between messages (or at the end-of-stream marker); 1 to 3 bytes
    // left are the start of a message marker whose rest is missing.
    if !ended && pos < size {
        return Err(malformed(format!(
            "the stream is cut short: it ends {} byte(s) into the message marker at byte {pos}",
            size - pos
        )));
    }
    let schema = schema.ok_or_else(|| {
        malformed(
            "it holds no schema message (an IPC stream starts with one; an IPC file with ARROW1)",
        )
    })?;
    Ok(Messages {
        format: Format::Stream,
        schema,
        messages,
    })
}

/// A record batch's buffer compression.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Codec {
    /// LZ4 frame format.
    Lz4Frame,
    /// Zstandard.
    Zstd,
}
