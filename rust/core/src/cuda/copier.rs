//! One copy thread per GPU: the thread that queues the large DMAs between pinned bounce
//! buffers and that device, and tells each waiting I/O thread when its copy has landed.
//!
//! When every I/O thread queues its own copies on its own stream and waits for each with a
//! driver call, the driver's calls contend: on a host with 4 GPUs and 64 cores, 16 pool
//! threads spent 44% of their time in `cuStreamSynchronize` and 8% queueing copies, and
//! 64 threads took 1.4 ms to queue one 4 MiB copy, so one process delivered about 50 GB/s
//! in all whether it read onto one GPU or four. Here each device has one thread, its
//! context bound once, one stream per direction and a pool of events: I/O threads hand it
//! a copy ([`Copier::copy`]) and wait on a [`Ticket`] (a mutex and a condition variable,
//! no driver call), so they go back to reading files while the copy runs, and the driver
//! sees one caller per device.

use std::collections::VecDeque;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};

use cudarc::driver::sys;

use super::device::{bind, device};
use super::driver::{check, device_count};
use crate::error::{Error, Result};

/// Which way a queued copy moves bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyKind {
    /// From pinned host memory to the device.
    HostToDevice,
    /// From the device to pinned host memory.
    DeviceToHost,
}

#[derive(Default)]
struct TicketState {
    done: bool,
    error: Option<Error>,
}

#[derive(Default)]
struct TicketInner {
    state: Mutex<TicketState>,
    landed: Condvar,
}

impl TicketInner {
    fn lock(&self) -> MutexGuard<'_, TicketState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn finish(&self, outcome: Result<()>) {
        let mut state = self.lock();
        state.done = true;
        state.error = outcome.err();
        drop(state);
        self.landed.notify_all();
    }
}

/// One queued copy's completion: [`Ticket::wait`] returns once the copy has landed (or
/// failed). Dropping a ticket does not wait: whoever owns the copy's memory waits first.
pub struct Ticket(Arc<TicketInner>);

impl Ticket {
    /// Block until the copy has completed; its error, if it failed.
    pub fn wait(&self) -> Result<()> {
        let mut state = self.0.lock();
        while !state.done {
            state = self
                .0
                .landed
                .wait(state)
                .unwrap_or_else(|e| e.into_inner());
        }
        match &state.error {
            None => Ok(()),
            Some(e) => Err(e.clone()),
        }
    }
}

/// A copy waiting for, or in, the device's copy thread.
struct Job {
    kind: CopyKind,
    device: u64,
    host: usize,
    len: usize,
    ticket: Arc<TicketInner>,
}

#[derive(Default)]
struct Queue {
    pending: VecDeque<Job>,
    /// Set when the copy thread could not start or stopped: new copies are refused.
    dead: Option<Error>,
}

/// A device's copy thread and its queue (see the module documentation).
pub struct Copier {
    ordinal: usize,
    queue: Mutex<Queue>,
    wake: Condvar,
}

impl std::fmt::Debug for Copier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Copier")
            .field("ordinal", &self.ordinal)
            .finish_non_exhaustive()
    }
}

/// Every device's copy thread slot, by ordinal (sized to the device count on first use).
static COPIERS: OnceLock<Box<[OnceLock<&'static Copier>]>> = OnceLock::new();

/// Device `ordinal`'s copy thread, started on first use and kept for the life of the
/// process.
pub fn copier(ordinal: usize) -> Result<&'static Copier> {
    device(ordinal)?; // checks the ordinal
    let slots = COPIERS.get_or_init(|| (0..device_count()).map(|_| OnceLock::new()).collect());
    let slot = slots.get(ordinal).ok_or_else(|| {
        Error::InvalidArgument(format!("CUDA device {ordinal} does not exist"))
    })?;
    Ok(slot.get_or_init(|| {
        let copier: &'static Copier = Box::leak(Box::new(Copier {
            ordinal,
            queue: Mutex::new(Queue::default()),
            wake: Condvar::new(),
        }));
        let started = std::thread::Builder::new()
            .name(format!("kvikpy-copy-{ordinal}"))
            .spawn(move || copier.run());
        if let Err(e) = started {
            copier.lock().dead = Some(Error::InvalidArgument(format!(
                "could not start the copy thread of cuda:{ordinal} ({e})"
            )));
        }
        copier
    }))
}

impl Copier {
    fn lock(&self) -> MutexGuard<'_, Queue> {
        self.queue.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queue a copy of `len` bytes between pinned host memory at `host` and device memory
    /// at `device`; the returned ticket says when it has landed.
    ///
    /// # Safety
    /// `host..host+len` must be pinned host memory and `device..device+len` device memory
    /// of this copier's device, both valid (and, for the destination, unused by anyone
    /// else) until the ticket's [`Ticket::wait`] has returned.
    pub unsafe fn copy(
        &self,
        kind: CopyKind,
        device: u64,
        host: *const u8,
        len: usize,
    ) -> Result<Ticket> {
        let ticket = Arc::new(TicketInner::default());
        let mut queue = self.lock();
        if let Some(e) = &queue.dead {
            return Err(e.clone());
        }
        queue.pending.push_back(Job {
            kind,
            device,
            host: host as usize,
            len,
            ticket: Arc::clone(&ticket),
        });
        drop(queue);
        self.wake.notify_one();
        Ok(Ticket(ticket))
    }

    /// The copy thread: bind the device once, then queue, watch and retire copies until
    /// the process ends. A panic (a driver gone at exit) fails every copy and stops it.
    fn run(&self) {
        let mut inflight: Vec<(sys::CUevent, Job)> = Vec::new();
        let outcome = catch_unwind(AssertUnwindSafe(|| self.serve(&mut inflight)));
        let why = match outcome {
            Ok(Err(e)) => e,
            _ => Error::InvalidArgument(format!(
                "the copy thread of cuda:{} stopped; restart the process",
                self.ordinal
            )),
        };
        let pending: Vec<Job> = {
            let mut queue = self.lock();
            queue.dead = Some(why.clone());
            queue.pending.drain(..).collect()
        };
        for job in pending
            .into_iter()
            .chain(inflight.into_iter().map(|(_, j)| j))
        {
            job.ticket.finish(Err(why.clone()));
        }
    }

    fn serve(&self, inflight: &mut Vec<(sys::CUevent, Job)>) -> Result<()> {
        let _context = bind(self.ordinal)?;
        let mut streams = [std::ptr::null_mut(); 2];
        for stream in &mut streams {
            // SAFETY: the device's context is current; `stream` is an out-pointer.
            check("cuStreamCreate", unsafe {
                sys::cuStreamCreate(
                    stream,
                    sys::CUstream_flags::CU_STREAM_NON_BLOCKING as u32,
                )
            })?;
        }
        let mut events: Vec<sys::CUevent> = Vec::new();
        let mut fresh: Vec<Job> = Vec::new();
        loop {
            {
                let mut queue = self.lock();
                while queue.pending.is_empty() && inflight.is_empty() {
                    queue = self.wake.wait(queue).unwrap_or_else(|e| e.into_inner());
                }
                fresh.extend(queue.pending.drain(..));
            }
            for job in fresh.drain(..) {
                match Self::start(&streams, &mut events, &job) {
                    Ok(event) => inflight.push((event, job)),
                    Err(e) => job.ticket.finish(Err(e)),
                }
            }
            let before = inflight.len();
            let mut k = 0;
            while k < inflight.len() {
                // SAFETY: the event is live and was recorded on this context.
                let rc = unsafe { sys::cuEventQuery(inflight[k].0) };
                if rc == sys::CUresult::CUDA_ERROR_NOT_READY {
                    k += 1;
                    continue;
                }
                let (event, job) = inflight.remove(k);
                events.push(event);
                job.ticket.finish(check("cuEventQuery", rc));
            }
            if inflight.is_empty() || inflight.len() < before {
                continue;
            }
            if !self.lock().pending.is_empty() {
                continue; // queue the newcomers behind the copies in flight first
            }
            // Nothing landed and nothing new: wait for the oldest copy (the driver's
            // wait; copies queued behind it keep the link busy meanwhile).
            // SAFETY: the event is live and was recorded on this context.
            let _ = unsafe { sys::cuEventSynchronize(inflight[0].0) };
        }
    }

    /// Queue `job`'s copy on its direction's stream and record an event after it.
    fn start(
        streams: &[sys::CUstream; 2],
        events: &mut Vec<sys::CUevent>,
        job: &Job,
    ) -> Result<sys::CUevent> {
        let stream = match job.kind {
            CopyKind::HostToDevice => streams[0],
            CopyKind::DeviceToHost => streams[1],
        };
        let rc = match job.kind {
            // SAFETY: `Copier::copy`'s caller keeps both ranges valid until the ticket
            // completes, which happens only after the event recorded below has.
            CopyKind::HostToDevice => unsafe {
                sys::cuMemcpyHtoDAsync_v2(job.device, job.host as *const _, job.len, stream)
            },
            // SAFETY: as above, with the roles of host and device swapped.
            CopyKind::DeviceToHost => unsafe {
                sys::cuMemcpyDtoHAsync_v2(job.host as *mut _, job.device, job.len, stream)
            },
        };
        check(
            match job.kind {
                CopyKind::HostToDevice => "cuMemcpyHtoDAsync",
                CopyKind::DeviceToHost => "cuMemcpyDtoHAsync",
            },
            rc,
        )?;
        let event = match events.pop() {
            Some(event) => event,
            None => {
                let mut event = std::ptr::null_mut();
                // SAFETY: the device's context is current; `event` is an out-pointer.
                check("cuEventCreate", unsafe {
                    sys::cuEventCreate(
                        &mut event,
                        sys::CUevent_flags::CU_EVENT_DISABLE_TIMING as u32,
                    )
                })?;
                event
            }
        };
        // SAFETY: both handles are live and belong to the current context.
        if let Err(e) = check("cuEventRecord", unsafe { sys::cuEventRecord(event, stream) }) {
            events.push(event);
            // The copy is queued but cannot be watched: wait for it here.
            // SAFETY: the stream is live.
            let _ = unsafe { sys::cuStreamSynchronize(stream) };
            return Err(e);
        }
        Ok(event)
    }
}
