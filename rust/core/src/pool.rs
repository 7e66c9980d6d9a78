//! The I/O thread pools: one shared by host transfers (`num_threads` threads), and one per
//! GPU for transfers to and from that GPU's memory (`gpu_threads` threads each).
//!
//! rayon's pool gives named, reusable worker threads and cheap `spawn`; I/O tasks never
//! block on each other, so its work-stealing needs no care. When a pool's thread count
//! changes, the next operation builds a new pool; operations already queued on the old
//! one finish there, and its threads exit once it is idle and unreferenced.
//!
//! Why a pool per GPU: when one pool's threads serve every GPU of a process, each thread
//! moving chunks for one device after another, one process delivered about 45 GB/s in
//! all whether it read onto one, two or four GPUs (4x H100, 64 cores, warm files), while
//! one process per GPU reached 72-79. With one pool per GPU, each thread only ever works
//! for one device (its context, stream and bounce buffers stay put), and the same
//! process reads onto two and four GPUs at 78-82 GB/s, what separate processes reach.
//! Each GPU's pool has `gpu_threads` threads (by default a share of the host's CPUs,
//! at most `num_threads`: see [`crate::settings::Settings::gpu_pool_threads`]).
//!
//! A forked child has none of the parent's pool threads: the fork hook forgets the
//! inherited pools (leaking them, since dropping them could wait on threads that do not
//! exist; see [`crate::fork`]), and the child's first pooled operation builds fresh ones.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};

use crate::error::{Error, Result};
use crate::fork::ForkLocal;
use crate::settings::{available_cpus, Settings};

/// A pool and the thread count it was built with.
type Sized = Option<(usize, Arc<rayon::ThreadPool>)>;

/// The shared pool (host transfers, planning work).
static POOL: ForkLocal<Mutex<Sized>> = ForkLocal::new(|| Mutex::new(None));

/// One pool per GPU, by ordinal.
static DEVICE_POOLS: ForkLocal<Mutex<Vec<Sized>>> = ForkLocal::new(|| Mutex::new(Vec::new()));

/// `slot`'s pool if it has `num_threads` threads, else a new one put in its place.
fn sized(
    slot: &mut Sized,
    num_threads: usize,
    name: impl Fn(usize) -> String + Send + Sync + 'static,
) -> Result<Arc<rayon::ThreadPool>> {
    if let Some((n, pool)) = slot.as_ref() {
        if *n == num_threads {
            return Ok(Arc::clone(pool));
        }
    }
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(num_threads)
        .thread_name(name)
        .build()
        .map_err(|e| {
            Error::InvalidArgument(format!(
                "could not start {num_threads} I/O threads ({e}); lower num_threads"
            ))
        })?;
    let pool = Arc::new(pool);
    *slot = Some((num_threads, Arc::clone(&pool)));
    Ok(pool)
}

/// The shared pool for `num_threads` threads, building (or rebuilding) it on demand.
pub fn pool(num_threads: usize) -> Result<Arc<rayon::ThreadPool>> {
    let mut guard = POOL.get().lock().unwrap_or_else(|e| e.into_inner());
    sized(&mut guard, num_threads, |i| format!("kvikpy-io-{i}"))
}

/// The pool for work on GPU `device` (its own, of [`gpu_threads`] threads), or the shared
/// pool of `num_threads` threads for host work (`None`).
pub(crate) fn pool_for(
    settings: &Settings,
    device: Option<usize>,
) -> Result<Arc<rayon::ThreadPool>> {
    let threads = threads_for(settings, device);
    match device {
        None => pool(threads),
        Some(ordinal) => device_pool(threads, ordinal),
    }
}

/// Threads of the pool that runs work on `device` (`None`: host work) under `settings`.
pub(crate) fn threads_for(settings: &Settings, device: Option<usize>) -> usize {
    match device {
        None => settings.num_threads,
        Some(_) => gpu_threads(settings),
    }
}

/// Threads of each GPU's pool under `settings` on this host (see
/// [`Settings::gpu_pool_threads`]).
pub fn gpu_threads(settings: &Settings) -> usize {
    settings.gpu_pool_threads(available_cpus(), local_processes())
}

/// How many processes of one job share this host: `LOCAL_WORLD_SIZE` as torchrun (and
/// other launchers) set it, else 1; read once.
pub fn local_processes() -> usize {
    static PROCESSES: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    *PROCESSES.get_or_init(|| {
        std::env::var("LOCAL_WORLD_SIZE")
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .filter(|&n| (1..=4096).contains(&n))
            .unwrap_or(1)
    })
}

/// GPUs whose copy turns are counted apart; higher ordinals share the last count.
const TURN_DEVICES: usize = 64;

/// The copy turns of this process (see [`copy_turn`]): how many GPUs want turns now, and
/// each GPU's count.
struct Turns {
    /// GPUs with a thread that holds a turn or waits for one.
    active: AtomicUsize,
    /// Threads waiting for a turn, of every GPU.
    waiting: AtomicUsize,
    devices: [DeviceTurns; TURN_DEVICES],
}

/// One GPU's copy turns: its threads that want one, hold one, wait for one, and where
/// they wait.
struct DeviceTurns {
    wanting: AtomicUsize,
    copying: AtomicUsize,
    waiting: AtomicUsize,
    lock: Mutex<()>,
    freed: Condvar,
}

impl Turns {
    fn new() -> Self {
        Self {
            active: AtomicUsize::new(0),
            waiting: AtomicUsize::new(0),
            devices: [const {
                DeviceTurns {
                    wanting: AtomicUsize::new(0),
                    copying: AtomicUsize::new(0),
                    waiting: AtomicUsize::new(0),
                    lock: Mutex::new(()),
                    freed: Condvar::new(),
                }
            }; TURN_DEVICES],
        }
    }
}

static TURNS: ForkLocal<Turns> = ForkLocal::new(Turns::new);

/// A turn to move file bytes through pinned memory for GPU `ordinal`, held until
/// dropped: a read holds it from before it takes its pinned buffers until its last DMA
/// has landed, a write for each `pwrite`. `None` (no waiting) when `settings` sets no
/// [`Settings::copy_budget`] or one GPU's pool alone cannot exceed it.
///
/// Each GPU's pool has up to 16 threads, but where one process reads onto several GPUs
/// at once, more busy threads than the budget (64 on 64 cores) only fight over the
/// host's memory and cache: every byte is copied from the page cache into a pinned
/// buffer and read out of it by the DMA, and that is fastest while the buffers in use
/// fit in the CPU's last-level cache. So while two or more GPUs want turns, their reads
/// move in 1 MiB pieces ([`gpus_copying`]): onto four GPUs (64 cores) one process read
/// 96.0-99.1 GB/s with 16 threads per GPU in 1 MiB pieces, against 73.6 in 4 MiB ones;
/// native threads copying the same files with no DMA reach 119-128 GB/s through 64
/// buffers of 1 MiB and 79-109 through 32 of 4 MiB. The budget is shared fairly among
/// the GPUs that want turns at the moment (`budget / GPUs` each, at least one). A free
/// turn costs a few atomic operations (no lock, no system call).
pub(crate) fn copy_turn(settings: &Settings, ordinal: usize) -> Option<CopyTurn> {
    let budget = turn_budget(settings)?;
    Some(TURNS.get().take(budget, ordinal))
}

/// The copy budget the GPU reads of this process take turns under at `settings` (see
/// [`copy_turn`]): `None` where there is none, or where one GPU's pool alone fills it and
/// there is nothing to share.
pub(crate) fn turn_budget(settings: &Settings) -> Option<usize> {
    let budget = copy_budget(settings)?;
    (gpu_threads(settings) < budget).then_some(budget)
}

/// [`Settings::copy_budget`] of this process on this host (its CPUs, and the processes
/// of its job here).
pub fn copy_budget(settings: &Settings) -> Option<usize> {
    settings.copy_budget(available_cpus(), local_processes())
}

/// How many GPUs of this process want copy turns now (see [`copy_turn`]): two or more
/// share the copy budget, and their reads move in smaller pieces.
pub(crate) fn gpus_copying() -> usize {
    TURNS.get().active.load(Ordering::SeqCst)
}

/// Threads of this process that may be moving bytes through pinned memory at once while
/// `gpus` of its GPUs take copy turns: each GPU's pool, all of them bounded by the copy
/// budget (see [`copy_turn`]).
pub(crate) fn copying_threads(settings: &Settings, gpus: usize) -> usize {
    let pools = gpu_threads(settings).saturating_mul(gpus.max(1));
    copy_budget(settings).map_or(pools, |budget| pools.min(budget))
}

impl Turns {
    /// This GPU's share of `budget` now.
    fn share(&self, budget: usize) -> usize {
        (budget / self.active.load(Ordering::SeqCst).max(1)).max(1)
    }

    /// Take a turn for GPU `ordinal`, waiting while its share of `budget` is taken.
    fn take(&'static self, budget: usize, ordinal: usize) -> CopyTurn {
        let device = &self.devices[ordinal.min(TURN_DEVICES - 1)];
        if device.wanting.fetch_add(1, Ordering::SeqCst) == 0 {
            self.active.fetch_add(1, Ordering::SeqCst);
        }
        loop {
            let now = device.copying.load(Ordering::SeqCst);
            if now < self.share(budget) {
                if device
                    .copying
                    .compare_exchange_weak(now, now + 1, Ordering::SeqCst, Ordering::SeqCst)
                    .is_ok()
                {
                    return CopyTurn {
                        turns: self,
                        device,
                    };
                }
                continue;
            }
            // The share is taken: wait for a turn to be given back or for the share to
            // grow. `waiting` is raised before the count is looked at again, under the
            // lock the giver takes to notify, so a change in between is either seen here
            // or notified.
            let guard = device.lock.lock().unwrap_or_else(|e| e.into_inner());
            device.waiting.fetch_add(1, Ordering::SeqCst);
            self.waiting.fetch_add(1, Ordering::SeqCst);
            let guard = device
                .freed
                .wait_while(guard, |()| {
                    device.copying.load(Ordering::SeqCst) >= self.share(budget)
                })
                .unwrap_or_else(|e| e.into_inner());
            self.waiting.fetch_sub(1, Ordering::SeqCst);
            device.waiting.fetch_sub(1, Ordering::SeqCst);
            drop(guard);
        }
    }
}

/// A turn from [`copy_turn`]; dropping it lets the next thread of its GPU copy.
pub(crate) struct CopyTurn {
    turns: &'static Turns,
    device: &'static DeviceTurns,
}

impl Drop for CopyTurn {
    fn drop(&mut self) {
        let Self { turns, device } = *self;
        device.copying.fetch_sub(1, Ordering::SeqCst);
        if device.wanting.fetch_sub(1, Ordering::SeqCst) == 1 {
            // This GPU wants no more turns: every other GPU's share grows. (A thread
            // alone, as a small read's is, takes this branch every time: no waiter, no
            // look at the other GPUs.)
            turns.active.fetch_sub(1, Ordering::SeqCst);
            if turns.waiting.load(Ordering::SeqCst) == 0 {
                return;
            }
            for other in &turns.devices {
                if other.waiting.load(Ordering::SeqCst) > 0 {
                    let _guard = other.lock.lock().unwrap_or_else(|e| e.into_inner());
                    other.freed.notify_all();
                }
            }
        } else if device.waiting.load(Ordering::SeqCst) > 0 {
            let _guard = device.lock.lock().unwrap_or_else(|e| e.into_inner());
            device.freed.notify_one();
        }
    }
}

/// GPU `ordinal`'s pool of `num_threads` threads, building (or rebuilding) it on demand.
fn device_pool(num_threads: usize, ordinal: usize) -> Result<Arc<rayon::ThreadPool>> {
    let mut pools = DEVICE_POOLS.get().lock().unwrap_or_else(|e| e.into_inner());
    if pools.len() <= ordinal {
        pools.resize_with(ordinal + 1, || None);
    }
    sized(&mut pools[ordinal], num_threads, move |i| {
        format!("kvikpy-cuda{ordinal}-{i}")
    })
}

/// Number of threads of the shared pool currently in use (0 before the first pooled
/// operation).
pub fn current_size() -> usize {
    POOL.get()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .as_ref()
        .map_or(0, |(n, _)| *n)
}

/// The GPUs that have a pool of their own so far, with its thread count.
pub fn device_pool_sizes() -> Vec<(usize, usize)> {
    DEVICE_POOLS
        .get()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .enumerate()
        .filter_map(|(ordinal, slot)| slot.as_ref().map(|(n, _)| (ordinal, *n)))
        .collect()
}

/// In a forked child: forget the parent's pools (their threads are not here).
/// Async-signal-safe.
pub(crate) fn forget_in_child() {
    POOL.forget();
    DEVICE_POOLS.forget();
    TURNS.forget();
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Run `threads` threads for each GPU of `gpus`, each taking `rounds` turns of
    /// `budget` and holding each for a moment; returns the most turns each GPU held at
    /// once and the most held in all.
    fn contend(
        turns: &'static Turns,
        budget: usize,
        gpus: &[(usize, usize)],
    ) -> (Vec<usize>, usize) {
        let all = Arc::new(AtomicUsize::new(0));
        let most_all = Arc::new(AtomicUsize::new(0));
        let per: Vec<_> = gpus
            .iter()
            .map(|_| Arc::new((AtomicUsize::new(0), AtomicUsize::new(0))))
            .collect();
        let mut handles = Vec::new();
        for (k, &(ordinal, threads)) in gpus.iter().enumerate() {
            for _ in 0..threads {
                let (all, most_all, mine) =
                    (Arc::clone(&all), Arc::clone(&most_all), Arc::clone(&per[k]));
                handles.push(std::thread::spawn(move || {
                    for _ in 0..200 {
                        let turn = turns.take(budget, ordinal);
                        let n = mine.0.fetch_add(1, Ordering::SeqCst) + 1;
                        mine.1.fetch_max(n, Ordering::SeqCst);
                        let n = all.fetch_add(1, Ordering::SeqCst) + 1;
                        most_all.fetch_max(n, Ordering::SeqCst);
                        std::thread::sleep(std::time::Duration::from_micros(30));
                        mine.0.fetch_sub(1, Ordering::SeqCst);
                        all.fetch_sub(1, Ordering::SeqCst);
                        drop(turn);
                    }
                }));
            }
        }
        for h in handles {
            h.join().unwrap();
        }
        (
            per.iter().map(|m| m.1.load(Ordering::SeqCst)).collect(),
            most_all.load(Ordering::SeqCst),
        )
    }

    #[test]
    fn copy_turns_share_the_budget_fairly_among_the_gpus_that_want_them() {
        let turns: &'static Turns = Box::leak(Box::new(Turns::new()));
        // One GPU alone may use the whole budget, and no more.
        let (each, all) = contend(turns, 3, &[(0, 12)]);
        assert_eq!((each, all), (vec![3], 3));
        // Three GPUs at once (one past the counted ordinals) all finish: every turn given
        // back wakes a waiter, and every GPU that stops wanting turns wakes the others. A
        // GPU that joins late lowers the shares of those that hold more than theirs only
        // as they give turns back, so the budget holds in all only in the steady state.
        let (each, _) = contend(turns, 12, &[(0, 8), (1, 8), (70, 8)]);
        assert!(each.iter().all(|&m| (1..=12).contains(&m)), "{each:?}");
        // Every count is back to rest: no GPU wants a turn, none is held or awaited.
        assert_eq!(turns.active.load(Ordering::SeqCst), 0);
        assert_eq!(turns.waiting.load(Ordering::SeqCst), 0);
        for d in &turns.devices {
            assert_eq!(d.wanting.load(Ordering::SeqCst), 0);
            assert_eq!(d.copying.load(Ordering::SeqCst), 0);
            assert_eq!(d.waiting.load(Ordering::SeqCst), 0);
        }
    }

    #[test]
    fn a_gpu_that_stops_wanting_turns_gives_its_share_to_the_others() {
        let turns: &'static Turns = Box::leak(Box::new(Turns::new()));
        // Three GPUs want turns of a budget of 6: two each. GPU 1 holds its two, GPU 2
        // one; GPU 0 takes two and its third thread waits.
        let held: Vec<_> = (0..2).map(|_| turns.take(6, 1)).collect();
        let third = turns.take(6, 2);
        let mut first: Vec<_> = (0..2).map(|_| turns.take(6, 0)).collect();
        assert_eq!(turns.share(6), 2);
        let spawn_waiter = || {
            let (tx, rx) = std::sync::mpsc::channel();
            let waiter = std::thread::spawn(move || {
                let turn = turns.take(6, 0);
                tx.send(()).unwrap();
                turn
            });
            (waiter, rx)
        };
        let waits = |rx: &std::sync::mpsc::Receiver<()>, what: &str| {
            let got = rx.recv_timeout(std::time::Duration::from_millis(200));
            assert!(got.is_err(), "{what}");
        };
        let (waiter, rx) = spawn_waiter();
        waits(&rx, "a third turn for GPU 0 while three GPUs want turns");
        // One of GPU 0's turns given back lets its waiter in, within the share.
        drop(first.pop());
        rx.recv_timeout(std::time::Duration::from_secs(30))
            .expect("a turn given back wakes a waiter of its GPU");
        first.push(waiter.join().unwrap());
        // GPU 2 gives its one turn back while GPU 1 holds two: GPU 2 wants no more, so
        // the other two GPUs' shares grow to three, and a third thread of GPU 0 gets in
        // although none of GPU 0's turns was given back.
        let (waiter, rx) = spawn_waiter();
        waits(&rx, "a third turn for GPU 0 before GPU 2 stops");
        drop(third);
        rx.recv_timeout(std::time::Duration::from_secs(30))
            .expect("the waiter was woken when GPU 2 stopped wanting turns");
        first.push(waiter.join().unwrap());
        assert_eq!(turns.share(6), 3);
        drop(held);
        drop(first);
        assert_eq!(turns.active.load(Ordering::SeqCst), 0);
    }

    #[test]
    fn no_turns_where_one_pool_fills_the_budget_or_threads_are_set() {
        let one = Settings {
            num_threads: 16,
            gpu_threads: 0,
            ..Settings::default()
        };
        if one.copy_budget(available_cpus(), local_processes()) == Some(gpu_threads(&one)) {
            assert!(copy_turn(&one, 0).is_none());
        }
        let fixed = Settings {
            gpu_threads: 8,
            ..Settings::default()
        };
        assert!(copy_turn(&fixed, 0).is_none(), "gpu_threads set: no budget");
    }

    #[test]
    fn each_device_gets_its_own_pool_sized_by_the_setting() {
        let a = device_pool(2, 5).unwrap();
        let b = device_pool(2, 5).unwrap();
        assert!(Arc::ptr_eq(&a, &b), "one pool per device, reused");
        let other = device_pool(2, 6).unwrap();
        assert!(!Arc::ptr_eq(&a, &other), "another device, another pool");
        let settings = Settings {
            num_threads: 2,
            ..Settings::default()
        };
        let host = pool_for(&settings, None).unwrap();
        assert!(!Arc::ptr_eq(&a, &host) && !Arc::ptr_eq(&other, &host));
        assert_eq!(a.current_num_threads(), 2);
        let resized = device_pool(3, 5).unwrap();
        assert_eq!(resized.current_num_threads(), 3);
        assert!(!Arc::ptr_eq(&a, &resized));
        let sizes = device_pool_sizes();
        assert!(
            sizes.contains(&(5, 3)) && sizes.contains(&(6, 2)),
            "{sizes:?}"
        );
        let name = resized.install(|| std::thread::current().name().map(str::to_owned));
        assert!(name.unwrap().starts_with("kvikpy-cuda5-"));
    }
}
