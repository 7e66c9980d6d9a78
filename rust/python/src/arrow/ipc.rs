//! `kvikpy.arrow.read_ipc`'s binding: the engine reads the table into one allocation
//! (`kvikpy_core::arrow_ipc::read_table`: route, placement, reads, decoding, fallbacks);
//! this module converts its arguments, hands back the work left for nvCOMP, and exports
//! the record batches as Arrow (device) arrays over the allocation.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use arrow_schema::{DataType, Fields};
use kvikpy_core::allocation::Placement;
use kvikpy_core::arrow_ipc::{
    addresses, build, join_column, plan_file_decode, read_table, BuiltArrays, Column, GpuWork,
    Placed, ReadPlan, Step, Table, TableRequest,
};
use kvikpy_core::cancel::CancelToken;
use kvikpy_macros::boundary;
use pyo3::exceptions::{PyBufferError, PyIndexError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::arrow_c::{
    array_capsules, device_array_capsules, ffi_field, ffi_schema, ffi_schema_capsule, ArrayExport,
    ARROW_DEVICE_CPU, ARROW_DEVICE_CUDA,
};
use crate::blocking::{interruptible_alone, without_gil};
use crate::buffer::{Buffer, Storage};
use crate::errors::{BindResult, UnsupportedOperationError};

/// Where a column's values lie for DLPack: `(offset in the allocation, shape, typestr,
/// DLPack code, bits)`.
type ValuesView = (usize, Vec<i64>, String, u8, u8);

/// An IPC table read into one allocation.
#[pyclass(module = "kvikpy._lib", frozen)]
pub struct IpcTable {
    plan: ReadPlan,
    /// The allocation's first address.
    base: u64,
    /// Each range's address in the allocation.
    addresses: Vec<u64>,
    /// Each range's offset in the allocation.
    offsets: Vec<usize>,
    /// Each range's size in the allocation (decoded, for compressed ranges).
    sizes: Vec<u64>,
    /// The arrays built after the read (dictionaries extended by deltas).
    built: Arc<BuiltArrays>,
    storage: Arc<Storage>,
    buffer: Py<Buffer>,
    ordinal: Option<usize>,
}

/// One piece of GPU work for Python's nvCOMP call: `(step, source, source bytes,
/// destination, destination bytes, range)`, step 0 a copy, 1 a ZSTD frame, 2 a raw LZ4
/// block.
type GpuPiece = (u8, u64, u64, u64, u64, usize);

fn gpu_piece(p: &Placed) -> GpuPiece {
    let step = match p.step {
        Step::Copy => 0,
        Step::Zstd => 1,
        Step::Lz4 => 2,
    };
    (step, p.src, p.src_len, p.dst, p.dst_len, p.range)
}

/// A table read by [`read_ipc_table`], and the work it leaves for nvCOMP, if any: taken
/// once, as an [`IpcTable`], when that work is done ([`IpcRead::table`]).
#[pyclass(module = "kvikpy._lib", frozen)]
pub struct IpcRead {
    read: Mutex<Option<(Table, Option<GpuWork>)>>,
}

/// Read the chosen `columns` (names; all when None) of the chosen record `batches`
/// (indices; all when None) of the IPC file or stream at `path` onto device `ordinal`
/// (the host when None). With `gpu_decoder` (nvCOMP is installed), a GPU table's
/// compressed buffers may be left for it: see [`IpcRead`].
#[boundary]
#[pyfunction]
#[pyo3(signature = (path, columns, batches, ordinal, gpu_decoder))]
pub fn read_ipc_table(
    py: Python<'_>,
    path: PathBuf,
    columns: Option<Vec<String>>,
    batches: Option<Vec<i64>>,
    ordinal: Option<usize>,
    gpu_decoder: bool,
) -> BindResult<IpcRead> {
    let settings = kvikpy_core::settings::current()?;
    let request = TableRequest {
        path,
        columns,
        batches,
        placement: Placement::from_ordinal(ordinal),
        gpu_decoder,
    };
    let read = interruptible_alone(py, &CancelToken::new(), move || {
        read_table(&settings, request)
    })?;
    Ok(IpcRead {
        read: Mutex::new(Some(read)),
    })
}

impl IpcRead {
    fn taken() -> PyErr {
        PyRuntimeError::new_err("this read's table was already taken")
    }
}

#[boundary]
#[pymethods]
impl IpcRead {
    /// The work left for nvCOMP, at its addresses on the table's GPU (empty when none):
    /// `(step, source, source bytes, destination, destination bytes, range)`, step 0 a
    /// copy, 1 a ZSTD frame, 2 a raw LZ4 block. The memory lives as long as this object.
    #[getter]
    fn gpu_pieces(&self) -> PyResult<Vec<GpuPiece>> {
        let guard = self.read.lock().unwrap_or_else(|e| e.into_inner());
        let (table, work) = guard.as_ref().ok_or_else(Self::taken)?;
        Ok(work.as_ref().map_or_else(Vec::new, |w| {
            w.pieces(table).iter().map(gpu_piece).collect()
        }))
    }

    /// Each range's name in messages (its record batch, column and buffer); empty when no
    /// work is left for nvCOMP.
    #[getter]
    fn labels(&self) -> PyResult<Vec<String>> {
        let guard = self.read.lock().unwrap_or_else(|e| e.into_inner());
        let (_, work) = guard.as_ref().ok_or_else(Self::taken)?;
        Ok(work.as_ref().map_or_else(Vec::new, |w| w.labels().to_vec()))
    }

    /// The engine decodes the work left for nvCOMP on the host instead, from the bytes
    /// already read (the fallback where nvCOMP is missing or fails; a malformed buffer is
    /// named). Nothing may still be writing the table.
    fn decode_on_host(&self, py: Python<'_>) -> BindResult<()> {
        let mut guard = self.read.lock().unwrap_or_else(|e| e.into_inner());
        let (table, work) = guard.as_mut().ok_or_else(Self::taken)?;
        if let Some(work) = work.take() {
            without_gil(py, move || work.decode_on_host(table))?;
        }
        Ok(())
    }

    /// The table, once the work left for nvCOMP is done (by nvCOMP, or by
    /// [`IpcRead::decode_on_host`]).
    fn table(&self, py: Python<'_>) -> PyResult<IpcTable> {
        let (table, _) = self
            .read
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .ok_or_else(Self::taken)?;
        let Table {
            plan,
            memory,
            offsets,
            sizes,
            built,
        } = table;
        let ordinal = memory.placement().ordinal();
        let buffer = Buffer::from_allocation(memory);
        let (_, storage) = buffer.span();
        let (base, _, _) = buffer.parts();
        Ok(IpcTable {
            plan,
            base,
            addresses: addresses(base, &offsets),
            offsets,
            sizes,
            built: Arc::new(built),
            storage,
            buffer: Py::new(py, buffer)?,
            ordinal,
        })
    }
}

/// The GPU decode plan of a read, as [`read_ipc_table`] would leave it for nvCOMP, with
/// file offsets for sources and allocation offsets for destinations: `(pieces,
/// host-decoded ranges as (allocation offset, bytes), allocation size, range names)`. For
/// tests that run the plan with a host stand-in for nvCOMP, and benchmarks.
#[boundary]
#[pyfunction]
#[pyo3(signature = (path, columns, batches))]
#[allow(clippy::type_complexity)]
pub fn ipc_decode_plan(
    py: Python<'_>,
    path: PathBuf,
    columns: Option<Vec<String>>,
    batches: Option<Vec<i64>>,
) -> BindResult<(Vec<GpuPiece>, Vec<(usize, Py<PyBytes>)>, usize, Vec<String>)> {
    let settings = kvikpy_core::settings::current()?;
    let plan = interruptible_alone(py, &CancelToken::new(), move || {
        plan_file_decode(&settings, &path, columns.as_deref(), batches.as_deref())
    })?;
    let pieces = plan.pieces.iter().map(gpu_piece).collect();
    let host = plan
        .host
        .into_iter()
        .map(|(at, bytes)| (at, PyBytes::new(py, &bytes).unbind()))
        .collect();
    Ok((pieces, host, plan.total, plan.labels))
}

impl IpcTable {
    fn export(&self, column: &Column) -> ArrayExport {
        let mut buffers: Vec<u64> = match column.built {
            Some(k) => self.built.addresses[k].clone(),
            None => column
                .buffers
                .iter()
                .map(|b| b.map_or(0, |i| self.addresses[i]))
                .collect(),
        };
        // A view-typed array's last buffer: its data buffers' sizes, in host memory.
        let sizes = view_sizes(column, &self.sizes);
        if let Some(sizes) = &sizes {
            buffers.push(sizes.as_ptr() as u64);
        }
        ArrayExport {
            format: column.data_type.clone(),
            length: column.length,
            null_count: column.null_count,
            buffers,
            children: column.children.iter().map(|c| self.export(c)).collect(),
            dictionary: column.dictionary.as_ref().map(|d| Box::new(self.export(d))),
            owner: Box::new((Arc::clone(&self.storage), sizes, Arc::clone(&self.built))),
        }
    }

    fn batch_export(&self, index: usize) -> PyResult<ArrayExport> {
        let batch = self.plan.batches.get(index).ok_or_else(|| {
            PyIndexError::new_err(format!(
                "record batch {index} is out of range: the table holds {}",
                self.plan.batches.len()
            ))
        })?;
        Ok(ArrayExport {
            format: DataType::Struct(self.fields()),
            length: batch.num_rows,
            null_count: 0,
            buffers: vec![0],
            children: batch.columns.iter().map(|c| self.export(c)).collect(),
            dictionary: None,
            owner: Box::new(Arc::clone(&self.storage)),
        })
    }

    fn column(&self, batch: usize, column: usize) -> PyResult<&Column> {
        self.plan
            .batches
            .get(batch)
            .and_then(|b| b.columns.get(column))
            .ok_or_else(|| {
                PyIndexError::new_err(format!("no column {column} in record batch {batch}"))
            })
    }

    fn fields(&self) -> Fields {
        self.plan.schema.fields().clone()
    }

    fn capsules(
        &self,
        py: Python<'_>,
        export: ArrayExport,
        device: bool,
    ) -> PyResult<(Py<PyAny>, Py<PyAny>)> {
        match (self.ordinal, device) {
            (Some(ordinal), _) => {
                device_array_capsules(py, export, ARROW_DEVICE_CUDA, ordinal as i64, None)
            }
            (None, true) => device_array_capsules(py, export, ARROW_DEVICE_CPU, -1, None),
            (None, false) => array_capsules(py, export),
        }
    }
    /// [`IpcTable::column_values`] of one record batch.
    fn batch_values(&self, batch: usize, column: usize) -> PyResult<Option<ValuesView>> {
        let c = self.column(batch, column)?;
        let (values, shape) = match &c.data_type {
            DataType::FixedSizeList(_, n) => match c.children.first() {
                Some(child) if c.null_count == 0 => (child, vec![c.length, i64::from(*n)]),
                _ => return Ok(None),
            },
            _ => (c, vec![c.length]),
        };
        let (code, bits, kind) = match values.data_type {
            DataType::Int8 => (0, 8, "i"),
            DataType::Int16 => (0, 16, "i"),
            DataType::Int32 | DataType::Date32 => (0, 32, "i"),
            DataType::Int64
            | DataType::Date64
            | DataType::Timestamp(..)
            | DataType::Duration(_) => (0, 64, "i"),
            DataType::UInt8 => (1, 8, "u"),
            DataType::UInt16 => (1, 16, "u"),
            DataType::UInt32 => (1, 32, "u"),
            DataType::UInt64 => (1, 64, "u"),
            DataType::Float16 => (2, 16, "f"),
            DataType::Float32 => (2, 32, "f"),
            DataType::Float64 => (2, 64, "f"),
            _ => return Ok(None),
        };
        if values.null_count > 0 {
            return Ok(None);
        }
        let offset = values
            .buffers
            .get(1)
            .copied()
            .flatten()
            .map_or(0, |i| self.offsets[i]);
        Ok(Some((
            offset,
            shape,
            format!("<{kind}{}", bits / 8),
            code,
            bits,
        )))
    }

    /// Column `column` over every record batch as one array over the table's memory, where
    /// its values lie end to end ([`IpcTable::joined_values`]); None otherwise.
    fn joined_view(&self, column: usize) -> PyResult<Option<ArrayExport>> {
        let Some((offset, shape, ..)) = self.joined_values(column)? else {
            return Ok(None);
        };
        let Some(field) = self.plan.schema.fields().get(column) else {
            return Ok(None);
        };
        let address = self.base + offset as u64;
        let level = |format: DataType, length: i64, buffers: Vec<u64>, children| ArrayExport {
            format,
            length,
            null_count: 0,
            buffers,
            children,
            dictionary: None,
            owner: Box::new(Arc::clone(&self.storage)),
        };
        let rows = shape[0];
        Ok(Some(match (field.data_type(), shape.get(1)) {
            (DataType::FixedSizeList(child, _), Some(&n)) => {
                let values = level(
                    child.data_type().clone(),
                    rows * n,
                    vec![0, address],
                    vec![],
                );
                level(field.data_type().clone(), rows, vec![0], vec![values])
            }
            (t, _) => level(t.clone(), rows, vec![0, address], Vec::new()),
        }))
    }

    /// Column `column` over every record batch as one array in new host memory, joined by
    /// the engine ([`join_column`]: validity bitmaps joined, offsets rebased).
    fn joined_copy(&self, py: Python<'_>, column: usize) -> BindResult<ArrayExport> {
        let (plan, addresses, sizes) = (&self.plan, &self.addresses, &self.sizes);
        let joined = without_gil(py, move || join_column(plan, addresses, sizes, column))?;
        let buffers = joined
            .buffers
            .iter()
            .map(|b| if b.is_empty() { 0 } else { b.as_ptr() as u64 })
            .collect();
        Ok(ArrayExport {
            format: joined.data_type,
            length: joined.length,
            null_count: joined.null_count,
            buffers,
            children: Vec::new(),
            dictionary: None,
            // A Vec's bytes stay where they are when the Vec moves.
            owner: Box::new(joined.buffers),
        })
    }

    /// [`IpcTable::column_values`] over every record batch: each batch's values (zero-row
    /// batches aside) must follow the previous one's directly in the allocation.
    fn joined_values(&self, column: usize) -> PyResult<Option<ValuesView>> {
        let mut joined: Option<ValuesView> = None;
        let mut end = 0usize;
        for batch in 0..self.plan.batches.len() {
            let Some((offset, shape, typestr, code, bits)) = self.batch_values(batch, column)?
            else {
                return Ok(None);
            };
            let items: i64 = shape.iter().product();
            if items == 0 {
                continue;
            }
            let bytes = usize::try_from(items).unwrap_or(usize::MAX) * usize::from(bits / 8);
            match joined.as_mut() {
                None => joined = Some((offset, shape, typestr, code, bits)),
                Some(j) if offset == end => j.1[0] += shape[0],
                Some(_) => return Ok(None),
            }
            end = offset.saturating_add(bytes);
        }
        if joined.is_none() {
            // Every batch empty: the first one's (empty) view.
            return match self.plan.batches.len() {
                0 => Ok(None),
                _ => self.batch_values(0, column),
            };
        }
        Ok(joined)
    }
}

#[boundary]
#[pymethods]
impl IpcTable {
    /// The `arrow_schema` capsule of the table (a struct of its columns, with the
    /// schema's metadata).
    fn schema_capsule(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let schema = ffi_schema(&self.plan.schema).map_err(|e| {
            PyRuntimeError::new_err(format!("cannot describe the schema to Arrow: {e}"))
        })?;
        ffi_schema_capsule(py, schema)
    }

    /// The `arrow_schema` capsule of column `column`.
    fn column_schema_capsule(&self, py: Python<'_>, column: usize) -> PyResult<Py<PyAny>> {
        let field = self
            .plan
            .schema
            .fields()
            .get(column)
            .ok_or_else(|| PyIndexError::new_err(format!("column {column} is out of range")))?;
        let schema = ffi_field(field).map_err(|e| {
            PyRuntimeError::new_err(format!("cannot describe {field} to Arrow: {e}"))
        })?;
        ffi_schema_capsule(py, schema)
    }

    /// `(schema, array)` capsules of record batch `index` as a struct array: a device
    /// array with `device`, else a host array (host tables only).
    fn batch_capsules(
        &self,
        py: Python<'_>,
        index: usize,
        device: bool,
    ) -> PyResult<(Py<PyAny>, Py<PyAny>)> {
        if self.ordinal.is_some() && !device {
            return Err(host_only());
        }
        let export = self.batch_export(index)?;
        self.capsules(py, export, device)
    }

    /// `(schema, array)` capsules of column `column` of record batch `batch`.
    fn column_capsules(
        &self,
        py: Python<'_>,
        batch: usize,
        column: usize,
        device: bool,
    ) -> PyResult<(Py<PyAny>, Py<PyAny>)> {
        if self.ordinal.is_some() && !device {
            return Err(host_only());
        }
        let export = self.export(self.column(batch, column)?);
        self.capsules(py, export, device)
    }

    /// For a fixed-width column of record batch `batch` without nulls (or a
    /// fixed-size list of such values, without nulls at either level): its values'
    /// `(offset in the allocation, shape, typestr, DLPack code, bits)`; None otherwise.
    /// With `batch` None, the column over every record batch, whose values the layout
    /// laid end to end ([`ReadPlan::layout`]); None also where they do not follow each
    /// other (a compressed buffer decoded with padding).
    #[pyo3(signature = (batch, column))]
    fn column_values(&self, batch: Option<usize>, column: usize) -> PyResult<Option<ValuesView>> {
        let Some(batch) = batch else {
            return self.joined_values(column);
        };
        self.batch_values(batch, column)
    }

    /// `(schema, array)` capsules of column `column` over every record batch as one array:
    /// over the table's memory where its values lie end to end (a fixed-width column
    /// without nulls, as for DLPack), else, for a host table, in new host memory joined by
    /// the engine (validity bitmaps joined, offsets rebased: a copy). A GPU table's other
    /// columns are an error saying what to do.
    fn joined_column_capsules(
        &self,
        py: Python<'_>,
        column: usize,
        device: bool,
    ) -> BindResult<(Py<PyAny>, Py<PyAny>)> {
        if self.ordinal.is_some() && !device {
            return Err(host_only().into());
        }
        let export = match self.joined_view(column)? {
            Some(export) => export,
            None if self.ordinal.is_none() => self.joined_copy(py, column)?,
            None => {
                let field = self.plan.schema.fields().get(column).ok_or_else(|| {
                    PyIndexError::new_err(format!("column {column} is out of range"))
                })?;
                return Err(UnsupportedOperationError::new_err(format!(
                    "column '{}' ({}) spans {} record batches whose buffers do not lie end to \
                     end in GPU memory (it has nulls, offsets or a padded compressed \
                     buffer), so they are not one Arrow array there, and kvikpy joins them \
                     only in host memory; export each record batch's chunk (column[i]), or \
                     join them on the host (table.to_host().column(name))",
                    field.name(),
                    field.data_type(),
                    self.plan.batches.len()
                ))
                .into());
            }
        };
        Ok(self.capsules(py, export, device)?)
    }

    /// An Arrow C device stream (with `device`) or C stream capsule of the table over
    /// `iterator`, a Python iterator of its record batches (objects exporting them).
    fn stream_capsule(
        &self,
        py: Python<'_>,
        iterator: Bound<'_, PyAny>,
        device: bool,
    ) -> PyResult<Py<PyAny>> {
        if self.ordinal.is_some() && !device {
            return Err(host_only());
        }
        super::typed_stream_capsule(
            py,
            iterator,
            DataType::Struct(self.fields()),
            self.plan.schema.metadata().clone(),
            device,
            self.ordinal.is_some(),
        )
    }

    /// The same table over `host`, a host copy of this table's allocation (its bytes
    /// copied back from the GPU).
    fn over_copy(&self, py: Python<'_>, host: Py<Buffer>) -> PyResult<IpcTable> {
        let (base, ordinal, _) = host.borrow(py).parts();
        let (span, storage) = host.borrow(py).span();
        let size = self.buffer.borrow(py).span().0.len();
        if ordinal.is_some() || span.len() != size {
            return Err(PyValueError::new_err(format!(
                "a copy of the table's allocation must be {size} bytes of host memory"
            )));
        }
        let addresses = addresses(base, &self.offsets);
        // The built arrays again, from the host copy.
        let built = {
            let (plan, addresses, sizes) = (&self.plan, &addresses, &self.sizes);
            without_gil(py, move || build(plan, addresses, sizes, None))?
        };
        Ok(IpcTable {
            built: Arc::new(built),
            plan: self.plan.clone(),
            base,
            addresses,
            offsets: self.offsets.clone(),
            sizes: self.sizes.clone(),
            storage,
            buffer: host,
            ordinal: None,
        })
    }

    /// The allocation holding every buffer.
    #[getter]
    fn buffer(&self, py: Python<'_>) -> Py<Buffer> {
        self.buffer.clone_ref(py)
    }

    /// The row count of each record batch read.
    #[getter]
    fn batch_rows(&self) -> Vec<i64> {
        self.plan.batches.iter().map(|b| b.num_rows).collect()
    }

    /// The column names.
    #[getter]
    fn column_names(&self) -> Vec<String> {
        self.plan
            .schema
            .fields()
            .iter()
            .map(|f| f.name().clone())
            .collect()
    }

    /// The column types, as arrow-rs writes them.
    #[getter]
    fn column_types(&self) -> Vec<String> {
        self.plan
            .schema
            .fields()
            .iter()
            .map(|f| f.data_type().to_string())
            .collect()
    }

    /// Record batches in the file.
    #[getter]
    fn total_batches(&self) -> usize {
        self.plan.total_batches
    }

    /// Bytes read from the file.
    #[getter]
    fn bytes_read(&self) -> u64 {
        self.plan.bytes()
    }

    /// The GPU, or None for host memory.
    #[getter]
    fn ordinal(&self) -> Option<usize> {
        self.ordinal
    }
}

fn host_only() -> PyErr {
    PyBufferError::new_err(
        "this table is in GPU memory, which the Arrow C data interface cannot describe; use \
         __arrow_c_device_stream__ (or column(...).__arrow_c_device_array__), or read with \
         device=\"cpu\"",
    )
}

/// The last buffer of a view-typed (`string_view`, `binary_view`) array: the sizes of its
/// data buffers (its buffers after the validity and the views), as `int64`, taken from
/// `range_sizes` (each planned range's size). It lives in host memory for host and
/// device arrays alike: consumers read it on the host to learn the sizes before touching
/// the data (Arrow C++'s importer and nanoarrow's array view do). None for other types.
pub fn view_sizes(column: &Column, range_sizes: &[u64]) -> Option<Box<[i64]>> {
    if !matches!(column.data_type, DataType::Utf8View | DataType::BinaryView) {
        return None;
    }
    let data = column.buffers.get(2..).unwrap_or_default();
    Some(
        data.iter()
            .map(|b| {
                b.and_then(|i| range_sizes.get(i))
                    .map_or(0, |&s| i64::try_from(s).unwrap_or(i64::MAX))
            })
            .collect(),
    )
}
