//! `Buffer.__dlpack__` and `__dlpack_device__`: a buffer as a DLPack capsule on its device,
//! after its bytes are ready in the consumer's stream, or as a host copy when asked.

use std::sync::Arc;

use pyo3::exceptions::PyBufferError;
use pyo3::prelude::*;

use super::Buffer;
use crate::blocking::without_gil;
use crate::dlpack::{self, Export, DEVICE_CPU, DEVICE_CUDA};
use crate::errors::BindResult;

/// The `stream` argument of `__dlpack__`: None, or an int.
fn stream_arg(stream: Option<&Bound<'_, PyAny>>) -> PyResult<Option<i64>> {
    match stream {
        None => Ok(None),
        Some(s) if s.is_none() => Ok(None),
        Some(s) => Ok(Some(s.extract::<i64>()?)),
    }
}

impl Buffer {
    /// `(device_type, device_id)` of DLPack: `(kDLCUDA, N)` or `(kDLCPU, 0)`.
    pub(super) fn dlpack_device(&self) -> (i32, i32) {
        match self.ordinal() {
            Some(o) => (DEVICE_CUDA, o as i32),
            None => (DEVICE_CPU, 0),
        }
    }

    /// The body of `__dlpack__` (see there).
    pub(super) fn dlpack(
        &self,
        py: Python<'_>,
        stream: Option<&Bound<'_, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> BindResult<Py<PyAny>> {
        let here = self.dlpack_device();
        if let Some(wanted) = dl_device {
            if wanted != here {
                if wanted == (DEVICE_CPU, 0) && copy != Some(false) {
                    // The array API's way to ask for a host copy (numpy.from_dlpack(x,
                    // device="cpu")): copy into new host memory and export that.
                    let host = self.host_copy(py)?;
                    return host.dlpack(py, None, max_version, None, None);
                }
                return Err(PyBufferError::new_err(format!(
                    "this buffer lives on DLPack device {here:?}; it can be exported there, \
                     or copied to the host with dl_device=(1, 0) (asked for {wanted:?}, \
                     copy={copy:?})"
                ))
                .into());
            }
        }
        if copy == Some(true) {
            return Err(PyBufferError::new_err(
                "kvikpy exports its buffers without copying; copy=True is supported only \
                 together with dl_device=(1, 0) for a GPU buffer",
            )
            .into());
        }
        let stream = stream_arg(stream)?;
        match (self.ordinal(), stream) {
            (None, Some(s)) => {
                return Err(PyBufferError::new_err(format!(
                    "stream={s} was given for a host buffer; pass stream=None"
                ))
                .into())
            }
            (Some(_), Some(-1)) => {}
            (Some(_), s) => {
                // None means the legacy default stream (DLPack's rule for CUDA).
                let target = s.unwrap_or(1) as usize;
                let storage = Arc::clone(&self.storage);
                without_gil(py, move || storage.readiness().wait_on(Some(target)))?;
            }
            (None, None) => {}
        }
        let versioned = max_version.is_some_and(|(major, _)| major >= 1);
        let export = Export {
            ptr: self.ptr(),
            device_type: here.0,
            device_id: here.1,
            code: self.dtype.code(),
            bits: self.dtype.bits(),
            shape: self.shape.clone(),
            owner: Box::new(Arc::clone(&self.storage)),
        };
        Ok(dlpack::to_capsule(py, export, versioned)?)
    }
}
