//! What every source is and shares: the [`Source`] trait, what its device path answers
//! ([`Direct`]), a stream-ordered transfer ([`Ordered`]), what it is asked to open
//! ([`Target`]), and the errors every source words the same way.

use std::any::Any;
use std::cell::RefCell;
use std::fmt::Debug;
use std::os::fd::RawFd;
use std::path::Path;
use std::sync::Arc;

use crate::cuda::{Lane, Stream};
use crate::error::{Error, Result};
use crate::future::IoFuture;
use crate::settings::{CompatMode, Settings};
use crate::span::{DeviceSpan, HostSpan};
use crate::vocab::{Direction, OpenFlags};

/// A transfer ordered on a CUDA stream; see [`crate::device_io::submit_stream_ordered`].
pub struct Ordered {
    /// The file's source.
    pub source: Arc<dyn Source>,
    /// Which way the bytes move.
    pub direction: Direction,
    /// The device memory (already clamped to the file for reads).
    pub span: DeviceSpan,
    /// Where in the file the transfer starts.
    pub file_offset: u64,
    /// The stream the transfer is ordered on.
    pub stream: Stream,
}

/// What [`Source::device_direct`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direct {
    /// Nothing: the transfer goes through the bounce ring.
    NotUsed,
    /// Moved this many bytes from the start of the span, and the transfer is complete
    /// (fewer than asked only where a read reached the end of the file).
    Complete(usize),
    /// Moved this many bytes from the start of the span, then stopped; the bounce ring
    /// moves the rest.
    Partial(usize),
    /// Nothing yet: the source moves only the aligned middle of the span, `middle` bytes
    /// from `head` on, through [`Source::device_aligned`]; the device pipeline moves the
    /// unaligned edges before and after it through the bounce ring, in file order.
    Edges {
        /// Bytes before the aligned middle.
        head: usize,
        /// Bytes of the aligned middle.
        middle: usize,
    },
}

/// Something with a size whose bytes can be read into and written from memory.
///
/// Implementations are shared (`Arc`) by a file handle and every task in flight, so all
/// methods take `&self` and may run on many threads at once for disjoint spans.
pub trait Source: Send + Sync + Debug {
    /// A short name for reports and diagnostics (`"posix"`).
    fn name(&self) -> &'static str;

    /// The path the source was opened with (for messages).
    fn path(&self) -> &Path;

    /// The mode the source was opened with.
    fn flags(&self) -> OpenFlags;

    /// The current size in bytes.
    fn size(&self) -> Result<u64>;

    /// Whether a reported size of 0 means the source is empty. `false` for local files,
    /// where it may be a device (`/dev/zero` never ends) or a pseudo-file (`/proc`) that
    /// has content: a read into a given buffer is then not cut to 0 bytes but reads what
    /// the source gives, up to the buffer's end (an empty file gives nothing anyway).
    fn zero_size_is_empty(&self) -> bool {
        true
    }

    /// What the source is when it is no regular file (`"a character device"`, `"a pipe
    /// (FIFO)"`...), whose size says nothing of its end; `None` for a regular file.
    fn special_kind(&self) -> Result<Option<&'static str>> {
        Ok(None)
    }

    /// Read into `span` from `offset` until the span is full or the source ends; the
    /// count is short only at the end.
    fn read_host(&self, span: HostSpan, offset: u64, settings: &Settings) -> Result<usize>;

    /// Write all of `span` at `offset`.
    fn write_host(&self, span: HostSpan, offset: u64, settings: &Settings) -> Result<usize>;

    /// The operating-system descriptor, for sources that have one (`CuFile.fileno()`).
    fn descriptor(&self) -> Option<RawFd> {
        None
    }

    /// The descriptor's status flags (`fcntl(F_GETFL)`), for sources that have one.
    fn status_flags(&self) -> Result<i32> {
        Err(Error::UnsupportedOperation(format!(
            "the {} source of '{}' has no file descriptor",
            self.name(),
            self.path().display()
        )))
    }

    /// Whether reads and writes can bypass the page cache (O_DIRECT).
    fn direct_io_supported(&self) -> bool {
        false
    }

    /// The smallest piece a device pipeline should ask of the source in one host read
    /// (0: the pipeline's own rule). A remote source answers each read with an HTTP
    /// request, whose round trip costs more than cutting a task into pieces to overlap
    /// them with their DMAs gains.
    fn min_device_chunk(&self) -> usize {
        0
    }

    /// Get ready for a write of `len` bytes at `offset` that the engine is about to cut
    /// into several tasks (the `write_preallocate` knob, on by default). Best effort:
    /// the write itself reports any error.
    fn prepare_write(&self, _offset: u64, _len: u64, _settings: &Settings) {}

    /// Whether a read can stall for long (a remote server that stops answering): such a
    /// source's requests always run on the pool, cancellably ([`crate::cancel`]), never
    /// in the calling thread, so that the caller's wait can be interrupted.
    fn may_stall(&self) -> bool {
        false
    }

    /// The version of the file that its reads are pinned to (a remote file's `ETag`),
    /// where it has one: another opening of the file may be pinned to it too
    /// ([`super::open_sized`]).
    fn version(&self) -> Option<&str> {
        None
    }

    /// Move the start of a device transfer without the bounce ring, where the source can
    /// (GPUDirect Storage, or DMA straight from cached pages); `lane` is the calling
    /// thread's stream on the span's device, its context current.
    fn device_direct(
        &self,
        _direction: Direction,
        _span: DeviceSpan,
        _offset: u64,
        _settings: &Settings,
        _lane: Lane<'_>,
    ) -> Result<Direct> {
        Ok(Direct::NotUsed)
    }

    /// Move the aligned middle that [`Source::device_direct`] answered with
    /// [`Direct::Edges`]; the count is short only where a read reaches the end of the file.
    /// Only sources that answer `Edges` are asked.
    fn device_aligned(
        &self,
        _direction: Direction,
        _span: DeviceSpan,
        _offset: u64,
    ) -> Result<usize> {
        Err(Error::UnsupportedOperation(format!(
            "{} has no direct device path for aligned pieces",
            self.name()
        )))
    }

    /// Start `ordered` with the source's own stream-ordered transfers (cuFile's async
    /// calls), keeping `keepalive` until it completes; `Err(keepalive)` hands it back and
    /// sends the transfer down the engine's own stream-ordered path (the bounce ring and
    /// host counters).
    fn stream_ordered(
        &self,
        _ordered: &Ordered,
        _settings: &Settings,
        keepalive: Keepalive,
    ) -> std::result::Result<Result<IoFuture>, Keepalive> {
        Err(keepalive)
    }

    /// Read each `(file offset, device span)` of a batch with the source's own batch
    /// transfers (cuFile's batch API), all spans on one device; each read's count (short
    /// only at the end of the file) or error. `None`: the source has none, and the batch
    /// reads through the bounce ring.
    fn device_batch(
        &self,
        _reads: &[(u64, DeviceSpan)],
        _settings: &Settings,
    ) -> Option<Result<Vec<Result<usize>>>> {
        None
    }
}

/// What keeps an operation's memory alive until its last task has finished (the Python
/// buffer export a span points into).
pub type Keepalive = Option<Box<dyn Any + Send>>;

impl dyn Source {
    /// [`Source::read_host`] or [`Source::write_host`], by `direction`.
    pub(crate) fn transfer_host(
        &self,
        direction: Direction,
        span: HostSpan,
        offset: u64,
        settings: &Settings,
    ) -> Result<usize> {
        match direction {
            Direction::Read => self.read_host(span, offset, settings),
            Direction::Write => self.write_host(span, offset, settings),
        }
    }

    /// The size, for sizing `what` (a read of whole ranges): as [`Source::size`], except
    /// that a source reporting 0 bytes but yielding bytes (a `/proc` or `/sys`
    /// pseudo-file) is an error rather than an empty read.
    pub fn size_for(&self, what: &str, settings: &Settings) -> Result<u64> {
        let size = self.size()?;
        if size == 0 && self.zero_but_yields(settings)? {
            return Err(unsized_file(self.path(), what));
        }
        Ok(size)
    }

    /// Whether a source that reports 0 bytes yields a byte when read at 0 (a `/proc` or
    /// `/sys` pseudo-file; a device too, so never ask it of one that may block, a pipe);
    /// `false` where 0 means empty or the source is not readable.
    pub(crate) fn zero_but_yields(&self, settings: &Settings) -> Result<bool> {
        if self.zero_size_is_empty() || !self.flags().readable {
            return Ok(false);
        }
        let mut byte = [0u8; 1];
        Ok(self.read_host(HostSpan::from_slice(&mut byte), 0, settings)? > 0)
    }

    /// Every byte from the start of a source whose size says nothing of its end (a
    /// `/proc` or `/sys` pseudo-file), read until it ends, but no more than `limit + 1`
    /// bytes: a caller that gets more than `limit` refuses the file.
    pub fn read_to_end(&self, limit: usize, settings: &Settings) -> Result<Vec<u8>> {
        const PIECE: usize = 1 << 20;
        let cap = limit.saturating_add(1);
        let mut out = Vec::new();
        while out.len() < cap {
            let at = out.len();
            out.resize(at + PIECE.min(cap - at), 0);
            let got = self.read_host(HostSpan::from_slice(&mut out[at..]), at as u64, settings)?;
            out.truncate(at + got);
            if got == 0 {
                break;
            }
        }
        Ok(out)
    }

    /// Fail with `UnsupportedOperation` unless the source was opened for `direction`.
    pub(crate) fn check_access(&self, direction: Direction) -> Result<()> {
        let flags = self.flags();
        let (allowed, verb, modes) = match direction {
            Direction::Read => (flags.readable, "write-only", "'r', 'r+' or 'w+' to read"),
            Direction::Write => (flags.writable, "read-only", "'r+', 'w' or 'w+' to write"),
        };
        if allowed {
            return Ok(());
        }
        // kvikio's words ("Operation not permitted") lead, for code that matches them.
        Err(Error::UnsupportedOperation(format!(
            "Operation not permitted: '{}' was opened {verb}; open it with {modes}",
            self.path().display()
        )))
    }
}

/// What a source is asked to open.
#[derive(Debug, Clone, Copy)]
pub struct Target<'a> {
    /// The path as given.
    pub path: &'a Path,
    /// The parsed open mode.
    pub flags: OpenFlags,
    /// The `compat_mode` setting when the file is opened: `On` asks for POSIX only.
    pub compat_mode: CompatMode,
    /// Why each source took or declined the target, in order (for `CuFile.backend`).
    pub notes: &'a RefCell<Vec<String>>,
}

impl Target<'_> {
    /// Record why this source takes or declines the target.
    pub fn note(&self, why: String) {
        self.notes.borrow_mut().push(why);
    }
}

/// The error for `what` (a kind of read) of a file that reports 0 bytes but has content.
pub fn unsized_file(path: &Path, what: &str) -> Error {
    Error::InvalidArgument(format!(
        "'{}' reports a size of 0 bytes but has content (a pseudo-file such as those in \
         /proc or /sys), so {what} cannot be sized from it; read it into host memory with \
         kvikpy.read(path, device='cpu'), which reads such files to their end, or with \
         open(path, 'rb').read()",
        path.display()
    ))
}

/// The error for a read that had to fill its span (`expected` bytes at `offset`) but
/// reached the end of the file after `got`: the file shrank after it was sized.
pub fn truncated(path: &Path, offset: u64, expected: usize, got: usize) -> Error {
    Error::Truncated(format!(
        "'{}' ended after {got} of the {expected} bytes expected at offset {offset}: it \
         shrank while being read",
        path.display()
    ))
}
