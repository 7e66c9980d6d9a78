//! `_lib.pread_ceiling` and `_lib.copy_wall`, the native-thread pread references the
//! benchmarks compare against, and `_lib.profile_*`, the engine's per-phase timing of
//! device transfers.

use kvikpy_core::ceiling;
use kvikpy_macros::boundary;
use pyo3::prelude::*;

use crate::blocking::without_gil;
use crate::errors::BindResult;

/// Read all of `path` with `threads` native threads in `piece`-byte preads (O_DIRECT when
/// `direct`) into one buffer (pinned when `pinned`); returns (seconds, bytes, byte_sum).
#[boundary]
#[pyfunction]
#[pyo3(signature = (path, threads, piece, direct=false, pinned=false))]
pub fn pread_ceiling(
    py: Python<'_>,
    path: String,
    threads: usize,
    piece: usize,
    direct: bool,
    pinned: bool,
) -> BindResult<(f64, u64, u64)> {
    let c = without_gil(py, move || {
        ceiling::with_memory(pinned, |memory| {
            ceiling::pread_ceiling(&path, threads, piece, direct, memory)
        })
    })?;
    Ok((c.seconds, c.bytes, c.byte_sum))
}

/// The page-cache copy wall: every file of `paths` `pread` with `threads` native threads
/// into a `piece`-byte buffer each thread reuses (pinned when `pinned`), no DMA; returns
/// (seconds, bytes, the sum of the bytes at file offsets that are multiples of 4096).
#[boundary]
#[pyfunction]
#[pyo3(signature = (paths, threads, piece, pinned=false))]
pub fn copy_wall(
    py: Python<'_>,
    paths: Vec<String>,
    threads: usize,
    piece: usize,
    pinned: bool,
) -> BindResult<(f64, u64, u64)> {
    let c = without_gil(py, move || {
        ceiling::with_memory(pinned, |memory| {
            ceiling::copy_wall(&paths, threads, piece, memory)
        })
    })?;
    Ok((c.seconds, c.bytes, c.byte_sum))
}

/// Switch the engine's per-phase timing of device transfers on or off.
#[boundary]
#[pyfunction]
pub fn profile_enable(on: bool) {
    kvikpy_core::profile::enable(on);
}

/// The per-phase totals of device transfers since the last reset: a list of
/// (phase, nanoseconds summed over threads, count), and the bytes moved; `reset` zeroes
/// them.
#[boundary]
#[pyfunction]
#[pyo3(signature = (reset=false))]
pub fn profile_phases(reset: bool) -> (Vec<(&'static str, u64, u64)>, u64) {
    let (phases, bytes) = kvikpy_core::profile::snapshot(reset);
    (
        phases.iter().map(|p| (p.name, p.nanos, p.count)).collect(),
        bytes,
    )
}
