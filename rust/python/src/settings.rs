//! Settings access for `kvikpy.defaults`: values cross as bool, int or str.

use kvikpy_core::settings::{self, CompatMode, SettingValue, Settings, SETTING_NAMES};
use kvikpy_core::Error;
use kvikpy_macros::boundary;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyInt, PyString};

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
    })
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
        SettingValue::Mode(_) => "a CompatMode, a bool, or 'ON'/'OFF'/'AUTO'",
        SettingValue::Bool(_) => "a bool",
        SettingValue::Int(_) => "an integer",
    }))
}

/// Apply `(name, value)` pairs all at once; on any error nothing changes.
#[boundary]
#[pyfunction]
pub fn set_settings(pairs: Vec<(String, Bound<'_, PyAny>)>) -> BindResult<()> {
    let converted = pairs
        .iter()
        .map(|(name, value)| Ok((name.as_str(), convert(name, value)?)))
        .collect::<Result<Vec<_>, Error>>()?;
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
