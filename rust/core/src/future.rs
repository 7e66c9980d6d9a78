//! Futures for operations split over the pool: a countdown of tasks, the summed byte
//! count, the first error, waiting, and done-callbacks.
//!
//! Fork: a future records the fork generation it was made in. In a forked child, the
//! parent's tasks are not running, so waiting on a future from before the fork fails at
//! once with [`Error::StartedBeforeFork`] (unless it had already finished), and the count
//! of operations in flight starts again from zero, so the child's exit does not wait for
//! them.

use std::any::Any;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, TryLockError};
use std::time::{Duration, Instant};

use crate::cancel::CancelToken;
use crate::error::{Error, Result};
use crate::fork::{self, ForkLocal};

type Callback = Box<dyn FnOnce() + Send>;

/// Operations whose last task has not yet finished running callbacks and releasing the
/// operation's memory. Lets a host process wait for them before it tears down (for
/// Python: before the interpreter finalises, when a thread touching it would abort).
/// Counted without a lock; [`IDLE`] is only taken when the count reaches zero and by
/// [`wait_idle`].
///
/// Wake-ups (here and of a future's waiters) go only to sleepers that are there: a
/// condition variable's `notify_all` is a `futex` system call even when nobody waits, and
/// a small read made twice of them per call.
static IN_FLIGHT: AtomicUsize = AtomicUsize::new(0);

/// Where [`wait_idle`] sleeps until [`IN_FLIGHT`] reaches zero; the count of its sleepers.
static IDLE: ForkLocal<(Mutex<usize>, Condvar)> =
    ForkLocal::new(|| (Mutex::new(0), Condvar::new()));

/// Wait until no operation is in flight, at most `timeout`; whether none is.
pub fn wait_idle(timeout: Duration) -> bool {
    let (lock, all_idle) = IDLE.get();
    let deadline = Instant::now() + timeout;
    let mut guard = lock.lock().unwrap_or_else(|e| e.into_inner());
    while IN_FLIGHT.load(Ordering::Acquire) > 0 {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return false;
        }
        *guard += 1;
        guard = all_idle
            .wait_timeout(guard, left)
            .unwrap_or_else(|e| e.into_inner())
            .0;
        *guard -= 1;
    }
    true
}

/// Count one operation out of flight, waking [`wait_idle`] when it was the last.
fn leave_flight() {
    let before = IN_FLIGHT
        .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
            Some(n.saturating_sub(1))
        })
        .unwrap_or(0);
    if before == 1 {
        let (lock, all_idle) = IDLE.get();
        // Taking the lock after the count changed means a waiter has either not checked
        // the count yet or is already counted as asleep: it cannot miss this wake-up.
        let sleepers = *lock.lock().unwrap_or_else(|e| e.into_inner());
        if sleepers > 0 {
            all_idle.notify_all();
        }
    }
}

/// In a forked child: no operation is in flight (the parent's are not running here), and
/// the waiters' lock may be held by a thread that does not exist. Async-signal-safe.
pub(crate) fn forget_in_child() {
    IN_FLIGHT.store(0, Ordering::Release);
    IDLE.forget();
}

#[derive(Default)]
struct Completion {
    done: bool,
    /// Threads asleep on `State::finished` (counted under this lock): the last report
    /// wakes them only if there are any.
    waiters: usize,
    error: Option<Error>,
    callbacks: Vec<Callback>,
}

struct State {
    remaining: AtomicUsize,
    bytes: AtomicU64,
    completion: Mutex<Completion>,
    finished: Condvar,
    /// The fork generation the operation started in (see [`crate::fork`]).
    generation: u64,
    /// Whatever keeps the operation's memory alive (a Python buffer export); dropped with
    /// the last reference to the future, never before the last task has finished.
    _keepalive: Mutex<Option<Box<dyn Any + Send>>>,
    /// The token its tasks watch, for operations that can be cancelled (remote reads).
    cancel: Option<CancelToken>,
}

/// The result of an operation that may still be running. Cloning shares the operation.
#[derive(Clone)]
pub struct IoFuture {
    state: Arc<State>,
}

/// The handle a task uses to report its part; the future completes when every
/// `TaskReporter` of it has reported.
pub struct TaskReporter {
    state: Option<Arc<State>>,
}

impl IoFuture {
    /// A future expecting `tasks` reports, keeping `keepalive` alive until it and every
    /// reporter are gone. With zero tasks it is complete at once with 0 bytes.
    pub fn new(tasks: usize, keepalive: Option<Box<dyn Any + Send>>) -> (Self, Vec<TaskReporter>) {
        Self::cancellable(tasks, keepalive, None)
    }

    /// [`IoFuture::new`] for an operation whose tasks watch `cancel`, which
    /// [`IoFuture::cancel`] cancels.
    pub fn cancellable(
        tasks: usize,
        keepalive: Option<Box<dyn Any + Send>>,
        cancel: Option<CancelToken>,
    ) -> (Self, Vec<TaskReporter>) {
        let future = Self::expecting(tasks, keepalive, cancel);
        let reporters = (0..tasks).map(|_| future.reporter()).collect();
        (future, reporters)
    }

    /// A future expecting one report, and the reporter for it; otherwise as [`IoFuture::new`].
    pub fn single(keepalive: Option<Box<dyn Any + Send>>) -> (Self, TaskReporter) {
        let future = Self::expecting(1, keepalive, None);
        let reporter = future.reporter();
        (future, reporter)
    }

    /// A future expecting `tasks` reports, without its reporters yet.
    fn expecting(
        tasks: usize,
        keepalive: Option<Box<dyn Any + Send>>,
        cancel: Option<CancelToken>,
    ) -> Self {
        if tasks > 0 {
            IN_FLIGHT.fetch_add(1, Ordering::AcqRel);
        }
        let state = Arc::new(State {
            remaining: AtomicUsize::new(tasks),
            bytes: AtomicU64::new(0),
            completion: Mutex::new(Completion {
                done: tasks == 0,
                ..Completion::default()
            }),
            finished: Condvar::new(),
            generation: fork::generation(),
            _keepalive: Mutex::new(keepalive),
            cancel,
        });
        Self { state }
    }

    /// A reporter for one of this future's tasks.
    fn reporter(&self) -> TaskReporter {
        TaskReporter {
            state: Some(Arc::clone(&self.state)),
        }
    }

    /// A future that is already complete with `result`.
    pub fn ready(result: Result<usize>, keepalive: Option<Box<dyn Any + Send>>) -> Self {
        let (future, reporter) = Self::single(keepalive);
        reporter.report(result);
        future
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Completion> {
        self.state
            .completion
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Ask the operation's tasks to stop where they can (remote requests: within
    /// [`crate::cancel::POLL`]); tasks not yet started fail at once. The future still
    /// completes only when every task has reported, so its memory stays alive until then.
    /// A no-op for operations that cannot be cancelled (local files: their tasks finish).
    pub fn cancel(&self) {
        if let Some(token) = &self.state.cancel {
            token.cancel();
        }
    }

    /// In a process forked after the operation started: its outcome, since it can never
    /// change here (its tasks are not running): its result if it had finished before the
    /// fork, else [`Error::StartedBeforeFork`]. `None` in the process it started in. The
    /// check is one relaxed atomic load.
    fn forked_outcome(&self) -> Option<Result<usize>> {
        if self.state.generation == fork::generation() {
            return None;
        }
        // Never block here: a thread of the parent may have died holding this lock.
        let finished = match self.state.completion.try_lock() {
            Ok(c) => c.done.then(|| self.result_locked(&c)),
            Err(TryLockError::Poisoned(c)) => {
                let c = c.into_inner();
                c.done.then(|| self.result_locked(&c))
            }
            Err(TryLockError::WouldBlock) => None,
        };
        Some(finished.unwrap_or(Err(Error::StartedBeforeFork)))
    }

    /// Whether every task has reported (in a forked child, an operation started before
    /// the fork counts as done: waiting on it answers at once, with an error).
    pub fn is_done(&self) -> bool {
        if self.forked_outcome().is_some() {
            return true;
        }
        self.lock().done
    }

    /// Block until done; the summed byte count, or the first error any task reported.
    /// May be called any number of times, from any thread. In a forked child, an
    /// operation started before the fork fails at once with [`Error::StartedBeforeFork`].
    pub fn wait(&self) -> Result<usize> {
        if let Some(outcome) = self.forked_outcome() {
            return outcome;
        }
        let mut guard = self.lock();
        while !guard.done {
            guard.waiters += 1;
            guard = self
                .state
                .finished
                .wait(guard)
                .unwrap_or_else(|e| e.into_inner());
            guard.waiters -= 1;
        }
        self.result_locked(&guard)
    }

    /// Like [`IoFuture::wait`] but gives up after `timeout`, returning `None`.
    pub fn wait_timeout(&self, timeout: Duration) -> Option<Result<usize>> {
        if let Some(outcome) = self.forked_outcome() {
            return Some(outcome);
        }
        let deadline = Instant::now().checked_add(timeout);
        let mut guard = self.lock();
        while !guard.done {
            let left = match deadline {
                Some(deadline) => deadline.saturating_duration_since(Instant::now()),
                None => Duration::MAX, // beyond any clock: as good as forever
            };
            if left.is_zero() {
                return None;
            }
            guard.waiters += 1;
            guard = self
                .state
                .finished
                .wait_timeout(guard, left)
                .unwrap_or_else(|e| e.into_inner())
                .0;
            guard.waiters -= 1;
        }
        Some(self.result_locked(&guard))
    }

    /// Bytes moved by the tasks finished so far (progress; final once done).
    pub fn bytes_so_far(&self) -> u64 {
        self.state.bytes.load(Ordering::Acquire)
    }

    fn result_locked(&self, c: &Completion) -> Result<usize> {
        match &c.error {
            Some(e) => Err(e.clone()),
            None => Ok(self.state.bytes.load(Ordering::Acquire) as usize),
        }
    }

    /// Run `callback` once the future is done: at once in this thread if it already is,
    /// otherwise in the thread that completes it. A panicking callback is contained.
    pub fn add_done_callback(&self, callback: impl FnOnce() + Send + 'static) {
        if self.forked_outcome().is_some() {
            let _ = catch_unwind(AssertUnwindSafe(callback));
            return;
        }
        let mut guard = self.lock();
        if guard.done {
            drop(guard);
            let _ = catch_unwind(AssertUnwindSafe(callback));
        } else {
            guard.callbacks.push(Box::new(callback));
        }
    }
}

impl TaskReporter {
    /// Report this task's outcome. The last report completes the future, wakes waiters and
    /// runs the callbacks (outside the lock, in this thread).
    pub fn report(mut self, result: Result<usize>) {
        if let Some(state) = self.state.take() {
            finish_and_release(state, result);
        }
    }
}

impl Drop for TaskReporter {
    // A task that was dropped unrun (its closure unwound before reporting) must still count
    // down, or every waiter would hang.
    fn drop(&mut self) {
        if let Some(state) = self.state.take() {
            finish_and_release(
                state,
                Err(Error::Panic("an I/O task ended without reporting".into())),
            );
        }
    }
}

/// Report, drop this task's reference (possibly releasing the operation's memory), and
/// only then count the operation out of flight.
fn finish_and_release(state: Arc<State>, result: Result<usize>) {
    let last = finish(&state, result);
    drop(state);
    if last {
        leave_flight();
    }
}

/// Count one report; true if it was the last.
fn finish(state: &State, result: Result<usize>) -> bool {
    match result {
        Ok(n) => {
            state.bytes.fetch_add(n as u64, Ordering::AcqRel);
        }
        Err(e) => {
            let mut c = state.completion.lock().unwrap_or_else(|e| e.into_inner());
            c.error.get_or_insert(e);
        }
    }
    if state.remaining.fetch_sub(1, Ordering::AcqRel) != 1 {
        return false;
    }
    let (callbacks, sleepers) = {
        let mut c = state.completion.lock().unwrap_or_else(|e| e.into_inner());
        c.done = true;
        (std::mem::take(&mut c.callbacks), c.waiters)
    };
    // A waiter counts itself under the lock before it sleeps, so one not counted here
    // sees `done` before it would sleep.
    if sleepers > 0 {
        state.finished.notify_all();
    }
    for callback in callbacks {
        let _ = catch_unwind(AssertUnwindSafe(callback));
    }
    true
}

/// Run `task` catching panics, turning one into [`Error::Panic`].
pub fn run_caught<T>(task: impl FnOnce() -> Result<T>) -> Result<T> {
    catch_unwind(AssertUnwindSafe(task)).unwrap_or_else(|payload| Err(Error::from_panic(payload)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicBool;

    #[test]
    fn sums_counts_and_keeps_first_error() {
        let (f, reporters) = IoFuture::new(3, None);
        assert!(!f.is_done());
        let mut it = reporters.into_iter();
        it.next().unwrap().report(Ok(5));
        it.next().unwrap().report(Ok(7));
        assert!(f.wait_timeout(Duration::from_millis(1)).is_none());
        it.next().unwrap().report(Ok(1));
        assert_eq!(f.wait().unwrap(), 13);
        assert_eq!(f.wait().unwrap(), 13, "second wait returns the same count");

        let (f, reporters) = IoFuture::new(2, None);
        let mut it = reporters.into_iter();
        it.next()
            .unwrap()
            .report(Err(Error::InvalidArgument("first".into())));
        it.next()
            .unwrap()
            .report(Err(Error::InvalidArgument("second".into())));
        assert!(f.wait().unwrap_err().to_string().contains("first"));
    }

    #[test]
    fn callbacks_run_once_when_done_and_panics_are_contained() {
        let (f, mut reporters) = IoFuture::new(1, None);
        let ran = Arc::new(AtomicUsize::new(0));
        let r = Arc::clone(&ran);
        f.add_done_callback(move || {
            r.fetch_add(1, Ordering::SeqCst);
        });
        f.add_done_callback(|| panic!("callback bug"));
        assert_eq!(ran.load(Ordering::SeqCst), 0);
        reporters.pop().unwrap().report(Ok(1));
        assert_eq!(ran.load(Ordering::SeqCst), 1);
        let late = Arc::new(AtomicBool::new(false));
        let l = Arc::clone(&late);
        f.add_done_callback(move || l.store(true, Ordering::SeqCst));
        assert!(
            late.load(Ordering::SeqCst),
            "callback on a done future runs at once"
        );
    }

    #[test]
    fn keepalive_lives_until_future_and_tasks_are_gone() {
        let token = Arc::new(());
        let (f, mut reporters) = IoFuture::new(1, Some(Box::new(Arc::clone(&token))));
        let reporter = reporters.pop().unwrap();
        drop(f);
        assert_eq!(
            Arc::strong_count(&token),
            2,
            "a running task keeps the memory alive"
        );
        reporter.report(Ok(0));
        assert_eq!(Arc::strong_count(&token), 1);
    }

    #[test]
    fn a_dropped_reporter_fails_the_future_instead_of_hanging() {
        let (f, reporters) = IoFuture::new(2, None);
        drop(reporters);
        assert!(matches!(f.wait(), Err(Error::Panic(_))));
    }

    #[test]
    fn wait_idle_waits_for_operations_in_flight() {
        let (_f, mut reporters) = IoFuture::new(1, None);
        let reporter = reporters.pop().unwrap();
        assert!(!wait_idle(Duration::from_millis(10)));
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(20));
            reporter.report(Ok(1));
        });
        assert!(wait_idle(Duration::from_secs(10)));
        t.join().unwrap();
    }

    #[test]
    fn every_waiter_wakes_whenever_it_started_waiting() {
        // Waiters counted under the lock are the ones woken: a report racing a waiter
        // that is just going to sleep must still wake it. Many rounds of the race, each
        // bounded: a lost wake-up fails the round instead of hanging the test.
        for round in 0..300 {
            let (f, mut reporters) = IoFuture::new(1, None);
            let reporter = reporters.pop().unwrap();
            let (tx, rx) = std::sync::mpsc::channel();
            for i in 0..3 {
                let (f, tx) = (f.clone(), tx.clone());
                std::thread::spawn(move || {
                    let got = if i == 0 {
                        f.wait().ok()
                    } else {
                        f.wait_timeout(Duration::from_secs(60)).and_then(|r| r.ok())
                    };
                    let _ = tx.send(got);
                });
            }
            if round % 2 == 0 {
                std::thread::yield_now();
            }
            reporter.report(Ok(round));
            for _ in 0..3 {
                let got = rx.recv_timeout(Duration::from_secs(20));
                assert_eq!(
                    got,
                    Ok(Some(round)),
                    "round {round}: a waiter was not woken"
                );
            }
        }
    }

    #[test]
    fn wait_timeout_gives_up_without_a_report_and_answers_once_there_is_one() {
        let (f, mut reporters) = IoFuture::new(1, None);
        let reporter = reporters.pop().unwrap();
        assert!(f.wait_timeout(Duration::ZERO).is_none());
        // Without a report it gives up (how long it waits is not timed here).
        assert!(f.wait_timeout(Duration::from_millis(30)).is_none());
        // A waiter with time left (an hour) gets the report's result. The channel's
        // timeout only guards against a waiter that is never answered.
        let (tx, rx) = std::sync::mpsc::channel();
        let waiter = f.clone();
        std::thread::spawn(move || {
            let _ = tx.send(waiter.wait_timeout(Duration::from_secs(3600)));
        });
        reporter.report(Ok(7));
        let got = rx
            .recv_timeout(Duration::from_secs(60))
            .expect("a waiter with time left was not answered by the report");
        assert!(matches!(got, Some(Ok(7))), "{got:?}");
        assert!(matches!(f.wait_timeout(Duration::ZERO), Some(Ok(7))));
    }

    #[test]
    fn panics_become_errors() {
        let r: Result<()> = run_caught(|| panic!("boom"));
        assert!(matches!(r, Err(Error::Panic(m)) if m == "boom"));
    }
}
