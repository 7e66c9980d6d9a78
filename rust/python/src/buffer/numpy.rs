//! The numpy side of a `Buffer`: its numpy dtype, `to_numpy`, and the host copy of a GPU
//! buffer that `to_numpy` and DLPack's `dl_device=(1, 0)` hand out.

use std::sync::Arc;

use kvikpy_core::allocation::Placement;
use kvikpy_core::cuda;
use pyo3::prelude::*;

use super::{Buffer, Dtype};
use crate::blocking::without_gil;
use crate::errors::BindResult;

impl Buffer {
    /// A copy of this GPU buffer in new host memory (pinned for its GPU), same dtype and
    /// shape.
    pub(super) fn host_copy(&self, py: Python<'_>) -> BindResult<Self> {
        let host = Self::allocate_at(py, self.nbytes, self.storage.placement(), true)?.view_as(
            self.dtype.clone(),
            self.shape.clone(),
            0,
            None,
        )?;
        let (ordinal, src, len) = (self.ordinal(), self.ptr(), self.nbytes);
        let dst = host.ptr() as usize;
        let storage = Arc::clone(&self.storage);
        without_gil(py, move || {
            storage.readiness().wait_on(None)?;
            match ordinal {
                // SAFETY: `src` is inside this buffer's live device allocation and `dst`
                // inside the fresh host allocation, both `len` bytes.
                Some(o) if len > 0 => unsafe {
                    cuda::copy_device_to_host(o, dst as *mut u8, src, len)
                },
                _ => Ok(()),
            }
        })?;
        Ok(host)
    }

    /// The body of the `dtype` getter (see there).
    pub(super) fn numpy_dtype<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let numpy_dtype = py.import("numpy")?.getattr("dtype")?;
        if self.dtype.is_bfloat16() {
            if let Ok(ml_dtypes) = py.import("ml_dtypes") {
                return numpy_dtype.call1((ml_dtypes.getattr("bfloat16")?,));
            }
        }
        numpy_dtype.call1((self.dtype.typestr(),))
    }
}

/// The body of `Buffer.to_numpy` (see there).
pub(super) fn to_numpy(slf: Bound<'_, Buffer>) -> BindResult<Bound<'_, PyAny>> {
    let py = slf.py();
    let numpy = py.import("numpy")?;
    let this = slf.get();
    let host = if this.storage.placement() == Placement::Host {
        slf.clone()
    } else {
        Bound::new(py, this.host_copy(py)?)?
    };
    if this.dtype.is_bfloat16() {
        // numpy's DLPack import knows no bfloat16: take the bits as uint16, then
        // reinterpret them as the dtype.
        let uint16 = Dtype::parse("<u2".into(), 1, 16)?;
        let bits = host.get().view_as(uint16, this.shape.clone(), 0, None)?;
        let array = numpy.getattr("from_dlpack")?.call1((bits,))?;
        return Ok(array.call_method1("view", (this.numpy_dtype(py)?,))?);
    }
    Ok(numpy.getattr("from_dlpack")?.call1((host,))?)
}
