//! Settings access for `kvikpy.defaults`: values cross as bool, int or str.

use std::path::PathBuf;

use kvikpy_core::settings::{
    self, intern_path, CompatMode, SettingValue, Settings, StatusCodes, SETTINGS, SETTING_NAMES,
};
use kvikpy_core::Error;
use kvikpy_macros::boundary;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyInt, PyList, PyString};

use crate::errors::BindResult;

/// The value of setting `name` (compat_mode as "ON"/"OFF"/"AUTO").
#[boundary]
#[pyfunction]
pub fn get_setting(py: Python<'_>, name: &str) -> BindResult<Py<PyAny>> {
    let value = settings::current()?.get(name)?;
    Ok(match value {
        SettingValue::Bool(b) => PyBool::new(py, b).to_owned().into_any().unbind(),
        SettingValue::Int(n) => {
            // Converting a u64 cannot fail (its error type is `Infallible`).
            let Ok(n) = n.into_pyobject(py);
            n.into_any().unbind()
        }
        SettingValue::Mode(m) => PyString::new(py, m.as_str()).into_any().unbind(),
        SettingValue::Codes(codes) => PyList::new(py, codes.as_slice())?.into_any().unbind(),
        SettingValue::Path(None) => py.None(),
        SettingValue::Path(Some(path)) => path.as_os_str().into_pyobject(py)?.into_any().unbind(),
        SettingValue::Auto => PyString::new(py, "auto").into_any().unbind(),
    })
}

/// The repr of a refused value, for messages.
fn repr(value: &Bound<'_, PyAny>) -> String {
    value
        .repr()
        .map(|r| r.to_string())
        .unwrap_or_else(|_| "?".into())
}

/// `value` as an int, the way `operator.index` takes it (ints, numpy integers, objects
/// with `__index__`), or `None` for anything else; `bool` is no integer here.
fn as_index<'py>(value: &Bound<'py, PyAny>) -> Option<Bound<'py, PyInt>> {
    if value.is_instance_of::<PyBool>() {
        return None;
    }
    if let Ok(int) = value.cast::<PyInt>() {
        return Some(int.clone());
    }
    let index = value.py().import("operator").ok()?.getattr("index").ok()?;
    index.call1((value,)).ok()?.cast_into::<PyInt>().ok()
}

/// `http_ca_bundle` from `None`, a `str` or an `os.PathLike` (bytes included).
fn convert_path(value: &Bound<'_, PyAny>) -> BindResult<SettingValue> {
    if value.is_none() {
        return Ok(SettingValue::Path(None));
    }
    let path = value.extract::<PathBuf>().map_err(|_| {
        PyTypeError::new_err(format!(
            "http_ca_bundle must be the path of a PEM file (or directory) of CA \
             certificates, as a str or os.PathLike, or None; got {}",
            value
                .get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_else(|_| "?".into())
        ))
    })?;
    Ok(SettingValue::Path(Some(intern_path(&path))))
}

/// `http_status_codes` from a list (or tuple) of ints from 100 to 599: `TypeError` for
/// anything else, as kvikio raises; `ValueError` for a number that is no HTTP status.
fn convert_codes(value: &Bound<'_, PyAny>) -> BindResult<SettingValue> {
    let type_error = || {
        PyTypeError::new_err(format!(
            "http_status_codes must be a list of int HTTP status codes, got {}",
            repr(value)
        ))
    };
    if value.is_instance_of::<PyString>() || value.is_instance_of::<PyBool>() {
        return Err(type_error().into());
    }
    let items: Vec<Bound<'_, PyAny>> = value
        .try_iter()
        .map_err(|_| type_error())?
        .collect::<PyResult<_>>()?;
    let mut codes = Vec::with_capacity(items.len());
    for item in items {
        let code = as_index(&item).ok_or_else(type_error)?;
        let code = code
            .extract::<u16>()
            .ok()
            .filter(|&c| StatusCodes::is_status(c))
            .ok_or_else(|| Error::InvalidSetting {
                name: "http_status_codes".into(),
                value: repr(&item),
                expected: "HTTP status codes from 100 to 599",
            })?;
        codes.push(code);
    }
    let codes = StatusCodes::new(&codes).ok_or_else(|| Error::InvalidSetting {
        name: "http_status_codes".into(),
        value: format!("a list of {}", codes.len()),
        expected: "at most 32 status codes",
    })?;
    Ok(SettingValue::Codes(codes))
}

/// An integer setting (a count, a size, seconds): `TypeError` for anything
/// `operator.index` refuses and for bools, `ValueError` (`NegativeValueError`, also an
/// `OverflowError` as kvikio's `size_t` conversion raises) for a negative one, and
/// `ValueError` for one beyond 64 bits; the setting checks its own range.
fn convert_int(name: &str, value: &Bound<'_, PyAny>) -> BindResult<SettingValue> {
    let Some(int) = as_index(value) else {
        return Err(PyTypeError::new_err(format!(
            "setting '{name}' takes an integer, got {} {}",
            value
                .get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_else(|_| "?".into()),
            repr(value)
        ))
        .into());
    };
    if int.lt(0).unwrap_or(false) {
        return Err(Error::Negative {
            what: format!("setting '{name}'"),
            value: int.to_string(),
            expected: match name {
                "gds_threshold" | "gpu_threads" => "a non-negative integer",
                _ => "a positive integer",
            },
        }
        .into());
    }
    // At most 2**63 - 1, the bound of every offset, size and count in kvikpy.
    int.extract::<i64>()
        .map(|n| SettingValue::Int(n.unsigned_abs()))
        .map_err(|_| {
            Error::InvalidSetting {
                name: name.to_string(),
                value: int.to_string(),
                expected: "an integer of at most 2**63 - 1",
            }
            .into()
        })
}

fn convert(name: &str, value: &Bound<'_, PyAny>) -> BindResult<SettingValue> {
    // Known names get the kind of value their setting holds; unknown names get KeyError.
    let kind = Settings::default().get(name)?;
    match kind {
        SettingValue::Codes(_) => return convert_codes(value),
        SettingValue::Int(_) => return convert_int(name, value),
        SettingValue::Path(_) => return convert_path(value),
        SettingValue::Bool(_) | SettingValue::Mode(_) | SettingValue::Auto => {}
    }
    let invalid = |expected| Error::InvalidSetting {
        name: name.to_string(),
        value: repr(value),
        expected,
    };
    if value.is_instance_of::<PyBool>() {
        return match value.extract::<bool>() {
            Ok(b) => Ok(SettingValue::Bool(b)),
            Err(_) => Err(invalid("a bool").into()),
        };
    }
    if value.is_instance_of::<PyInt>() {
        return match value.extract::<u64>() {
            Ok(n) => Ok(SettingValue::Int(n)),
            Err(_) => Err(invalid("a non-negative integer").into()),
        };
    }
    if let SettingValue::Auto = kind {
        // `auto_direct_io_read`: True, False or "auto" (any case).
        return match value.extract::<String>() {
            Ok(text) if text.trim().eq_ignore_ascii_case("auto") => Ok(SettingValue::Auto),
            _ => Err(invalid("True, False or 'auto'").into()),
        };
    }
    if let SettingValue::Mode(_) = kind {
        if let Ok(text) = value.extract::<String>() {
            return CompatMode::parse(&text)
                .map(SettingValue::Mode)
                .ok_or_else(|| invalid("'ON', 'OFF' or 'AUTO' (or a CompatMode or bool)").into());
        }
        return Err(invalid("a CompatMode, a bool, or 'ON'/'OFF'/'AUTO'").into());
    }
    Err(invalid("a bool").into())
}

/// Apply `(name, value)` pairs all at once; on any error nothing changes.
#[boundary]
#[pyfunction]
pub fn set_settings(pairs: Vec<(String, Bound<'_, PyAny>)>) -> BindResult<()> {
    let converted = pairs
        .iter()
        .map(|(name, value)| Ok((name.as_str(), convert(name, value)?)))
        .collect::<BindResult<Vec<_>>>()?;
    settings::set_many(&converted)?;
    Ok(())
}

/// Every setting name.
#[boundary]
#[pyfunction]
pub fn setting_names() -> Vec<&'static str> {
    SETTING_NAMES.to_vec()
}

/// Every setting and the environment variable it is read from, in documentation order.
#[boundary]
#[pyfunction]
pub fn setting_variables() -> Vec<(&'static str, &'static str)> {
    SETTINGS.to_vec()
}

/// Whether `mode` ("ON"/"OFF"/"AUTO") resolves to POSIX I/O on this system.
#[boundary]
#[pyfunction]
pub fn is_compat_mode_preferred(mode: &str) -> BindResult<bool> {
    let mode = CompatMode::parse(mode).ok_or_else(|| Error::InvalidSetting {
        name: "compat_mode".into(),
        value: format!("{mode:?}"),
        expected: "'ON', 'OFF' or 'AUTO'",
    })?;
    Ok(kvikpy_core::cufile::is_compat_mode_preferred(mode))
}

/// The thread count kvikpy picks when `KVIKIO_NTHREADS` is unset.
#[boundary]
#[pyfunction]
pub fn default_num_threads() -> usize {
    settings::default_num_threads()
}

/// Free the idle bounce buffers (host and pinned); returns the bytes released.
#[boundary]
#[pyfunction]
pub fn bounce_buffer_free() -> usize {
    let pinned = if kvikpy_core::cuda::available() {
        kvikpy_core::cuda::free_idle_pinned()
    } else {
        0
    };
    kvikpy_core::bounce::host_pool().free_idle() + pinned
}

/// A pool's [`PoolMemory`](kvikpy_core::bounce::PoolMemory) as Python takes it.
fn memory_dict(py: Python<'_>, m: kvikpy_core::bounce::PoolMemory) -> PyResult<Py<PyDict>> {
    let d = PyDict::new(py);
    d.set_item("held", m.held)?;
    d.set_item("peak_held", m.peak_held)?;
    d.set_item("in_use", m.in_use)?;
    d.set_item("peak_in_use", m.peak_in_use)?;
    Ok(d.unbind())
}

/// The staging memory kvikpy's bounce buffers hold: `{"host": {...}, "pinned": {ordinal:
/// {...}}}`, each `held` (allocated, idle or in use), `in_use` (held by transfers) and
/// their peaks since the last reset, in bytes.
#[boundary]
#[pyfunction]
pub fn staging_memory(py: Python<'_>) -> PyResult<Py<PyDict>> {
    let out = PyDict::new(py);
    out.set_item(
        "host",
        memory_dict(py, kvikpy_core::bounce::host_pool().memory())?,
    )?;
    let pinned = PyDict::new(py);
    if kvikpy_core::cuda::available() {
        for (ordinal, m) in kvikpy_core::cuda::pinned_memory() {
            pinned.set_item(ordinal, memory_dict(py, m)?)?;
        }
    }
    out.set_item("pinned", pinned)?;
    Ok(out.unbind())
}

/// Start the peaks of [`staging_memory`] again from what the pools hold now.
#[boundary]
#[pyfunction]
pub fn staging_memory_reset_peaks() {
    kvikpy_core::bounce::host_pool().reset_peaks();
    if kvikpy_core::cuda::available() {
        kvikpy_core::cuda::reset_pinned_peaks();
    }
}

/// Enter a checkpoint load's staging budget of `limit` bytes on this thread (see
/// `kvikpy_core::staging::enter`); returns what to pass to [`staging_leave`].
#[boundary]
#[pyfunction]
pub fn staging_enter(limit: usize) -> usize {
    kvikpy_core::staging::enter(limit)
}

/// Leave the staging budgets this thread entered since [`staging_enter`] returned `depth`.
#[boundary]
#[pyfunction]
pub fn staging_leave(depth: usize) {
    kvikpy_core::staging::leave(depth)
}

/// This thread's staging budget, if a load entered one: `{"limit", "in_use", "peak",
/// "over"}` in bytes (`over`: reservations larger than the limit that went alone).
#[boundary]
#[pyfunction]
pub fn staging_budget(py: Python<'_>) -> PyResult<Option<Py<PyDict>>> {
    let Some(budget) = kvikpy_core::staging::entered() else {
        return Ok(None);
    };
    let u = budget.usage();
    let d = PyDict::new(py);
    d.set_item("limit", u.limit)?;
    d.set_item("in_use", u.in_use)?;
    d.set_item("peak", u.peak)?;
    d.set_item("over", u.over)?;
    Ok(Some(d.unbind()))
}

/// How the `checkpoint_staging` setting splits for a load into GPU memory (`gpu`), host
/// memory (`host`) or both: `(bounce, device)`, the bytes its bounce buffers may hold
/// (pinned and host) and those left for its staging windows on each GPU.
#[boundary]
#[pyfunction]
pub fn staging_split(gpu: bool, host: bool) -> BindResult<(usize, usize)> {
    let settings = settings::current()?;
    Ok(kvikpy_core::checkpoint_split(&settings, gpu, host))
}

/// What a checkpoint load's bounce buffers would hold at once without a budget, at the
/// current settings: `(pinned per GPU, host)`, in bytes.
#[boundary]
#[pyfunction]
pub fn staging_demand() -> BindResult<(usize, usize)> {
    let d = kvikpy_core::staging_demand(&settings::current()?);
    Ok((d.pinned, d.host))
}

/// How a local read onto a GPU moves while `gpus` GPUs of this process read at once, at
/// the current settings: `(piece bytes, pinned buffers per read)`, or `None` where it
/// moves as on one GPU alone or in pieces `KVIKPY_READ_CHUNK_SIZE` sets.
#[boundary]
#[pyfunction]
pub fn shared_read_pieces(gpus: usize) -> BindResult<Option<(usize, usize)>> {
    Ok(kvikpy_core::shared_pieces(&settings::current()?, gpus))
}

/// Threads of the shared I/O pool (host transfers) now running (0 before the first pooled
/// operation).
#[boundary]
#[pyfunction]
pub fn thread_pool_size() -> usize {
    kvikpy_core::pool::current_size()
}

/// The GPUs whose transfers have run on a pool of their own so far, as (ordinal, threads).
#[boundary]
#[pyfunction]
pub fn device_pool_sizes() -> Vec<(usize, usize)> {
    kvikpy_core::pool::device_pool_sizes()
}

/// Threads each GPU's pool has under the current settings on this host (see the
/// `gpu_threads` setting), and how many of this process's GPU threads may copy at once
/// (0: no bound); `(0, 0)` where CUDA is unavailable.
#[boundary]
#[pyfunction]
pub fn gpu_pool_threads() -> BindResult<(usize, usize)> {
    if !kvikpy_core::cuda::available() {
        return Ok((0, 0));
    }
    let current = settings::current()?;
    Ok((
        kvikpy_core::pool::gpu_threads(&current),
        kvikpy_core::pool::copy_budget(&current).unwrap_or(0),
    ))
}
