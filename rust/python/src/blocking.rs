//! The one way the binding runs engine code that may block: without the GIL, with panics
//! caught so that none crosses into Python. No other module of the binding releases the
//! GIL itself (tests/test_binding_rules.py checks it).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use kvikpy_core::cancel::{self, CancelToken};
use kvikpy_core::run_caught;
use kvikpy_core::IoFuture;
use kvikpy_macros::boundary;
use pyo3::prelude::*;

use crate::errors::{BindError, BindResult};

/// How long a wait lasts between checks for Ctrl-C (KeyboardInterrupt in Jupyter).
pub const SIGNAL_CHECK_INTERVAL: Duration = Duration::from_millis(25);

/// Run `work` with the GIL released; a panic inside becomes `kvikpy.InternalError`.
pub fn without_gil<T, F>(py: Python<'_>, work: F) -> BindResult<T>
where
    F: FnOnce() -> kvikpy_core::Result<T> + Send,
    T: Send,
{
    py.detach(|| run_caught(work)).map_err(BindError::Engine)
}

/// [`without_gil`] for work that cannot fail (a query, a wait with a timeout): its value,
/// or `kvikpy.InternalError` if it panicked.
pub fn without_gil_value<T, F>(py: Python<'_>, work: F) -> BindResult<T>
where
    F: FnOnce() -> T + Send,
    T: Send,
{
    without_gil(py, move || Ok(work()))
}

/// Run `work` on the I/O pool, watching `token` ([`kvikpy_core::cancel`]), and wait for
/// it with the GIL released, checking for signals every few tens of milliseconds: for
/// engine calls that can take long or stall (a batch read, a remote file's size request)
/// and own everything they touch. A signal handler's exception (KeyboardInterrupt) cancels
/// `token` and is raised at once; the work, abandoned, stops at its next check and drops
/// what it owns (the memory it wrote into) only then. Not for the local-file blocking
/// path: a pool hop costs more than such a read.
pub fn interruptible<T, F>(py: Python<'_>, token: &CancelToken, work: F) -> BindResult<T>
where
    F: FnOnce() -> kvikpy_core::Result<T> + Send + 'static,
    T: Send + 'static,
{
    let pool = kvikpy_core::pool::pool(kvikpy_core::settings::current()?.num_threads)?;
    wait_interruptibly(py, token, work, |job| {
        pool.spawn(job);
        Ok(())
    })
}

/// [`interruptible`] on a thread of its own rather than the pool, for a call that must
/// not queue behind the pool's work (opening a remote file while reads of a stalled
/// server hold every pool thread).
pub fn interruptible_alone<T, F>(py: Python<'_>, token: &CancelToken, work: F) -> BindResult<T>
where
    F: FnOnce() -> kvikpy_core::Result<T> + Send + 'static,
    T: Send + 'static,
{
    wait_interruptibly(py, token, work, |job| {
        std::thread::Builder::new()
            .name("kvikpy-open".into())
            .spawn(job)
            .map(drop)
            .map_err(|e| {
                kvikpy_core::Error::InvalidArgument(format!("could not start a thread ({e})"))
            })
    })
}

/// Start `work` with `start` (a pool or a new thread) and wait for it, interruptibly.
fn wait_interruptibly<T, F, S>(
    py: Python<'_>,
    token: &CancelToken,
    work: F,
    start: S,
) -> BindResult<T>
where
    F: FnOnce() -> kvikpy_core::Result<T> + Send + 'static,
    T: Send + 'static,
    S: FnOnce(Box<dyn FnOnce() + Send + 'static>) -> kvikpy_core::Result<()>,
{
    let slot = Arc::new(Mutex::new(None));
    // Counted in flight like any read, so that interpreter exit waits for it.
    let (future, reporter) = IoFuture::single(None);
    {
        let (slot, token) = (Arc::clone(&slot), token.clone());
        let job = Box::new(move || {
            let outcome = run_caught(|| cancel::scope(&token, work));
            *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(outcome);
            reporter.report(Ok(0));
        });
        // A job that could not start is dropped: its reporter then completes the future.
        start(job)?;
    }
    loop {
        let waiting = &future;
        if without_gil_value(py, move || waiting.wait_timeout(SIGNAL_CHECK_INTERVAL))?.is_some() {
            break;
        }
        if let Err(e) = py.check_signals() {
            token.cancel();
            return Err(e.into());
        }
    }
    let outcome = slot.lock().unwrap_or_else(|e| e.into_inner()).take();
    outcome
        .unwrap_or_else(|| {
            Err(kvikpy_core::Error::Panic(
                "a pooled call ended without its result".into(),
            ))
        })
        .map_err(BindError::Engine)
}

/// Panics on purpose, to test that a panic surfaces as `kvikpy.InternalError`: inside
/// engine work without the GIL (`where_="engine"`) or in the binding's own code, with the
/// GIL held (`where_="binding"`, caught by `#[boundary]`).
#[boundary]
#[pyfunction]
#[pyo3(signature = (where_ = "engine"))]
pub fn _panic_for_tests(py: Python<'_>, where_: &str) -> BindResult<()> {
    match where_ {
        "engine" => without_gil(py, || panic!("deliberate panic for kvikpy's tests")),
        _ => panic!("deliberate panic in the binding for kvikpy's tests"),
    }
}
