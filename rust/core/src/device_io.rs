//! Device reads and writes: a source's own device path where it has one, else the bounce
//! ring, double-buffered per task (more slots for the small pieces of reads onto several
//! GPUs) so the file I/O of one chunk overlaps the DMA of the previous one; and
//! stream-ordered transfers.

use crate::cuda::{self, Lane};
use crate::error::Result;
use crate::future::{run_caught, IoFuture};
use crate::profile::{self, Phase};
use crate::ring::{
    pinned_buffers_ordered, stage, staging_capacity, Chunk, Chunks, Ring, DOUBLE, MAX_SLOTS,
};
use crate::settings::Settings;
use crate::source::{Direct, Keepalive, Ordered, Source};
use crate::span::{DeviceSpan, Span};
use crate::tasks::{align_up, AlignedSplit, DIRECT_IO_ALIGNMENT};
use crate::vocab::Direction;

/// Chunks per task the pipeline aims for: enough to overlap, few enough to keep each DMA
/// large.
const CHUNKS_PER_TASK: usize = 4;
/// Smallest chunk worth a DMA of its own when few threads run: then overlapping file I/O
/// with DMA inside each task is what keeps the link busy.
const MIN_CHUNK_FEW_THREADS: usize = 1 << 20;
/// Smallest chunk with many threads: other threads already overlap the DMAs, and every
/// chunk costs driver calls that the threads contend for. Measured on an H100 with 16
/// threads and 4 MiB tasks: 1 MiB chunks read at 0.79x kvikio, whole-task chunks at par.
const MIN_CHUNK_MANY_THREADS: usize = 4 << 20;
/// From this many threads on, chunks are at least `MIN_CHUNK_MANY_THREADS`.
const MANY_THREADS: usize = 4;
/// The piece of a local read while two or more GPUs of the process take copy turns (see
/// [`crate::pool::copy_turn`]), over [`SHARED_STAGING`]: every byte is copied from the page
/// cache into a pinned buffer and read out of it by a DMA, and with many threads busy
/// that is fastest while their buffers fit in the CPU's cache. One process onto four
/// H100s (64 cores, 16 threads per GPU) read 81.4 GB/s in 1 MiB pieces over two buffers
/// where 8 threads per GPU in 4 MiB pieces over one read 64.2, in one run (the same
/// pieces set by hand: 96.0-99.1 against 77.7-94.4 on four H100s or H200s).
const SHARED_PIECE: usize = 1 << 20;

/// Pinned bytes the busy threads of a process reading onto several GPUs hold together in
/// [`SHARED_PIECE`]s: each read's ring has this divided among the threads, two to four
/// slots. A read waits for the DMA of a slot before it fills it again, and with many
/// threads queueing DMAs on one GPU that DMA can still be queued; fewer busy threads each
/// get more slots for the same bytes in the cache. One process onto two H100s (32 busy
/// threads, 64 cores) read 77.4 GB/s over four slots against 67.6 over two, in one run,
/// where four GPUs (64 busy threads) read slower over four (84.0 against 105.3) and three
/// (96.2): their buffers no longer fit the cache.
const SHARED_STAGING: usize = 128 << 20;

/// The piece of a `len`-byte transfer that one ring slot carries, at least the source's
/// `min_device_chunk` and at most one bounce buffer.
///
/// Writes with many threads move a whole task (up to a bounce buffer) per chunk, as
/// kvikio does: one download, then one `pwrite` of it all. Other threads already overlap
/// the downloads, and a write is paced by the disk, where a larger `pwrite` (with
/// O_DIRECT, a larger request in flight) beats overlapping a download that takes a
/// twentieth of its time. `write_chunk_size` (`KVIKPY_WRITE_CHUNK_SIZE`) overrides the
/// choice for writes, `read_chunk_size` (`KVIKPY_READ_CHUNK_SIZE`) for reads.
fn chunk_size(len: usize, settings: &Settings, source_min: usize, direction: Direction) -> usize {
    let threads = crate::pool::gpu_threads(settings);
    let wanted = match direction {
        Direction::Write if settings.write_chunk_size > 0 => {
            align_up(settings.write_chunk_size as u64, DIRECT_IO_ALIGNMENT) as usize
        }
        Direction::Write if threads >= MANY_THREADS => len,
        Direction::Read if settings.read_chunk_size > 0 => {
            align_up(settings.read_chunk_size as u64, DIRECT_IO_ALIGNMENT) as usize
        }
        _ => {
            let piece = align_up(len.div_ceil(CHUNKS_PER_TASK) as u64, DIRECT_IO_ALIGNMENT);
            let floor = if threads >= MANY_THREADS {
                MIN_CHUNK_MANY_THREADS
            } else {
                MIN_CHUNK_FEW_THREADS
            };
            (piece as usize).max(floor)
        }
    };
    wanted
        .max(source_min)
        .min(staging_capacity(settings))
        .max(1)
}

/// How a device transfer of `len` bytes moves through pinned memory: `(chunk, slots)`,
/// its pieces and the buffers of the ring they cycle through. With many threads, other
/// threads already overlap each one's DMAs: a read takes one slot, so that the process's
/// pinned buffers in use, which every byte is copied into and read out of by the DMA,
/// stay few enough to sit in the CPU's cache (one process onto two H200s: 16 MiB batch
/// pieces read over two 4 MiB slots at 60-65 GB/s, over one at 78-80). A chunk size set
/// by `KVIKPY_READ_CHUNK_SIZE` reads over two.
///
/// `shared`: for a read while two or more of the process's GPUs take copy turns, the
/// threads that may be copying at once (see [`crate::pool::copying_threads`]). Such a
/// read moves in [`SHARED_PIECE`]s (the source's own minimum piece and the buffer size
/// bound it) over [`SHARED_STAGING`] shared among those threads, two to [`MAX_SLOTS`]
/// buffers each; a piece size set by `KVIKPY_READ_CHUNK_SIZE` stays the one, over two.
fn pieces(
    len: usize,
    settings: &Settings,
    source_min: usize,
    direction: Direction,
    shared: Option<usize>,
) -> (usize, usize) {
    let read = direction == Direction::Read;
    let shared = shared.filter(|_| read && settings.read_chunk_size == 0);
    let chunk = if shared.is_some() {
        SHARED_PIECE.max(source_min).min(staging_capacity(settings))
    } else {
        chunk_size(len, settings, source_min, direction)
    };
    let many = crate::pool::gpu_threads(settings) >= MANY_THREADS
        && settings.read_chunk_size == 0
        && shared.is_none();
    let slots = if len <= chunk || (many && read) {
        1
    } else if let Some(threads) = shared {
        // Never more than two full bounce buffers' worth (see `pinned_buffers_for`).
        let within = DOUBLE.saturating_mul(staging_capacity(settings)) / chunk.max(1);
        (SHARED_STAGING / threads.max(1).saturating_mul(chunk))
            .min(within)
            .clamp(DOUBLE, MAX_SLOTS)
    } else {
        DOUBLE
    };
    (chunk, slots)
}

/// How a local read of whole `task_size` tasks moves while `gpus` GPUs of this process
/// read at once, at `settings`: `(piece, buffers per read)`, or `None` where it moves as
/// on one GPU alone (fewer than two GPUs, no copy turns to take: see
/// [`crate::pool::turn_budget`]) or in the pieces `KVIKPY_READ_CHUNK_SIZE` sets. The rule
/// `kvikpy info` prints.
pub fn shared_pieces(settings: &Settings, gpus: usize) -> Option<(usize, usize)> {
    if gpus < 2 || settings.read_chunk_size > 0 {
        return None;
    }
    crate::pool::turn_budget(settings)?;
    let threads = crate::pool::copying_threads(settings, gpus);
    Some(pieces(
        settings.task_size.max(1),
        settings,
        0,
        Direction::Read,
        Some(threads),
    ))
}

/// Pinned bytes one device read task of `task_size` bytes holds at once through
/// [`via_ring`] (its ring's slots, each a buffer of [`crate::ring::pinned_need`] for its
/// chunk), at `settings`: the more of a local file's (no minimum chunk) and a remote
/// one's (whole tasks).
pub fn task_staging(settings: &Settings) -> usize {
    let len = settings.task_size.max(1);
    [0, usize::MAX]
        .into_iter()
        .map(|source_min| {
            // A task alone on its GPU holds the most: one whole-task piece (4 MiB + 4 KiB
            // at the defaults). The small pieces of several GPUs at once hold up to four
            // of `SHARED_PIECE` (4 MiB + 16 KiB), which a budget bounds as it does any.
            let (chunk, slots) = pieces(len, settings, source_min, Direction::Read, None);
            slots.saturating_mul(crate::ring::pinned_need(settings, chunk.min(len)))
        })
        .max()
        .unwrap_or(0)
}

/// The staging a checkpoint load would hold at `settings` without a budget, in bytes:
/// `pinned`, of the pinned pool of one GPU (the GPU pool's threads, each with the ring
/// slots of one `task_size` task: [`task_staging`]), and `host`, of the
/// host pool (the I/O pool's threads, each with one host bounce buffer).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Demand {
    /// Pinned bytes, per GPU.
    pub pinned: usize,
    /// Host bounce-buffer bytes.
    pub host: usize,
}

/// See [`Demand`].
pub fn staging_demand(settings: &Settings) -> Demand {
    let gpu_threads = crate::pool::gpu_threads(settings);
    Demand {
        pinned: gpu_threads.saturating_mul(task_staging(settings)),
        host: settings
            .num_threads
            .saturating_mul(settings.bounce_capacity()),
    }
}

/// [`crate::staging::split`] of `settings`' `checkpoint_staging` for a load into GPU memory (`gpu`: the
/// pinned demand of one GPU), host memory (`host`: the host pool's), or both (their sum).
pub fn checkpoint_split(settings: &Settings, gpu: bool, host: bool) -> (usize, usize) {
    let d = staging_demand(settings);
    let mut wanted = 0usize;
    if gpu {
        wanted = wanted.saturating_add(d.pinned);
    }
    if host {
        wanted = wanted.saturating_add(d.host);
    }
    crate::staging::split(settings.checkpoint_staging, wanted)
}

/// Move `span.len()` bytes between `source` at `offset` and host or device memory, in
/// the calling thread: one task of a request, or one piece of a batch request. The count
/// is short only where a read reaches the end of the file.
pub fn transfer_span(
    source: &(dyn Source + 'static),
    direction: Direction,
    span: Span,
    offset: u64,
    settings: &Settings,
) -> Result<usize> {
    match span {
        Span::Host(host) => source.transfer_host(direction, host, offset, settings),
        Span::Device(device) => transfer(source, direction, device, offset, settings),
    }
}

/// Move `span.len()` bytes between `source` at `offset` and device memory, in the calling
/// thread; the count is short only where a read reaches the end of the file.
pub fn transfer(
    source: &dyn Source,
    direction: Direction,
    span: DeviceSpan,
    offset: u64,
    settings: &Settings,
) -> Result<usize> {
    if span.len == 0 {
        return Ok(0);
    }
    // Declared first, so dropped last: the ring drains before the caller's context comes
    // back.
    let context = profile::time(Phase::Bind, || cuda::bind(span.ordinal))?;
    let lane = profile::time(Phase::Bind, || cuda::thread_stream(&context))?;
    let moved = match source.device_direct(direction, span, offset, settings, lane)? {
        Direct::Complete(n) => return Ok(n),
        Direct::Partial(n) => n,
        Direct::NotUsed => 0,
        Direct::Edges { head, middle } => {
            return around_edges(
                source, direction, span, offset, settings, lane, head, middle,
            )
        }
    };
    let rest = span.sub(moved, span.len - moved);
    Ok(moved
        + via_ring(
            source,
            direction,
            rest,
            offset + moved as u64,
            settings,
            lane,
        )?)
}

/// A transfer whose source moves only the aligned middle ([`Direct::Edges`]): the head
/// through the ring, the middle through [`Source::device_aligned`], the tail through the
/// ring, in file order, stopping at the end of the file.
#[allow(clippy::too_many_arguments)]
fn around_edges(
    source: &dyn Source,
    direction: Direction,
    span: DeviceSpan,
    offset: u64,
    settings: &Settings,
    lane: Lane<'_>,
    head: usize,
    middle: usize,
) -> Result<usize> {
    let split = AlignedSplit {
        head,
        middle,
        tail: span.len - head - middle,
    };
    split.move_in_order(|at, len, aligned| {
        let part = span.sub(at, len);
        let part_offset = offset + at as u64;
        if aligned {
            source.device_aligned(direction, part, part_offset)
        } else {
            via_ring(source, direction, part, part_offset, settings, lane)
        }
    })
}

/// Move `span.len()` bytes between `source` at `offset` and device memory through the
/// bounce ring: the source's host reads or writes, double-buffered against the DMAs on
/// `lane`. The device path of every source that has no direct one, and the unaligned
/// edges of those that do.
pub fn via_ring(
    source: &dyn Source,
    direction: Direction,
    span: DeviceSpan,
    offset: u64,
    settings: &Settings,
    lane: Lane<'_>,
) -> Result<usize> {
    if span.len == 0 {
        return Ok(0);
    }
    // A read holds its GPU's copy turn from before its buffers are taken until its last
    // DMA has landed (see [`crate::pool::copy_turn`]); a write takes one per `pwrite`.
    let _turn = match direction {
        Direction::Read => crate::pool::copy_turn(settings, span.ordinal),
        Direction::Write => None,
    };
    // Reads of several GPUs at once, each holding a turn, move in small pieces.
    let shared = _turn.as_ref().and_then(|_| {
        let gpus = crate::pool::gpus_copying();
        (gpus >= 2).then(|| crate::pool::copying_threads(settings, gpus))
    });
    let (chunk, slots) = pieces(
        span.len,
        settings,
        source.min_device_chunk(),
        direction,
        shared,
    );
    // A checkpoint load's task stages in buffers that fit its staging budget together,
    // so that it waits for room rather than going alone past the budget.
    let chunk = match settings.staging.budget() {
        Some(budget) => chunk.min(budget.slot_bytes(slots, DIRECT_IO_ALIGNMENT)),
        None => chunk,
    };
    let mut ring = profile::time(Phase::Buffers, || {
        Ring::pinned_for(lane, slots, settings, chunk.min(span.len))
    })?;
    // The ring holds this task's staging reservation, if any: the host I/O below it
    // reserves nothing more (see `crate::staging`).
    let settings = &*settings.unbudgeted();
    let pipeline = Pipeline {
        source,
        span,
        offset,
        settings,
        chunk,
    };
    match direction {
        Direction::Read => pipeline.read(&mut ring),
        Direction::Write => pipeline.write(&mut ring),
    }
}

/// One device transfer through the ring, cut into chunks of `chunk` bytes.
struct Pipeline<'a> {
    source: &'a dyn Source,
    span: DeviceSpan,
    offset: u64,
    settings: &'a Settings,
    chunk: usize,
}

impl Pipeline<'_> {
    /// The span cut into chunks over the ring's slots.
    fn chunks(&self, ring: &Ring<'_>) -> Chunks {
        Chunks::new(self.span.len, self.chunk, ring.len())
    }

    /// Read chunk after chunk into alternating slots, each uploaded while the next one is
    /// read from the file.
    fn read(&self, ring: &mut Ring<'_>) -> Result<usize> {
        let mut done = 0usize;
        for Chunk {
            slot, start, len, ..
        } in self.chunks(ring).iter()
        {
            profile::time(Phase::Wait, || ring.reclaim(slot).map(|_| ()))?; // its DMA drained
            let at = self.offset + start as u64;
            let staged = ring.stage(slot, at, len);
            let got = profile::time(Phase::HostIo, || {
                self.source.read_host(staged, at, self.settings)
            })?;
            if got > 0 {
                let dst = self.span.ptr + start as u64;
                profile::time(Phase::Enqueue, || {
                    // SAFETY: `staged` lies in the slot's pinned buffer, which the ring
                    // keeps until the copy has completed; the destination lies inside the
                    // span.
                    unsafe { ring.upload(slot, dst, staged.as_ptr(), got) }
                })?;
                profile::moved(got);
            }
            done += got;
            if got < len {
                break; // end of file
            }
        }
        profile::time(Phase::Wait, || ring.drain())?;
        Ok(done)
    }

    /// Download chunk `k + 1` while chunk `k` is written to the file.
    fn write(&self, ring: &mut Ring<'_>) -> Result<usize> {
        let chunks = self.chunks(ring);
        let fetch = |c: Chunk, ring: &mut Ring<'_>| -> Result<()> {
            ring.reclaim(c.slot)?;
            let staged = ring.stage(c.slot, self.offset + c.start as u64, c.len);
            // SAFETY: `staged` lies in the slot's pinned buffer, kept until the copy has
            // completed; the source lies inside the span.
            unsafe {
                ring.download(
                    c.slot,
                    staged.as_ptr(),
                    self.span.ptr + c.start as u64,
                    c.len,
                )
            }
        };
        let count = chunks.count();
        if count > 0 {
            fetch(chunks.get(0), ring)?;
        }
        let mut done = 0usize;
        for c in chunks.iter() {
            if c.index + 1 < count {
                fetch(chunks.get(c.index + 1), ring)?; // overlaps the pwrite below
            }
            ring.reclaim(c.slot)?; // its download has landed
            let at = self.offset + c.start as u64;
            let staged = ring.stage(c.slot, at, c.len);
            let _turn = crate::pool::copy_turn(self.settings, self.span.ordinal);
            done += self.source.write_host(staged, at, self.settings)?;
        }
        Ok(done)
    }
}

/// Start a stream-ordered transfer: it begins after the work queued on `stream` so far,
/// and work queued on `stream` afterwards sees its bytes (reads) or may reuse the buffer
/// (writes). The call returns at once; nothing blocks the host.
///
/// Every driver call happens here, in the calling thread: for each chunk, `stream` gets a
/// wait on a host counter, the DMA between the chunk's pinned bounce buffer and the
/// user's memory, and a write of a second counter. The worker thread then only moves
/// file bytes and reads and writes those counters, with no driver call, so it can never
/// deadlock against an application thread that holds the driver's locks in a
/// device-synchronising call (`cudaMalloc`, `cudaDeviceSynchronize`) while `stream`
/// waits for the worker. The ring's two bounce buffers bound host memory; the counters,
/// not the ring's events, fence them. Where the device cannot wait on host memory, the
/// stream is synchronised and the transfer runs in the calling thread (kvikio's
/// behaviour).
pub fn submit_stream_ordered(
    ordered: Ordered,
    settings: &Settings,
    keepalive: Keepalive,
) -> Result<IoFuture> {
    if ordered.span.len == 0 {
        return Ok(IoFuture::ready(Ok(0), keepalive));
    }
    // A source with its own stream-ordered transfers (cuFile's async calls) takes it.
    let keepalive = match ordered.source.stream_ordered(&ordered, settings, keepalive) {
        Ok(started) => return started,
        Err(keepalive) => keepalive,
    };
    let Ordered {
        source,
        direction,
        span,
        file_offset,
        stream,
    } = ordered;
    let counters = (
        cuda::Counter::acquire(span.ordinal)?,
        cuda::Counter::acquire(span.ordinal)?,
    );
    let (Some(host_done), Some(gpu_done)) = counters else {
        let context = cuda::bind(span.ordinal)?;
        cuda::synchronize(&context, stream)?;
        drop(context);
        let result = run_caught(|| transfer(&*source, direction, span, file_offset, settings));
        return Ok(IoFuture::ready(result, keepalive));
    };
    let chunk = staging_capacity(settings);
    let ring = span.len.div_ceil(chunk).min(DOUBLE);
    let cut = Chunks::new(span.len, chunk, ring);
    let chunks = cut.count();
    // Taken freeing nothing: this call must not wait for the work queued before it.
    let mut buffers = pinned_buffers_ordered(span.ordinal, ring, settings)?;
    // A stream-ordered transfer stays outside any staging budget: its host I/O reserves
    // nothing either (see `crate::staging`).
    let settings = settings.unbudgeted().into_owned();
    // Queue the GPU side of every chunk. A failure part-way must not leave `stream`
    // waiting for chunks that will never come: release it, and keep the counters out of
    // the pool (the GPU may still look at them).
    let enqueue = |buffers: &mut [crate::bounce::BounceBuffer]| -> Result<()> {
        let context = cuda::bind(span.ordinal)?;
        for Chunk {
            index: k,
            slot,
            start,
            len,
        } in cut.iter()
        {
            let at = file_offset + start as u64;
            let staged = stage(&mut buffers[slot], at, len);
            let device = span.ptr + start as u64;
            match direction {
                Direction::Read => {
                    host_done.enqueue_wait(&context, stream, k as u32 + 1)?;
                    // SAFETY: the bounce buffer stays out of the pool until the GPU has
                    // counted this copy done; the destination lies inside `span`.
                    unsafe { cuda::copy_htod(&context, device, staged.as_ptr(), len, stream)? };
                }
                Direction::Write => {
                    if k >= ring {
                        host_done.enqueue_wait(&context, stream, (k - ring) as u32 + 1)?;
                    }
                    // SAFETY: as above, with the roles of host and device swapped.
                    unsafe { cuda::copy_dtoh(&context, staged.as_ptr(), device, len, stream)? };
                }
            }
            gpu_done.enqueue_write(&context, stream, k as u32 + 1)?;
        }
        Ok(())
    };
    // The GPU compares cyclically ((int32)(value - target) >= 0), so "let everything
    // through" is the largest target, never u32::MAX (which reads as -1).
    let release_all = chunks as u32;
    if let Err(e) = enqueue(&mut buffers) {
        host_done.store(release_all);
        std::mem::forget(host_done);
        std::mem::forget(gpu_done);
        std::mem::forget(buffers); // the GPU may still use them
        return Err(e);
    }
    let pool = crate::pool::pool_for(&settings, Some(span.ordinal))?;
    let job = move || -> Result<usize> {
        let mut buffers = buffers;
        let mut done = 0usize;
        let mut outcome = Ok(());
        for Chunk {
            index: k,
            slot,
            start,
            len,
        } in cut.iter()
        {
            let at = file_offset + start as u64;
            match direction {
                Direction::Read if k >= ring => gpu_done.wait_for((k - ring) as u32 + 1),
                Direction::Write => gpu_done.wait_for(k as u32 + 1),
                Direction::Read => {}
            }
            let staged = stage(&mut buffers[slot], at, len);
            let moved = run_caught(|| source.transfer_host(direction, staged, at, &settings));
            match moved {
                Ok(n) => {
                    done += n;
                    host_done.store(k as u32 + 1);
                    if n < len {
                        break; // end of file: the GPU copies what the buffer holds
                    }
                }
                Err(e) => {
                    outcome = Err(e);
                    break;
                }
            }
        }
        // Let every remaining wait through, then hold the buffers and counters until the
        // GPU has executed all of this transfer's work.
        host_done.store(release_all);
        gpu_done.wait_for(chunks as u32);
        drop(buffers);
        outcome.map(|()| done)
    };
    let (future, reporter) = IoFuture::single(keepalive);
    pool.spawn(move || reporter.report(run_caught(job)));
    Ok(future)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn reads_of_several_gpus_move_in_small_pieces_over_the_shared_staging() {
        let s = Settings {
            num_threads: 16,
            ..Settings::default()
        };
        let task = 4 << 20;
        // One GPU, many threads: whole-task pieces through one buffer.
        assert_eq!(pieces(task, &s, 0, Direction::Read, None), (task, 1));
        // Several GPUs: 1 MiB pieces, `SHARED_STAGING` among the busy threads, two to
        // four buffers each.
        for (threads, slots) in [(64, 2), (48, 2), (32, 4), (8, 4), (128, 2), (0, 4)] {
            assert_eq!(
                pieces(task, &s, 0, Direction::Read, Some(threads)),
                (SHARED_PIECE, slots),
                "{threads} threads"
            );
        }
        assert_eq!(DOUBLE, 2);
        assert_eq!(MAX_SLOTS, 4);
        // A read no longer than a piece needs one buffer.
        assert_eq!(
            pieces(SHARED_PIECE, &s, 0, Direction::Read, Some(32)),
            (SHARED_PIECE, 1)
        );
        // A remote source's whole tasks, writes and a set piece size are left alone.
        assert_eq!(
            pieces(task, &s, usize::MAX, Direction::Read, Some(32)),
            pieces(task, &s, usize::MAX, Direction::Read, None)
        );
        assert_eq!(
            pieces(task, &s, 0, Direction::Write, Some(32)),
            pieces(task, &s, 0, Direction::Write, None)
        );
        let set = Settings {
            read_chunk_size: 2 << 20,
            ..s.clone()
        };
        assert_eq!(
            pieces(task, &set, 0, Direction::Read, Some(32)),
            (2 << 20, DOUBLE)
        );
        // A bounce buffer smaller than a piece bounds it, and however few threads are
        // busy, a read's buffers stay within two full ones.
        for (bounce, piece, slots) in [
            (256 << 10, 256 << 10, DOUBLE),
            (1 << 20, SHARED_PIECE, DOUBLE),
            (2 << 20, SHARED_PIECE, 4),
        ] {
            let b = Settings {
                bounce_buffer_size: bounce,
                ..s.clone()
            };
            assert_eq!(
                pieces(task, &b, 0, Direction::Read, Some(8)),
                (piece, slots),
                "{bounce}-byte bounce buffers"
            );
        }
    }

    #[test]
    fn the_rule_info_prints_is_the_one_reads_take() {
        // 8 threads per GPU leave room in any budget (at least 16): turns are taken.
        let s = Settings {
            num_threads: 8,
            ..Settings::default()
        };
        assert_eq!(shared_pieces(&s, 1), None);
        let threads = crate::pool::copying_threads(&s, 2);
        assert_eq!(
            shared_pieces(&s, 2),
            Some(pieces(s.task_size, &s, 0, Direction::Read, Some(threads)))
        );
        assert_eq!(shared_pieces(&s, 2), Some((SHARED_PIECE, MAX_SLOTS)));
        // A piece size set by hand, a pool set by hand, a pool filling the budget: none.
        let set = Settings {
            read_chunk_size: 2 << 20,
            ..s.clone()
        };
        assert_eq!(shared_pieces(&set, 2), None);
        let by_hand = Settings {
            gpu_threads: 8,
            ..s.clone()
        };
        assert_eq!(shared_pieces(&by_hand, 2), None);
        let full = Settings {
            num_threads: 1024,
            ..s.clone()
        };
        assert_eq!(shared_pieces(&full, 2), None);
    }

    #[test]
    fn a_checkpoint_load_splits_its_staging_by_what_its_reads_would_hold() {
        // The defaults with 16 GPU threads: one 4 MiB task each, one pinned slot of
        // 4 MiB + 4 KiB (16 threads are "many": reads take one slot).
        let s = Settings {
            num_threads: 16,
            ..Settings::default()
        };
        let per_task = task_staging(&s);
        assert_eq!(per_task, (4 << 20) + 4096);
        let d = staging_demand(&s);
        assert_eq!(d.host, 16 * (16 << 20));
        assert_eq!(d.pinned, crate::pool::gpu_threads(&s) * per_task);
        let (bounce, device) = checkpoint_split(&s, true, false);
        assert_eq!((bounce, device), crate::staging::split(512 << 20, d.pinned));
        assert_eq!(checkpoint_split(&s, false, true), (256 << 20, 256 << 20));
        assert_eq!(
            checkpoint_split(&s, true, true).0,
            (256 << 20).min(d.pinned + d.host)
        );
        assert_eq!(checkpoint_split(&s, false, false), (0, 512 << 20));
    }

    #[test]
    fn a_task_is_cut_into_pieces_unless_the_source_asks_for_whole_ones() {
        let settings = Settings {
            num_threads: 1,
            ..Settings::default()
        };
        let read = Direction::Read;
        assert_eq!(chunk_size(4 << 20, &settings, 0, read), 1 << 20);
        assert!(chunk_size(4 << 20, &settings, usize::MAX, read) >= 4 << 20);
        assert_eq!(
            chunk_size(1 << 30, &settings, usize::MAX, read),
            staging_capacity(&settings)
        );
        // One thread: writes overlap downloads with pwrites as reads do.
        assert_eq!(chunk_size(4 << 20, &settings, 0, Direction::Write), 1 << 20);
    }

    #[test]
    fn writes_with_many_threads_move_a_whole_task_per_chunk() {
        let many = Settings {
            num_threads: 16,
            ..Settings::default()
        };
        let write = Direction::Write;
        assert_eq!(chunk_size(16 << 20, &many, 0, Direction::Read), 4 << 20);
        assert_eq!(chunk_size(16 << 20, &many, 0, write), 16 << 20);
        assert_eq!(
            chunk_size(1 << 30, &many, 0, write),
            staging_capacity(&many)
        );
        assert_eq!(chunk_size(5000, &many, 0, write), 5000);
        let knob = Settings {
            write_chunk_size: (4 << 20) - 1,
            ..many.clone()
        };
        assert_eq!(chunk_size(16 << 20, &knob, 0, write), 4 << 20);
        assert_eq!(chunk_size(16 << 20, &knob, 0, Direction::Read), 4 << 20);
        let reads = Settings {
            read_chunk_size: (1 << 20) + 1,
            ..many
        };
        assert_eq!(
            chunk_size(16 << 20, &reads, 0, Direction::Read),
            (1 << 20) + 4096
        );
        assert_eq!(chunk_size(16 << 20, &reads, 0, write), 16 << 20);
    }

    proptest! {
        #[test]
        fn a_chunk_fits_a_bounce_buffer_and_honours_the_source(
            len in 1usize..(1 << 32),
            threads in 1usize..64,
            source_min in prop_oneof![Just(0usize), Just(usize::MAX), 0usize..(64 << 20)],
            write in any::<bool>(),
            knob in prop_oneof![Just(0usize), 1usize..(64 << 20)],
        ) {
            let settings = Settings {
                num_threads: threads,
                write_chunk_size: knob,
                ..Settings::default()
            };
            let direction = if write { Direction::Write } else { Direction::Read };
            let chunk = chunk_size(len, &settings, source_min, direction);
            let capacity = staging_capacity(&settings);
            prop_assert!(chunk >= 1 && chunk <= capacity);
            prop_assert!(chunk >= source_min.min(capacity));
        }
    }
}
