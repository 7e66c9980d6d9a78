//! Zero-copy device reads of POSIX files already in the page cache: map the range, pin its
//! pages read-only (`cuMemHostRegister`) and let the DMA engine read them where they lie.
//!
//! The bounce-buffer path moves every byte through memory three times (the page cache is
//! read and a pinned buffer written by `pread`, then the DMA reads the pinned buffer), so
//! on a warm file the CPU's memory copy, not PCIe, sets the pace. Pinning the cached pages
//! themselves removes the copy: what is left is the kernel pinning pages (faster than
//! copying them) and the DMA. Only resident ranges take this path (checked with
//! `mincore`); anything else, or any refusal on the way, falls back to the bounce ring.
//!
//! Pinning does not scale with threads: the driver serialises registration process-wide.
//! Measured on the H100 machine (registering then unregistering a 4 GiB warm file in
//! pieces): 45 GB/s at 1, 4 and 16 threads alike, and with the DMA added 17-23 GB/s with
//! 4 MiB pieces, 24-30 GB/s with 64 MiB ones, while bounce buffers read at 8 GB/s per
//! thread up to 50 GB/s at 16. Registering costs about 40 us + 18 us/MiB and
//! unregistering 25 us + 7 us/MiB. So page-cache DMA is used only where one thread reads
//! (`num_threads == 1`), where it beats that thread's `pread` copy (10 against 8 GB/s for
//! a warm 4 GiB file, with less CPU time).

use std::os::fd::RawFd;
use std::sync::atomic::{AtomicU64, Ordering};

use super::mapping::{page_size, FileMapping};
use super::Direct;
use crate::cuda::{self, HostRegistration, Lane};
use crate::error::Result;
use crate::ring::{Chunk, Chunks, Ring, DOUBLE};
use crate::settings::Settings;
use crate::span::DeviceSpan;
use crate::tasks::align_down;

/// Smallest read worth mapping: below it the fixed cost of mapping and pinning (tens of
/// microseconds) is more than the copy it saves.
pub const MIN_MAPPED_READ: usize = 1 << 20;
/// Pool sizes up to which page-cache DMA is used (see the module documentation).
pub const MAX_THREADS: usize = 1;
/// Pieces pinned and copied at a time: one is pinned while the previous one's DMA runs;
/// large, since every registration has a fixed cost of tens of microseconds.
const PIECE: usize = 4 << 20;

/// Bytes this process has moved by page-cache DMA (tests and diagnostics use it to tell
/// which path a read took).
static BYTES_MOVED: AtomicU64 = AtomicU64::new(0);

/// Bytes moved by page-cache DMA since the process started.
pub fn bytes_moved() -> u64 {
    BYTES_MOVED.load(Ordering::Relaxed)
}

/// Whether a device read of `span` under `settings` may try page-cache DMA at all.
pub fn worth_trying(span: &DeviceSpan, settings: &Settings) -> bool {
    settings.page_cache_dma
        && crate::pool::gpu_threads(settings) <= MAX_THREADS
        && span.len >= MIN_MAPPED_READ
        && cuda::can_register_read_only(span.ordinal)
}

/// Read `span.len()` bytes at `offset` of the file open on `fd` (of `size()` bytes, asked
/// only when the read is worth trying) into device memory straight from the page cache,
/// if the range is resident; see [`Direct`] for the outcomes.
pub fn read_resident(
    fd: RawFd,
    size: impl FnOnce() -> Result<u64>,
    span: DeviceSpan,
    offset: u64,
    settings: &Settings,
    lane: Lane<'_>,
) -> Result<Direct> {
    if !worth_trying(&span, settings) {
        return Ok(Direct::NotUsed);
    }
    let size = size()?;
    let len = (span.len as u64).min(size.saturating_sub(offset)) as usize;
    if len < MIN_MAPPED_READ {
        return Ok(Direct::NotUsed); // near the end of the file: not worth it
    }
    let Some(mapping) = FileMapping::map(fd, offset, len) else {
        return Ok(Direct::NotUsed);
    };
    if !mapping.resident() {
        return Ok(Direct::NotUsed);
    }
    // SAFETY: `mapping` is a live read-only mapping of `mapping.len()` bytes from its
    // page-aligned base, dropped only after this call returns.
    unsafe { upload_mapped(mapping.base(), mapping.len(), mapping.head(), span, lane) }
}

/// DMA the bytes `base+head..base+len` of a mapped, resident file range into the start of
/// `span` (`len - head <= span.len`), pinning `base..base+len` piece by piece; see
/// [`Direct`] for the outcomes (a piece the driver refuses to pin stops it).
///
/// # Safety
/// `base` is page-aligned and `base..base+len` a live read-only mapping that stays
/// mapped until this call returns.
pub unsafe fn upload_mapped(
    base: *const u8,
    len: usize,
    head: usize,
    span: DeviceSpan,
    lane: Lane<'_>,
) -> Result<Direct> {
    debug_assert!(head <= len && len - head <= span.len);
    let page = page_size();
    let piece = align_down(PIECE.max(page) as u64, page) as usize;
    // Dropped (draining the stream, then unpinning) before returning, while the caller's
    // mapping is still live.
    let mut ring: Ring<'_, Option<HostRegistration>> =
        Ring::with(lane, (0..DOUBLE).map(|_| None).collect());
    let mut done = 0usize; // bytes of the request queued so far

    // Pieces of `piece` bytes (page-aligned starts, from `base`) over the ring's slots.
    for Chunk {
        slot,
        start,
        len: piece_len,
        ..
    } in Chunks::new(len, piece, ring.len()).iter()
    {
        *ring.reclaim(slot)? = None; // its DMA is done: unpin
        let end = start + piece_len;
        // SAFETY: `start < end <= len`, so the offset stays inside the mapping.
        let piece_start = unsafe { base.add(start) };
        // SAFETY: `piece_start..piece_start + (end - start)` lies inside the live mapping,
        // which outlives the ring (the caller keeps it until this call returns); the ring
        // waits for the stream before unpinning.
        let registration =
            unsafe { HostRegistration::read_only(span.ordinal, piece_start, end - start) };
        let Ok(registration) = registration else {
            drop(ring); // waits for what was queued
            BYTES_MOVED.fetch_add(done as u64, Ordering::Relaxed);
            return Ok(if done == 0 {
                Direct::NotUsed
            } else {
                Direct::Partial(done)
            });
        };
        *ring.reclaim(slot)? = Some(registration);
        let from = start.max(head);
        let count = end - from;
        // SAFETY: `from <= end <= len`, so the offset stays inside the mapping.
        let source = unsafe { base.add(from) };
        // SAFETY: the source pages are pinned by this slot's registration until its event
        // has completed (or the stream drained); the destination lies inside `span`
        // (`done + count <= len - head <= span.len`).
        unsafe { ring.upload(slot, span.ptr + done as u64, source, count)? };
        done += count;
    }
    ring.drain()?;
    drop(ring);
    BYTES_MOVED.fetch_add(done as u64, Ordering::Relaxed);
    Ok(Direct::Complete(done))
}
