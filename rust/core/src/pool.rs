//! The I/O thread pool, sized by the `num_threads` setting.
//!
//! rayon's pool gives named, reusable worker threads and cheap `spawn`; I/O tasks never
//! block on each other, so its work-stealing needs no care. When `num_threads` changes,
//! the next operation builds a new pool; operations already queued on the old one finish
//! there, and its threads exit once it is idle and unreferenced.
//!
//! A forked child has none of the parent's pool threads: the fork hook forgets the
//! inherited pool (leaking it, since dropping it could wait on threads that do not exist;
//! see [`crate::fork`]), and the child's first pooled operation builds a fresh one.

use std::sync::{Arc, Mutex};

use crate::error::{Error, Result};
use crate::fork::ForkLocal;

type Slot = Mutex<Option<(usize, Arc<rayon::ThreadPool>)>>;

static POOL: ForkLocal<Slot> = ForkLocal::new(|| Mutex::new(None));

/// The pool for `num_threads` threads, building (or rebuilding) it on demand.
pub fn pool(num_threads: usize) -> Result<Arc<rayon::ThreadPool>> {
    let mut guard = POOL.get().lock().unwrap_or_else(|e| e.into_inner());
    if let Some((n, pool)) = guard.as_ref() {
        if *n == num_threads {
            return Ok(Arc::clone(pool));
        }
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(num_threads)
        .thread_name(|i| format!("kvikpy-io-{i}"))
        .build()
        .map_err(|e| {
            Error::InvalidArgument(format!(
                "could not start {num_threads} I/O threads ({e}); lower num_threads"
            ))
        })?;
    let pool = Arc::new(pool);
    *guard = Some((num_threads, Arc::clone(&pool)));
    Ok(pool)
}

/// Number of threads of the pool currently in use (0 before the first pooled operation).
pub fn current_size() -> usize {
    POOL.get()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .map_or(0, |(n, _)| *n)
}

/// In a forked child: forget the parent's pool (its threads are not here). Async-signal-safe.
pub(crate) fn forget_in_child() {
    POOL.forget();
}
