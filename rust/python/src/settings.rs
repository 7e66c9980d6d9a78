//! Settings access for `kvikpy.defaults`: values cross as bool, int or str.

use std::path::PathBuf;

use kvikpy_core::settings::{
    self, intern_path, CompatMode, SettingValue, Settings, StatusCodes, SETTING_NAMES,
};
use kvikpy_core::Error;
use kvikpy_macros::boundary;
use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyInt, PyList, PyString};

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
    })
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

/// `http_status_codes` from a list (or tuple) of ints: `TypeError` for anything else,
/// as kvikio raises.
fn convert_codes(value: &Bound<'_, PyAny>) -> BindResult<SettingValue> {
    let type_error = || {
        PyTypeError::new_err(format!(
            "http_status_codes must be a list of int HTTP status codes, got {}",
            value
                .repr()
                .map(|r| r.to_string())
                .unwrap_or_else(|_| "?".into())
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
        if !item.is_instance_of::<PyInt>() || item.is_instance_of::<PyBool>() {
            return Err(type_error().into());
        }
        let code = item.extract::<u16>().map_err(|_| Error::InvalidSetting {
            name: "http_status_codes".into(),
            value: item.to_string(),
            expected: "HTTP status codes from 0 to 65535",
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

fn convert(name: &str, value: &Bound<'_, PyAny>) -> Result<SettingValue, Error> {
    let invalid = |expected| Error::InvalidSetting {
        name: name.to_string(),
        value: value
            .repr()
            .map(|r| r.to_string())
            .unwrap_or_else(|_| "?".into()),
        expected,
    };
    if value.is_instance_of::<PyBool>() {
        return match value.extract::<bool>() {
            Ok(b) => Ok(SettingValue::Bool(b)),
            Err(_) => Err(invalid("a bool")),
        };
    }
    if value.is_instance_of::<PyInt>() {
        if value.lt(0).unwrap_or(false) {
            // kvikio's sizes and counts are C `size_t`: it raises OverflowError for these.
            return Err(Error::Negative {
                what: format!("setting '{name}'"),
                value: value.to_string(),
                expected: match name {
                    "gds_threshold" => "a non-negative integer",
                    _ => "a positive integer",
                },
            });
        }
        return match value.extract::<u64>() {
            Ok(n) => Ok(SettingValue::Int(n)),
            Err(_) => Err(invalid("a non-negative integer")),
        };
    }
    if name == "compat_mode" {
        if let Ok(text) = value.extract::<String>() {
            return CompatMode::parse(&text)
                .map(SettingValue::Mode)
                .ok_or_else(|| invalid("'ON', 'OFF' or 'AUTO' (or a CompatMode or bool)"));
        }
    }
    // Known names get the kind of value their setting holds; unknown names get KeyError.
    Err(invalid(match Settings::default().get(name)? {
        SettingValue::Codes(_) => "a list of HTTP status codes",
        SettingValue::Mode(_) => "a CompatMode, a bool, or 'ON'/'OFF'/'AUTO'",
        SettingValue::Bool(_) => "a bool",
        SettingValue::Int(_) => "an integer",
        SettingValue::Path(_) => "a path or None",
    }))
}

/// Apply `(name, value)` pairs all at once; on any error nothing changes.
#[boundary]
#[pyfunction]
pub fn set_settings(pairs: Vec<(String, Bound<'_, PyAny>)>) -> BindResult<()> {
    let converted = pairs
        .iter()
        .map(|(name, value)| {
            if name == "http_status_codes" {
                return Ok((name.as_str(), convert_codes(value)?));
            }
            if name == "http_ca_bundle" {
                return Ok((name.as_str(), convert_path(value)?));
            }
            Ok((name.as_str(), convert(name, value)?))
        })
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

/// Whether `mode` ("ON"/"OFF"/"AUTO") resolves to POSIX I/O on this system.
#[boundary]
#[pyfunction]
pub fn is_compat_mode_preferred(mode: &str) -> BindResult<bool> {
    let mode = CompatMode::parse(mode).ok_or_else(|| Error::InvalidSetting {
        name: "compat_mode".into(),
        value: format!("{mode:?}"),
        expected: "'ON', 'OFF' or 'AUTO'",
    })?;
    Ok(settings::is_compat_mode_preferred(mode))
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

/// Threads of the I/O pool now running (0 before the first pooled operation).
#[boundary]
#[pyfunction]
pub fn thread_pool_size() -> usize {
    kvikpy_core::pool::current_size()
}
