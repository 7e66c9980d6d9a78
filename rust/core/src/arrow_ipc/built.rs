//! Arrays built after an IPC read: dictionaries extended by delta batches, concatenated on
//! the host from their parts in the table's allocation (copied from the GPU first for a
//! GPU table), and placed beside it: in host memory, or in one GPU allocation; and a host
//! table's column joined over its record batches into one array ([`join_column`]).

use arrow_schema::DataType;

use super::concat::{concat, concatenable, Part};
use super::plan::{Column, ReadPlan, ALIGN};
use crate::cuda::{copy_device_to_host, copy_host_to_device, DeviceAllocation};
use crate::error::{Error, Result};

/// The built arrays of a table, and the memory holding them.
pub struct BuiltArrays {
    /// Each built array's buffer addresses, in the C data interface's order (0: none).
    pub addresses: Vec<Vec<u64>>,
    /// The buffers of a host table.
    _host: Vec<Vec<u8>>,
    /// The buffers of a GPU table.
    _device: Option<DeviceAllocation>,
}

impl BuiltArrays {
    /// None built.
    pub fn none() -> Self {
        Self {
            addresses: Vec::new(),
            _host: Vec::new(),
            _device: None,
        }
    }
}

/// The bytes of range `i` of a table: at `addresses[i]`, `sizes[i]` long, on GPU
/// `ordinal` or the host.
fn range_bytes(
    addresses: &[u64],
    sizes: &[u64],
    i: usize,
    ordinal: Option<usize>,
) -> Result<Vec<u8>> {
    let len = usize::try_from(sizes[i]).unwrap_or(usize::MAX);
    let mut bytes = vec![0u8; len];
    if len == 0 {
        return Ok(bytes);
    }
    match ordinal {
        // SAFETY: range `i` of the table's allocation holds `len` bytes at `addresses[i]`,
        // alive while the caller holds the table; `bytes` is apart from it.
        None => unsafe {
            std::ptr::copy_nonoverlapping(addresses[i] as *const u8, bytes.as_mut_ptr(), len)
        },
        // SAFETY: as above, on GPU `ordinal`; `bytes` is writable host memory of `len`.
        Some(ordinal) => unsafe {
            copy_device_to_host(ordinal, bytes.as_mut_ptr(), addresses[i], len)?
        },
    }
    Ok(bytes)
}

/// Build the arrays of `plan.built` from the table's ranges (`addresses`, `sizes`) on GPU
/// `ordinal` (the host when None). Blocks on GPU copies: call without the GIL.
pub fn build(
    plan: &ReadPlan,
    addresses: &[u64],
    sizes: &[u64],
    ordinal: Option<usize>,
) -> Result<BuiltArrays> {
    if plan.built.is_empty() {
        return Ok(BuiltArrays::none());
    }
    let mut all: Vec<Vec<Vec<u8>>> = Vec::with_capacity(plan.built.len());
    for (k, built) in plan.built.iter().enumerate() {
        let mut bytes: Vec<Vec<Vec<u8>>> = Vec::with_capacity(built.parts.len());
        for part in &built.parts {
            let buffers = part
                .buffers
                .iter()
                .map(|b| {
                    b.map_or(Ok(Vec::new()), |i| {
                        range_bytes(addresses, sizes, i, ordinal)
                    })
                })
                .collect::<Result<Vec<_>>>()?;
            bytes.push(buffers);
        }
        let parts: Vec<Part<'_>> = built
            .parts
            .iter()
            .zip(&bytes)
            .map(|(p, b)| Part {
                length: p.length,
                null_count: p.null_count,
                buffers: b.iter().map(Vec::as_slice).collect(),
            })
            .collect();
        let data_type = &built.parts[0].data_type;
        all.push(concat(
            data_type,
            &parts,
            &format!("extended dictionary {k}"),
        )?);
    }
    match ordinal {
        None => {
            let mut host = Vec::new();
            let addresses = all
                .into_iter()
                .map(|buffers| {
                    buffers
                        .into_iter()
                        .map(|b| {
                            // A Vec's bytes stay where they are when the Vec moves.
                            let at = if b.is_empty() { 0 } else { b.as_ptr() as u64 };
                            host.push(b);
                            at
                        })
                        .collect()
                })
                .collect();
            Ok(BuiltArrays {
                addresses,
                _host: host,
                _device: None,
            })
        }
        Some(ordinal) => {
            // One staging area laid out as the GPU allocation, one copy.
            let mut staging = Vec::new();
            let mut at: Vec<Vec<Option<usize>>> = Vec::new();
            for buffers in &all {
                at.push(
                    buffers
                        .iter()
                        .map(|b| {
                            (!b.is_empty()).then(|| {
                                let start = staging.len().next_multiple_of(ALIGN);
                                staging.resize(start, 0);
                                staging.extend_from_slice(b);
                                start
                            })
                        })
                        .collect(),
                );
            }
            let allocation = DeviceAllocation::new(ordinal, staging.len().max(1))?;
            // SAFETY: the allocation holds at least `staging.len()` bytes on GPU `ordinal`;
            // `staging` is readable host memory of that length.
            unsafe {
                copy_host_to_device(ordinal, allocation.ptr(), staging.as_ptr(), staging.len())?
            };
            let base = allocation.ptr();
            let addresses = at
                .into_iter()
                .map(|b| {
                    b.into_iter()
                        .map(|o| o.map_or(0, |o| base + o as u64))
                        .collect()
                })
                .collect();
            Ok(BuiltArrays {
                addresses,
                _host: Vec::new(),
                _device: Some(allocation),
            })
        }
    }
}

/// A column's record batches joined into one array, in host memory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct JoinedColumn {
    /// Its Arrow type.
    pub data_type: DataType,
    /// Elements in all.
    pub length: i64,
    /// Nulls in all.
    pub null_count: i64,
    /// Its buffers in the C data interface's order: validity (empty without nulls), then
    /// values, or offsets and data.
    pub buffers: Vec<Vec<u8>>,
}

/// The bytes of a column's buffers (empty for a buffer not read), at `addresses` of a
/// host table.
fn part_bytes(column: &Column, addresses: &[u64], sizes: &[u64]) -> Result<Vec<Vec<u8>>> {
    column
        .buffers
        .iter()
        .map(|b| b.map_or(Ok(Vec::new()), |i| range_bytes(addresses, sizes, i, None)))
        .collect()
}

/// Column `column` of every record batch of a host table (its ranges at `addresses`,
/// `sizes` long) joined into one array on the host: validity bitmaps joined bit by bit,
/// values one after the other, offsets rebased. Fixed-width (boolean included), string and
/// binary columns; another type is an [`Error::UnsupportedOperation`] that says what to do.
pub fn join_column(
    plan: &ReadPlan,
    addresses: &[u64],
    sizes: &[u64],
    column: usize,
) -> Result<JoinedColumn> {
    let field = plan.schema.fields().get(column).ok_or_else(|| {
        Error::OutOfRange(format!(
            "column {column} is out of range: the table has {}",
            plan.schema.fields().len()
        ))
    })?;
    let (name, data_type) = (field.name(), field.data_type());
    let columns: Vec<&Column> = plan
        .batches
        .iter()
        .filter_map(|b| b.columns.get(column))
        .collect();
    let batches = columns.len();
    if !concatenable(data_type) || columns.iter().any(|c| c.built.is_some()) {
        return Err(Error::UnsupportedOperation(format!(
            "column '{name}' ({data_type}) spans {batches} record batches, which kvikpy joins \
             into one Arrow array only for fixed-width, string and binary columns; export \
             each record batch's chunk (column[i]), or the whole table (pyarrow.table(t), \
             whose column is a chunked array)"
        )));
    }
    if matches!(data_type, DataType::Utf8 | DataType::Binary) {
        let data: u64 = columns
            .iter()
            .filter_map(|c| c.buffers.get(2).copied().flatten())
            .map(|i| sizes[i])
            .sum();
        if data > i32::MAX as u64 {
            return Err(Error::UnsupportedOperation(format!(
                "column '{name}' ({data_type}) holds {data} bytes of values over its \
                 {batches} record batches, more than one array's 32-bit offsets address; \
                 export each record batch's chunk (column[i])"
            )));
        }
    }
    let bytes = columns
        .iter()
        .map(|c| part_bytes(c, addresses, sizes))
        .collect::<Result<Vec<_>>>()?;
    let parts: Vec<Part<'_>> = columns
        .iter()
        .zip(&bytes)
        .map(|(c, b)| Part {
            length: c.length,
            null_count: c.null_count,
            buffers: b.iter().map(Vec::as_slice).collect(),
        })
        .collect();
    let buffers = concat(data_type, &parts, &format!("column '{name}'"))?;
    Ok(JoinedColumn {
        data_type: data_type.clone(),
        length: columns.iter().map(|c| c.length).sum(),
        null_count: columns.iter().map(|c| c.null_count).sum(),
        buffers,
    })
}
