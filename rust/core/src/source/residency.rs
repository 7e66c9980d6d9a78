//! Reads by residency: which parts of a read's aligned middle are in the page cache
//! (`cachestat(2)`, or `mincore` where the kernel lacks it), and the plan that reads the
//! resident parts through the page cache and the rest with O_DIRECT.
//!
//! The rule, per task of a read (see `docs/settings.md`):
//!
//! * A task whose O_DIRECT-able middle (the 4 KiB-aligned blocks wholly inside the file)
//!   is shorter than [`MIN_PROBED`] is read through the page cache, with no probe and no
//!   extra system call.
//! * Otherwise the middle is cut into granules of [`GRANULE`] bytes (the last one takes
//!   the remainder, so every granule is 1 to 2 MiB). Each granule is judged by a sample
//!   of [`SAMPLE`] bytes at its centre: it goes by O_DIRECT when at most 1/16 of the
//!   sample's pages are resident ([`is_cold`]), else through the page cache; neighbouring
//!   granules of one kind are read as one run.
//!
//! A sample, not the whole granule: `cachestat` walks every cached page of the range it
//! is asked about, so on a warm file a 4 MiB question costs about 40 us (measured on a
//! 2-core VM), a 64 KiB one about 1 us, as does any question about a cold range. The
//! centre, not the start: a read through the page cache reads ahead into what follows,
//! which would make the start of a cold granule after a warm one look resident.
//!
//! So a read pays one probe per MiB of its O_DIRECT-able part, each asking about 16
//! pages: about 1 us per MiB, against 300 us (warm, one thread) to 700 us (cold) of
//! reading it.

use std::io;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, AtomicU8, Ordering};

use super::mapping::FileMapping;

/// The smallest aligned middle worth probing. O_DIRECT gains 5-10% over the page cache
/// on a cold read, that is 35-70 us on a 1 MiB read from a 1.4 GB/s disk, against a
/// probe of about 1 us; smaller reads are the ones whose latency matters, and they go
/// through the page cache as they always did, with no extra system call.
pub(crate) const MIN_PROBED: usize = 1 << 20;

/// The granule: no run read by one path is shorter (except a whole middle shorter than
/// it), so a 4 MiB task is at most 4 pieces, never hundreds.
pub(crate) const GRANULE: usize = 1 << 20;

/// The bytes of a granule asked about (16 pages of 4 KiB).
pub(crate) const SAMPLE: usize = 64 << 10;

/// A granule goes by O_DIRECT when at most `1/COLD_DIVISOR` of its sample's pages are
/// resident. O_DIRECT saves at most ~10% of a cold read, while a resident page read by
/// O_DIRECT costs a disk read instead of a memory copy (~30x slower): with 1.4 GB/s
/// buffered, 1.5 GB/s direct and 45 GB/s from the cache, the page cache wins from ~7%
/// resident on.
pub(crate) const COLD_DIVISOR: u64 = 16;

/// One piece of a planned read: `len` bytes at file offset `offset`, by O_DIRECT or not.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Run {
    /// Where the run starts in the file.
    pub offset: u64,
    /// Its length in bytes.
    pub len: usize,
    /// Whether it goes by O_DIRECT (else through the page cache).
    pub direct: bool,
}

/// Whether a range of `pages` pages of which `resident` are cached reads faster by
/// O_DIRECT (see [`COLD_DIVISOR`]).
pub(crate) fn is_cold(resident: u64, pages: u64) -> bool {
    resident.saturating_mul(COLD_DIVISOR) <= pages
}

/// The pages of `page` bytes that `len` bytes at `offset` touch.
pub(crate) fn pages_touched(offset: u64, len: usize, page: usize) -> u64 {
    if len == 0 {
        return 0;
    }
    let page = page as u64;
    let first = offset / page;
    let last = (offset + len as u64 - 1) / page;
    last - first + 1
}

/// The bytes of the granule `at..at+len` asked about: [`SAMPLE`] bytes (4 KiB-aligned)
/// around its centre, or the whole of a shorter granule.
pub(crate) fn sample_of(at: u64, len: usize) -> (u64, usize) {
    if len <= SAMPLE {
        return (at, len);
    }
    let from = (len - SAMPLE) / 2 / 4096 * 4096;
    (at + from as u64, SAMPLE)
}

/// Plan the read of `len` bytes at `start` (the aligned middle of a task): ask `probe`
/// how many pages of a granule's sample are resident (`None`: no answer, read through
/// the page cache), and hand each run, in file order, to `emit`, which reads it and says
/// whether to go on (`false` at the end of the file). Runs cover the range exactly, two
/// neighbours never go the same way, and `probe` is asked once per granule.
///
/// Every granule of a window is probed before any is read: a read through the page
/// cache starts readahead into what follows, which must not make the next granules look
/// resident. A window's classes fit one bit each in a u64.
pub fn plan<E>(
    start: u64,
    len: usize,
    page: usize,
    mut probe: impl FnMut(u64, usize) -> Option<u64>,
    mut emit: impl FnMut(Run) -> Result<bool, E>,
) -> Result<(), E> {
    if len == 0 {
        return Ok(());
    }
    let granules = (len / GRANULE).max(1); // the last one takes the remainder
    let bounds = |k: usize| {
        let glen = if k + 1 == granules {
            len - k * GRANULE
        } else {
            GRANULE
        };
        (start + (k * GRANULE) as u64, glen)
    };
    let mut pending: Option<Run> = None;
    for first in (0..granules).step_by(WINDOW_GRANULES) {
        let window = first..granules.min(first + WINDOW_GRANULES);
        let mut cold = 0u64;
        for k in window.clone() {
            let (at, glen) = bounds(k);
            let (sample_at, sample_len) = sample_of(at, glen);
            let resident = probe(sample_at, sample_len);
            if resident.is_some_and(|r| is_cold(r, pages_touched(sample_at, sample_len, page))) {
                cold |= 1 << (k - first);
            }
        }
        for k in window {
            let (at, glen) = bounds(k);
            let direct = cold & (1 << (k - first)) != 0;
            match pending.as_mut() {
                Some(run) if run.direct == direct => run.len += glen,
                _ => {
                    if let Some(run) = pending.take() {
                        if !emit(run)? {
                            return Ok(());
                        }
                    }
                    pending = Some(Run {
                        offset: at,
                        len: glen,
                        direct,
                    });
                }
            }
        }
    }
    if let Some(run) = pending {
        emit(run)?;
    }
    Ok(())
}

/// Granules probed before any of them is read (see [`plan`]).
const WINDOW_GRANULES: usize = 64;

/// The syscall number of `cachestat(2)` (Linux 6.5; one number on every architecture
/// kvikpy is built for).
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
const SYS_CACHESTAT: libc::c_long = 451;

/// `struct cachestat_range` of `<linux/mman.h>`.
#[repr(C)]
struct CachestatRange {
    off: u64,
    len: u64,
}

/// `struct cachestat` of `<linux/mman.h>`.
#[repr(C)]
#[derive(Default)]
struct Cachestat {
    nr_cache: u64,
    nr_dirty: u64,
    nr_writeback: u64,
    nr_evicted: u64,
    nr_recently_evicted: u64,
}

/// Whether `cachestat` works here: not asked yet, yes, or no (ENOSYS: an older kernel;
/// EPERM: a seccomp filter that does not know it). A forked child inherits the answer,
/// which holds for it too.
static CACHESTAT: AtomicU8 = AtomicU8::new(UNKNOWN);
const UNKNOWN: u8 = 0;
const PRESENT: u8 = 1;
const ABSENT: u8 = 2;

/// Residency probes made by reads by residency since the process started.
static PROBES: AtomicU64 = AtomicU64::new(0);

/// Residency probes made by reads since the process started (tests and diagnostics).
pub fn probes() -> u64 {
    PROBES.load(Ordering::Relaxed)
}

/// Resident pages of `len` bytes of `fd` at `offset`, by `cachestat(2)`.
#[cfg(any(target_arch = "x86_64", target_arch = "aarch64"))]
pub fn cachestat(fd: RawFd, offset: u64, len: usize) -> io::Result<u64> {
    let range = CachestatRange {
        off: offset,
        len: len as u64,
    };
    let mut stat = Cachestat::default();
    // SAFETY: cachestat reads `range` and writes `stat`, both live, correctly laid out
    // structs of the kernel's ABI; an invalid descriptor fails with EBADF.
    let rc = unsafe {
        libc::syscall(
            SYS_CACHESTAT,
            fd as libc::c_uint,
            &range as *const CachestatRange,
            &mut stat as *mut Cachestat,
            0 as libc::c_uint,
        )
    };
    if rc != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(stat.nr_cache)
}

/// Resident pages of `len` bytes of `fd` at `offset`, by `cachestat(2)` (not built for
/// this architecture: always ENOSYS).
#[cfg(not(any(target_arch = "x86_64", target_arch = "aarch64")))]
pub fn cachestat(_fd: RawFd, _offset: u64, _len: usize) -> io::Result<u64> {
    Err(io::Error::from_raw_os_error(libc::ENOSYS))
}

/// How a [`Prober`] asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    /// `cachestat(2)` while the kernel has it, else `mincore`.
    Best,
    /// `mincore` over a mapping of the range (what kernels before 6.5 get).
    Mincore,
}

/// Answers residency questions about one range of a file: by `cachestat`, or by
/// `mincore` over one mapping of the whole range, made on the first question and
/// unmapped when the prober is dropped (one mapping per task costs less than one per
/// question: about 40 us against 65 us for a 4 MiB task, on a 2-core VM).
#[derive(Debug)]
pub struct Prober {
    fd: RawFd,
    start: u64,
    len: usize,
    method: Method,
    mapping: Option<Option<FileMapping>>,
}

impl Prober {
    /// A prober for the `len` bytes of `fd` at `start` (questions stay inside them).
    pub fn new(fd: RawFd, start: u64, len: usize, method: Method) -> Self {
        Self {
            fd,
            start,
            len,
            method,
            mapping: None,
        }
    }

    /// Resident pages among the `len` bytes at `offset` (inside the prober's range), or
    /// `None` when neither way can tell (a file the kernel will not map).
    pub fn resident(&mut self, offset: u64, len: usize) -> Option<u64> {
        PROBES.fetch_add(1, Ordering::Relaxed);
        if self.method == Method::Best && CACHESTAT.load(Ordering::Relaxed) != ABSENT {
            match cachestat(self.fd, offset, len) {
                Ok(n) => {
                    CACHESTAT.store(PRESENT, Ordering::Relaxed);
                    return Some(n);
                }
                Err(e) if matches!(e.raw_os_error(), Some(libc::ENOSYS | libc::EPERM)) => {
                    CACHESTAT.store(ABSENT, Ordering::Relaxed);
                }
                Err(_) => {} // EOPNOTSUPP (hugetlbfs) and the like: ask mincore
            }
        }
        self.by_mincore(offset, len)
    }

    fn by_mincore(&mut self, offset: u64, len: usize) -> Option<u64> {
        let (fd, start, whole) = (self.fd, self.start, self.len);
        let mapping = self
            .mapping
            .get_or_insert_with(|| FileMapping::map(fd, start, whole))
            .as_ref()?;
        let from = mapping.head() + usize::try_from(offset.checked_sub(start)?).ok()?;
        mapping.resident_pages(from, len)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::cell::Cell;
    use std::convert::Infallible;

    /// Resident pages of `offset..offset+len` in a map of one flag per page.
    fn count(map: &[bool], page: usize, offset: u64, len: usize) -> u64 {
        let first = (offset / page as u64) as usize;
        let n = pages_touched(offset, len, page) as usize;
        map[first..first + n].iter().filter(|&&r| r).count() as u64
    }

    /// The plan written plainly: each granule by its sample, neighbours of one kind merged.
    fn reference(map: &[bool], page: usize, start: u64, len: usize) -> Vec<Run> {
        let granules = (len / GRANULE).max(1);
        let mut runs: Vec<Run> = Vec::new();
        for k in 0..granules {
            let at = start + (k * GRANULE) as u64;
            let glen = if k + 1 == granules {
                len - k * GRANULE
            } else {
                GRANULE
            };
            let (s_at, s_len) = sample_of(at, glen);
            let direct = is_cold(
                count(map, page, s_at, s_len),
                pages_touched(s_at, s_len, page),
            );
            match runs.last_mut() {
                Some(run) if run.direct == direct => run.len += glen,
                _ => runs.push(Run {
                    offset: at,
                    len: glen,
                    direct,
                }),
            }
        }
        runs
    }

    fn planned(map: &[bool], page: usize, start: u64, len: usize) -> (Vec<Run>, usize) {
        let probes = Cell::new(0usize);
        let mut runs = Vec::new();
        plan(
            start,
            len,
            page,
            |at, n| {
                probes.set(probes.get() + 1);
                Some(count(map, page, at, n))
            },
            |run| {
                runs.push(run);
                Ok::<bool, Infallible>(true)
            },
        )
        .unwrap();
        (runs, probes.get())
    }

    /// A residency map of `pages` pages: runs of resident and missing pages whose lengths
    /// come from `runs` (so cold, warm, half-warm and speckled maps all occur).
    fn map_of(pages: usize, first: bool, runs: &[usize]) -> Vec<bool> {
        let mut map = Vec::with_capacity(pages);
        let mut resident = first;
        for &n in runs.iter().cycle() {
            if map.len() >= pages {
                break;
            }
            map.extend(std::iter::repeat_n(resident, n.min(pages - map.len())));
            resident = !resident;
        }
        map
    }

    proptest! {
        #[test]
        fn plan_matches_granule_by_granule_and_stays_cheap(
            page_shift in prop::sample::select(vec![12u32, 14, 16]),
            start_blocks in 0u64..64,
            len_blocks in 1usize..(40 << 8),
            first in any::<bool>(),
            runs in prop::collection::vec(prop_oneof![1usize..8, 8usize..600, 600usize..5000], 1..12),
        ) {
            let page = 1usize << page_shift;
            let start = start_blocks * 4096;
            let len = len_blocks * 4096;
            let pages = pages_touched(start, len, page) as usize + (start / page as u64) as usize;
            let map = map_of(pages, first, &runs);
            let (got, probes) = planned(&map, page, start, len);
            prop_assert_eq!(&got, &reference(&map, page, start, len));
            // Runs cover the range in order, and two neighbours never go the same way.
            let mut at = start;
            for pair in got.windows(2) {
                prop_assert_ne!(pair[0].direct, pair[1].direct);
            }
            for run in &got {
                prop_assert_eq!(run.offset, at);
                prop_assert!(run.len >= GRANULE.min(len));
                at += run.len as u64;
            }
            prop_assert_eq!(at, start + len as u64);
            // One probe per granule, each about one sample.
            prop_assert_eq!(probes, (len / GRANULE).max(1));
            // A range all cold or all warm is one run.
            let all = count(&map, page, start, len);
            if all == 0 || all == pages_touched(start, len, page) {
                prop_assert_eq!(got.len(), 1);
                prop_assert_eq!(got[0].direct, all == 0);
            }
        }

        #[test]
        fn probe_failures_read_through_the_page_cache(
            len_blocks in 256usize..(20 << 8),
            fail_every in 1usize..5,
        ) {
            let len = len_blocks * 4096;
            let calls = Cell::new(0usize);
            let mut runs = Vec::new();
            plan(0, len, 4096, |_, _| {
                calls.set(calls.get() + 1);
                // Every `fail_every`th granule has no answer; the others are cold.
                if calls.get() % fail_every == 0 { None } else { Some(0) }
            }, |run| { runs.push(run); Ok::<bool, Infallible>(true) }).unwrap();
            prop_assert_eq!(runs.iter().map(|r| r.len).sum::<usize>(), len);
            // Granules without an answer go through the page cache.
            prop_assert_eq!(runs[0].direct, fail_every != 1);
            let mut none = 0;
            plan(0, len, 4096, |_, _| None, |run| {
                prop_assert!(!run.direct && run.len == len);
                none += 1;
                Ok(true)
            })?;
            prop_assert_eq!(none, 1);
        }
    }

    #[test]
    fn emit_can_stop_the_plan() {
        // Alternating cold and warm granules; stop after the first run.
        let page = 4096;
        let granule_pages = GRANULE / page;
        let map: Vec<bool> = (0..8 * granule_pages)
            .map(|p| (p / granule_pages) % 2 == 1)
            .collect();
        assert_eq!(planned(&map, page, 0, 8 * GRANULE).0.len(), 8);
        let mut emitted = 0;
        plan(
            0,
            8 * GRANULE,
            page,
            |at, n| Some(count(&map, page, at, n)),
            |_| {
                emitted += 1;
                Ok::<bool, Infallible>(false)
            },
        )
        .unwrap();
        assert_eq!(emitted, 1);
    }

    #[test]
    fn samples_sit_at_the_centre() {
        assert_eq!(
            sample_of(0, GRANULE),
            ((GRANULE - SAMPLE) as u64 / 2, SAMPLE)
        );
        assert_eq!(sample_of(4096, 8192), (4096, 8192));
        let (at, n) = sample_of(1 << 30, GRANULE + 5 * 4096);
        assert!(at % 4096 == 0 && n == SAMPLE && at > 1 << 30);
    }

    #[test]
    fn cold_rule() {
        assert!(is_cold(0, 256) && is_cold(16, 256) && !is_cold(17, 256));
        assert!(!is_cold(1, 1) && is_cold(0, 0));
        assert_eq!(pages_touched(4095, 2, 4096), 2);
        assert_eq!(pages_touched(0, 0, 4096), 0);
    }
}
