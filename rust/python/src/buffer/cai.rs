//! `Buffer.__cuda_array_interface__`: the CUDA Array Interface (version 3) of a GPU buffer,
//! with the stream its bytes land in.

use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use super::Buffer;

impl Buffer {
    /// The body of the `__cuda_array_interface__` getter (see there).
    pub(super) fn cuda_array_interface<'py>(
        &self,
        py: Python<'py>,
    ) -> PyResult<Bound<'py, PyDict>> {
        if self.ordinal().is_none() {
            return Err(pyo3::exceptions::PyAttributeError::new_err(
                "host buffers have no __cuda_array_interface__; use numpy.asarray(buf)",
            ));
        }
        let d = PyDict::new(py);
        d.set_item("shape", PyTuple::new(py, &self.shape)?)?;
        d.set_item("typestr", self.dtype.typestr())?;
        d.set_item("data", (self.ptr(), false))?;
        d.set_item("version", 3)?;
        d.set_item("strides", py.None())?;
        // Bytes read in a stream's order land in that stream: consumers synchronise on it
        // (0 is not allowed by the interface; the legacy default stream is 1 there).
        match self.storage.readiness().ordered_stream() {
            Some(stream) => d.set_item("stream", stream.max(1))?,
            None => d.set_item("stream", py.None())?,
        }
        Ok(d)
    }
}
