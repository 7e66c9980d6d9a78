//! The bounce ring: the one place device pipelines get pinned bounce buffers, place file
//! bytes in them, and pace their DMAs.
//!
//! A [`Ring`] is up to [`MAX_SLOTS`] slots (two, [`DOUBLE`], but for the small pieces of
//! reads onto several GPUs), each a payload (a pinned bounce buffer, or pinned page-cache
//! pages for page-cache DMA) and one of the calling thread's events on the device. A
//! pipeline fills a slot, queues its DMA ([`Ring::upload`] / [`Ring::download`] record
//! the slot's event), and before reusing the slot [`Ring::reclaim`] waits for that event,
//! so the file I/O of one slot overlaps the DMAs of the others. Dropping a ring with
//! DMAs in flight waits for the stream first, so no payload goes back to its pool (or is
//! unpinned) while the DMA engine still reads or writes it. Device reads and writes,
//! page-cache DMA and batch segments run on it; stream-ordered transfers take their
//! buffers and staging from [`pinned_buffers_ordered`] and [`stage`] here too, and fence with
//! GPU-side counters instead of events (their host side makes no driver call).

use crate::bounce::BounceBuffer;
use crate::cuda::{self, Lane};
use crate::error::Result;
use crate::settings::Settings;
use crate::span::HostSpan;
use crate::staging::Reservation;
use crate::tasks::DIRECT_IO_ALIGNMENT;

/// The slots of a double-buffered ring: one filling while the other's DMA runs.
pub const DOUBLE: usize = 2;
/// The most slots a ring has (one event of the thread's [`Lane`] each): reads onto several
/// GPUs at once with few threads busy take more than two, so that a DMA still queued
/// behind other threads' does not hold up the next piece's file read.
pub const MAX_SLOTS: usize = cuda::LANE_EVENTS;

/// One chunk of a transfer cut for a ring: which it is, the slot it takes, and where it
/// lies in the transfer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Chunk {
    /// Its index, from 0.
    pub index: usize,
    /// The ring slot it uses: the slots are taken in turn.
    pub slot: usize,
    /// Its first byte, from the start of the transfer.
    pub start: usize,
    /// Its length: `size` bytes, less for the last chunk.
    pub len: usize,
}

/// A `len`-byte transfer cut into chunks of `size` bytes over `slots` ring slots: the one
/// spelling of the chunk and slot arithmetic that every device loop uses.
#[derive(Debug, Clone, Copy)]
pub struct Chunks {
    len: usize,
    size: usize,
    slots: usize,
}

impl Chunks {
    /// `len` bytes in chunks of `size` (at least 1) over `slots` slots (at least 1).
    pub fn new(len: usize, size: usize, slots: usize) -> Self {
        Self {
            len,
            size: size.max(1),
            slots: slots.max(1),
        }
    }

    /// How many chunks there are.
    pub fn count(&self) -> usize {
        self.len.div_ceil(self.size)
    }

    /// Chunk `index` (below [`Chunks::count`]).
    pub fn get(&self, index: usize) -> Chunk {
        let start = index * self.size;
        Chunk {
            index,
            slot: index % self.slots,
            start,
            len: self.size.min(self.len - start),
        }
    }

    /// Every chunk, in order.
    pub fn iter(self) -> impl Iterator<Item = Chunk> {
        (0..self.count()).map(move |index| self.get(index))
    }
}

/// Size of every pinned bounce buffer: the `bounce_buffer_size` setting rounded up to
/// whole 4 KiB blocks, plus one block of room for [`stage`]'s alignment shift.
pub fn pinned_buffer_size(settings: &Settings) -> usize {
    staging_capacity(settings) + DIRECT_IO_ALIGNMENT
}

/// The most file bytes one pinned buffer stages at any file offset.
pub fn staging_capacity(settings: &Settings) -> usize {
    settings.bounce_capacity()
}

/// `count` full pinned bounce buffers of device `ordinal`'s pool for a stream-ordered
/// transfer, taken without freeing any idle buffer ([`BouncePool::acquire_keeping`]): the
/// call returns before the work its stream is ordered after has run, and freeing pinned
/// memory would wait for that work. Outside any staging budget (the call is not part of
/// a checkpoint load's reads).
///
/// [`BouncePool::acquire_keeping`]: crate::bounce::BouncePool::acquire_keeping
pub fn pinned_buffers_ordered(
    ordinal: usize,
    count: usize,
    settings: &Settings,
) -> Result<Vec<BounceBuffer>> {
    let pool = cuda::pinned_pool(ordinal)?;
    let full = pinned_buffer_size(settings);
    (0..count)
        .map(|_| pool.acquire_keeping(full, settings.bounce_buffer_size))
        .collect()
}

/// Smallest pinned buffer made for a short transfer ([`pinned_buffers_for`]).
const MIN_PINNED_STAGING: usize = 64 << 10;

/// `count` pinned bounce buffers of device `ordinal`'s pool, each staging at least
/// `chunk` file bytes: a new buffer is sized for `chunk` (rounded up to a power of two,
/// so that sizes repeat and buffers are reused), not for a full `bounce_buffer_size`,
/// since pinning memory is slow and a small transfer should not pay for a large buffer.
pub fn pinned_buffers_for(
    ordinal: usize,
    count: usize,
    settings: &Settings,
    chunk: usize,
) -> Result<Vec<BounceBuffer>> {
    let pool = cuda::pinned_pool(ordinal)?;
    let full = pinned_buffer_size(settings);
    let need = pinned_need(settings, chunk);
    let serves = settings.bounce_buffer_size;
    // Each buffer exactly its size, not an idle full one, where its bytes are reserved
    // from a checkpoint load's budget (its part held until it returns to the pool; the
    // only reservation the task makes, see `crate::staging`), or where more than two
    // carry the small pieces of reads onto several GPUs, so that a task's buffers stay
    // within the two full ones a task may hold.
    let budget = settings.staging.budget();
    let most = if budget.is_some() || count > DOUBLE {
        need
    } else {
        full
    };
    let mut reserved = match budget {
        Some(budget) => budget.take(count.saturating_mul(need))?,
        None => Reservation::default(),
    };
    (0..count)
        .map(|_| {
            let mut buffer = pool.acquire_within(need, most, full, serves)?;
            buffer.hold(reserved.split(need));
            Ok(buffer)
        })
        .collect()
}

/// Bytes of the pinned buffer [`pinned_buffers_for`] takes to stage `chunk` bytes: `chunk`
/// rounded up to a power of two (at least 64 KiB, at most one bounce buffer), plus the
/// alignment room of [`stage`].
pub fn pinned_need(settings: &Settings, chunk: usize) -> usize {
    let staged = chunk
        .checked_next_power_of_two()
        .unwrap_or(usize::MAX)
        .max(MIN_PINNED_STAGING)
        .min(staging_capacity(settings));
    staged.saturating_add(DIRECT_IO_ALIGNMENT)
}

/// Where `len` file bytes from `file_offset` go in `buffer`: at the same offset modulo
/// 4 KiB as in the file, so with `auto_direct_io_*` their aligned middle moves by O_DIRECT
/// straight into or out of the pinned buffer, with no further copy.
pub fn stage(buffer: &mut BounceBuffer, file_offset: u64, len: usize) -> HostSpan {
    let shift = (file_offset % DIRECT_IO_ALIGNMENT as u64) as usize;
    HostSpan::from_slice(buffer.as_mut_slice()).sub(shift, len)
}

struct Slot<P> {
    payload: P,
    busy: bool,
}

/// Slots of pinned memory paced by the calling thread's events; see the module docs.
pub struct Ring<'l, P = BounceBuffer> {
    lane: Lane<'l>,
    // Dropped after `Ring::drop` has drained the stream.
    slots: Vec<Slot<P>>,
}

impl<'l> Ring<'l, BounceBuffer> {
    /// A ring of `count` (1 to [`MAX_SLOTS`]) pinned bounce buffers on `lane`'s device, each staging
    /// at least `chunk` bytes (see [`pinned_buffers_for`]; `staging_capacity` for full
    /// ones).
    pub fn pinned_for(
        lane: Lane<'l>,
        count: usize,
        settings: &Settings,
        chunk: usize,
    ) -> Result<Self> {
        let count = count.clamp(1, MAX_SLOTS);
        let buffers = pinned_buffers_for(lane.context.ordinal(), count, settings, chunk)?;
        Ok(Self::with(lane, buffers))
    }

    /// Slot `slot`'s buffer placed for `len` file bytes at `file_offset` (see [`stage`]).
    /// Call [`Ring::reclaim`] first when the slot may have a DMA in flight.
    pub fn stage(&mut self, slot: usize, file_offset: u64, len: usize) -> HostSpan {
        stage(&mut self.slots[slot].payload, file_offset, len)
    }
}

impl<'l, P> Ring<'l, P> {
    /// A ring over `payloads` (at most [`MAX_SLOTS`]) on `lane`.
    pub fn with(lane: Lane<'l>, payloads: Vec<P>) -> Self {
        debug_assert!(payloads.len() <= MAX_SLOTS);
        Self {
            lane,
            slots: payloads
                .into_iter()
                .map(|payload| Slot {
                    payload,
                    busy: false,
                })
                .collect(),
        }
    }

    /// The number of slots.
    pub fn len(&self) -> usize {
        self.slots.len()
    }

    /// Slot `slot`'s payload, once the DMA last queued on it (if any) has completed.
    pub fn reclaim(&mut self, slot: usize) -> Result<&mut P> {
        if self.slots[slot].busy {
            self.lane.wait(slot)?;
            self.slots[slot].busy = false;
        }
        Ok(&mut self.slots[slot].payload)
    }

    /// Queue a copy of `len` bytes from `src` (inside slot `slot`'s payload) to device
    /// address `dst`, and mark the slot busy until it completes.
    ///
    /// # Safety
    /// `src..src+len` must lie in slot `slot`'s pinned payload and `dst..dst+len` in live
    /// device memory of the lane's device.
    pub unsafe fn upload(
        &mut self,
        slot: usize,
        dst: u64,
        src: *const u8,
        len: usize,
    ) -> Result<()> {
        // SAFETY: forwarded from the caller; the payload outlives the copy (reclaim or
        // drop waits for the slot's event or the stream).
        unsafe { self.lane.copy_htod(dst, src, len)? };
        self.mark(slot)
    }

    /// Queue a copy of `len` bytes from device address `src` into `dst` (inside slot
    /// `slot`'s payload), and mark the slot busy until it completes.
    ///
    /// # Safety
    /// As for [`Ring::upload`], with the roles of host and device swapped.
    pub unsafe fn download(
        &mut self,
        slot: usize,
        dst: *mut u8,
        src: u64,
        len: usize,
    ) -> Result<()> {
        // SAFETY: forwarded from the caller, as in `upload`.
        unsafe { self.lane.copy_dtoh(dst, src, len)? };
        self.mark(slot)
    }

    fn mark(&mut self, slot: usize) -> Result<()> {
        // Busy from the copy on: were the record to fail, drop still drains the stream.
        self.slots[slot].busy = true;
        self.lane.record(slot)
    }

    /// Wait until every queued DMA has completed.
    pub fn drain(&mut self) -> Result<()> {
        self.lane.synchronize()?;
        for s in &mut self.slots {
            s.busy = false;
        }
        Ok(())
    }
}

impl<P> Drop for Ring<'_, P> {
    fn drop(&mut self) {
        if self.slots.iter().any(|s| s.busy) {
            let _ = self.lane.synchronize();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn chunks_tile_the_transfer(len in 0usize..1 << 20, size in 1usize..1 << 16, slots in 1usize..=MAX_SLOTS) {
            let cut = Chunks::new(len, size, slots);
            let mut next = 0usize;
            for (k, c) in cut.iter().enumerate() {
                prop_assert_eq!(c.index, k);
                prop_assert_eq!(c.slot, k % slots);
                prop_assert_eq!(c.start, next);
                prop_assert!(c.len > 0 && c.len <= size);
                prop_assert_eq!(c, cut.get(k));
                next += c.len;
            }
            prop_assert_eq!(next, len);
            prop_assert_eq!(cut.iter().count(), cut.count());
        }
    }
}
