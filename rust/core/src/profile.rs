//! Where device transfers spend their time: per-phase wall-clock totals of the pool
//! threads' work (binding a context, taking pinned buffers, file I/O, queueing DMAs,
//! waiting for them), summed over all threads, off unless asked for.
//!
//! Benchmarks switch it on around a run to see where threads wait when several GPUs are
//! read at once; switched off, each phase costs one relaxed load.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

/// A phase of a device transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Making the device's context current and finding the thread's stream.
    Bind,
    /// Taking pinned bounce buffers from the device's pool (allocating where none idles).
    Buffers,
    /// Moving file bytes into or out of pinned memory (`pread`/`pwrite`).
    HostIo,
    /// Queueing DMAs and their events on the thread's stream.
    Enqueue,
    /// Waiting for a DMA to complete before a slot is reused or a transfer returns.
    Wait,
}

const PHASES: [Phase; 5] = [
    Phase::Bind,
    Phase::Buffers,
    Phase::HostIo,
    Phase::Enqueue,
    Phase::Wait,
];

impl Phase {
    /// The phase's name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Phase::Bind => "bind",
            Phase::Buffers => "buffers",
            Phase::HostIo => "host_io",
            Phase::Enqueue => "enqueue",
            Phase::Wait => "wait",
        }
    }
}

static ENABLED: AtomicBool = AtomicBool::new(false);
static NANOS: [AtomicU64; 5] = [const { AtomicU64::new(0) }; 5];
static COUNTS: [AtomicU64; 5] = [const { AtomicU64::new(0) }; 5];
static BYTES: AtomicU64 = AtomicU64::new(0);

/// Switch the totals on or off (they keep their values).
pub fn enable(on: bool) {
    ENABLED.store(on, Ordering::Relaxed);
}

/// Whether the totals are being kept.
pub(crate) fn enabled() -> bool {
    ENABLED.load(Ordering::Relaxed)
}

/// Run `f`, adding its wall-clock time to `phase` when the totals are on.
#[inline]
pub(crate) fn time<T>(phase: Phase, f: impl FnOnce() -> T) -> T {
    if !enabled() {
        return f();
    }
    let start = Instant::now();
    let out = f();
    let nanos = start.elapsed().as_nanos().min(u64::MAX as u128) as u64;
    NANOS[phase as usize].fetch_add(nanos, Ordering::Relaxed);
    COUNTS[phase as usize].fetch_add(1, Ordering::Relaxed);
    out
}

/// Count `n` bytes moved to or from a device, when the totals are on.
#[inline]
pub(crate) fn moved(n: usize) {
    if enabled() {
        BYTES.fetch_add(n as u64, Ordering::Relaxed);
    }
}

/// One phase's totals.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PhaseTotal {
    /// The phase's name.
    pub name: &'static str,
    /// Nanoseconds spent in it, summed over threads.
    pub nanos: u64,
    /// How many times it ran.
    pub count: u64,
}

/// Every phase's totals and the bytes moved, then (with `reset`) zeroed.
pub fn snapshot(reset: bool) -> (Vec<PhaseTotal>, u64) {
    let take = |a: &AtomicU64| {
        if reset {
            a.swap(0, Ordering::Relaxed)
        } else {
            a.load(Ordering::Relaxed)
        }
    };
    let phases = PHASES
        .iter()
        .map(|&p| PhaseTotal {
            name: p.name(),
            nanos: take(&NANOS[p as usize]),
            count: take(&COUNTS[p as usize]),
        })
        .collect();
    (phases, take(&BYTES))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn totals_count_only_while_enabled() {
        let _ = snapshot(true);
        time(Phase::Wait, || {
            std::thread::sleep(std::time::Duration::from_millis(1))
        });
        let (phases, _) = snapshot(false);
        assert!(phases.iter().all(|p| p.count == 0), "off by default");
        enable(true);
        time(Phase::Wait, || {
            std::thread::sleep(std::time::Duration::from_millis(2))
        });
        moved(10);
        enable(false);
        let (phases, bytes) = snapshot(true);
        let wait = phases.iter().find(|p| p.name == "wait").unwrap();
        assert_eq!(wait.count, 1);
        assert!(wait.nanos >= 2_000_000, "{wait:?}");
        assert_eq!(bytes, 10);
        let (phases, bytes) = snapshot(false);
        assert!(phases.iter().all(|p| p.count == 0 && p.nanos == 0) && bytes == 0);
    }
}
