//! `_lib.Buffer`: memory kvikpy allocated (GPU, pinned host or plain host) with its dtype
//! and shape; this module holds the class, its constructors and small getters, and hands
//! each export protocol to its own module.

mod arrow_export;
mod buffer_protocol;
mod cai;
mod dlpack_export;
mod dtype;
mod numpy;
mod pickle;
mod storage;

use std::ffi::c_int;
use std::sync::Arc;

use kvikpy_core::allocation::{Allocation, Placement};
use kvikpy_core::Span;
use kvikpy_macros::boundary;
use pyo3::exceptions::PyValueError;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use crate::blocking::without_gil;
use crate::errors::BindResult;

pub use dtype::{item_types, Dtype};
pub use storage::{live_buffers, mark_ready, Storage};

/// A block of memory filled by kvikpy: GPU memory, or ordinary host memory.
///
/// Hand it to PyTorch, CuPy, JAX or numpy without a copy: ``torch.from_dlpack(buf)``,
/// ``cupy.from_dlpack(buf)``, ``numpy.from_dlpack(buf)`` (host buffers), or through
/// ``__cuda_array_interface__``; to Arrow through the PyCapsule interface
/// (``pyarrow.array(buf)`` for host buffers, ``__arrow_c_device_array__`` for GPU ones).
/// Exports keep the memory alive. A ``Buffer`` is also a valid destination for
/// ``CuFile.read``. Made by ``kvikpy.read``, batches and ``iter_chunks``. Host buffers
/// pickle (bytes, dtype and shape; unpickled as ordinary host memory); GPU buffers refuse.
///
/// Examples
/// --------
/// >>> buf = kvikpy.read("weights.bin", dtype="float16", shape=(4096, 4096))
/// >>> buf
/// <kvikpy.Buffer 32.0 MiB on cuda:0, dtype=float16, shape=(4096, 4096)>
/// >>> t = torch.from_dlpack(buf)  # same memory, now a torch tensor
/// >>> host = buf.to_numpy()  # a copy back to host memory
#[pyclass(module = "kvikpy._lib", frozen)]
pub struct Buffer {
    storage: Arc<Storage>,
    offset: usize,
    nbytes: usize,
    dtype: Dtype,
    shape: Vec<i64>,
}

impl Buffer {
    fn ptr(&self) -> u64 {
        self.storage.base() + self.offset as u64
    }

    /// The GPU the memory is on, or None for host memory.
    fn ordinal(&self) -> Option<usize> {
        self.storage.placement().ordinal()
    }

    /// `nbytes` new bytes at `placement` (pinned host memory serving that device when
    /// `pinned`), as one `uint8` dimension.
    pub fn allocate_at(
        py: Python<'_>,
        nbytes: usize,
        placement: Placement,
        pinned: bool,
    ) -> BindResult<Self> {
        let allocation = if placement == Placement::Host && !pinned {
            // Ordinary host memory is mapped lazily: quicker than releasing the GIL.
            Allocation::new(placement, nbytes, pinned)?
        } else {
            without_gil(py, move || Allocation::new(placement, nbytes, pinned))?
        };
        Ok(Self::from_allocation(allocation))
    }

    /// A buffer of bytes over the whole of `allocation`.
    pub fn from_allocation(allocation: Allocation) -> Self {
        let nbytes = allocation.size();
        Self {
            storage: Arc::new(Storage::new(allocation)),
            offset: 0,
            nbytes,
            dtype: Dtype::bytes(),
            shape: vec![nbytes as i64],
        }
    }

    /// A view of the bytes `[offset, offset + nbytes)` (default: to the end) as `shape`
    /// items of `dtype`; `ValueError` if they are outside the buffer or do not fill it.
    pub(crate) fn view_as(
        &self,
        dtype: Dtype,
        shape: Vec<i64>,
        offset: usize,
        nbytes: Option<usize>,
    ) -> PyResult<Self> {
        let nbytes = nbytes.unwrap_or(self.nbytes.saturating_sub(offset));
        if offset
            .checked_add(nbytes)
            .is_none_or(|end| end > self.nbytes)
        {
            return Err(PyValueError::new_err(format!(
                "view of bytes [{offset}, {}) is outside a buffer of {} bytes",
                offset.saturating_add(nbytes),
                self.nbytes
            )));
        }
        let count: i64 = shape.iter().product();
        let itemsize = dtype.itemsize();
        if shape.iter().any(|&d| d < 0) || count as usize * itemsize != nbytes {
            return Err(PyValueError::new_err(format!(
                "shape {shape:?} of {itemsize}-byte items needs {} bytes, but the view has {nbytes}",
                count.max(0) as usize * itemsize
            )));
        }
        Ok(Self {
            storage: Arc::clone(&self.storage),
            offset: self.offset + offset,
            nbytes,
            dtype,
            shape,
        })
    }

    /// The memory as an engine span, and the owner to keep alive while it is used.
    pub fn span(&self) -> (Span, Arc<Storage>) {
        // A view lies inside its storage (checked in `view_as`), so `sub` cannot fail.
        let span = self.storage.span().sub(self.offset, self.nbytes);
        (span, Arc::clone(&self.storage))
    }

    /// The data address, the GPU (None for host memory) and an owner keeping it alive.
    pub fn parts(&self) -> (u64, Option<usize>, Box<dyn std::any::Any + Send>) {
        (
            self.ptr(),
            self.ordinal(),
            Box::new(Arc::clone(&self.storage)),
        )
    }
}

#[boundary]
#[pymethods]
impl Buffer {
    /// Allocate `nbytes` on CUDA device `ordinal`, or on the host when `ordinal` is None.
    /// With `pinned`, host memory page-locked for device `ordinal` (the calling thread's
    /// current device when None), allocated and freed under that device's context.
    #[staticmethod]
    #[pyo3(signature = (nbytes, ordinal, pinned))]
    pub fn allocate(
        py: Python<'_>,
        nbytes: usize,
        ordinal: Option<usize>,
        pinned: bool,
    ) -> BindResult<Self> {
        Self::allocate_at(py, nbytes, Placement::from_ordinal(ordinal), pinned)
    }

    /// A view of the same memory with another dtype and shape (same byte size), or of the
    /// bytes `[offset, offset + nbytes)`.
    #[pyo3(signature = (typestr, code, bits, shape, offset=0, nbytes=None))]
    fn view(
        &self,
        typestr: String,
        code: u8,
        bits: u8,
        shape: Vec<i64>,
        offset: usize,
        nbytes: Option<usize>,
    ) -> PyResult<Self> {
        self.view_as(Dtype::parse(typestr, code, bits)?, shape, offset, nbytes)
    }

    /// Address of the first byte.
    #[getter(ptr)]
    fn get_ptr(&self) -> u64 {
        self.ptr()
    }

    /// Size in bytes.
    #[getter]
    fn nbytes(&self) -> usize {
        self.nbytes
    }

    /// ``"cuda:N"`` or ``"cpu"``.
    #[getter]
    fn device(&self) -> String {
        match self.ordinal() {
            Some(o) => format!("cuda:{o}"),
            None => "cpu".into(),
        }
    }

    /// Whether host memory is page-locked (pinned).
    #[getter]
    fn is_pinned(&self) -> bool {
        self.storage.is_pinned()
    }

    /// The numpy-style type string (``"<f4"``...).
    #[getter]
    fn typestr(&self) -> &str {
        self.dtype.typestr()
    }

    /// The shape.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, &self.shape)
    }

    /// How many holders share this buffer's memory (views, exports, running reads, and
    /// the buffer itself): 1 means nothing else can see it.
    #[getter]
    fn _holders(&self) -> usize {
        Arc::strong_count(&self.storage)
    }

    fn __dlpack_device__(&self) -> (i32, i32) {
        self.dlpack_device()
    }

    /// Export as a DLPack capsule (the array API's ``__dlpack__`` protocol).
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__(
        &self,
        py: Python<'_>,
        stream: Option<&Bound<'_, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> BindResult<Py<PyAny>> {
        self.dlpack(py, stream, max_version, dl_device, copy)
    }

    /// The Arrow type of the buffer (its dtype; nested fixed-size lists for 2-D and higher
    /// shapes), as an ``arrow_schema`` capsule. ``TypeError`` for dtypes Arrow lacks.
    fn __arrow_c_schema__(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        self.arrow_schema(py)
    }

    /// A host buffer as an Arrow array of its dtype and shape (``arrow_schema`` and
    /// ``arrow_array`` capsules), without a copy: ``pyarrow.array(buf)``.
    #[pyo3(signature = (requested_schema=None))]
    fn __arrow_c_array__(
        &self,
        py: Python<'_>,
        requested_schema: Option<&Bound<'_, PyAny>>,
    ) -> PyResult<(Py<PyAny>, Py<PyAny>)> {
        let _ = requested_schema; // the protocol lets a producer keep its own schema
        self.arrow_array(py)
    }

    /// The buffer as an Arrow array of its dtype and shape on its device (``arrow_schema`` and
    /// ``arrow_device_array`` capsules, the Arrow C device data interface): CUDA with
    /// ``device_id`` the GPU and ``sync_event`` an event to wait on, or CPU.
    #[pyo3(signature = (requested_schema=None, **kwargs))]
    fn __arrow_c_device_array__(
        &self,
        py: Python<'_>,
        requested_schema: Option<&Bound<'_, PyAny>>,
        kwargs: Option<&Bound<'_, PyDict>>,
    ) -> BindResult<(Py<PyAny>, Py<PyAny>)> {
        let _ = requested_schema;
        crate::arrow_c::check_device_kwargs("__arrow_c_device_array__", kwargs)?;
        self.arrow_device_array(py)
    }

    /// The CUDA Array Interface (version 3) of a GPU buffer.
    #[getter]
    fn __cuda_array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        self.cuda_array_interface(py)
    }

    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut pyo3::ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        // SAFETY: Python passes the Py_buffer to fill, as `get_buffer` requires.
        unsafe { buffer_protocol::get_buffer(slf, view, flags) }
    }

    unsafe fn __releasebuffer__(&self, view: *mut pyo3::ffi::Py_buffer) {
        // SAFETY: Python passes the Py_buffer that `__getbuffer__` filled.
        unsafe { buffer_protocol::release_buffer(view) }
    }

    /// The numpy dtype of the elements. numpy has no bfloat16: for bfloat16 buffers this
    /// is ``ml_dtypes.bfloat16`` where ml_dtypes is installed, else ``numpy.dtype('V2')``
    /// (raw 2-byte items; view them as ``uint16`` for their bits).
    #[getter]
    fn dtype<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        self.numpy_dtype(py)
    }

    /// A numpy array of the contents: a zero-copy view for host buffers, a copy for GPU
    /// buffers. bfloat16 items come as :attr:`dtype` (``ml_dtypes.bfloat16`` or ``V2``).
    fn to_numpy<'py>(slf: Bound<'py, Self>) -> BindResult<Bound<'py, PyAny>> {
        numpy::to_numpy(slf)
    }

    /// Pickle support for host buffers: the bytes (out of band with pickle protocol 5),
    /// dtype and shape; they come back as ordinary (unpinned) host memory. GPU buffers
    /// refuse with ``TypeError``: copy to the host (``to_numpy``) or send the file's path.
    fn __reduce_ex__<'py>(
        slf: &Bound<'py, Self>,
        protocol: i64,
    ) -> BindResult<(Bound<'py, PyAny>, Bound<'py, PyTuple>)> {
        pickle::reduce(slf, protocol)
    }

    /// Rebuild a pickled host buffer in new host memory (see ``__reduce_ex__``).
    #[staticmethod]
    fn _from_pickle(
        py: Python<'_>,
        data: &Bound<'_, PyAny>,
        typestr: String,
        code: u8,
        bits: u8,
        shape: Vec<i64>,
    ) -> BindResult<Self> {
        pickle::rebuild(py, data, Dtype::parse(typestr, code, bits)?, shape)
    }

    /// One line with human units (formatted in `kvikpy._display`, the one place that
    /// decides how kvikpy objects look).
    fn __repr__(slf: &Bound<'_, Self>) -> PyResult<String> {
        let display = slf.py().import("kvikpy._display")?;
        display.call_method1("buffer_repr", (slf,))?.extract()
    }

    /// A table for notebooks: size, device and kind of memory, dtype, shape, address.
    fn _repr_html_(slf: &Bound<'_, Self>) -> PyResult<String> {
        let display = slf.py().import("kvikpy._display")?;
        display.call_method1("buffer_html", (slf,))?.extract()
    }
}
