//! `_lib.Buffer`: memory kvikpy allocated (GPU, pinned host or plain host), with its
//! dtype and shape, exported through DLPack, `__cuda_array_interface__`, the Arrow
//! PyCapsule interface and the buffer protocol.

use kvikpy_macros::boundary;
use std::alloc::Layout;
use std::ffi::{c_int, c_void, CString};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use kvikpy_core::cuda::{self, DeviceAllocation, PinnedHostAllocation, StreamEvent};
use kvikpy_core::{DeviceSpan, HostSpan, Span};
use pyo3::exceptions::{PyBufferError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};

use crate::arrow;
use crate::blocking::without_gil;
use crate::dlpack::{self, Export, DEVICE_CPU, DEVICE_CUDA};

const HOST_ALIGNMENT: usize = 4096;
/// DLPack's type code of bfloat16 (`kDLBfloat`), which numpy has no dtype for.
const DLPACK_BFLOAT: u8 = 4;
/// From this size on, host allocations are aligned to and advised for 2 MiB transparent
/// huge pages: a fresh buffer is first touched by the read filling it, and 4 KiB pages
/// would cost a page fault each (32,768 for 128 MiB). numpy does the same for its arrays.
const HUGE_PAGE: usize = 2 << 20;

fn host_layout(size: usize) -> PyResult<Layout> {
    let align = if size >= 2 * HUGE_PAGE {
        HUGE_PAGE
    } else {
        HOST_ALIGNMENT
    };
    Layout::from_size_align(size.max(1), align).map_err(|e| PyValueError::new_err(e.to_string()))
}

/// Page-aligned ordinary host memory (when no CUDA driver can pin it).
struct AlignedHost {
    ptr: NonNull<u8>,
    /// The layout it was allocated with, which freeing must repeat.
    layout: Layout,
}

// SAFETY: plain memory exclusively owned by this value.
unsafe impl Send for AlignedHost {}
// SAFETY: shared access only exposes the address.
unsafe impl Sync for AlignedHost {}

impl AlignedHost {
    fn new(size: usize) -> PyResult<Self> {
        let layout = host_layout(size)?;
        // SAFETY: non-zero size.
        let ptr = unsafe { std::alloc::alloc(layout) };
        let ptr = NonNull::new(ptr).ok_or_else(|| {
            pyo3::exceptions::PyMemoryError::new_err(format!("could not allocate {size} bytes"))
        })?;
        if layout.align() == HUGE_PAGE {
            // SAFETY: advice on memory we own; failure (THP off) changes nothing.
            unsafe { libc::madvise(ptr.as_ptr().cast(), size, libc::MADV_HUGEPAGE) };
        }
        Ok(Self { ptr, layout })
    }
}

impl Drop for AlignedHost {
    fn drop(&mut self) {
        // SAFETY: allocated in `new` with `self.layout`, freed once.
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) }
    }
}

enum Memory {
    Device(DeviceAllocation),
    Pinned(PinnedHostAllocation),
    Host(AlignedHost),
}

/// The allocation behind one or more `Buffer` views; freed when the last view, export or
/// running operation lets go of it.
pub struct Storage {
    memory: Memory,
    /// Set when bytes land in stream order: the event after the transfer, and the stream
    /// it was ordered in. Consumers must wait for it.
    ready: Mutex<Option<(StreamEvent, usize)>>,
}

/// Storages alive in this process: tests use it to prove every export lets go exactly
/// once (a leak keeps the count up; a double free crashes).
static LIVE_STORAGES: AtomicUsize = AtomicUsize::new(0);

/// How many buffer allocations are alive (see [`LIVE_STORAGES`]).
#[boundary]
#[pyfunction]
pub fn live_buffers() -> usize {
    LIVE_STORAGES.load(Ordering::Acquire)
}

impl Drop for Storage {
    fn drop(&mut self) {
        LIVE_STORAGES.fetch_sub(1, Ordering::AcqRel);
    }
}

impl Storage {
    fn new(memory: Memory) -> Self {
        LIVE_STORAGES.fetch_add(1, Ordering::AcqRel);
        Self {
            memory,
            ready: Mutex::new(None),
        }
    }

    fn base(&self) -> u64 {
        match &self.memory {
            Memory::Device(d) => d.ptr(),
            Memory::Pinned(p) => p.as_ptr() as u64,
            Memory::Host(h) => h.ptr.as_ptr() as u64,
        }
    }

    fn ordinal(&self) -> Option<usize> {
        match &self.memory {
            Memory::Device(d) => Some(d.ordinal()),
            _ => None,
        }
    }

    /// Record that the bytes land when `stream` reaches this point.
    pub fn set_ready(&self, event: StreamEvent, stream: usize) {
        *self.ready.lock().unwrap_or_else(|e| e.into_inner()) = Some((event, stream));
    }

    fn ordered_stream(&self) -> Option<usize> {
        self.ready
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(|(_, s)| *s)
    }

    fn wait_ready_on(&self, stream: Option<usize>) -> kvikpy_core::Result<()> {
        let guard = self.ready.lock().unwrap_or_else(|e| e.into_inner());
        match (guard.as_ref(), stream) {
            (None, _) => Ok(()),
            (Some((event, _)), Some(s)) => event.make_wait(cuda::Stream::from_raw(s)),
            (Some((event, _)), None) => event.synchronize(),
        }
    }
}

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
    typestr: String,
    code: u8,
    bits: u8,
    shape: Vec<i64>,
}

impl Buffer {
    fn ptr(&self) -> u64 {
        self.storage.base() + self.offset as u64
    }

    /// The memory as an engine span, and the owner to keep alive while it is used.
    pub fn span(&self) -> (Span, Arc<Storage>) {
        let span = match self.storage.ordinal() {
            Some(ordinal) => Span::Device(DeviceSpan {
                ptr: self.ptr(),
                len: self.nbytes,
                ordinal,
            }),
            // SAFETY: the storage is host memory of at least offset + nbytes bytes, kept
            // alive by the returned Arc for as long as the caller uses the span.
            None => Span::Host(unsafe { HostSpan::new(self.ptr() as *mut u8, self.nbytes) }),
        };
        (span, Arc::clone(&self.storage))
    }

    /// The data address, the GPU (None for host memory) and an owner keeping it alive.
    pub fn parts(&self) -> (u64, Option<usize>, Box<dyn std::any::Any + Send>) {
        (
            self.ptr(),
            self.storage.ordinal(),
            Box::new(Arc::clone(&self.storage)),
        )
    }

    /// The typed Arrow export of the memory (see `arrow::buffer_export`), no copy.
    pub fn arrow_export(&self) -> PyResult<arrow::ArrayExport> {
        arrow::buffer_export(
            self.ptr(),
            (self.code, self.bits, &self.typestr),
            &self.shape,
            &self.storage,
        )
    }

    fn dlpack_device(&self) -> (i32, i32) {
        match self.storage.ordinal() {
            Some(o) => (DEVICE_CUDA, o as i32),
            None => (DEVICE_CPU, 0),
        }
    }
}

fn stream_arg(stream: Option<&Bound<'_, PyAny>>) -> PyResult<Option<i64>> {
    match stream {
        None => Ok(None),
        Some(s) if s.is_none() => Ok(None),
        Some(s) => Ok(Some(s.extract::<i64>()?)),
    }
}

impl Buffer {
    /// A copy of this GPU buffer in new host memory (pinned), same dtype and shape.
    fn host_copy(&self, py: Python<'_>) -> PyResult<Self> {
        let serving = self.storage.ordinal().map_or(-1, |o| o as i64);
        let host = Self::allocate(py, self.nbytes, serving, true)?.view(
            self.typestr.clone(),
            self.code,
            self.bits,
            self.shape.clone(),
            0,
            None,
        )?;
        let (ordinal, src, len) = (self.storage.ordinal(), self.ptr(), self.nbytes);
        let dst = host.ptr() as usize;
        let storage = Arc::clone(&self.storage);
        without_gil(py, move || {
            storage.wait_ready_on(None)?;
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
}

#[boundary]
#[pymethods]
impl Buffer {
    /// Allocate `nbytes` on CUDA device `ordinal`, or on the host when `ordinal` is -1.
    /// With `pinned`, host memory page-locked for device `ordinal` (the calling thread's
    /// current device when -1), allocated and freed under that device's context.
    #[staticmethod]
    pub fn allocate(py: Python<'_>, nbytes: usize, ordinal: i64, pinned: bool) -> PyResult<Self> {
        let memory = if pinned {
            Memory::Pinned(without_gil(py, move || {
                let serving = match usize::try_from(ordinal) {
                    Ok(o) => o,
                    Err(_) => cuda::current_device()?,
                };
                PinnedHostAllocation::new(serving, nbytes)
            })?)
        } else if ordinal >= 0 {
            let ordinal = ordinal as usize;
            Memory::Device(without_gil(py, move || {
                DeviceAllocation::new(ordinal, nbytes)
            })?)
        } else {
            Memory::Host(AlignedHost::new(nbytes)?)
        };
        Ok(Self {
            storage: Arc::new(Storage::new(memory)),
            offset: 0,
            nbytes,
            typestr: "|u1".into(),
            code: 1,
            bits: 8,
            shape: vec![nbytes as i64],
        })
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
        let itemsize = (bits as usize).div_ceil(8);
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
            typestr,
            code,
            bits,
            shape,
        })
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
        match self.storage.ordinal() {
            Some(o) => format!("cuda:{o}"),
            None => "cpu".into(),
        }
    }

    /// Whether host memory is page-locked (pinned).
    #[getter]
    fn is_pinned(&self) -> bool {
        matches!(self.storage.memory, Memory::Pinned(_))
    }

    /// The numpy-style type string (``"<f4"``...).
    #[getter]
    fn typestr(&self) -> &str {
        &self.typestr
    }

    /// The shape.
    #[getter]
    fn shape<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, &self.shape)
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
    ) -> PyResult<Py<PyAny>> {
        let here = self.dlpack_device();
        if let Some(wanted) = dl_device {
            if wanted != here {
                if wanted == (DEVICE_CPU, 0) && copy != Some(false) {
                    // The array API's way to ask for a host copy (numpy.from_dlpack(x,
                    // device="cpu")): copy into new host memory and export that.
                    let host = self.host_copy(py)?;
                    return host.__dlpack__(py, None, max_version, None, None);
                }
                return Err(PyBufferError::new_err(format!(
                    "this buffer lives on DLPack device {here:?}; it can be exported there, \
                     or copied to the host with dl_device=(1, 0) (asked for {wanted:?}, \
                     copy={copy:?})"
                )));
            }
        }
        if copy == Some(true) {
            return Err(PyBufferError::new_err(
                "kvikpy exports its buffers without copying; copy=True is supported only \
                 together with dl_device=(1, 0) for a GPU buffer",
            ));
        }
        let stream = stream_arg(stream)?;
        match (self.storage.ordinal(), stream) {
            (None, Some(s)) => {
                return Err(PyBufferError::new_err(format!(
                    "stream={s} was given for a host buffer; pass stream=None"
                )))
            }
            (Some(_), Some(-1)) => {}
            (Some(_), s) => {
                // None means the legacy default stream (DLPack's rule for CUDA).
                let target = s.unwrap_or(1) as usize;
                let storage = Arc::clone(&self.storage);
                without_gil(py, move || storage.wait_ready_on(Some(target)))?;
            }
            (None, None) => {}
        }
        let versioned = max_version.is_some_and(|(major, _)| major >= 1);
        let export = Export {
            ptr: self.ptr(),
            device_type: here.0,
            device_id: here.1,
            code: self.code,
            bits: self.bits,
            shape: self.shape.clone(),
            owner: Box::new(Arc::clone(&self.storage)),
        };
        dlpack::to_capsule(py, export, versioned)
    }

    /// How many holders share this buffer's memory (views, exports, running reads, and
    /// the buffer itself): 1 means nothing else can see it.
    #[getter]
    fn _holders(&self) -> usize {
        Arc::strong_count(&self.storage)
    }

    /// The Arrow type of the buffer (its dtype; nested fixed-size lists for 2-D and higher
    /// shapes), as an ``arrow_schema`` capsule. ``TypeError`` for dtypes Arrow lacks.
    fn __arrow_c_schema__(&self, py: Python<'_>) -> PyResult<Py<PyAny>> {
        let element = arrow::element_type(self.code, self.bits, &self.typestr)?;
        arrow::schema_capsule(py, &arrow::buffer_type(element, &self.shape)?)
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
        if let Some(ordinal) = self.storage.ordinal() {
            return Err(PyBufferError::new_err(format!(
                "this buffer is in the memory of GPU {ordinal}, which the Arrow C data \
                 interface cannot describe; use __arrow_c_device_array__ (for example \
                 nanoarrow.device.c_device_array(buf)), or read with device=\"cpu\""
            )));
        }
        arrow::array_capsules(py, self.arrow_export()?)
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
    ) -> PyResult<(Py<PyAny>, Py<PyAny>)> {
        let _ = requested_schema;
        arrow::check_device_kwargs("__arrow_c_device_array__", kwargs)?;
        match self.storage.ordinal() {
            None => arrow::device_array_capsules(
                py,
                self.arrow_export()?,
                arrow::ARROW_DEVICE_CPU,
                -1,
                None,
            ),
            Some(ordinal) => {
                // An event after whatever last filled the buffer (its stream for a
                // stream-ordered read; blocking reads have finished already).
                let stream = self.storage.ordered_stream().unwrap_or(0);
                let event = without_gil(py, move || {
                    cuda::StreamEvent::record(ordinal, cuda::Stream::from_raw(stream))
                })?;
                arrow::device_array_capsules(
                    py,
                    self.arrow_export()?,
                    arrow::ARROW_DEVICE_CUDA,
                    ordinal as i64,
                    Some(event),
                )
            }
        }
    }

    /// The CUDA Array Interface (version 3) of a GPU buffer.
    #[getter]
    fn __cuda_array_interface__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        if self.storage.ordinal().is_none() {
            return Err(pyo3::exceptions::PyAttributeError::new_err(
                "host buffers have no __cuda_array_interface__; use numpy.asarray(buf)",
            ));
        }
        let d = PyDict::new(py);
        d.set_item("shape", PyTuple::new(py, &self.shape)?)?;
        d.set_item("typestr", &self.typestr)?;
        d.set_item("data", (self.ptr(), false))?;
        d.set_item("version", 3)?;
        d.set_item("strides", py.None())?;
        // Bytes read in a stream's order land in that stream: consumers synchronise on it
        // (0 is not allowed by the interface; the legacy default stream is 1 there).
        match self.storage.ordered_stream() {
            Some(stream) => d.set_item("stream", stream.max(1))?,
            None => d.set_item("stream", py.None())?,
        }
        Ok(d)
    }

    unsafe fn __getbuffer__(
        slf: Bound<'_, Self>,
        view: *mut pyo3::ffi::Py_buffer,
        flags: c_int,
    ) -> PyResult<()> {
        let this = slf.get();
        if this.storage.ordinal().is_some() {
            return Err(PyBufferError::new_err(
                "GPU buffers do not support the buffer protocol; use DLPack \
                 (torch.from_dlpack, cupy.from_dlpack) or copy to a host buffer",
            ));
        }
        if view.is_null() {
            return Err(PyBufferError::new_err("view is NULL"));
        }
        let storage = Arc::clone(&this.storage);
        without_gil(slf.py(), move || storage.wait_ready_on(None))?;
        let itemsize = (this.bits as usize).div_ceil(8).max(1);
        let format = CString::new(numpy_format(&this.typestr)).map_err(|e| {
            PyBufferError::new_err(format!(
                "the buffer's element format {:?} contains a NUL byte and cannot be exported \
                 through the buffer protocol; use DLPack instead",
                String::from_utf8_lossy(&e.into_vec())
            ))
        })?;
        let shape: Box<[isize]> = this.shape.iter().map(|&d| d as isize).collect();
        let mut strides = vec![itemsize as isize; this.shape.len()];
        for i in (0..this.shape.len().saturating_sub(1)).rev() {
            strides[i] = strides[i + 1] * this.shape[i + 1] as isize;
        }
        let extras = Box::new(BufferExtras {
            format,
            shape,
            strides: strides.into_boxed_slice(),
        });
        // SAFETY: `view` (not null, checked above) is the Py_buffer Python passed us to
        // fill, and nothing else touches it during this call.
        let view = unsafe { &mut *view };
        // Every pointer stored stays valid until __releasebuffer__ (the extras box) or
        // longer (the storage, kept alive by `view.obj`, a strong reference to this Buffer).
        view.buf = this.ptr() as *mut c_void;
        view.obj = slf.clone().into_any().into_ptr();
        view.len = this.nbytes as isize;
        view.readonly = 0;
        view.itemsize = itemsize as isize;
        view.ndim = this.shape.len() as c_int;
        view.format = if flags & pyo3::ffi::PyBUF_FORMAT != 0 {
            extras.format.as_ptr().cast_mut()
        } else {
            std::ptr::null_mut()
        };
        view.shape = if flags & pyo3::ffi::PyBUF_ND != 0 {
            extras.shape.as_ptr().cast_mut()
        } else {
            std::ptr::null_mut()
        };
        view.strides = if flags & pyo3::ffi::PyBUF_STRIDES == pyo3::ffi::PyBUF_STRIDES {
            extras.strides.as_ptr().cast_mut()
        } else {
            std::ptr::null_mut()
        };
        view.suboffsets = std::ptr::null_mut();
        view.internal = Box::into_raw(extras).cast();
        Ok(())
    }

    unsafe fn __releasebuffer__(&self, view: *mut pyo3::ffi::Py_buffer) {
        // SAFETY: Python passes the Py_buffer that __getbuffer__ filled, and nothing else
        // touches it during this call.
        let view = unsafe { &mut *view };
        let internal = std::mem::replace(&mut view.internal, std::ptr::null_mut());
        if !internal.is_null() {
            // SAFETY: `internal` holds the extras boxed in __getbuffer__, released once
            // here (the field is cleared above).
            drop(unsafe { Box::from_raw(internal.cast::<BufferExtras>()) });
        }
    }

    /// The numpy dtype of the elements. numpy has no bfloat16: for bfloat16 buffers this
    /// is ``ml_dtypes.bfloat16`` where ml_dtypes is installed, else ``numpy.dtype('V2')``
    /// (raw 2-byte items; view them as ``uint16`` for their bits).
    #[getter]
    fn dtype<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        let numpy_dtype = py.import("numpy")?.getattr("dtype")?;
        if self.code == DLPACK_BFLOAT {
            if let Ok(ml_dtypes) = py.import("ml_dtypes") {
                return numpy_dtype.call1((ml_dtypes.getattr("bfloat16")?,));
            }
        }
        numpy_dtype.call1((&self.typestr,))
    }

    /// A numpy array of the contents: a zero-copy view for host buffers, a copy for GPU
    /// buffers. bfloat16 items come as :attr:`dtype` (``ml_dtypes.bfloat16`` or ``V2``).
    fn to_numpy<'py>(slf: Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let numpy = py.import("numpy")?;
        let this = slf.get();
        let host = if this.storage.ordinal().is_none() {
            slf.clone()
        } else {
            Bound::new(py, this.host_copy(py)?)?
        };
        if this.code == DLPACK_BFLOAT {
            // numpy's DLPack import knows no bfloat16: take the bits as uint16, then
            // reinterpret them as the dtype.
            let bits = host
                .get()
                .view("<u2".into(), 1, 16, this.shape.clone(), 0, None)?;
            let array = numpy.getattr("from_dlpack")?.call1((bits,))?;
            return array.call_method1("view", (this.dtype(py)?,));
        }
        numpy.getattr("from_dlpack")?.call1((host,))
    }

    /// Pickle support for host buffers: the bytes (out of band with pickle protocol 5),
    /// dtype and shape; they come back as ordinary (unpinned) host memory. GPU buffers
    /// refuse with ``TypeError``: copy to the host (``to_numpy``) or send the file's path.
    fn __reduce_ex__<'py>(
        slf: &Bound<'py, Self>,
        protocol: i64,
    ) -> PyResult<(Bound<'py, PyAny>, Bound<'py, PyTuple>)> {
        let py = slf.py();
        let this = slf.get();
        if let Some(ordinal) = this.storage.ordinal() {
            return Err(pyo3::exceptions::PyTypeError::new_err(format!(
                "a kvikpy.Buffer in the memory of GPU {ordinal} cannot be pickled (another \
                 process cannot see this GPU allocation); pickle buf.to_numpy() (a host copy) \
                 or send the file's path and read it where it is needed"
            )));
        }
        let storage = Arc::clone(&this.storage);
        without_gil(py, move || storage.wait_ready_on(None))?;
        let bytes = this.view("|u1".into(), 1, 8, vec![this.nbytes as i64], 0, None)?;
        let payload = if protocol >= 5 {
            py.import("pickle")?
                .getattr("PickleBuffer")?
                .call1((Bound::new(py, bytes)?,))?
        } else {
            // SAFETY: host memory of `nbytes` bytes at `ptr`, kept alive by `this`.
            let data = unsafe { std::slice::from_raw_parts(this.ptr() as *const u8, this.nbytes) };
            pyo3::types::PyBytes::new(py, data).into_any()
        };
        let rebuild = py.get_type::<Self>().getattr("_from_pickle")?;
        let args = PyTuple::new(
            py,
            [
                payload,
                this.typestr.clone().into_pyobject(py)?.into_any(),
                this.code.into_pyobject(py)?.into_any(),
                this.bits.into_pyobject(py)?.into_any(),
                PyTuple::new(py, &this.shape)?.into_any(),
            ],
        )?;
        Ok((rebuild, args))
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
    ) -> PyResult<Self> {
        let source = pyo3::buffer::PyBuffer::<u8>::get(data)?;
        let nbytes = source.len_bytes();
        let buffer = Self::allocate(py, nbytes, -1, false)?;
        // SAFETY: fresh host memory of `nbytes` bytes owned by `buffer`, which nothing else
        // can see yet.
        let dst = unsafe { std::slice::from_raw_parts_mut(buffer.ptr() as *mut u8, nbytes) };
        source.copy_to_slice(py, dst)?;
        buffer.view(typestr, code, bits, shape, 0, None)
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

/// Arrays a Py_buffer points into, owned by the view until released.
struct BufferExtras {
    format: CString,
    shape: Box<[isize]>,
    strides: Box<[isize]>,
}

/// The struct-module format of a numpy typestr (`"<f4"` -> `"<f"`).
fn numpy_format(typestr: &str) -> String {
    let (order, kind, size) = (
        &typestr[..1],
        typestr.as_bytes().get(1).copied().unwrap_or(b'u'),
        typestr[2..].parse::<usize>().unwrap_or(1),
    );
    let code = match (kind, size) {
        (b'b', _) => "?",
        (b'i', 1) => "b",
        (b'i', 2) => "h",
        (b'i', 4) => "i",
        (b'i', 8) => "q",
        (b'u', 1) => "B",
        (b'u', 2) => "H",
        (b'u', 4) => "I",
        (b'u', 8) => "Q",
        (b'f', 2) => "e",
        (b'f', 4) => "f",
        (b'f', 8) => "d",
        (b'c', 8) => "Zf",
        (b'c', 16) => "Zd",
        // bfloat16 ("<V2"): the buffer protocol has no such type; its bits as uint16.
        (b'V', 2) => "H",
        _ => "B",
    };
    let order = if order == "|" { "" } else { order };
    format!("{order}{code}")
}

/// Stream-ordering helper used by `kvikpy.read(..., stream=...)`.
pub fn mark_ready(storage: &Storage, ordinal: usize, stream: usize) -> kvikpy_core::Result<()> {
    storage.set_ready(
        cuda::StreamEvent::record(ordinal, cuda::Stream::from_raw(stream))?,
        stream,
    );
    Ok(())
}
