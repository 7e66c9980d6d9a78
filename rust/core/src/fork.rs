//! Fork generations and process-wide state a forked child can replace: the building blocks
//! of fork safety (the hook that uses them is [`crate::atfork`]).
//!
//! `fork()` copies the whole address space but only the calling thread. A child therefore
//! inherits the engine's statics — the I/O pool, the in-flight count, bounce pools,
//! settings, the HTTP agent — in whatever state the parent's other threads left them: a
//! pool whose worker threads do not exist, mutexes locked by threads that will never
//! unlock them. Such state lives in a [`ForkLocal`]: a pointer to a value that is never
//! freed, which the child hook sets back to null so that the next use in the child makes
//! a fresh value. The inherited one is deliberately leaked (one small allocation per kind
//! of state, once per fork): dropping it could wait for threads that do not exist, or
//! free memory a dead thread was using.
//!
//! The fork generation counts the forks between the first process and this one (0 in a
//! process that was not forked, 1 in its children...). Objects that belong to one process
//! — futures of operations the parent's threads run, the CUDA driver the parent
//! initialised — record it and refuse to be used in another generation, instead of
//! waiting forever.

use std::ptr;
use std::sync::atomic::{AtomicPtr, AtomicU64, Ordering};

static GENERATION: AtomicU64 = AtomicU64::new(0);

/// This process's fork generation: 0 unless it is a forked child (of a child...) of the
/// process that loaded the engine. One relaxed atomic load.
#[inline]
pub fn generation() -> u64 {
    GENERATION.load(Ordering::Relaxed)
}

/// Count one more fork; called once in a new child, before anything else of the engine.
pub(crate) fn enter_child() {
    GENERATION.fetch_add(1, Ordering::Relaxed);
}

/// Why an operation started before `fork()` cannot be waited on in the child.
pub const STARTED_BEFORE_FORK: &str = "this read or write was started before os.fork() in \
     the parent process, and the threads running it do not exist in this forked child, so \
     it will never finish here: wait for it before forking (or in the parent), and start \
     new reads or writes in the child";

/// A process-wide value made on first use, which a forked child can drop (leak) so that
/// its next use makes a fresh one. Reading it is one acquire load (a plain load on x86,
/// as for a `OnceLock`); values are never freed, so references to them stay valid.
pub struct ForkLocal<T: 'static> {
    ptr: AtomicPtr<T>,
    init: fn() -> T,
}

impl<T: Send + Sync + 'static> ForkLocal<T> {
    /// An empty slot whose value `init` makes on first use.
    pub const fn new(init: fn() -> T) -> Self {
        Self {
            ptr: AtomicPtr::new(ptr::null_mut()),
            init,
        }
    }

    /// The value, made on first use (in this process since the last fork).
    #[inline]
    pub fn get(&'static self) -> &'static T {
        let current = self.ptr.load(Ordering::Acquire);
        if current.is_null() {
            return self.make();
        }
        // SAFETY: a non-null pointer came from `Box::into_raw` in `make` or `install` and
        // is never freed, so it is valid for 'static; `T: Sync` allows sharing it.
        unsafe { &*current }
    }

    #[cold]
    fn make(&'static self) -> &'static T {
        self.install(Box::new((self.init)()))
    }

    /// Publish `value` unless another thread published one first; the published value.
    fn install(&'static self, value: Box<T>) -> &'static T {
        let fresh = Box::into_raw(value);
        match self
            .ptr
            .compare_exchange(ptr::null_mut(), fresh, Ordering::AcqRel, Ordering::Acquire)
        {
            // SAFETY: just published; never freed from now on.
            Ok(_) => unsafe { &*fresh },
            Err(existing) => {
                // SAFETY: `fresh` was never published, so this is its only owner.
                drop(unsafe { Box::from_raw(fresh) });
                // SAFETY: as in `get`: published values are never freed.
                unsafe { &*existing }
            }
        }
    }

    /// Replace the value with `value` (leaking the old one): for a child handler that
    /// carries a value made before the fork over into the child.
    pub(crate) fn replace_leaking(&'static self, value: Box<T>) {
        self.ptr.store(Box::into_raw(value), Ordering::Release);
    }

    /// Forget the value (leaking it): the next [`ForkLocal::get`] makes a fresh one. Only
    /// an atomic store, so async-signal-safe: for the child side of a fork hook.
    pub(crate) fn forget(&'static self) {
        self.ptr.store(ptr::null_mut(), Ordering::Release);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    static SLOT: ForkLocal<Mutex<u32>> = ForkLocal::new(|| Mutex::new(7));

    #[test]
    fn a_forgotten_value_is_made_afresh_and_the_old_one_stays_valid() {
        let first = SLOT.get();
        *first.lock().unwrap() = 8;
        assert!(std::ptr::eq(first, SLOT.get()), "one value until forgotten");
        // What a child whose parent thread died holding the lock would see.
        let held = first.lock().unwrap();
        SLOT.forget();
        let second = SLOT.get();
        assert!(!std::ptr::eq(first, second));
        assert_eq!(*second.try_lock().unwrap(), 7, "a fresh, unlocked value");
        drop(held);
        assert_eq!(*first.lock().unwrap(), 8, "the leaked value is still valid");
    }

    #[test]
    fn concurrent_first_uses_agree_on_one_value() {
        static RACE: ForkLocal<u64> = ForkLocal::new(|| 1);
        let addrs: Vec<usize> = std::thread::scope(|s| {
            let handles: Vec<_> = (0..8)
                .map(|_| s.spawn(|| RACE.get() as *const u64 as usize))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        assert!(addrs.windows(2).all(|w| w[0] == w[1]));
    }
}
