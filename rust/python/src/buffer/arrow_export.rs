//! A `Buffer` through the Arrow PyCapsule interface: its Arrow type (its dtype's element
//! type, nested in fixed-size lists for 2-D and higher shapes), and its memory as an Arrow
//! array on the host or on its device, without a copy (the capsule machinery is
//! `crate::arrow_c`).

use std::sync::Arc;

use arrow_schema::DataType;
use kvikpy_core::cuda;
use pyo3::exceptions::{PyBufferError, PyTypeError, PyValueError};
use pyo3::prelude::*;

use super::{Buffer, Dtype};
use crate::arrow_c::{self as arrow, buffer_type, ArrayExport};
use crate::blocking::without_gil;
use crate::errors::BindResult;

/// The Arrow type of one element of a buffer, from its dtype's DLPack type code, bit width
/// and byte order. Booleans (one byte each) export as `uint8`: Arrow's boolean is
/// bit-packed, which would need a copy.
pub fn element_type(dtype: &Dtype) -> PyResult<DataType> {
    let (code, bits, typestr) = (dtype.code(), dtype.bits(), dtype.typestr());
    let order = if cfg!(target_endian = "little") {
        "little"
    } else {
        "big"
    };
    if dtype.is_foreign_order() {
        return Err(PyTypeError::new_err(format!(
            "the buffer's items ({typestr:?}) are not in this machine's byte order, and \
             Arrow arrays hold items in it ({order}-endian); read with the native dtype \
             and swap the bytes (numpy's byteswap), or read with dtype='uint8' to export \
             the bytes"
        )));
    }
    Ok(match (code, bits) {
        (0, 8) => DataType::Int8,
        (0, 16) => DataType::Int16,
        (0, 32) => DataType::Int32,
        (0, 64) => DataType::Int64,
        (1, 8) | (6, 8) => DataType::UInt8,
        (1, 16) => DataType::UInt16,
        (1, 32) => DataType::UInt32,
        (1, 64) => DataType::UInt64,
        (2, 16) => DataType::Float16,
        (2, 32) => DataType::Float32,
        (2, 64) => DataType::Float64,
        (5, bits) => {
            return Err(PyTypeError::new_err(format!(
                "complex{bits} has no Arrow type (Arrow has no complex numbers); read with \
                 dtype='float{}' and a shape ending in 2 to export (real, imaginary) \
                 pairs as a fixed-size list, or with dtype='uint8' to export the bytes",
                bits / 2
            )))
        }
        (code, bits) => {
            let kind = match code {
                0 => "int".to_owned(),
                1 => "uint".to_owned(),
                2 => "float".to_owned(),
                4 => "bfloat".to_owned(),
                6 => "bool".to_owned(),
                _ => format!("DLPack type code {code}, bits "),
            };
            return Err(PyTypeError::new_err(format!(
                "{kind}{bits} ({typestr:?}) has no Arrow type; read with dtype='uint8' to \
                 export the bytes"
            )));
        }
    })
}

/// The export of `length` values of type `format` whose elements start at `ptr`: a
/// primitive array, or a fixed-size list whose child holds `length * size` values. Every
/// level owns a reference to `owner`.
fn typed_level<T: Send + Sync + 'static>(
    format: &DataType,
    length: i64,
    ptr: u64,
    owner: &Arc<T>,
) -> PyResult<ArrayExport> {
    let (buffers, children) = match format {
        DataType::FixedSizeList(field, size) => {
            let values = length.checked_mul(i64::from(*size)).ok_or_else(|| {
                PyValueError::new_err(format!("{length} lists of {size} values overflow"))
            })?;
            (
                vec![0],
                vec![typed_level(field.data_type(), values, ptr, owner)?],
            )
        }
        _ => (vec![0, ptr], Vec::new()),
    };
    Ok(ArrayExport {
        format: format.clone(),
        length,
        null_count: 0,
        buffers,
        children,
        dictionary: None,
        owner: Box::new(Arc::clone(owner)),
    })
}

/// The typed Arrow export of a buffer's memory at `ptr` (see [`element_type`] and
/// [`buffer_type`]), kept alive by `owner`; no copy.
fn buffer_export<T: Send + Sync + 'static>(
    ptr: u64,
    dtype: &Dtype,
    shape: &[i64],
    owner: &Arc<T>,
) -> PyResult<ArrayExport> {
    let format = buffer_type(element_type(dtype)?, shape)?;
    typed_level(&format, shape.first().copied().unwrap_or(1), ptr, owner)
}

impl Buffer {
    /// The typed Arrow export of the memory (see [`buffer_export`]), no copy.
    pub fn arrow_export(&self) -> PyResult<ArrayExport> {
        buffer_export(self.ptr(), &self.dtype, &self.shape, &self.storage)
    }

    /// The body of `__arrow_c_schema__` (see there).
    pub(super) fn arrow_schema(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let element = element_type(&self.dtype)?;
        arrow::schema_capsule(py, &buffer_type(element, &self.shape)?)
    }

    /// The body of `__arrow_c_array__` (see there).
    pub(super) fn arrow_array(&self, py: Python<'_>) -> PyResult<(Py<PyAny>, Py<PyAny>)> {
        if let Some(ordinal) = self.ordinal() {
            return Err(PyBufferError::new_err(format!(
                "this buffer is in the memory of GPU {ordinal}, which the Arrow C data \
                 interface cannot describe; use __arrow_c_device_array__ (for example \
                 nanoarrow.device.c_device_array(buf)), or read with device=\"cpu\""
            )));
        }
        arrow::array_capsules(py, self.arrow_export()?)
    }

    /// The body of `__arrow_c_device_array__` (see there), its keywords checked.
    pub(super) fn arrow_device_array(&self, py: Python<'_>) -> BindResult<(Py<PyAny>, Py<PyAny>)> {
        match self.ordinal() {
            None => Ok(arrow::device_array_capsules(
                py,
                self.arrow_export()?,
                arrow::ARROW_DEVICE_CPU,
                -1,
                None,
            )?),
            Some(ordinal) => {
                // An event after whatever last filled the buffer (its stream for a
                // stream-ordered read; blocking reads have finished already).
                let stream = self.storage.readiness().ordered_stream().unwrap_or(0);
                let event = without_gil(py, move || {
                    cuda::StreamEvent::record(ordinal, cuda::Stream::from_raw(stream))
                })?;
                Ok(arrow::device_array_capsules(
                    py,
                    self.arrow_export()?,
                    arrow::ARROW_DEVICE_CUDA,
                    ordinal as i64,
                    Some(event),
                )?)
            }
        }
    }
}
