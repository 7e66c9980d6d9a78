//! DLPack both ways: reading the tensor inside a producer's capsule (intake), and exporting
//! kvikpy memory as versioned or legacy capsules whose deleters may run on any thread,
//! without the GIL, even at interpreter exit.

use std::any::Any;
use std::ffi::{c_void, CStr};
use std::panic::{catch_unwind, AssertUnwindSafe};

use dlpark::ffi::{
    DLDataType, DLDataTypeCode, DLDevice, DLDeviceType, DLManagedTensor, DLManagedTensorVersioned,
    DLPackVersion, DLTensor,
};
use dlpark::DlpackFlags;
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::prelude::*;

const VERSIONED: &CStr = c"dltensor_versioned";
const LEGACY: &CStr = c"dltensor";

/// `kDLCPU`.
pub const DEVICE_CPU: i32 = 1;
/// `kDLCUDA`.
pub const DEVICE_CUDA: i32 = 2;
/// `kDLCUDAHost`.
pub const DEVICE_CUDA_HOST: i32 = 3;
/// `kDLCUDAManaged`.
pub const DEVICE_CUDA_MANAGED: i32 = 13;

/// What a producer's capsule describes.
#[derive(Debug, Clone, Copy)]
pub struct Imported {
    pub ptr: u64,
    pub nbytes: usize,
    pub device_type: i32,
    pub device_id: i32,
    pub read_only: bool,
}

fn tensor_bytes(t: &DLTensor) -> PyResult<(usize, bool)> {
    let ndim = usize::try_from(t.ndim).map_err(|_| {
        PyValueError::new_err(format!(
            "the DLPack tensor's ndim is {}; it must be non-negative",
            t.ndim
        ))
    })?;
    if ndim > 0 && t.shape.is_null() {
        return Err(PyValueError::new_err(format!(
            "the DLPack tensor has ndim {ndim} but a null shape"
        )));
    }
    let shape: &[i64] = if ndim == 0 {
        &[]
    } else {
        // SAFETY: DLPack guarantees `shape` points to `ndim` int64s while the capsule lives
        // (checked non-null above).
        unsafe { std::slice::from_raw_parts(t.shape, ndim) }
    };
    if let Some(bad) = shape.iter().find(|&&d| d < 0) {
        return Err(PyValueError::new_err(format!(
            "the DLPack tensor's shape {shape:?} has a negative dimension {bad}"
        )));
    }
    let bits = t.dtype.bits as u64 * t.dtype.lanes as u64;
    if bits % 8 != 0 {
        return Err(PyValueError::new_err(format!(
            "the DLPack tensor's dtype has {} bits x {} lanes, not a whole number of bytes \
             per item; kvikpy moves bytes",
            t.dtype.bits, t.dtype.lanes
        )));
    }
    let itemsize = bits / 8;
    let too_large = || {
        PyValueError::new_err(format!(
            "the DLPack tensor of shape {shape:?} with {itemsize}-byte items has more bytes \
             than fit in memory"
        ))
    };
    let count = shape
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d as u64))
        .ok_or_else(too_large)?;
    let nbytes = count
        .checked_mul(itemsize)
        .filter(|&n| n <= isize::MAX as u64)
        .ok_or_else(too_large)? as usize;
    let contiguous = if t.strides.is_null() || ndim == 0 {
        true
    } else {
        // SAFETY: as for `shape`.
        let strides = unsafe { std::slice::from_raw_parts(t.strides, ndim) };
        let mut expected = 1i128;
        let mut ok = true;
        for i in (0..ndim).rev() {
            if shape[i] != 1 && strides[i] as i128 != expected {
                ok = false;
            }
            expected *= shape[i].max(1) as i128;
        }
        ok || count == 0
    };
    if t.data.is_null() && nbytes > 0 {
        return Err(PyValueError::new_err(format!(
            "the DLPack tensor has a null data pointer for {nbytes} bytes"
        )));
    }
    Ok((nbytes, contiguous))
}

/// Read the tensor description out of a `dltensor` or `dltensor_versioned` capsule
/// without consuming it (the capsule keeps ownership and frees the tensor when it dies).
pub fn inspect(capsule: &Bound<'_, PyAny>) -> PyResult<Imported> {
    let raw = capsule.as_ptr();
    // SAFETY: IsValid only inspects the object; it accepts any object.
    let versioned = unsafe { ffi::PyCapsule_IsValid(raw, VERSIONED.as_ptr()) } == 1;
    // SAFETY: IsValid only inspects the object; it accepts any object.
    let legacy = !versioned && unsafe { ffi::PyCapsule_IsValid(raw, LEGACY.as_ptr()) } == 1;
    let (tensor, read_only) = if versioned {
        // SAFETY: the capsule is valid with this name, so this returns its pointer.
        let p = unsafe { ffi::PyCapsule_GetPointer(raw, VERSIONED.as_ptr()) };
        // SAFETY: a valid capsule of this name holds a live DLManagedTensorVersioned,
        // kept alive by the capsule, which `capsule` borrows.
        let m = unsafe { &*p.cast::<DLManagedTensorVersioned>() };
        (m.dl_tensor, m.flags.contains(DlpackFlags::READ_ONLY))
    } else if legacy {
        // SAFETY: the capsule is valid with this name, so this returns its pointer.
        let p = unsafe { ffi::PyCapsule_GetPointer(raw, LEGACY.as_ptr()) };
        // SAFETY: a valid capsule of this name holds a live DLManagedTensor, kept alive
        // by the capsule, which `capsule` borrows.
        let m = unsafe { &*p.cast::<DLManagedTensor>() };
        (m.dl_tensor, false)
    } else {
        return Err(PyTypeError::new_err(
            "__dlpack__() returned something that is not an unconsumed DLPack capsule \
             ('dltensor' or 'dltensor_versioned'); pass an array whose __dlpack__ follows \
             the DLPack protocol",
        ));
    };
    let (nbytes, contiguous) = tensor_bytes(&tensor)?;
    if !contiguous {
        return Err(PyValueError::new_err(
            "the array is not contiguous; pass a contiguous array (e.g. x.contiguous() in \
             torch, cupy.ascontiguousarray(x))",
        ));
    }
    Ok(Imported {
        ptr: tensor.data as u64 + tensor.byte_offset,
        nbytes,
        device_type: tensor.device.device_type.0 as i32,
        device_id: tensor.device.device_id,
        read_only,
    })
}

/// What an export keeps alive, and the arrays its DLTensor points into.
struct ExportContext {
    _owner: Box<dyn Any + Send>,
    shape: Vec<i64>,
    strides: Vec<i64>,
}

/// Description of memory to export.
pub struct Export {
    pub ptr: u64,
    pub device_type: i32,
    pub device_id: i32,
    pub code: u8,
    pub bits: u8,
    pub shape: Vec<i64>,
    pub owner: Box<dyn Any + Send>,
}

/// Move `export` into its boxed context and describe it as a C-contiguous DLTensor whose
/// shape and strides point into that context (stable: it is boxed).
fn into_context(export: Export) -> (Box<ExportContext>, DLTensor) {
    let Export {
        ptr,
        device_type,
        device_id,
        code,
        bits,
        shape,
        owner,
    } = export;
    let mut strides = vec![1i64; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        strides[i] = strides[i + 1] * shape[i + 1].max(1);
    }
    let mut ctx = Box::new(ExportContext {
        _owner: owner,
        shape,
        strides,
    });
    let tensor = DLTensor {
        data: ptr as *mut c_void,
        device: DLDevice {
            device_type: DLDeviceType(device_type as u32),
            device_id,
        },
        ndim: ctx.shape.len() as i32,
        dtype: DLDataType {
            code: DLDataTypeCode(code),
            bits,
            lanes: 1,
        },
        shape: ctx.shape.as_mut_ptr(),
        strides: ctx.strides.as_mut_ptr(),
        byte_offset: 0,
    };
    (ctx, tensor)
}

/// The two managed-tensor structs (DLPack 1.x and legacy): each points at the
/// [`ExportContext`] that owns the exported memory.
trait Managed {
    fn manager_ctx(&self) -> *mut c_void;
}

impl Managed for DLManagedTensorVersioned {
    fn manager_ctx(&self) -> *mut c_void {
        self.manager_ctx
    }
}

impl Managed for DLManagedTensor {
    fn manager_ctx(&self) -> *mut c_void {
        self.manager_ctx
    }
}

/// The deleter of an exported tensor: frees the managed struct and its context.
unsafe extern "C" fn delete<T: Managed>(tensor: *mut T) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        if tensor.is_null() {
            return;
        }
        // SAFETY: `tensor` was created by `Box::into_raw` in `to_capsule` and its deleter is
        // called exactly once (by the consumer, or by the capsule destructor if unconsumed).
        let tensor = unsafe { Box::from_raw(tensor) };
        // SAFETY: `manager_ctx` is the `Box<ExportContext>` leaked alongside it.
        drop(unsafe { Box::from_raw(tensor.manager_ctx().cast::<ExportContext>()) });
    }));
}

/// [`delete`] for the managed struct at `tensor`: versioned or legacy.
///
/// # Safety
/// `tensor` is a managed tensor made by `to_capsule` of that kind, not yet deleted.
unsafe fn delete_either(tensor: *mut c_void, versioned: bool) {
    if versioned {
        // SAFETY: the caller's promise, for the versioned struct.
        unsafe { delete::<DLManagedTensorVersioned>(tensor.cast()) };
    } else {
        // SAFETY: the caller's promise, for the legacy struct.
        unsafe { delete::<DLManagedTensor>(tensor.cast()) };
    }
}

unsafe extern "C" fn destroy_capsule(capsule: *mut ffi::PyObject) {
    // A consumer renames the capsule ("used_dltensor...") when it takes ownership; only an
    // unconsumed capsule still owns its tensor.
    // SAFETY: called by Python with the GIL held on a capsule we created; IsValid only
    // inspects the object.
    let versioned = unsafe { ffi::PyCapsule_IsValid(capsule, VERSIONED.as_ptr()) } == 1;
    // SAFETY: IsValid only inspects the object; it accepts any object.
    let legacy = !versioned && unsafe { ffi::PyCapsule_IsValid(capsule, LEGACY.as_ptr()) } == 1;
    if versioned || legacy {
        let name = if versioned { VERSIONED } else { LEGACY };
        // SAFETY: the capsule is valid with this name, so this returns its pointer.
        let t = unsafe { ffi::PyCapsule_GetPointer(capsule, name.as_ptr()) };
        // SAFETY: an unconsumed capsule of ours owns this boxed tensor; freed once, here.
        unsafe { delete_either(t, versioned) };
    }
}

/// Export `export` as a DLPack capsule: versioned (DLPack 1.x) when `versioned`, else
/// legacy. The capsule owns `export.owner` until the consumer's deleter call (or the
/// capsule's death if never consumed).
pub fn to_capsule(py: Python<'_>, export: Export, versioned: bool) -> PyResult<Py<PyAny>> {
    let (ctx, tensor) = into_context(export);
    let ctx = Box::into_raw(ctx).cast::<c_void>();
    let (ptr, name) = if versioned {
        let managed = Box::new(DLManagedTensorVersioned {
            version: DLPackVersion { major: 1, minor: 0 },
            manager_ctx: ctx,
            deleter: Some(delete::<DLManagedTensorVersioned>),
            flags: DlpackFlags::empty(),
            dl_tensor: tensor,
        });
        (Box::into_raw(managed).cast::<c_void>(), VERSIONED)
    } else {
        let managed = Box::new(DLManagedTensor {
            dl_tensor: tensor,
            manager_ctx: ctx,
            deleter: Some(delete::<DLManagedTensor>),
        });
        (Box::into_raw(managed).cast::<c_void>(), LEGACY)
    };
    // SAFETY: `ptr` is a live boxed managed tensor; `name` is a static C string; the
    // destructor frees the tensor unless a consumer took ownership.
    let capsule = unsafe { ffi::PyCapsule_New(ptr, name.as_ptr(), Some(destroy_capsule)) };
    if capsule.is_null() {
        // SAFETY: the capsule was not created, so nobody else will free the tensor.
        unsafe { delete_either(ptr, versioned) };
        return Err(PyErr::fetch(py));
    }
    // SAFETY: PyCapsule_New returned a new reference.
    Ok(unsafe { Bound::from_owned_ptr(py, capsule) }.unbind())
}
