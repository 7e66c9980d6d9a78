//! A batch (`read_many`, `read_ranges`) as one Arrow `large_binary` array: its schema,
//! validity bitmap, offsets on the GPU for device exports, and the array capsules.

use std::sync::Arc;

use arrow_schema::DataType;
use kvikpy_core::allocation::{Allocation, Placement};
use kvikpy_core::cuda::StreamEvent;
use kvikpy_macros::boundary;
use pyo3::prelude::*;

use crate::arrow_c::{
    array_capsules, device_array_capsules, schema_capsule, ArrayExport, ARROW_DEVICE_CPU,
    ARROW_DEVICE_CUDA,
};

/// The schema of a batch's Arrow export (`large_binary`).
#[boundary]
#[pyfunction]
pub fn batch_schema(py: Python<'_>) -> PyResult<Py<PyAny>> {
    schema_capsule(py, &DataType::LargeBinary)
}

/// A batch's validity bitmap (bit set: valid), or None when no element failed.
fn validity_bits(count: usize, failed: &[usize]) -> Option<Vec<u8>> {
    (!failed.is_empty()).then(|| {
        let mut bits = vec![0xFFu8; count.div_ceil(8).max(1)];
        for &i in failed {
            bits[i / 8] &= !(1 << (i % 8));
        }
        bits
    })
}

/// A GPU batch's offsets and validity bitmap, uploaded once to the batch's GPU (the device
/// interface wants all of an array's buffers on one device) and shared by every export:
/// a batch never changes, so neither do they.
#[pyclass(module = "kvikpy._lib", frozen)]
pub struct BatchDeviceMeta {
    /// The offsets (8-byte items), then the bitmap, in one allocation on the batch's GPU.
    allocation: Arc<Allocation>,
    /// Where the bitmap starts, when some element failed.
    bitmap_at: Option<usize>,
}

/// Upload a GPU batch's offsets and validity bitmap (see [`BatchDeviceMeta`]).
#[boundary]
#[pyfunction]
pub fn batch_device_meta(
    py: Python<'_>,
    buffer: &crate::buffer::Buffer,
    offsets: Vec<i64>,
    failed: Vec<usize>,
) -> PyResult<BatchDeviceMeta> {
    let (_, ordinal, _) = buffer.parts();
    let ordinal = ordinal.ok_or_else(|| {
        pyo3::exceptions::PyValueError::new_err("a host batch keeps its offsets on the host")
    })?;
    let count = offsets.len().saturating_sub(1);
    check_failed(count, &failed)?;
    let mut bytes: Vec<u8> = offsets.iter().flat_map(|o| o.to_le_bytes()).collect();
    let validity = validity_bits(count, &failed);
    let bitmap_at = validity.as_ref().map(|_| bytes.len());
    bytes.extend(validity.iter().flatten());
    let placement = Placement::Device(ordinal);
    let allocation =
        crate::blocking::without_gil(py, move || Allocation::with_bytes(placement, &bytes))?;
    Ok(BatchDeviceMeta {
        allocation: Arc::new(allocation),
        bitmap_at,
    })
}

fn check_failed(count: usize, failed: &[usize]) -> PyResult<()> {
    match failed.iter().find(|&&i| i >= count) {
        Some(i) => Err(pyo3::exceptions::PyIndexError::new_err(format!(
            "failed element {i} of a batch of {count}"
        ))),
        None => Ok(()),
    }
}

/// Arrow `large_binary` export of a batch: one element per file or range (`offsets` has
/// one entry more than elements), `failed` elements null. `device` asks for an
/// `arrow_device_array`; a GPU batch needs its `meta` (offsets and bitmap on its GPU).
#[boundary]
#[pyfunction]
#[pyo3(signature = (buffer, offsets, failed, device, meta=None))]
pub fn batch_arrow(
    py: Python<'_>,
    buffer: &crate::buffer::Buffer,
    offsets: Vec<i64>,
    failed: Vec<usize>,
    device: bool,
    meta: Option<&BatchDeviceMeta>,
) -> PyResult<(Py<PyAny>, Py<PyAny>)> {
    let count = offsets.len().saturating_sub(1);
    check_failed(count, &failed)?;
    let (data, ordinal, owner) = buffer.parts();
    let null_count = failed.len() as i64;
    match (ordinal, device) {
        (Some(_), false) => Err(pyo3::exceptions::PyBufferError::new_err(
            "this batch is in GPU memory, which the Arrow C data interface cannot describe; \
             use __arrow_c_device_array__, or read with device=\"cpu\"",
        )),
        (None, _) => {
            let offsets = offsets.into_boxed_slice();
            let validity = validity_bits(count, &failed).map(Vec::into_boxed_slice);
            let buffers = vec![
                validity.as_ref().map_or(0, |v| v.as_ptr() as u64),
                offsets.as_ptr() as u64,
                data,
            ];
            let export = ArrayExport {
                format: DataType::LargeBinary,
                length: count as i64,
                null_count,
                buffers,
                children: Vec::new(),
                dictionary: None,
                owner: Box::new((owner, offsets, validity)),
            };
            if device {
                device_array_capsules(py, export, ARROW_DEVICE_CPU, -1, None)
            } else {
                array_capsules(py, export)
            }
        }
        (Some(ordinal), true) => {
            let meta = meta.ok_or_else(|| {
                pyo3::exceptions::PyValueError::new_err(
                    "a GPU batch's export needs its offsets on the GPU (batch_device_meta)",
                )
            })?;
            let base = meta.allocation.base();
            let event = crate::blocking::without_gil(py, move || {
                StreamEvent::record(ordinal, kvikpy_core::cuda::Stream::LEGACY)
            })?;
            let export = ArrayExport {
                format: DataType::LargeBinary,
                length: count as i64,
                null_count,
                buffers: vec![meta.bitmap_at.map_or(0, |at| base + at as u64), base, data],
                children: Vec::new(),
                dictionary: None,
                owner: Box::new((owner, Arc::clone(&meta.allocation))),
            };
            device_array_capsules(py, export, ARROW_DEVICE_CUDA, ordinal as i64, Some(event))
        }
    }
}
