//! torch CUDA tensors read without DLPack: their pointer, size, device and the stream
//! that orders their pending work, from a handful of cheap attribute calls.
//!
//! A torch tensor's `__cuda_array_interface__` names no stream, so kvikpy would have to
//! take it through `__dlpack__(stream=...)` to learn which work to wait for; on the H100
//! machine that handshake cost 19 µs a call (torch makes events and stream objects in
//! Python), against 11 µs for the whole 4 KiB read it guards. torch's own answer to
//! "which stream is current on this device" (`torch._C._cuda_getCurrentRawStream`, the
//! call torch's compiled kernels use) gives the same ordering for a fraction of that:
//! waiting for the tensor's device's current stream is what `__dlpack__` arranges.
//!
//! Only plain tensors take this path (`torch.Tensor` and `torch.nn.Parameter` exactly,
//! on a CUDA device, contiguous, not requiring grad, without the conjugate or negative
//! bit): subclasses may redefine what their memory is, and every other case keeps the
//! interfaces' behaviour and messages.

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::PyType;

use crate::modules::Found;

/// A plain CUDA tensor's memory and the stream its pending work is queued on.
pub struct TorchView {
    pub ptr: u64,
    pub nbytes: usize,
    pub device: usize,
    /// The raw `CUstream` current on the tensor's device (0: the legacy default stream).
    pub stream: usize,
}

/// What the fast path needs of torch, found once torch has been imported.
struct Torch {
    tensor: Py<PyType>,
    parameter: Option<Py<PyType>>,
    current_raw_stream: Py<PyAny>,
}

static TORCH: Found<Torch> = Found::new();

/// torch's pieces, or `None` while torch is not imported (looked for again once more
/// modules are: a program may import torch after kvikpy) or lacks them (then never
/// looked for again).
fn torch(py: Python<'_>) -> Option<&'static Torch> {
    TORCH.get(py, intern!(py, "torch"), |torch| {
        let found = (|| -> PyResult<Option<Torch>> {
            let tensor = torch.getattr("Tensor")?.cast_into::<PyType>()?.unbind();
            let parameter = torch
                .getattr("nn")
                .and_then(|nn| nn.getattr("Parameter"))
                .ok()
                .and_then(|p| p.cast_into::<PyType>().ok())
                .map(Bound::unbind);
            let current_raw_stream = match torch
                .getattr("_C")
                .and_then(|c| c.getattr("_cuda_getCurrentRawStream"))
            {
                Ok(f) => f.unbind(),
                Err(_) => return Ok(None),
            };
            Ok(Some(Torch {
                tensor,
                parameter,
                current_raw_stream,
            }))
        })();
        Some(found.unwrap_or(None))
    })
}

/// `obj` as a [`TorchView`] when it is a plain CUDA tensor this path can take; `None`
/// sends it down the general interfaces (which also give every error its message).
pub fn view(obj: &Bound<'_, PyAny>) -> Option<TorchView> {
    let py = obj.py();
    let torch = torch(py)?;
    let ty = obj.get_type();
    let plain =
        ty.is(torch.tensor.bind(py)) || torch.parameter.as_ref().is_some_and(|p| ty.is(p.bind(py)));
    if !plain {
        return None;
    }
    let flag = |name: &Bound<'_, pyo3::types::PyString>| -> Option<bool> {
        obj.getattr(name).ok()?.extract::<bool>().ok()
    };
    let call_flag = |name: &Bound<'_, pyo3::types::PyString>| -> Option<bool> {
        obj.call_method0(name).ok()?.extract::<bool>().ok()
    };
    if !flag(intern!(py, "is_cuda"))?
        || flag(intern!(py, "requires_grad"))?
        || !call_flag(intern!(py, "is_contiguous"))?
        || call_flag(intern!(py, "is_conj"))?
        || call_flag(intern!(py, "is_neg"))?
    {
        return None;
    }
    let ptr: u64 = obj
        .call_method0(intern!(py, "data_ptr"))
        .ok()?
        .extract()
        .ok()?;
    let nbytes: usize = obj.getattr(intern!(py, "nbytes")).ok()?.extract().ok()?;
    let device: usize = obj
        .call_method0(intern!(py, "get_device"))
        .ok()?
        .extract()
        .ok()?;
    let stream: usize = torch
        .current_raw_stream
        .bind(py)
        .call1((device,))
        .ok()?
        .extract()
        .ok()?;
    Some(TorchView {
        ptr,
        nbytes,
        device,
        stream,
    })
}
