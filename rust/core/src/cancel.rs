//! Cancelling work that can stall (remote requests): a token an operation's tasks share,
//! the token of the work the current thread runs, and a process-wide cancel for exit.
//!
//! Remote requests never look at an operation directly: the task that runs one sets the
//! operation's token as the thread's current one ([`scope`]), and the HTTP client asks
//! [`cancelled`] before each attempt, during backoff sleeps, between body chunks and,
//! through its transport, every [`POLL`] while a socket waits for data. [`cancel_all`]
//! (interpreter exit) cancels every request in flight at that moment, and no later one.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::error::{Error, RemoteFailure};

/// How often blocked remote work looks at its token: a socket waiting for data, a backoff
/// sleep. Cancelled work stops within about this long.
pub(crate) const POLL: Duration = Duration::from_millis(20);

/// Bumped by [`cancel_all`]: work begun under an older generation is cancelled.
static GENERATION: AtomicU64 = AtomicU64::new(0);

/// A cancel flag shared by an operation's tasks (cloning shares it).
#[derive(Clone, Debug, Default)]
pub struct CancelToken(Arc<AtomicBool>);

impl CancelToken {
    /// A token not yet cancelled.
    pub fn new() -> Self {
        Self::default()
    }

    /// Cancel the work watching this token; idempotent.
    pub fn cancel(&self) {
        self.0.store(true, Ordering::Release);
    }

    /// Whether [`CancelToken::cancel`] was called.
    pub(crate) fn is_cancelled(&self) -> bool {
        self.0.load(Ordering::Acquire)
    }
}

/// What the current thread's work watches: its operation's token, if any, and the
/// generation it began under.
#[derive(Clone)]
struct Watch {
    token: Option<CancelToken>,
    /// A second token, of work inside the operation (a batch stopping at its first error).
    extra: Option<CancelToken>,
    generation: u64,
}

impl Watch {
    fn now(token: Option<CancelToken>) -> Self {
        Self {
            token,
            extra: None,
            generation: GENERATION.load(Ordering::Acquire),
        }
    }

    fn cancelled(&self) -> bool {
        self.generation != GENERATION.load(Ordering::Acquire)
            || self.token.as_ref().is_some_and(CancelToken::is_cancelled)
            || self.extra.as_ref().is_some_and(CancelToken::is_cancelled)
    }
}

thread_local! {
    static CURRENT: RefCell<Option<Watch>> = const { RefCell::new(None) };
}

/// Restores the thread's previous watch when a scope ends (also on unwinding).
struct Restore(Option<Watch>);

impl Drop for Restore {
    fn drop(&mut self) {
        let previous = self.0.take();
        let _ = CURRENT.try_with(|c| *c.borrow_mut() = previous);
    }
}

fn with_watch<R>(watch: Watch, work: impl FnOnce() -> R) -> R {
    let previous = CURRENT.with(|c| c.borrow_mut().replace(watch));
    let _restore = Restore(previous);
    work()
}

/// Run `work` with `token` as the current thread's token (and the generation now).
pub fn scope<R>(token: &CancelToken, work: impl FnOnce() -> R) -> R {
    with_watch(Watch::now(Some(token.clone())), work)
}

/// Run `work` under the thread's current watch, or, outside any [`scope`], under a watch
/// of no token begun now (so that [`cancel_all`] reaches it too).
pub(crate) fn watched<R>(work: impl FnOnce() -> R) -> R {
    if CURRENT.with(|c| c.borrow().is_some()) {
        return work();
    }
    with_watch(Watch::now(None), work)
}

/// Whether the current thread's work was cancelled (its token, or [`cancel_all`] since
/// it began); false outside any [`scope`] or [`watched`].
pub fn cancelled() -> bool {
    CURRENT
        .try_with(|c| c.borrow().as_ref().is_some_and(Watch::cancelled))
        .unwrap_or(false)
}

/// The current thread's watch, carried into work it hands to other threads (a batch's
/// parallel pieces), so that they see the same cancellation.
#[derive(Clone, Default)]
pub(crate) struct Carried(Option<Watch>);

/// The current thread's watch (none outside any [`scope`] or [`watched`]).
pub(crate) fn carry() -> Carried {
    Carried(CURRENT.with(|c| c.borrow().clone()))
}

impl Carried {
    /// The carried watch that `token` cancels too (or, where none was carried, `token`
    /// alone).
    pub fn and(&self, token: &CancelToken) -> Carried {
        let mut watch = self.0.clone().unwrap_or_else(|| Watch::now(None));
        watch.extra = Some(token.clone());
        Carried(Some(watch))
    }

    /// Whether the carried watch's work was cancelled (without making it current).
    pub fn cancelled(&self) -> bool {
        self.0.as_ref().is_some_and(Watch::cancelled)
    }

    /// Run `work` under the carried watch (as is, where none was carried).
    pub fn run<R>(&self, work: impl FnOnce() -> R) -> R {
        match &self.0 {
            Some(watch) => with_watch(watch.clone(), work),
            None => work(),
        }
    }
}

/// Whether `error` is that of cancelled work (see [`error`]).
pub(crate) fn is_cancellation(error: &Error) -> bool {
    matches!(
        error,
        Error::Remote {
            kind: RemoteFailure::Cancelled,
            ..
        }
    )
}

/// The error of work on `what` (a path or URL) that stopped because it was cancelled.
pub fn error(what: &str) -> Error {
    Error::remote(
        RemoteFailure::Cancelled,
        what,
        format!(
            "'{what}': the read was cancelled (the call was interrupted, or the interpreter \
             is exiting)"
        ),
    )
}

/// Cancel every piece of work watched at this moment (interpreter exit); work begun
/// afterwards is not affected.
pub fn cancel_all() {
    GENERATION.fetch_add(1, Ordering::AcqRel);
}

/// Sleep `duration`, waking every [`POLL`] to see whether the work was cancelled; false
/// if it was (the sleep then ends early).
pub(crate) fn sleep(duration: Duration) -> bool {
    let end = Instant::now() + duration;
    loop {
        if cancelled() {
            return false;
        }
        let now = Instant::now();
        if now >= end {
            return true;
        }
        std::thread::sleep((end - now).min(POLL));
    }
}

/// Serialises the engine's tests that watch for cancellation with the one that calls
/// [`cancel_all`], which would cancel them too (tests run in parallel threads).
#[cfg(test)]
pub(crate) fn generation_lock() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scopes_nest_and_restore() {
        let _serial = generation_lock();
        assert!(!cancelled(), "nothing is watched outside a scope");
        let outer = CancelToken::new();
        let inner = CancelToken::new();
        scope(&outer, || {
            scope(&inner, || {
                inner.cancel();
                assert!(cancelled());
            });
            assert!(!cancelled(), "the outer token is not cancelled");
            let extra = CancelToken::new();
            let both = carry().and(&extra);
            assert!(!both.cancelled());
            extra.cancel();
            assert!(both.cancelled() && !carry().cancelled());
            let carried = carry();
            std::thread::scope(|s| {
                s.spawn(|| {
                    assert!(!cancelled(), "a new thread watches nothing");
                    carried.run(|| {
                        outer.cancel();
                        assert!(cancelled(), "a carried watch sees its token");
                    });
                });
            });
            watched(|| assert!(cancelled(), "watched() keeps the current token"));
        });
        assert!(!cancelled());
    }

    #[test]
    fn cancel_all_reaches_work_in_flight_only() {
        let _serial = generation_lock();
        watched(|| {
            assert!(!cancelled());
            let token = CancelToken::new();
            scope(&token, || {
                cancel_all();
                assert!(cancelled(), "work begun before cancel_all is cancelled");
            });
            assert!(cancelled());
        });
        watched(|| assert!(!cancelled(), "work begun afterwards is not"));
    }

    #[test]
    fn sleep_ends_early_when_cancelled() {
        let _serial = generation_lock();
        let token = CancelToken::new();
        let t = token.clone();
        let (started_tx, started) = std::sync::mpsc::channel();
        let (slept_tx, slept) = std::sync::mpsc::channel();
        // An hour's sleep, cancelled once under way: it must end and say it was cut
        // short. The channels' timeouts only guard against a sleep that does not end
        // (that thread is then left to sleep on).
        std::thread::spawn(move || {
            let _ = started_tx.send(());
            let _ = slept_tx.send(scope(&t, || sleep(Duration::from_secs(3600))));
        });
        started
            .recv_timeout(Duration::from_secs(60))
            .expect("the sleeping thread did not start");
        std::thread::sleep(Duration::from_millis(50)); // most likely asleep by now
        token.cancel();
        let slept = slept
            .recv_timeout(Duration::from_secs(60))
            .expect("a cancelled sleep did not end");
        assert!(!slept, "a cancelled sleep reports that it was cut short");
        assert!(
            sleep(Duration::from_millis(1)),
            "outside a scope a sleep runs out"
        );
    }
}
