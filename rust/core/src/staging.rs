//! The staging budget of a checkpoint load: one byte count that bounds the bounce buffers
//! (pinned, and host ones for O_DIRECT) the load's transfers hold at once.
//!
//! A load makes one [`StagingBudget`] and enters it on the calling thread ([`enter`]);
//! every settings snapshot taken on that thread meanwhile (`settings::current`)
//! carries it ([`Staging`]), so the requests the load starts take their buffers against
//! it, on whichever pool thread they run. A task reserves the bytes of all its buffers in
//! one call ([`StagingBudget::take`]) before it acquires them, and the [`Reservation`]
//! travels with the buffers, giving the bytes back when they return to their pool.
//!
//! Two rules keep a load moving: a task waits only while others of its budget hold
//! bytes, so one task always goes, even one larger than the whole budget (progress); and
//! no task asks for more while it holds a reservation (a task's transfers below it run on
//! a snapshot without the budget, `Settings::unbudgeted`), so no task
//! waits for bytes that only it could give back. Waits answer cancellation
//! ([`crate::cancel`]) every [`crate::cancel::POLL`]. Snapshots without a budget (every
//! read that is not a checkpoint load's) take one `Option` check and never wait.

use std::cell::RefCell;
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use crate::error::Result;

/// The smallest buffer [`StagingBudget::slot_bytes`] asks for: one page.
const MIN_SLOT: usize = 4096;

/// A byte budget that transfers reserve from before they take bounce buffers; see the
/// module docs.
#[derive(Debug)]
pub struct StagingBudget {
    limit: usize,
    state: Mutex<State>,
    freed: Condvar,
}

#[derive(Debug, Default)]
struct State {
    in_use: usize,
    peak: usize,
    /// Tasks that went alone past the limit (the progress rule).
    over: usize,
}

/// What a [`StagingBudget`] holds now and at most, in bytes.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct BudgetUse {
    /// The budget's limit.
    pub limit: usize,
    /// Reserved now.
    pub in_use: usize,
    /// The most reserved at once.
    pub peak: usize,
    /// Reservations larger than the limit that went alone.
    pub over: usize,
}

impl StagingBudget {
    /// A budget of `limit` bytes, none reserved.
    pub fn new(limit: usize) -> Arc<Self> {
        Arc::new(Self {
            limit,
            state: Mutex::new(State::default()),
            freed: Condvar::new(),
        })
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// What the budget holds now and at most.
    pub fn usage(&self) -> BudgetUse {
        let s = self.lock();
        BudgetUse {
            limit: self.limit,
            in_use: s.in_use,
            peak: s.peak,
            over: s.over,
        }
    }

    /// Reserve `bytes`, waiting while they do not fit beside what others hold. With
    /// nothing reserved, any amount goes at once (so a budget smaller than one task's
    /// buffers still finishes, a task at a time). Fails only if the waiting work is
    /// cancelled ([`crate::cancel::cancelled`]).
    pub fn take(self: &Arc<Self>, bytes: usize) -> Result<Reservation> {
        let mut s = self.lock();
        loop {
            let fits = s
                .in_use
                .checked_add(bytes)
                .is_some_and(|total| total <= self.limit);
            if fits || s.in_use == 0 {
                if !fits {
                    s.over += 1;
                }
                s.in_use = s.in_use.saturating_add(bytes);
                s.peak = s.peak.max(s.in_use);
                return Ok(Reservation {
                    budget: Some(Arc::clone(self)),
                    bytes,
                });
            }
            if crate::cancel::cancelled() {
                return Err(crate::cancel::error("checkpoint staging"));
            }
            s = self
                .freed
                .wait_timeout(s, crate::cancel::POLL)
                .unwrap_or_else(|e| e.into_inner())
                .0;
        }
    }

    /// The budget's limit, in bytes.
    pub fn limit(&self) -> usize {
        self.limit
    }

    /// The largest power of two `p` (at least 4 KiB) for which `slots` buffers of `p`
    /// plus `overhead` bytes each fit in the limit: the most a task with that many
    /// buffers should stage per buffer, so that it never has to go alone past the limit
    /// (only a limit below `slots` x (4 KiB + `overhead`) still does).
    pub fn slot_bytes(&self, slots: usize, overhead: usize) -> usize {
        let room = (self.limit / slots.max(1)).saturating_sub(overhead);
        match room.checked_ilog2() {
            Some(bits) => (1usize << bits).max(MIN_SLOT),
            None => MIN_SLOT,
        }
    }

    fn give_back(&self, bytes: usize) {
        if bytes == 0 {
            return;
        }
        let mut s = self.lock();
        s.in_use = s.in_use.saturating_sub(bytes);
        drop(s);
        self.freed.notify_all();
    }
}

/// Bytes reserved from a [`StagingBudget`], given back when dropped (a reservation of no
/// budget is empty and gives back nothing).
#[derive(Debug, Default)]
pub struct Reservation {
    budget: Option<Arc<StagingBudget>>,
    bytes: usize,
}

impl Reservation {
    /// The bytes this reservation holds.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// A reservation of `bytes` of these (all that are left, if fewer), moved out of
    /// this one: so that one `take` for a task's buffers is handed out a buffer each.
    pub fn split(&mut self, bytes: usize) -> Reservation {
        let bytes = bytes.min(self.bytes);
        self.bytes -= bytes;
        Reservation {
            budget: self.budget.clone(),
            bytes,
        }
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        if let Some(budget) = self.budget.take() {
            budget.give_back(self.bytes);
        }
    }
}

/// The budget a settings snapshot carries: none (every read that is not a checkpoint
/// load's), or a load's. Compared by identity.
#[derive(Clone, Default)]
pub struct Staging(Option<Arc<StagingBudget>>);

impl Staging {
    /// The budget, if any.
    pub fn budget(&self) -> Option<&Arc<StagingBudget>> {
        self.0.as_ref()
    }

    /// `bytes` reserved from the budget (waiting as [`StagingBudget::take`] does), or
    /// an empty reservation without waiting where there is none.
    pub fn reserve(&self, bytes: usize) -> Result<Reservation> {
        match &self.0 {
            None => Ok(Reservation::default()),
            Some(budget) => budget.take(bytes),
        }
    }
}

impl From<Option<Arc<StagingBudget>>> for Staging {
    fn from(budget: Option<Arc<StagingBudget>>) -> Self {
        Self(budget)
    }
}

impl PartialEq for Staging {
    fn eq(&self, other: &Self) -> bool {
        match (&self.0, &other.0) {
            (None, None) => true,
            (Some(a), Some(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }
}

impl Eq for Staging {}

impl std::fmt::Debug for Staging {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.0 {
            None => f.write_str("Staging(none)"),
            Some(b) => write!(f, "Staging({} bytes)", b.limit),
        }
    }
}

thread_local! {
    /// The budgets entered on this thread, innermost last.
    static ENTERED: RefCell<Vec<Arc<StagingBudget>>> = const { RefCell::new(Vec::new()) };
}

/// Make a budget of `limit` bytes this thread's until [`leave`]: a load's, carried by
/// every settings snapshot taken on this thread meanwhile. Inside a load already entered,
/// the outer load's budget stays the one (a load is one budget). Returns what to pass to
/// [`leave`].
pub fn enter(limit: usize) -> usize {
    ENTERED.with(|e| {
        let mut entered = e.borrow_mut();
        let depth = entered.len();
        let budget = match entered.last() {
            Some(outer) => Arc::clone(outer),
            None => StagingBudget::new(limit),
        };
        entered.push(budget);
        depth
    })
}

/// Leave the budgets entered on this thread since [`enter`] returned `depth`.
pub fn leave(depth: usize) {
    let _ = ENTERED.try_with(|e| e.borrow_mut().truncate(depth));
}

/// This thread's budget (see [`enter`]), if any.
pub fn entered() -> Option<Arc<StagingBudget>> {
    ENTERED
        .try_with(|e| e.borrow().last().cloned())
        .ok()
        .flatten()
}

/// How a `checkpoint_staging` of `total` bytes is split for a load whose transfers would
/// hold `demand` bytes of bounce buffers without a budget: `(bounce, device)`, the
/// bounce buffers' part (`min(total / 2, demand)`) and what is left for staging windows
/// on the GPU.
pub fn split(total: usize, demand: usize) -> (usize, usize) {
    let bounce = (total / 2).min(demand);
    (bounce, total - bounce)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::time::Duration;

    #[test]
    fn a_reservation_gives_its_bytes_back_when_dropped() {
        let budget = StagingBudget::new(100);
        let mut r = budget.take(60).unwrap();
        let part = r.split(20);
        assert_eq!((r.bytes(), part.bytes()), (40, 20));
        assert_eq!(budget.usage().in_use, 60);
        drop(part);
        assert_eq!(budget.usage().in_use, 40);
        drop(r);
        assert_eq!(
            budget.usage(),
            BudgetUse {
                limit: 100,
                in_use: 0,
                peak: 60,
                over: 0
            }
        );
        // Splitting more than is left hands out what is left.
        let mut r = budget.take(10).unwrap();
        assert_eq!(r.split(50).bytes(), 10);
        assert_eq!(r.bytes(), 0);
        drop(r);
        assert_eq!(budget.usage().in_use, 0);
        assert_eq!(Reservation::default().bytes(), 0, "no budget, nothing held");
    }

    #[test]
    fn a_budget_smaller_than_one_task_lets_one_task_go_at_a_time() {
        let budget = StagingBudget::new(10);
        let big = budget.take(25).unwrap();
        assert_eq!(budget.usage().over, 1);
        let (tx, rx) = std::sync::mpsc::channel();
        let b = Arc::clone(&budget);
        let waiter = std::thread::spawn(move || {
            let r = b.take(25).unwrap();
            tx.send(()).unwrap();
            drop(r);
        });
        assert!(
            rx.recv_timeout(Duration::from_millis(150)).is_err(),
            "the second task waits while the first holds its bytes"
        );
        drop(big);
        rx.recv_timeout(Duration::from_secs(20))
            .expect("the waiter wakes once the bytes are back");
        waiter.join().unwrap();
        let used = budget.usage();
        assert_eq!((used.in_use, used.peak, used.over), (0, 25, 2));
    }

    #[test]
    fn waiters_wake_when_bytes_come_back() {
        let budget = StagingBudget::new(100);
        let held: Vec<_> = (0..4).map(|_| budget.take(25).unwrap()).collect();
        let (tx, rx) = std::sync::mpsc::channel();
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let (b, tx) = (Arc::clone(&budget), tx.clone());
                std::thread::spawn(move || {
                    let r = b.take(25).unwrap();
                    tx.send(()).unwrap();
                    std::thread::sleep(Duration::from_millis(5));
                    drop(r);
                })
            })
            .collect();
        assert!(rx.recv_timeout(Duration::from_millis(100)).is_err());
        drop(held);
        for _ in 0..3 {
            rx.recv_timeout(Duration::from_secs(20))
                .expect("every waiter goes");
        }
        for w in waiters {
            w.join().unwrap();
        }
        assert_eq!(budget.usage().in_use, 0);
        assert!(budget.usage().peak <= 100);
    }

    #[test]
    fn a_cancelled_wait_fails_and_holds_nothing() {
        let _serial = crate::cancel::generation_lock();
        let budget = StagingBudget::new(10);
        let held = budget.take(10).unwrap();
        let token = crate::cancel::CancelToken::new();
        let (b, t) = (Arc::clone(&budget), token.clone());
        let waiter = std::thread::spawn(move || crate::cancel::scope(&t, || b.take(5)));
        std::thread::sleep(Duration::from_millis(50));
        token.cancel();
        let err = waiter.join().unwrap().unwrap_err();
        assert!(crate::cancel::is_cancellation(&err), "{err}");
        drop(held);
        assert_eq!(budget.usage().in_use, 0);
    }

    #[test]
    fn slots_are_sized_to_fit_the_limit() {
        let b = StagingBudget::new(4 << 20);
        assert_eq!(b.slot_bytes(1, 4096), 2 << 20);
        assert_eq!(b.slot_bytes(2, 4096), 1 << 20);
        assert_eq!(b.slot_bytes(1, 0), 4 << 20);
        assert_eq!(StagingBudget::new(100 << 10).slot_bytes(1, 0), 64 << 10);
        assert_eq!(StagingBudget::new(1).slot_bytes(2, 4096), 4096);
        assert_eq!(StagingBudget::new(usize::MAX).slot_bytes(0, 0), 1 << 63);
    }

    proptest! {
        #[test]
        fn a_slot_fits_its_share(limit in 0usize..(1 << 40), slots in 1usize..3, overhead in 0usize..8192) {
            let p = StagingBudget::new(limit).slot_bytes(slots, overhead);
            prop_assert!(p.is_power_of_two() && p >= MIN_SLOT);
            if limit >= slots * (MIN_SLOT + overhead) {
                prop_assert!(slots * (p + overhead) <= limit);
                prop_assert!(slots * (2 * p + overhead) > limit, "the largest that fits");
            }
        }
    }

    #[test]
    fn no_budget_reserves_nothing_and_never_waits() {
        let none = Staging::default();
        assert!(none.budget().is_none());
        assert_eq!(none.reserve(usize::MAX).unwrap().bytes(), 0);
        let budget = StagingBudget::new(1);
        let some = Staging::from(Some(Arc::clone(&budget)));
        assert_ne!(some, none);
        assert_eq!(some, Staging::from(Some(budget)));
        assert_ne!(some, Staging::from(Some(StagingBudget::new(1))));
    }

    #[test]
    fn loads_enter_one_budget_per_thread_and_nest() {
        assert!(entered().is_none());
        let outer = enter(100);
        let first = entered().unwrap();
        assert_eq!(first.usage().limit, 100);
        let inner = enter(5);
        assert!(
            Arc::ptr_eq(&first, &entered().unwrap()),
            "an inner load keeps the outer's"
        );
        // Another thread sees no budget.
        assert!(std::thread::spawn(|| entered().is_none()).join().unwrap());
        leave(inner);
        assert!(Arc::ptr_eq(&first, &entered().unwrap()));
        leave(outer);
        assert!(entered().is_none());
    }

    #[test]
    fn the_split_gives_the_bounce_buffers_at_most_half() {
        assert_eq!(split(512 << 20, 64 << 20), (64 << 20, 448 << 20));
        assert_eq!(split(64 << 20, 256 << 20), (32 << 20, 32 << 20));
        assert_eq!(split(3, 100), (1, 2));
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(24))]

        /// Tasks of any sizes on several threads never hold more than the limit at once,
        /// except one task alone that is larger than it; every byte comes back.
        #[test]
        fn concurrent_tasks_stay_within_the_limit(
            limit in 1usize..4096,
            sizes in proptest::collection::vec(1usize..2048, 1..48),
            threads in 1usize..6,
        ) {
            let budget = StagingBudget::new(limit);
            let holding = Arc::new(AtomicUsize::new(0));
            let worst = Arc::new(AtomicUsize::new(0));
            let sizes = Arc::new(sizes);
            let next = Arc::new(AtomicUsize::new(0));
            let workers: Vec<_> = (0..threads)
                .map(|_| {
                    let (budget, holding, worst, sizes, next) = (
                        Arc::clone(&budget),
                        Arc::clone(&holding),
                        Arc::clone(&worst),
                        Arc::clone(&sizes),
                        Arc::clone(&next),
                    );
                    std::thread::spawn(move || loop {
                        let k = next.fetch_add(1, Ordering::SeqCst);
                        let Some(&n) = sizes.get(k) else { break };
                        let mut r = budget.take(n).unwrap();
                        let now = holding.fetch_add(n, Ordering::SeqCst) + n;
                        // Over the limit only when this task went alone.
                        let bound = if n > limit { n } else { limit };
                        worst.fetch_max(now.saturating_sub(bound), Ordering::SeqCst);
                        std::thread::yield_now();
                        holding.fetch_sub(n, Ordering::SeqCst);
                        let half = r.split(n / 2);
                        drop(half);
                        drop(r);
                    })
                })
                .collect();
            for w in workers {
                w.join().unwrap();
            }
            prop_assert_eq!(worst.load(Ordering::SeqCst), 0);
            let used = budget.usage();
            prop_assert_eq!(used.in_use, 0);
            let largest = sizes.iter().copied().max().unwrap_or(0);
            prop_assert!(used.peak <= limit.max(largest));
        }
    }
}
