//! The read plan of an IPC file: which byte ranges of which bodies the chosen columns and
//! record batches need, checked against their bodies, types and row counts, and how each
//! column's arrays are laid out over those ranges once they are read.

use std::collections::HashMap;
use std::sync::Arc;

use arrow_ipc::{Buffer, FieldNode, MetadataVersion, RecordBatch};
use arrow_schema::{DataType, Schema};

use super::framing::{malformed, Codec, Kind, Messages};
use super::schema::{fixed_width, IpcSchema, SchemaNode};
use crate::error::{Error, Result};

/// One array of a record batch (a column, a child, a dictionary), over the plan's ranges.
#[derive(Debug, Clone)]
pub struct Column {
    /// Its Arrow type (`DataType::Dictionary` for dictionary-encoded arrays).
    pub data_type: DataType,
    /// Its length in elements.
    pub length: i64,
    /// Its null count.
    pub null_count: i64,
    /// Its buffers in the C data interface's order, each an index into
    /// [`ReadPlan::ranges`], or `None` for a buffer not read (no nulls, or empty).
    pub buffers: Vec<Option<usize>>,
    /// Its child arrays.
    pub children: Vec<Column>,
    /// The dictionary of a dictionary-encoded array.
    pub dictionary: Option<Arc<Column>>,
    /// For an array built after the read (a dictionary extended by delta batches): its
    /// index in [`ReadPlan::built`]; its `buffers` are then all `None`.
    pub built: Option<usize>,
}

/// An array built after the read: the concatenation (see [`super::concat`]) of its parts,
/// planned as they lie in the file (a dictionary's base batch, then its deltas).
#[derive(Debug, Clone)]
pub struct Built {
    /// The parts, in order.
    pub parts: Vec<Column>,
}

/// One record batch: its row count and its chosen columns.
#[derive(Debug, Clone)]
pub struct BatchLayout {
    /// Rows in the batch.
    pub num_rows: i64,
    /// The chosen columns, in the order asked for.
    pub columns: Vec<Column>,
}

/// What to read and how it is laid out.
#[derive(Debug, Clone)]
pub struct ReadPlan {
    /// The schema of the chosen columns.
    pub schema: Schema,
    /// `(file offset, length)` of every buffer to read, in destination order.
    pub ranges: Vec<(u64, u64)>,
    /// Each range's compression (None: read as is).
    pub codecs: Vec<Option<Codec>>,
    /// The bytes each range must hold once decoded (checked at once for ranges read as
    /// they are).
    pub needs: Vec<u64>,
    /// The chosen record batches.
    pub batches: Vec<BatchLayout>,
    /// Record batches in the file.
    pub total_batches: usize,
    /// The arrays built after the read, which columns refer to by index.
    pub built: Vec<Built>,
}

/// Where every range of a [`ReadPlan`] goes in the table's one allocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Layout {
    /// Each range's offset in the allocation.
    pub offsets: Vec<usize>,
    /// The allocation's size.
    pub total: usize,
}

/// Arrow's buffer alignment: every buffer of a table starts at a multiple of 64 bytes.
pub(crate) const ALIGN: usize = 64;

/// The largest gap (padding between buffers) a read of two neighbouring ranges spans.
const JOIN_GAP: u64 = 4096;

impl Layout {
    /// The reads that fill this layout from the file: `(file offset, bytes)` with each
    /// one's place, in destination order, ranges that follow each other both in the file
    /// and in the allocation joined into one read. `ranges` and `sizes` are the plan's
    /// ranges and each one's bytes as read ([`ReadPlan::read_sizes`]).
    pub fn reads(&self, ranges: &[(u64, u64)], sizes: &[u64]) -> (Vec<(u64, u64)>, Vec<usize>) {
        let mut order: Vec<usize> = (0..ranges.len()).filter(|&r| sizes[r] > 0).collect();
        order.sort_unstable_by_key(|&r| self.offsets[r]);
        let mut reads: Vec<(u64, u64)> = Vec::with_capacity(order.len());
        let mut starts: Vec<usize> = Vec::with_capacity(order.len());
        for r in order {
            let (offset, size, start) = (ranges[r].0, sizes[r], self.offsets[r]);
            if let (Some(last), Some(&at)) = (reads.last_mut(), starts.last()) {
                // The next range lies as far past this one in the file as in the table,
                // across a gap of at most `JOIN_GAP` (padding): one read covers both,
                // the gap's bytes landing in the table's gap, which nothing else uses.
                let file_gap = offset.checked_sub(last.0 + last.1);
                let here_gap = (start as u64).checked_sub(at as u64 + last.1);
                if let (Some(g), Some(h)) = (file_gap, here_gap) {
                    if g == h && g <= JOIN_GAP {
                        last.1 += g + size;
                        continue;
                    }
                }
            }
            reads.push((offset, size));
            starts.push(start);
        }
        (reads, starts)
    }
}

/// The range holding the values of `column` when a tensor can view them: a fixed-width
/// column (not a dictionary, not bits), or a fixed-size list of such values, without
/// nulls at either level; `None` otherwise (or when the values buffer was not read).
pub fn tensor_values(column: &Column) -> Option<usize> {
    let values = match &column.data_type {
        DataType::FixedSizeList(..) => column.children.first()?,
        _ => column,
    };
    let fixed = !matches!(values.data_type, DataType::Dictionary(..))
        && fixed_width(&values.data_type).is_some_and(|w| w > 0);
    (fixed && column.null_count == 0 && values.null_count == 0)
        .then(|| values.buffers.get(1).copied().flatten())
        .flatten()
}

impl ReadPlan {
    /// Where each range goes in one allocation, given each range's size there (its
    /// bytes once read or decoded).
    ///
    /// The ranges are laid out column by column, and within a column record batch by
    /// record batch, each at a multiple of `align`, except that the values of a column a
    /// tensor can view ([`tensor_values`]) follow the same column's values of the
    /// previous record batch directly when those hold exactly the bytes their rows need:
    /// such a column's values over all its record batches are then one contiguous run,
    /// one tensor. Dictionaries and arrays joined after the read (shared by several
    /// batches) are placed once, where first met.
    pub fn layout(&self, sizes: &[u64], align: usize) -> Result<Layout> {
        let overflow =
            || Error::InvalidArgument("the table's size overflows the address space".into());
        if sizes.len() != self.ranges.len() {
            return Err(Error::InvalidArgument(format!(
                "{} sizes for {} ranges",
                sizes.len(),
                self.ranges.len()
            )));
        }
        let sizes = sizes
            .iter()
            .map(|&s| usize::try_from(s).map_err(|_| overflow()))
            .collect::<Result<Vec<usize>>>()?;
        let mut offsets: Vec<Option<usize>> = vec![None; sizes.len()];
        let mut end = 0usize;
        let mut last: Option<usize> = None; // the range placed last
        let mut place =
            |r: usize, tight: bool, end: &mut usize, last: &mut Option<usize>| -> Result<()> {
                if offsets[r].is_some() {
                    return Ok(());
                }
                let start = if tight {
                    *end
                } else {
                    end.checked_next_multiple_of(align.max(1))
                        .ok_or_else(overflow)?
                };
                offsets[r] = Some(start);
                *end = start.checked_add(sizes[r]).ok_or_else(overflow)?;
                *last = Some(r);
                Ok(())
            };
        let columns = self.batches.first().map_or(0, |b| b.columns.len());
        // Columns in the order they lie in the file (not the order asked for), so that
        // the allocation follows the file where it can and reads of neighbours join.
        let mut by_file: Vec<(u64, usize)> = (0..columns)
            .map(|c| {
                let mut first = Vec::new();
                if let Some(column) = self.batches.iter().find_map(|b| b.columns.get(c)) {
                    self.ranges_of(column, &mut first);
                }
                let at = first
                    .iter()
                    .map(|&r| self.ranges[r].0)
                    .min()
                    .unwrap_or(u64::MAX);
                (at, c)
            })
            .collect();
        by_file.sort_unstable();
        for (_, c) in by_file {
            let mut previous: Option<usize> = None; // this column's values, last batch
            for batch in &self.batches {
                let Some(column) = batch.columns.get(c) else {
                    continue;
                };
                if column.length == 0 {
                    continue; // no bytes: the next batch's values may still follow on
                }
                let values = tensor_values(column);
                let mut order = Vec::new();
                self.ranges_of(column, &mut order);
                for r in order {
                    let tight = Some(r) == values
                        && previous
                            .is_some_and(|p| last == Some(p) && sizes[p] as u64 == self.needs[p]);
                    place(r, tight, &mut end, &mut last)?;
                }
                previous = values;
            }
        }
        for r in 0..sizes.len() {
            place(r, false, &mut end, &mut last)?; // anything no column reached
        }
        Ok(Layout {
            offsets: offsets.into_iter().map(Option::unwrap_or_default).collect(),
            total: end,
        })
    }

    /// The ranges `column` refers to, depth first: its buffers, its children, its
    /// dictionary, the parts of an array joined after the read.
    fn ranges_of(&self, column: &Column, out: &mut Vec<usize>) {
        out.extend(column.buffers.iter().flatten().copied());
        for child in &column.children {
            self.ranges_of(child, out);
        }
        if let Some(dictionary) = &column.dictionary {
            self.ranges_of(dictionary, out);
        }
        if let Some(built) = column.built.and_then(|i| self.built.get(i)) {
            for part in &built.parts {
                self.ranges_of(part, out);
            }
        }
    }

    /// The bytes each range is read as when it is not compressed: the range, trimmed to
    /// the bytes its rows need for the values of a column a tensor can view (so that
    /// the next record batch's values can follow them directly; see [`Self::layout`]).
    pub fn read_sizes(&self) -> Vec<u64> {
        let values = self.is_tensor_values();
        self.ranges
            .iter()
            .enumerate()
            .map(|(r, &(_, len))| {
                if values[r] && self.codecs[r].is_none() {
                    len.min(self.needs[r])
                } else {
                    len
                }
            })
            .collect()
    }

    /// Whether range `r` holds the values of a column a tensor can view in some record
    /// batch ([`tensor_values`]): such a range is placed with exactly the bytes its rows
    /// need, so that the next batch's values can follow it.
    pub fn is_tensor_values(&self) -> Vec<bool> {
        let mut out = vec![false; self.ranges.len()];
        for batch in &self.batches {
            for column in &batch.columns {
                if let Some(r) = tensor_values(column) {
                    out[r] = true;
                }
            }
        }
        out
    }

    /// The bytes the plan reads.
    pub fn bytes(&self) -> u64 {
        self.ranges.iter().map(|r| r.1).sum()
    }

    /// Whether some buffers are compressed (decoded on the host).
    pub fn is_compressed(&self) -> bool {
        self.codecs.iter().any(Option::is_some)
    }
}

/// Walks the field nodes and buffers of one record batch message.
struct Walk<'a> {
    nodes: flatbuffers::Vector<'a, FieldNode>,
    buffers: flatbuffers::Vector<'a, Buffer>,
    node: usize,
    buffer: usize,
    body_offset: u64,
    body_len: u64,
    what: String,
    codec: Option<Codec>,
    /// The data buffer counts of the view-typed arrays (`variadicBufferCounts`), in order.
    variadic: Option<flatbuffers::Vector<'a, i64>>,
    variadic_next: usize,
    /// The message's metadata version (unions had a validity buffer before V5).
    version: MetadataVersion,
}

/// Collects the ranges to read, bounded by the file's size.
struct Ranges {
    ranges: Vec<(u64, u64)>,
    codecs: Vec<Option<Codec>>,
    needs: Vec<u64>,
    total: u64,
    limit: u64,
}

impl Ranges {
    fn push(&mut self, offset: u64, len: u64, codec: Option<Codec>, need: u64) -> Result<usize> {
        self.total = self
            .total
            .checked_add(len)
            .filter(|&t| t <= self.limit)
            .ok_or_else(|| {
                malformed(format!(
                    "its buffers add up to more than the file's {} bytes (they overlap)",
                    self.limit
                ))
            })?;
        self.ranges.push((offset, len));
        self.codecs.push(codec);
        self.needs.push(need);
        Ok(self.ranges.len() - 1)
    }
}

impl Walk<'_> {
    fn next_node(&mut self, path: &str) -> Result<(i64, i64)> {
        let node = (self.node < self.nodes.len())
            .then(|| self.nodes.get(self.node))
            .ok_or_else(|| malformed(format!("{} has no field node for '{path}'", self.what)))?;
        self.node += 1;
        let (length, nulls) = (node.length(), node.null_count());
        if length < 0 || nulls < 0 || nulls > length {
            return Err(malformed(format!(
                "{} gives '{path}' {length} elements with {nulls} nulls",
                self.what
            )));
        }
        Ok((length, nulls))
    }

    /// The next buffer's `(file offset, length)`, checked to lie inside the body.
    fn next_buffer(&mut self, path: &str) -> Result<(u64, u64)> {
        let buffer = (self.buffer < self.buffers.len())
            .then(|| self.buffers.get(self.buffer))
            .ok_or_else(|| malformed(format!("{} has too few buffers for '{path}'", self.what)))?;
        self.buffer += 1;
        let (offset, len) = (buffer.offset(), buffer.length());
        let inside = u64::try_from(offset)
            .ok()
            .zip(u64::try_from(len).ok())
            .filter(|&(o, l)| o.checked_add(l).is_some_and(|end| end <= self.body_len));
        let (o, l) = inside.ok_or_else(|| {
            malformed(format!(
                "{}: a buffer of '{path}' (offset {offset}, length {len}) lies outside its \
                 body of {} bytes",
                self.what, self.body_len
            ))
        })?;
        Ok((self.body_offset + o, l))
    }

    /// The data buffer count of the next view-typed array, no more than the buffers left.
    fn next_variadic(&mut self, path: &str) -> Result<usize> {
        let count = self
            .variadic
            .filter(|v| self.variadic_next < v.len())
            .map(|v| v.get(self.variadic_next))
            .ok_or_else(|| {
                malformed(format!(
                    "{} has no variadic buffer count for the view-typed '{path}'",
                    self.what
                ))
            })?;
        self.variadic_next += 1;
        let left = self.buffers.len() - self.buffer;
        usize::try_from(count)
            .ok()
            .filter(|&n| n <= left)
            .ok_or_else(|| {
                malformed(format!(
                    "{} gives '{path}' {count} data buffers where {left} buffers are left",
                    self.what
                ))
            })
    }
}

/// Bytes needed for `count` items of `width` bytes, or of bits when `width` is 0.
fn needed(count: i64, width: u64, path: &str) -> Result<u64> {
    let count = count as u64; // checked non-negative by `next_node`
    let bytes = if width == 0 {
        Some(count.div_ceil(8))
    } else {
        count.checked_mul(width)
    };
    bytes.ok_or_else(|| malformed(format!("'{path}' is too long")))
}

/// A dictionary's value field, the message holding its current dictionary, and that
/// dictionary planned (once a chosen batch needed it).
type DictionaryState = (SchemaNode, Option<usize>, Option<Arc<Column>>);

/// The planning state shared by all batches: ranges, dictionaries.
struct Planner<'m> {
    ranges: Ranges,
    /// For each dictionary id: its value field, and the message holding its current
    /// dictionary together with its planned column (once a chosen batch needed it).
    dictionaries: HashMap<i64, DictionaryState>,
    /// For each dictionary extended by delta batches: the messages holding the deltas.
    deltas: HashMap<i64, Vec<usize>>,
    /// The arrays built after the read.
    built: Vec<Built>,
    messages: &'m Messages,
}

impl Planner<'_> {
    /// Walk one array: `keep` plans its buffers, otherwise they are only checked.
    fn array(
        &mut self,
        w: &mut Walk<'_>,
        node: &SchemaNode,
        path: &str,
        keep: bool,
    ) -> Result<Option<Column>> {
        let (length, null_count) = w.next_node(path)?;
        let validity = w.next_buffer_for_validity(path, node)?;
        let mut buffers = Vec::new();
        let mut children = Vec::new();
        let mut dictionary = None;
        let what = w.what.clone();
        let codec = w.codec;
        let add = |planner: &mut Self, range: (u64, u64), need: u64| -> Result<Option<usize>> {
            if range.1 < need && codec.is_none() {
                return Err(malformed(format!(
                    "{what}: a buffer of '{path}' has {} bytes where {length} elements need {need}",
                    range.1
                )));
            }
            if !keep || range.1 == 0 {
                return Ok(None);
            }
            planner.ranges.push(range.0, range.1, codec, need).map(Some)
        };
        // Validity: read only when there are nulls (a null pointer means "all valid").
        match validity {
            None => {}
            Some(v) => {
                let need = if null_count > 0 {
                    needed(length, 0, path)?
                } else {
                    0
                };
                let v = if null_count > 0 { v } else { (v.0, 0) };
                buffers.push(add(self, v, need)?);
            }
        }
        let data_type = node.field.data_type();
        match data_type {
            DataType::Null => {}
            DataType::Dictionary(index, _) => {
                let width = fixed_width(index).unwrap_or(8);
                let b = w.next_buffer(path)?;
                buffers.push(add(self, b, needed(length, width, path)?)?);
                if keep {
                    let id = node.dictionary.unwrap_or_default();
                    dictionary = Some(self.dictionary(id, path)?);
                }
            }
            t if fixed_width(t).is_some() => {
                let b = w.next_buffer(path)?;
                let width = fixed_width(t).unwrap_or_default();
                buffers.push(add(self, b, needed(length, width, path)?)?);
            }
            DataType::Binary | DataType::Utf8 | DataType::LargeBinary | DataType::LargeUtf8 => {
                let width = if t_large(data_type) { 8 } else { 4 };
                let offsets = w.next_buffer(path)?;
                let need = if length > 0 {
                    needed(length + 1, width, path)?
                } else {
                    0
                };
                buffers.push(add(self, offsets, need)?);
                let data = w.next_buffer(path)?;
                buffers.push(add(self, data, 0)?);
            }
            DataType::List(_) | DataType::LargeList(_) | DataType::Map(..) => {
                let width = if matches!(data_type, DataType::LargeList(_)) {
                    8
                } else {
                    4
                };
                let offsets = w.next_buffer(path)?;
                let need = if length > 0 {
                    needed(length + 1, width, path)?
                } else {
                    0
                };
                buffers.push(add(self, offsets, need)?);
                let c = &node.children[0];
                children.extend(self.array(w, c, &format!("{path}.{}", c.field.name()), keep)?);
            }
            DataType::Utf8View | DataType::BinaryView => {
                // Views (16 bytes each), then this array's share of the data buffers.
                let views = w.next_buffer(path)?;
                buffers.push(add(self, views, needed(length, 16, path)?)?);
                for _ in 0..w.next_variadic(path)? {
                    let data = w.next_buffer(path)?;
                    buffers.push(add(self, data, 0)?);
                }
            }
            DataType::ListView(_) | DataType::LargeListView(_) => {
                let width = if matches!(data_type, DataType::LargeListView(_)) {
                    8
                } else {
                    4
                };
                for _ in 0..2 {
                    // offsets, then sizes: one of each per list
                    let b = w.next_buffer(path)?;
                    buffers.push(add(self, b, needed(length, width, path)?)?);
                }
                let c = &node.children[0];
                children.extend(self.array(w, c, &format!("{path}.{}", c.field.name()), keep)?);
            }
            DataType::Union(_, mode) => {
                let ids = w.next_buffer(path)?;
                buffers.push(add(self, ids, needed(length, 1, path)?)?);
                let dense = matches!(mode, arrow_schema::UnionMode::Dense);
                if dense {
                    let offsets = w.next_buffer(path)?;
                    buffers.push(add(self, offsets, needed(length, 4, path)?)?);
                }
                for c in &node.children {
                    let child = self.array(w, c, &format!("{path}.{}", c.field.name()), keep)?;
                    if let Some(child) = child {
                        if !dense && child.length < length {
                            return Err(malformed(format!(
                                "{}: the sparse union '{path}' has {length} elements but its \
                                 member '{}' {}",
                                w.what,
                                c.field.name(),
                                child.length
                            )));
                        }
                        children.push(child);
                    }
                }
            }
            DataType::FixedSizeList(_, size) => {
                let c = &node.children[0];
                let need = length
                    .checked_mul(i64::from(*size))
                    .ok_or_else(|| malformed(format!("'{path}' is too long")))?;
                let child = self.array(w, c, &format!("{path}.{}", c.field.name()), keep)?;
                if let Some(child) = child {
                    if child.length < need {
                        return Err(malformed(format!(
                            "{}: '{path}' holds {length} lists of {size} but its values have {} elements",
                            w.what, child.length
                        )));
                    }
                    children.push(child);
                }
            }
            DataType::Struct(_) => {
                for c in &node.children {
                    let child = self.array(w, c, &format!("{path}.{}", c.field.name()), keep)?;
                    if let Some(child) = child {
                        if child.length < length {
                            return Err(malformed(format!(
                                "{}: '{path}' has {length} rows but its field '{}' {}",
                                w.what,
                                c.field.name(),
                                child.length
                            )));
                        }
                        children.push(child);
                    }
                }
            }
            other => {
                return Err(Error::UnsupportedOperation(format!(
                    "column '{path}' has Arrow type {other}, which kvikpy cannot read onto \
                     the device yet; leave the column out (columns=[...]) or read the file \
                     with pyarrow"
                )))
            }
        }
        // A union has no validity of its own: its nulls are its children's.
        let null_count = if matches!(data_type, DataType::Union(..)) {
            0
        } else {
            null_count
        };
        Ok(keep.then(|| Column {
            data_type: data_type.clone(),
            length,
            null_count,
            buffers,
            children,
            dictionary,
            built: None,
        }))
    }

    /// The planned dictionary `id` as of the current message.
    fn dictionary(&mut self, id: i64, path: &str) -> Result<Arc<Column>> {
        let (node, message, planned) = self.dictionaries.get(&id).cloned().ok_or_else(|| {
            malformed(format!(
                "'{path}' refers to dictionary {id}, which the schema lacks"
            ))
        })?;
        if let Some(column) = planned {
            return Ok(column);
        }
        let message = message.ok_or_else(|| {
            malformed(format!(
                "'{path}' needs dictionary {id}, which no dictionary batch before it holds"
            ))
        })?;
        let base = self.dictionary_batch(message, id, &node, path)?;
        let deltas = self.deltas.get(&id).cloned().unwrap_or_default();
        let column = if deltas.is_empty() {
            base
        } else {
            let value = node.field.data_type();
            if !super::concat::concatenable(value) {
                return Err(Error::UnsupportedOperation(format!(
                    "column '{path}' is dictionary-encoded with delta dictionary batches \
                     (dictionary {id}) over values of Arrow type {value}, which kvikpy cannot \
                     extend; leave the column out (columns=[...]) or read the file with \
                     pyarrow"
                )));
            }
            let mut parts = vec![base];
            for m in deltas {
                parts.push(self.dictionary_batch(m, id, &node, path)?);
            }
            let length = parts
                .iter()
                .try_fold(0i64, |n, p| n.checked_add(p.length))
                .ok_or_else(|| malformed(format!("dictionary {id} is too long")))?;
            let null_count = parts.iter().map(|p| p.null_count).sum();
            let buffers = vec![None; parts[0].buffers.len()];
            self.built.push(Built { parts });
            Column {
                data_type: value.clone(),
                length,
                null_count,
                buffers,
                children: Vec::new(),
                dictionary: None,
                built: Some(self.built.len() - 1),
            }
        };
        let column = Arc::new(column);
        if let Some(entry) = self.dictionaries.get_mut(&id) {
            entry.2 = Some(Arc::clone(&column));
        }
        Ok(column)
    }

    /// The dictionary batch in message `message`, planned as the values of `node`.
    fn dictionary_batch(
        &mut self,
        message: usize,
        id: i64,
        node: &SchemaNode,
        path: &str,
    ) -> Result<Column> {
        let (_, m) = &self.messages.messages[message];
        let parsed = m.message()?;
        let batch = parsed
            .header_as_dictionary_batch()
            .and_then(|d| d.data())
            .ok_or_else(|| malformed(format!("dictionary batch {id} holds no data")))?;
        let what = format!("dictionary batch {id}");
        let mut walk = walk(batch, parsed.version(), m.body_offset, m.body_len, what)?;
        self.array(&mut walk, node, path, true)?
            .ok_or_else(|| malformed("an empty dictionary"))
    }
}

fn t_large(t: &DataType) -> bool {
    matches!(t, DataType::LargeBinary | DataType::LargeUtf8)
}

impl Walk<'_> {
    /// The validity buffer of a type that has one (all but null and union).
    fn next_buffer_for_validity(
        &mut self,
        path: &str,
        node: &SchemaNode,
    ) -> Result<Option<(u64, u64)>> {
        match node.field.data_type() {
            DataType::Null => Ok(None),
            // Unions have no validity buffer since metadata version 5; an older writer's
            // is skipped (a union's nulls are its children's).
            DataType::Union(..) => {
                if self.version < MetadataVersion::V5 {
                    self.next_buffer(path)?;
                }
                Ok(None)
            }
            _ => self.next_buffer(path).map(Some),
        }
    }
}

fn walk(
    batch: RecordBatch<'_>,
    version: MetadataVersion,
    body_offset: u64,
    body_len: u64,
    what: String,
) -> Result<Walk<'_>> {
    let codec = match batch.compression() {
        None => None,
        Some(c) if c.method() != arrow_ipc::BodyCompressionMethod::BUFFER => {
            return Err(malformed(format!(
                "{what} has body compression method {}",
                c.method().0
            )))
        }
        Some(c) => Some(match c.codec() {
            arrow_ipc::CompressionType::LZ4_FRAME => Codec::Lz4Frame,
            arrow_ipc::CompressionType::ZSTD => Codec::Zstd,
            other => {
                return Err(malformed(format!(
                    "{what} has compression codec {}",
                    other.0
                )))
            }
        }),
    };
    let nodes = batch
        .nodes()
        .ok_or_else(|| malformed(format!("{what} has no field nodes")))?;
    let buffers = batch
        .buffers()
        .ok_or_else(|| malformed(format!("{what} has no buffers")))?;
    Ok(Walk {
        nodes,
        buffers,
        node: 0,
        buffer: 0,
        body_offset,
        body_len,
        what,
        codec,
        variadic: batch.variadicBufferCounts(),
        variadic_next: 0,
        version,
    })
}

fn collect_dictionaries(nodes: &[SchemaNode], out: &mut HashMap<i64, DictionaryState>) {
    for node in nodes {
        if let (Some(id), DataType::Dictionary(_, value)) =
            (node.dictionary, node.field.data_type())
        {
            let mut value_node = node.clone();
            value_node.dictionary = None;
            value_node.field = node.field.clone().with_data_type(value.as_ref().clone());
            out.insert(id, (value_node, None, None));
        }
        collect_dictionaries(&node.children, out);
    }
}

/// Plan reading the columns at `columns` (indices into the schema's fields; all when
/// `None`) of the record batches at `batches` (all when `None`; a negative index counts
/// from the end, as in Python) of a file of `file_size` bytes.
pub fn plan(
    messages: &Messages,
    schema: &IpcSchema,
    columns: Option<&[usize]>,
    batches: Option<&[i64]>,
    file_size: u64,
) -> Result<ReadPlan> {
    let all: Vec<usize> = (0..schema.fields.len()).collect();
    let columns = columns.unwrap_or(&all);
    // Which fields are read, by field index: one pass, so planning stays linear in the
    // columns (a `contains` per field made a 100,000-column table take seconds).
    let mut keep = vec![false; schema.fields.len()];
    for &c in columns {
        if c >= schema.fields.len() {
            return Err(Error::OutOfRange(format!(
                "column {c} is out of range: the table has {} columns",
                schema.fields.len()
            )));
        }
        keep[c] = true;
    }
    let batch_messages: Vec<usize> = messages
        .messages
        .iter()
        .enumerate()
        .filter(|(_, (k, _))| *k == Kind::RecordBatch)
        .map(|(i, _)| i)
        .collect();
    let total_batches = batch_messages.len();
    let chosen: Vec<usize> = match batches {
        None => (0..total_batches).collect(),
        Some(asked) => asked
            .iter()
            .map(|&b| {
                let total = i64::try_from(total_batches).unwrap_or(i64::MAX);
                let index = if b < 0 { b.checked_add(total) } else { Some(b) };
                index
                    .filter(|&i| (0..total).contains(&i))
                    .map(|i| i as usize)
                    .ok_or_else(|| {
                        Error::OutOfRange(format!(
                            "record batch {b} is out of range: the file has {total_batches}"
                        ))
                    })
            })
            .collect::<Result<Vec<usize>>>()?,
    };
    let mut dictionaries = HashMap::new();
    collect_dictionaries(&schema.fields, &mut dictionaries);
    let mut planner = Planner {
        ranges: Ranges {
            ranges: Vec::new(),
            codecs: Vec::new(),
            needs: Vec::new(),
            total: 0,
            limit: file_size,
        },
        dictionaries,
        deltas: HashMap::new(),
        built: Vec::new(),
        messages,
    };
    // Batches in file order (dictionaries change along the stream), then as asked.
    let mut order: Vec<usize> = chosen.clone();
    order.sort_unstable();
    order.dedup();
    let mut planned: HashMap<usize, BatchLayout> = HashMap::new();
    let mut next = order.iter().peekable();
    let mut batch_index = 0;
    for (i, (kind, m)) in messages.messages.iter().enumerate() {
        if next.peek().is_none() {
            break;
        }
        let parsed = m.message()?;
        match kind {
            Kind::Dictionary => {
                let d = parsed
                    .header_as_dictionary_batch()
                    .ok_or_else(|| malformed("a dictionary block holds another message"))?;
                let known = planner.dictionaries.contains_key(&d.id());
                if d.isDelta() {
                    if !known {
                        return Err(malformed(format!(
                            "a delta dictionary batch extends dictionary {}, which the \
                             schema lacks",
                            d.id()
                        )));
                    }
                    planner.deltas.entry(d.id()).or_default().push(i);
                    if let Some(entry) = planner.dictionaries.get_mut(&d.id()) {
                        entry.2 = None; // planned again, with the delta
                    }
                } else if let Some(entry) = planner.dictionaries.get_mut(&d.id()) {
                    *entry = (entry.0.clone(), Some(i), None);
                    planner.deltas.remove(&d.id());
                }
            }
            Kind::RecordBatch => {
                let this = batch_index;
                batch_index += 1;
                if next.peek() != Some(&&this) {
                    continue;
                }
                next.next();
                let batch = parsed
                    .header_as_record_batch()
                    .ok_or_else(|| malformed("a record batch block holds another message"))?;
                let num_rows = batch.length();
                let what = format!("record batch {this}");
                let mut w = walk(batch, parsed.version(), m.body_offset, m.body_len, what)?;
                let mut out: Vec<Option<Column>> = vec![None; schema.fields.len()];
                for (f, node) in schema.fields.iter().enumerate() {
                    let col = planner.array(&mut w, node, node.field.name(), keep[f])?;
                    if let Some(col) = &col {
                        if col.length != num_rows {
                            return Err(malformed(format!(
                                "record batch {this} has {num_rows} rows but column '{}' {}",
                                node.field.name(),
                                col.length
                            )));
                        }
                    }
                    out[f] = col;
                }
                let columns = columns.iter().filter_map(|&c| out[c].clone()).collect();
                planned.insert(this, BatchLayout { num_rows, columns });
            }
        }
    }
    let batches = chosen
        .iter()
        .map(|b| {
            planned
                .get(b)
                .cloned()
                .ok_or_else(|| malformed("a record batch went missing"))
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(ReadPlan {
        schema: schema.project(columns),
        ranges: planner.ranges.ranges,
        codecs: planner.ranges.codecs,
        needs: planner.ranges.needs,
        batches,
        total_batches,
        built: planner.built,
    })
}
