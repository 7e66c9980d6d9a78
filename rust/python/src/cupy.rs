//! CuPy arrays read without their `__cuda_array_interface__`: pointer, size, device and
//! the stream that orders their pending work, from a few attribute reads.
//!
//! The interface costs a dict of eight entries built by CuPy (its shape tuple, its dtype's
//! `descr` list, its current stream) and taken apart again here, and a CuPy array's
//! buffer slot first raises a `TypeError` (it serves host-accessible memory only); the
//! attributes behind them are a handful of slot reads. The ordering is the interface's:
//! version 3 names CuPy's current stream, which the read then waits for (or, stream
//! ordered, its stream waits for on the GPU). Here it is the current stream of the
//! array's own device (`cupy.cuda.get_current_stream(device_id)`), which is the
//! interface's stream whenever that device is current, and the one that can be ordered
//! against when it is not.
//!
//! Only plain arrays take this path: `cupy.ndarray` exactly, C-contiguous, in memory
//! CuPy allocated on a device (`Memory`, `MemoryAsync`, or pool memory over them), or
//! in memory the driver reports as device memory (other allocators, CuPy before 13.5,
//! whose pool memory does not say what it pools). Subclasses, other layouts, managed
//! and host-accessible memory (which CuPy may also serve through the buffer protocol)
//! keep the interfaces' behaviour and messages; so does CuPy before 13, whose current
//! stream is not kept per device.

use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::PyType;

use crate::modules::Found;

/// A plain CuPy array's memory and the stream its pending work is queued on.
pub struct CupyView {
    pub ptr: u64,
    pub nbytes: usize,
    pub device: usize,
    /// The raw `CUstream` current on the array's device (0: the legacy default stream).
    pub stream: usize,
    /// Whether the memory is known to be device memory from its type (else the caller
    /// asks the driver).
    pub known_device: bool,
}

/// What the fast path needs of CuPy, found once CuPy has been imported.
struct CuPy {
    ndarray: Py<PyType>,
    /// `cupy.cuda.memory.Memory` and `MemoryAsync`: memory CuPy allocated on a device.
    device_memory: Vec<Py<PyType>>,
    /// `cupy.cuda.memory.PooledMemory`, and whether it says what it pools (`identity`,
    /// CuPy 13.5 on).
    pooled: Option<(Py<PyType>, bool)>,
    get_current_stream: Py<PyAny>,
}

static CUPY: Found<CuPy> = Found::new();

/// CuPy's pieces, or `None` while CuPy is not imported (looked for again once more
/// modules are) or lacks them (then never looked for again).
fn cupy(py: Python<'_>) -> Option<&'static CuPy> {
    CUPY.get(py, intern!(py, "cupy"), |module| {
        // A module still being imported lacks its attributes: look again next time.
        let ndarray = module
            .getattr("ndarray")
            .ok()?
            .cast_into::<PyType>()
            .ok()?
            .unbind();
        let cuda = module.getattr("cuda").ok()?;
        let found = (|| -> PyResult<Option<CuPy>> {
            // The current stream per device (`get_current_stream(device_id)`) came in
            // CuPy 13.
            let version: String = module.getattr("__version__")?.extract()?;
            let major: u32 = version
                .split('.')
                .next()
                .and_then(|m| m.parse().ok())
                .unwrap_or(0);
            if major < 13 {
                return Ok(None);
            }
            let memory = cuda.getattr("memory")?;
            let device_memory = ["Memory", "MemoryAsync"]
                .iter()
                .filter_map(|name| memory.getattr(*name).ok()?.cast_into::<PyType>().ok())
                .map(Bound::unbind)
                .collect();
            let pooled = memory
                .getattr("PooledMemory")
                .ok()
                .and_then(|t| t.cast_into::<PyType>().ok())
                .map(|t| {
                    let says = t.hasattr("identity").unwrap_or(false);
                    (t.unbind(), says)
                });
            let get_current_stream = cuda.getattr("get_current_stream")?.unbind();
            Ok(Some(CuPy {
                ndarray,
                device_memory,
                pooled,
                get_current_stream,
            }))
        })();
        Some(found.unwrap_or(None))
    })
}

/// `obj` as a [`CupyView`] when it is a plain CuPy array this path can take; `None`
/// sends it down the general interfaces (which also give every error its message).
pub fn view(obj: &Bound<'_, PyAny>) -> Option<CupyView> {
    let py = obj.py();
    let cupy = cupy(py)?;
    if !obj.get_type().is(cupy.ndarray.bind(py)) {
        return None;
    }
    let contiguous: bool = obj
        .getattr(intern!(py, "_c_contiguous"))
        .ok()?
        .extract()
        .ok()?;
    if !contiguous {
        return None;
    }
    let data = obj.getattr(intern!(py, "data")).ok()?;
    let mem = data.getattr(intern!(py, "mem")).ok()?;
    let mem_type = mem.get_type();
    let known_device = if cupy.device_memory.iter().any(|t| mem_type.is(t.bind(py))) {
        true
    } else {
        match &cupy.pooled {
            Some((pooled, true)) if mem_type.is(pooled.bind(py)) => {
                let identity = mem.getattr(intern!(py, "identity")).ok()?;
                let identity = identity
                    .cast::<pyo3::types::PyString>()
                    .ok()?
                    .to_str()
                    .ok()?;
                // Managed and system memory may be served as host memory: not here.
                if !matches!(identity, "Memory" | "MemoryAsync") {
                    return None;
                }
                true
            }
            _ => false,
        }
    };
    let ptr: u64 = data.getattr(intern!(py, "ptr")).ok()?.extract().ok()?;
    let device: usize = data
        .getattr(intern!(py, "device_id"))
        .ok()?
        .extract()
        .ok()?;
    let nbytes: usize = obj.getattr(intern!(py, "nbytes")).ok()?.extract().ok()?;
    if ptr == 0 && nbytes > 0 {
        return None; // the interface's path words the error
    }
    let stream: usize = cupy
        .get_current_stream
        .bind(py)
        .call1((device,))
        .ok()?
        .getattr(intern!(py, "ptr"))
        .ok()?
        .extract()
        .ok()?;
    Some(CupyView {
        ptr,
        nbytes,
        device,
        stream,
        known_device,
    })
}
