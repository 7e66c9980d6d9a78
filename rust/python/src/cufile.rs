//! cuFile (GPUDirect Storage) for Python: kvikio's driver API, its buffer and stream
//! registrations, and what `info` reports about cuFile.

use kvikpy_core::cufile::{self as driver, Setting};
use kvikpy_core::Span;
use kvikpy_macros::boundary;
use pyo3::exceptions::{PyKeyError, PyTypeError};
use pyo3::prelude::*;
use pyo3::types::PyDict;

use crate::blocking::{without_gil, without_gil_value};
use crate::errors::BindResult;
use crate::intake::{intake, Access};

/// libcufile's version as cuFile reports it (`1150` for 1.15); 0 without the library.
#[boundary]
#[pyfunction]
pub fn cufile_version(py: Python<'_>) -> BindResult<i32> {
    without_gil_value(py, driver::version)
}

/// One more `cuFileDriverOpen`.
#[boundary]
#[pyfunction]
pub fn cufile_driver_open(py: Python<'_>) -> BindResult<()> {
    without_gil(py, || driver::contained(driver::driver_open))
}

/// One `cuFileDriverClose`.
#[boundary]
#[pyfunction]
pub fn cufile_driver_close(py: Python<'_>) -> BindResult<()> {
    without_gil(py, || driver::contained(driver::driver_close))
}

/// Close what kvikpy opened in cuFile (at interpreter exit); whether the driver closed.
#[boundary]
#[pyfunction]
pub fn cufile_shutdown(py: Python<'_>, timeout: f64) -> BindResult<bool> {
    let timeout = std::time::Duration::from_secs_f64(timeout.max(0.0));
    without_gil_value(py, move || driver::shutdown(timeout))
}

/// The driver properties as a dict (opening the driver first).
#[boundary]
#[pyfunction]
pub fn cufile_properties<'py>(py: Python<'py>) -> BindResult<Bound<'py, PyDict>> {
    let p = without_gil(py, || driver::contained(driver::properties))?;
    let d = PyDict::new(py);
    d.set_item("is_gds_available", p.is_gds_available())?;
    d.set_item("major_version", p.major_version)?;
    d.set_item("minor_version", p.minor_version)?;
    d.set_item("allow_compat_mode", p.allow_compat_mode)?;
    d.set_item("poll_mode", p.poll_mode)?;
    d.set_item("poll_thresh_size", p.poll_thresh_size)?;
    d.set_item("max_device_cache_size", p.max_device_cache_size)?;
    d.set_item("per_buffer_cache_size", p.per_buffer_cache_size)?;
    d.set_item("max_pinned_memory_size", p.max_pinned_memory_size)?;
    Ok(d)
}

/// Set one settable driver property (`KeyError` for any other name).
#[boundary]
#[pyfunction]
pub fn cufile_set_property(py: Python<'_>, name: &str, value: &Bound<'_, PyAny>) -> BindResult<()> {
    let size = || -> PyResult<usize> {
        if value.is_instance_of::<pyo3::types::PyBool>() {
            return Err(PyTypeError::new_err(format!(
                "{name} is a size in KiB (an int), got a bool"
            )));
        }
        value.extract::<usize>()
    };
    let setting = match name {
        "poll_mode" => Setting::PollMode(value.is_truthy()?),
        "poll_thresh_size" => Setting::PollThreshSize(size()?),
        "max_device_cache_size" => Setting::MaxDeviceCacheSize(size()?),
        "max_pinned_memory_size" => Setting::MaxPinnedMemorySize(size()?),
        _ => return Err(PyKeyError::new_err(format!("{name} is not a settable property")).into()),
    };
    without_gil(py, move || {
        driver::contained(|| driver::set_property(setting))
    })
}

/// What `info` reports: the library loaded (or why none), the stand-in's description,
/// nvidia-fs, and the first reason cuFile is not usable (None where it may be).
#[boundary]
#[pyfunction]
pub fn cufile_status<'py>(py: Python<'py>) -> BindResult<Bound<'py, PyDict>> {
    let (library, standin, load_error, refusal, nvfs) = without_gil_value(py, || {
        let (library, standin, load_error) = match driver::api() {
            Ok(api) => (Some(api.library.clone()), api.standin.clone(), None),
            Err(why) => (None, None, Some(why)),
        };
        (
            library,
            standin,
            load_error,
            driver::system_refusal(),
            driver::nvidia_fs_loaded(),
        )
    })?;
    let d = PyDict::new(py);
    d.set_item("library", library)?;
    d.set_item("standin", standin)?;
    d.set_item("load_error", load_error)?;
    d.set_item("system_refusal", refusal)?;
    d.set_item("nvidia_fs", nvfs)?;
    Ok(d)
}

fn buffer_address(buf: &Bound<'_, PyAny>) -> PyResult<(u64, usize)> {
    let taken = intake(buf, Access::Drain)?;
    Ok(match taken.span {
        Span::Host(h) => (h.as_ptr() as u64, h.len()),
        Span::Device(d) => (d.ptr, d.len),
    })
}

/// kvikio's `memory_register`: register `buf`'s memory with cuFile (a no-op where
/// compat mode is preferred).
#[boundary]
#[pyfunction]
#[pyo3(signature = (buf, flags=0))]
pub fn memory_register(py: Python<'_>, buf: &Bound<'_, PyAny>, flags: i32) -> BindResult<()> {
    let (ptr, len) = buffer_address(buf)?;
    without_gil(py, move || {
        driver::contained(|| driver::memory_register(ptr, len, flags))
    })
}

/// kvikio's `memory_deregister` (a no-op where compat mode is preferred).
#[boundary]
#[pyfunction]
pub fn memory_deregister(py: Python<'_>, buf: &Bound<'_, PyAny>) -> BindResult<()> {
    let (ptr, _) = buffer_address(buf)?;
    without_gil(py, move || {
        driver::contained(|| driver::memory_deregister(ptr))
    })
}

/// kvikio's `stream_register` (a no-op where compat mode is preferred).
#[boundary]
#[pyfunction]
pub fn stream_register(py: Python<'_>, stream: usize, flags: u32) -> BindResult<()> {
    without_gil(py, move || {
        driver::contained(|| driver::stream_register(stream, flags))
    })
}

/// kvikio's `stream_deregister` (a no-op where compat mode is preferred).
#[boundary]
#[pyfunction]
pub fn stream_deregister(py: Python<'_>, stream: usize) -> BindResult<()> {
    without_gil(py, move || {
        driver::contained(|| driver::stream_deregister(stream))
    })
}
