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

/// The copy turns of this process (see [`copy_turn`]): how many threads copy now, how
/// many wait for a turn, and where they wait.
struct Turns {
    copying: AtomicUsize,
    waiting: AtomicUsize,
    lock: Mutex<()>,
    freed: Condvar,
}

static TURNS: ForkLocal<Turns> = ForkLocal::new(|| Turns {
    copying: AtomicUsize::new(0),
    waiting: AtomicUsize::new(0),
    lock: Mutex::new(()),
    freed: Condvar::new(),
});

/// A turn to copy between a file and pinned memory for a GPU transfer, held until
/// dropped; `None` (no waiting) when `settings` sets no [`Settings::copy_budget`] or one
/// GPU's pool alone cannot exceed it.
///
/// Each GPU's pool has up to 16 threads, but on a host where one process reads onto
/// several GPUs at once more copying threads than the budget (32 on 64 cores) only fight
/// over the host's memory: four GPUs read 87 GB/s with 64 threads copying and 93-98 with
/// 32. The turns let one or two GPUs use all their threads and hold four GPUs to the
/// budget in all. A free turn costs two atomic operations (no lock, no system call).
pub(crate) fn copy_turn(settings: &Settings) -> Option<CopyTurn> {
    let budget = settings.copy_budget(available_cpus(), local_processes())?;
    if gpu_threads(settings) >= budget {
        return None; // one GPU's pool alone fills the budget: nothing to share
    }
    Some(TURNS.get().take(budget))
}

impl Turns {
    /// Take a turn, waiting while `budget` threads hold one.
    fn take(&'static self, budget: usize) -> CopyTurn {
        loop {
            let now = self.copying.load(Ordering::SeqCst);
            if now < budget {
                if self
                    .copying
                    .compare_exchange_weak(now, now + 1, Ordering::SeqCst, Ordering::SeqCst)
                    .is_ok()
                {
                    return CopyTurn(self);
                }
                continue;
            }
            // Every turn is taken: wait for one to be given back. `waiting` is raised
            // before `copying` is looked at again, under the lock the giver takes to
            // notify, so a turn given back in between is either seen here or notified.
            let guard = self.lock.lock().unwrap_or_else(|e| e.into_inner());
            self.waiting.fetch_add(1, Ordering::SeqCst);
            let guard = self
                .freed
                .wait_while(guard, |()| self.copying.load(Ordering::SeqCst) >= budget)
                .unwrap_or_else(|e| e.into_inner());
            self.waiting.fetch_sub(1, Ordering::SeqCst);
            drop(guard);
        }
    }
}

/// A turn from [`copy_turn`]; dropping it lets the next thread copy.
pub(crate) struct CopyTurn(&'static Turns);

impl Drop for CopyTurn {
    fn drop(&mut self) {
        let turns = self.0;
        turns.copying.fetch_sub(1, Ordering::SeqCst);
        if turns.waiting.load(Ordering::SeqCst) > 0 {
            let _guard = turns.lock.lock().unwrap_or_else(|e| e.into_inner());
            turns.freed.notify_one();
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

    #[test]
    fn copy_turns_hold_the_threads_copying_to_the_budget() {
        let turns: &'static Turns = Box::leak(Box::new(Turns {
            copying: AtomicUsize::new(0),
            waiting: AtomicUsize::new(0),
            lock: Mutex::new(()),
            freed: Condvar::new(),
        }));
        let budget = 3;
        let most = Arc::new(AtomicUsize::new(0));
        let now = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..12)
            .map(|_| {
                let (most, now) = (Arc::clone(&most), Arc::clone(&now));
                std::thread::spawn(move || {
                    for _ in 0..300 {
                        let turn = turns.take(budget);
                        let n = now.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(n, Ordering::SeqCst);
                        std::thread::sleep(std::time::Duration::from_micros(20));
                        now.fetch_sub(1, Ordering::SeqCst);
                        drop(turn);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        // Twelve threads wanted turns all along: exactly the budget copied at once, no more.
        assert_eq!(most.load(Ordering::SeqCst), budget);
        assert_eq!(turns.copying.load(Ordering::SeqCst), 0);
        assert_eq!(turns.waiting.load(Ordering::SeqCst), 0);
        // A process whose one GPU's pool fills the budget takes no turns at all.
        let one = Settings {
            num_threads: 16,
            gpu_threads: 0,
            ..Settings::default()
        };
        if one.copy_budget(available_cpus(), local_processes()) == Some(gpu_threads(&one)) {
            assert!(copy_turn(&one).is_none());
        }
        let fixed = Settings {
            gpu_threads: 8,
            ..Settings::default()
        };
        assert!(copy_turn(&fixed).is_none(), "gpu_threads set: no budget");
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
