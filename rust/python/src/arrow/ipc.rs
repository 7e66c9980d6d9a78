//! `kvikpy.arrow.read_ipc`'s engine side: an Arrow IPC file or stream planned by the
//! engine (`kvikpy_core::arrow_ipc`), its chosen buffers read in one batch into one
//! allocation, and the record batches exported as Arrow (device) arrays over it.

use std::path::PathBuf;
use std::sync::Arc;

use arrow_schema::{DataType, Fields};
use kvikpy_core::allocation::Placement;
use kvikpy_core::arrow_ipc::{
    decode_to_host, plan_gpu_decode, Column, Decoded, GpuDecodePlan, IpcFile, ReadPlan,
    SourceReader, Step,
};
use kvikpy_core::batch_plan::{plan_ranges_aligned, plan_ranges_placed};
use kvikpy_core::cancel::CancelToken;
use kvikpy_core::cuda::{copy_host_to_device, zero_device};
use kvikpy_core::settings::Settings;
use kvikpy_macros::boundary;
use pyo3::exceptions::{PyBufferError, PyIndexError, PyRuntimeError};
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use super::built::{build, BuiltArrays};
use super::c_abi::{ARROW_DEVICE_CPU, ARROW_DEVICE_CUDA};
use super::capsule::{array_capsules, device_array_capsules, ffi_schema_capsule};
use super::export::{view_sizes, ArrayExport};
use super::types::{ffi_field, ffi_schema};
use crate::batch::read_plan;
use crate::blocking::{interruptible_alone, without_gil};
use crate::buffer::{Buffer, Storage};
use crate::errors::BindResult;

/// Arrow's buffer alignment: every buffer starts at a multiple of 64 bytes.
const ALIGN: usize = 64;

/// Where a column's values lie for DLPack: `(offset in the allocation, shape, typestr,
/// DLPack code, bits)`.
type ValuesView = (usize, Vec<i64>, String, u8, u8);

/// An IPC table read into one allocation.
#[pyclass(module = "kvikpy._lib", frozen)]
pub struct IpcTable {
    plan: ReadPlan,
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

/// The IPC file or stream at `path` opened, its metadata read and checked, and the plan
/// of the chosen `columns` (names; all when None) of the chosen record `batches`.
fn open_plan(
    path: &std::path::Path,
    settings: &Settings,
    columns: Option<Vec<String>>,
    batches: Option<Vec<i64>>,
) -> kvikpy_core::Result<(SourceReader, ReadPlan)> {
    let reader = SourceReader::open(path, settings)?;
    let file = IpcFile::read(&reader)?;
    let columns = columns.map(|c| file.column_indices(&c)).transpose()?;
    let plan = file.plan(columns.as_deref(), batches.as_deref())?;
    Ok((reader, plan))
}

/// Read the chosen `columns` (names; all when None) of the chosen record `batches`
/// (indices; all when None) of the IPC file or stream at `path` onto device `ordinal`
/// (the host when None).
#[boundary]
#[pyfunction]
#[pyo3(signature = (path, columns, batches, ordinal))]
pub fn read_ipc_table(
    py: Python<'_>,
    path: PathBuf,
    columns: Option<Vec<String>>,
    batches: Option<Vec<i64>>,
    ordinal: Option<usize>,
) -> BindResult<IpcTable> {
    let settings = kvikpy_core::settings::current()?;
    let meta_path = path.clone();
    let (plan, decoded) = interruptible_alone(py, &CancelToken::new(), move || {
        let (reader, plan) = open_plan(&meta_path, &settings, columns, batches)?;
        // Compressed buffers are decoded on the host, into the table's memory when that is
        // host memory, else then moved in one copy.
        let decoded = if plan.is_compressed() {
            Some(decode_to_host(&reader, &plan, ALIGN)?)
        } else {
            None
        };
        Ok((plan, decoded))
    })?;
    if let Some(decoded) = decoded {
        return from_host_decoded(py, plan, decoded, ordinal);
    }
    read_uncompressed(py, &settings, path, plan, ordinal)
}

/// The table of a compressed `plan` whose buffers the host decoded ([`decode_to_host`]):
/// that memory itself for a host table, else moved onto GPU `ordinal` in one copy.
fn from_host_decoded(
    py: Python<'_>,
    plan: ReadPlan,
    decoded: Decoded,
    ordinal: Option<usize>,
) -> BindResult<IpcTable> {
    let Decoded {
        memory,
        offsets,
        sizes,
    } = decoded;
    let buffer = match ordinal {
        None => Buffer::from_allocation(memory),
        Some(ordinal) => {
            let size = memory.size();
            let buffer = Buffer::allocate_at(py, size, Placement::Device(ordinal), false)?;
            let (base, _, _) = buffer.parts();
            if size > 0 {
                let source = memory.base();
                without_gil(py, move || {
                    // SAFETY: the new buffer holds `size` bytes on GPU `ordinal` at `base`;
                    // `memory` is `size` bytes of host memory at `source`, alive until
                    // this returns.
                    unsafe { copy_host_to_device(ordinal, base, source as *const u8, size) }
                })?;
            }
            buffer
        }
    };
    let sizes = sizes.iter().map(|&s| s as u64).collect();
    table(py, plan, buffer, offsets, sizes, ordinal)
}

/// The table of an uncompressed `plan`: its buffers read straight into their places in
/// one allocation ([`ReadPlan::layout`]), neighbouring buffers as one read where they
/// follow each other both in the file and in the table.
fn read_uncompressed(
    py: Python<'_>,
    settings: &Settings,
    path: PathBuf,
    plan: ReadPlan,
    ordinal: Option<usize>,
) -> BindResult<IpcTable> {
    let sizes = plan.read_sizes();
    let layout = plan.layout(&sizes, ALIGN)?;
    let (reads, starts) = layout.reads(&plan.ranges, &sizes);
    let (plan_settings, total) = (*settings, layout.total);
    let batch = interruptible_alone(py, &CancelToken::new(), move || {
        plan_ranges_placed(&plan_settings, &path, &reads, &starts, total)
    })?;
    let (buffer, _, _, _) = read_plan(py, settings, batch, ordinal, None)?;
    table(py, plan, buffer, layout.offsets, sizes, ordinal)
}

/// One piece of GPU work for Python's nvCOMP call: `(step, source address, source
/// bytes, destination address, destination bytes, range)`, step 0 a copy, 1 a ZSTD frame,
/// 2 a raw LZ4 block.
type GpuPiece = (u8, u64, u64, u64, u64, usize);

/// What is left to do on the GPU after [`read_ipc_table_gpu`]: the buffers as read (kept
/// until decoded), the pieces, and each range's name for messages.
type GpuWork = (Py<Buffer>, Vec<GpuPiece>, Vec<String>);

/// [`read_ipc_table`] onto GPU `ordinal` with compressed buffers left for the GPU to
/// decode: the buffers are read as they are in the file in one batch read onto the GPU,
/// the table's allocation is sized by the engine's checked plan, buffers the GPU cannot
/// decode are decoded on the host and copied into place, and the rest is returned as
/// work for nvCOMP (None when nothing is compressed: the table is then complete).
#[boundary]
#[pyfunction]
#[pyo3(signature = (path, columns, batches, ordinal))]
pub fn read_ipc_table_gpu(
    py: Python<'_>,
    path: PathBuf,
    columns: Option<Vec<String>>,
    batches: Option<Vec<i64>>,
    ordinal: usize,
) -> BindResult<(IpcTable, Option<GpuWork>)> {
    let settings = kvikpy_core::settings::current()?;
    let meta_path = path.clone();
    let (plan, gpu, host) = interruptible_alone(py, &CancelToken::new(), move || {
        let (reader, plan) = open_plan(&meta_path, &settings, columns, batches)?;
        // Dictionaries extended by deltas are joined from the decoded bytes when the
        // table is made, before nvCOMP could run: such a read decodes on the host.
        let (gpu, host) = match (plan.is_compressed(), plan.built.is_empty()) {
            (true, true) => (Some(plan_gpu_decode(&reader, &plan, ALIGN)?), None),
            (true, false) => (None, Some(decode_to_host(&reader, &plan, ALIGN)?)),
            (false, _) => (None, None),
        };
        Ok((plan, gpu, host))
    })?;
    if let Some(decoded) = host {
        return Ok((from_host_decoded(py, plan, decoded, Some(ordinal))?, None));
    }
    let Some(gpu) = gpu else {
        return Ok((
            read_uncompressed(py, &settings, path, plan, Some(ordinal))?,
            None,
        ));
    };
    let ranges = plan.ranges.clone();
    let batch = interruptible_alone(py, &CancelToken::new(), move || {
        plan_ranges_aligned(&settings, &path, &ranges, ALIGN)
    })?;
    let (read, read_offsets, _, _) = read_plan(py, &settings, batch, Some(ordinal), None)?;
    let buffer = Buffer::allocate_at(py, gpu.total, Placement::Device(ordinal), false)?;
    let (base, _, _) = buffer.parts();
    let (read_base, _, _) = read.parts();
    let GpuDecodePlan {
        offsets,
        sizes,
        pieces,
        host,
        labels,
        ..
    } = gpu;
    let host_offsets = offsets.clone();
    let total = gpu.total;
    without_gil(py, move || {
        // The gaps between buffers (their 64-byte alignment) are zero, as on the host
        // routes: the decoders write only the buffers.
        if total > 0 {
            // SAFETY: the new buffer holds `total` bytes on GPU `ordinal` at `base`,
            // unused yet.
            unsafe { zero_device(ordinal, base, total)? };
        }
        for (range, bytes) in &host {
            let at = base + host_offsets[*range] as u64;
            // SAFETY: the plan placed range `range` (its decoded size, `bytes.len()`) at
            // `at` inside the new buffer of `gpu.total` bytes on GPU `ordinal`.
            unsafe { copy_host_to_device(ordinal, at, bytes.as_ptr(), bytes.len())? };
        }
        Ok::<(), kvikpy_core::Error>(())
    })?;
    let work = pieces
        .iter()
        .map(|p| {
            let step = step_code(p.step);
            let src = read_base + read_offsets[p.range] as u64 + p.src;
            let dst = base + offsets[p.range] as u64 + p.dst;
            (step, src, p.src_len, dst, p.dst_len, p.range)
        })
        .collect();
    let table = table(py, plan, buffer, offsets, sizes, Some(ordinal))?;
    Ok((table, Some((Py::new(py, read)?, work, labels))))
}

/// The GPU decode plan of a read, as [`read_ipc_table_gpu`] would run it, with file
/// offsets for sources and allocation offsets for destinations: `(pieces, host-decoded
/// ranges as (allocation offset, bytes), allocation size, range names)`. For tests that
/// run the plan with a host stand-in for nvCOMP.
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
    let (plan, gpu) = interruptible_alone(py, &CancelToken::new(), move || {
        let reader = SourceReader::open(&path, &settings)?;
        let file = IpcFile::read(&reader)?;
        let columns = columns.map(|c| file.column_indices(&c)).transpose()?;
        let plan = file.plan(columns.as_deref(), batches.as_deref())?;
        let gpu = plan_gpu_decode(&reader, &plan, ALIGN)?;
        Ok((plan, gpu))
    })?;
    let pieces = gpu
        .pieces
        .iter()
        .map(|p| {
            let src = plan.ranges[p.range].0 + p.src;
            let dst = gpu.offsets[p.range] as u64 + p.dst;
            (step_code(p.step), src, p.src_len, dst, p.dst_len, p.range)
        })
        .collect();
    let host = gpu
        .host
        .into_iter()
        .map(|(r, bytes)| (gpu.offsets[r], PyBytes::new(py, &bytes).unbind()))
        .collect();
    Ok((pieces, host, gpu.total, gpu.labels))
}

fn step_code(step: Step) -> u8 {
    match step {
        Step::Copy => 0,
        Step::Zstd => 1,
        Step::Lz4 => 2,
    }
}

fn table(
    py: Python<'_>,
    plan: ReadPlan,
    buffer: Buffer,
    offsets: Vec<usize>,
    sizes: Vec<u64>,
    ordinal: Option<usize>,
) -> BindResult<IpcTable> {
    let (_, storage) = buffer.span();
    let (base, _, _) = buffer.parts();
    let addresses: Vec<u64> = offsets.iter().map(|&o| base + o as u64).collect();
    let built = if plan.built.is_empty() {
        BuiltArrays::none()
    } else {
        let (plan, addresses, sizes) = (&plan, &addresses, &sizes);
        without_gil(py, move || build(plan, addresses, sizes, ordinal))?
    };
    Ok(IpcTable {
        plan,
        addresses,
        offsets,
        sizes,
        built: Arc::new(built),
        storage,
        buffer: Py::new(py, buffer)?,
        ordinal,
    })
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
            return Err(pyo3::exceptions::PyValueError::new_err(format!(
                "a copy of the table's allocation must be {size} bytes of host memory"
            )));
        }
        let addresses: Vec<u64> = self.offsets.iter().map(|&o| base + o as u64).collect();
        // The built arrays again, from the host copy.
        let built = if self.plan.built.is_empty() {
            BuiltArrays::none()
        } else {
            let (plan, addresses, sizes) = (&self.plan, &addresses, &self.sizes);
            without_gil(py, move || build(plan, addresses, sizes, None))?
        };
        Ok(IpcTable {
            built: Arc::new(built),
            plan: self.plan.clone(),
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
