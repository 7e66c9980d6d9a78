//! A `Buffer` through the Arrow PyCapsule interface: its schema, and its memory as an Arrow
//! array on the host or on its device (the capsule machinery is in `crate::arrow`).

use kvikpy_core::cuda;
use pyo3::exceptions::PyBufferError;
use pyo3::prelude::*;

use super::Buffer;
use crate::arrow;
use crate::blocking::without_gil;
use crate::errors::BindResult;

impl Buffer {
    /// The body of `__arrow_c_schema__` (see there).
    pub(super) fn arrow_schema(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let element = arrow::element_type(&self.dtype)?;
        arrow::schema_capsule(py, &arrow::buffer_type(element, &self.shape)?)
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
