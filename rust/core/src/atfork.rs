//! The fork hook: leaves a working engine in a child made by `fork()` while the parent's
//! I/O threads were busy (`os.fork()`, multiprocessing's "fork" start method).
//!
//! Registered once with `pthread_atfork` ([`install`]), so it runs for every `fork()` of
//! the process, whoever calls it; `posix_spawn` and `vfork` (what `subprocess` uses) run
//! no handlers, and need none since the child execs at once. The approach is to
//! reinitialise in the child rather than to take every lock before forking: the engine's
//! locks include ones inside other libraries (the HTTP agent's connection pool), a
//! prepare handler that waited for I/O threads could stall every fork, and the parent's
//! operations must keep running undisturbed across the fork.
//!
//! - prepare (parent, forking thread): copy the settings for the child.
//! - parent: free that copy.
//! - child: count a new fork generation, then forget (leak) the I/O pool, the in-flight
//!   count and its lock, the host bounce pool, the cuFile driver state and the HTTP
//!   agent, and install the settings copy. Only atomic loads and stores: nothing that
//!   allocates, locks or waits, so it is async-signal-safe as a child handler must be.
//!   What is forgotten is made afresh on first use in the child.
//!
//! Futures of operations started before the fork fail at once when waited on in the
//! child ([`crate::Error::StartedBeforeFork`]); CUDA, once initialised in the parent (by
//! kvikpy or by opening cuFile's driver), is refused in the child with
//! [`crate::Error::CudaUnavailable`] saying why (see `cuda::refuse_after_fork`), which
//! also keeps the child off the parent's pinned pools and cuFile (host reads then take
//! POSIX I/O, as with `compat_mode` AUTO on a machine without cuFile). A child of a
//! process that never initialised CUDA may use the GPU.
//! The leak is a few small allocations per kind of state, once per fork, plus whatever
//! the parent's operations held (their memory belongs to the parent's image anyway).

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Once;

use crate::error::{Error, Result};

/// Register the fork hook (once per process; later calls do nothing).
pub fn install() -> Result<()> {
    static ONCE: Once = Once::new();
    let mut rc = 0;
    ONCE.call_once(|| {
        // SAFETY: the three handlers are `extern "C" fn()` items of this library, which a
        // Python extension never unloads, so they stay valid for the life of the process.
        rc = unsafe { libc::pthread_atfork(Some(prepare), Some(parent), Some(child)) };
    });
    if rc != 0 {
        return Err(Error::OutOfMemory(format!(
            "could not register kvikpy's fork handler (pthread_atfork returned {rc})"
        )));
    }
    Ok(())
}

extern "C" fn prepare() {
    // A panic must not unwind into libc; failing to copy the settings only means the
    // child reloads them from the environment.
    let _ = catch_unwind(AssertUnwindSafe(crate::settings::prepare_fork));
}

extern "C" fn parent() {
    let _ = catch_unwind(AssertUnwindSafe(crate::settings::parent_after_fork));
}

extern "C" fn child() {
    crate::fork::enter_child();
    crate::pool::forget_in_child();
    crate::future::forget_in_child();
    crate::bounce::forget_in_child();
    crate::settings::enter_child();
    crate::cufile::forget_in_child();
    crate::source::forget_in_child();
}
