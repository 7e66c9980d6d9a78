//! Batches (`cuFileBatchIO*`): a batch has the capacity given at set-up; each submit hands
//! its entries to a thread that performs them in order, and every completed entry becomes
//! an event (cookie, `CUFILE_COMPLETE` or `CUFILE_FAILED`, and `ret`) that
//! `cuFileBatchIOGetStatus` collects. Cancelling or destroying stops entries not yet
//! started; they complete as `CUFILE_CANCELED`.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use cudarc::cufile::sys::{CUfileOpError, CUfileStatus_t};

use crate::error::Fail;
use crate::io;

/// One entry of a submit, checked and with its descriptor resolved.
#[derive(Debug, Clone, Copy)]
pub struct Entry {
    /// The registered file's descriptor, taken at submit time.
    pub fd: i32,
    /// True for `CUFILE_WRITE`.
    pub write: bool,
    /// `devPtr_base + devPtr_offset`.
    pub addr: usize,
    /// Bytes to transfer.
    pub size: usize,
    /// File offset.
    pub file_offset: i64,
    /// The caller's cookie, returned in the event.
    pub cookie: usize,
}

/// A finished entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    /// The entry's cookie.
    pub cookie: usize,
    /// `CUFILE_COMPLETE`, `CUFILE_FAILED` or `CUFILE_CANCELED`.
    pub status: CUfileStatus_t,
    /// Bytes transferred; for a failure the result of the equivalent `cuFileRead` /
    /// `cuFileWrite` (-1 or a negated `CUfileOpError`) as a `size_t`.
    pub ret: usize,
}

#[derive(Default)]
struct Queue {
    /// Submitted entries whose events have not been collected yet.
    outstanding: usize,
    /// Events ready to be collected.
    done: VecDeque<Event>,
}

/// A batch set up by `cuFileBatchIOSetUp`.
pub struct Batch {
    capacity: usize,
    queue: Mutex<Queue>,
    ready: Condvar,
    cancelled: AtomicBool,
}

impl Batch {
    /// A batch for up to `capacity` outstanding entries.
    pub fn new(capacity: usize) -> Batch {
        Batch {
            capacity,
            queue: Mutex::new(Queue::default()),
            ready: Condvar::new(),
            cancelled: AtomicBool::new(false),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Stops entries not yet started (they complete as cancelled).
    pub fn cancel(&self) {
        self.cancelled.store(true, Ordering::SeqCst);
    }

    /// Starts `entries` on a thread; `CU_FILE_BATCH_FULL` when they do not fit beside the
    /// entries still outstanding.
    ///
    /// # Safety
    /// Every entry's buffer must stay valid (writable for reads) until its event is
    /// collected, as for the real library.
    pub unsafe fn submit(self: &Arc<Self>, entries: Vec<Entry>) -> Result<(), Fail> {
        {
            let mut queue = self.lock();
            if queue.outstanding + entries.len() > self.capacity {
                return Err(Fail::op(CUfileOpError::CU_FILE_BATCH_FULL));
            }
            queue.outstanding += entries.len();
        }
        self.cancelled.store(false, Ordering::SeqCst);
        let batch = Arc::clone(self);
        let spawned = std::thread::Builder::new()
            .name("cufile-standin-batch".into())
            .spawn(move || {
                for entry in entries {
                    let event = batch.perform(entry);
                    batch.lock().done.push_back(event);
                    batch.ready.notify_all();
                }
            });
        if spawned.is_err() {
            return Err(Fail::op(CUfileOpError::CU_FILE_INTERNAL_BATCH_SUBMIT_ERROR));
        }
        Ok(())
    }

    fn perform(&self, entry: Entry) -> Event {
        if self.cancelled.load(Ordering::SeqCst) {
            return Event {
                cookie: entry.cookie,
                status: CUfileStatus_t::CUFILE_CANCELED,
                ret: 0,
            };
        }
        let result = std::panic::catch_unwind(|| {
            if entry.write {
                // SAFETY: submit's caller keeps the buffer valid until the event is collected.
                unsafe { io::write(entry.fd, entry.addr, entry.size, entry.file_offset) }
            } else {
                // SAFETY: as above.
                unsafe { io::read(entry.fd, entry.addr, entry.size, entry.file_offset) }
            }
        })
        .unwrap_or(Err(Fail::op(CUfileOpError::CU_FILE_INTERNAL_ERROR)));
        match result {
            Ok(n) => Event {
                cookie: entry.cookie,
                status: CUfileStatus_t::CUFILE_COMPLETE,
                ret: n,
            },
            Err(fail) => Event {
                cookie: entry.cookie,
                status: CUfileStatus_t::CUFILE_FAILED,
                ret: fail.to_ssize() as usize,
            },
        }
    }

    /// Waits until at least `min_nr` events are ready (at most as many as are outstanding)
    /// or `timeout` passes (None: no limit), then takes up to `max_nr` of them.
    pub fn collect(&self, min_nr: usize, max_nr: usize, timeout: Option<Duration>) -> Vec<Event> {
        let deadline = timeout.map(|t| Instant::now() + t);
        let mut queue = self.lock();
        loop {
            let wanted = min_nr.min(queue.outstanding);
            if queue.done.len() >= wanted {
                break;
            }
            match deadline {
                None => {
                    queue = self
                        .ready
                        .wait(queue)
                        .unwrap_or_else(PoisonError::into_inner)
                }
                Some(deadline) => {
                    let now = Instant::now();
                    if now >= deadline {
                        break;
                    }
                    queue = self
                        .ready
                        .wait_timeout(queue, deadline - now)
                        .unwrap_or_else(PoisonError::into_inner)
                        .0;
                }
            }
        }
        let take = max_nr.min(queue.done.len());
        let events: Vec<Event> = queue.done.drain(..take).collect();
        queue.outstanding -= events.len();
        events
    }
}
