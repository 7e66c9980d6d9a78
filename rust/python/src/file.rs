//! `_lib.FileHandle`: an open file and its read/write entry points. Each one converts its
//! arguments into one engine [`Request`] and submits it (the entry points are rows of
//! [`io_pymethods!`]); the engine decides how it runs.

use kvikpy_core::extent::{extent, Extent, Want};
use kvikpy_core::{Completion, Direction, Request, Span};
use kvikpy_macros::boundary;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

use crate::blocking::{interruptible_alone, without_gil};
use crate::buffer::{mark_ready, Buffer};
use crate::calls::{io_pymethods, task_size_arg, Call, Submit, Submitted};
use crate::errors::{BindError, BindResult};
use crate::future::{Future, StreamFuture};
use crate::intake::{file_offset, intake_with, Access, Pending};

/// An open file (the private handle behind `kvikpy.CuFile`).
#[pyclass(module = "kvikpy._lib", frozen)]
pub struct FileHandle {
    inner: kvikpy_core::FileHandle,
}

/// A file a call reads: a path it opens itself, or a [`FileHandle`] already open, so
/// that the reads of several calls see one file (one version of a URL, one inode of a
/// local path, however the name is reused meanwhile).
#[derive(FromPyObject)]
pub(crate) enum FileArg {
    Open(Py<FileHandle>),
    Path(std::path::PathBuf),
}

impl FileArg {
    /// The file's source: the open handle's (an error if it was closed), or the path
    /// opened read-only now (as `FileHandle(path, "r")` opens it: with the GIL
    /// released, a URL interruptibly).
    pub(crate) fn source(
        &self,
        py: Python<'_>,
    ) -> BindResult<std::sync::Arc<dyn kvikpy_core::Source>> {
        match self {
            Self::Open(handle) => Ok(handle.borrow(py).inner.get()?),
            Self::Path(path) => Ok(open(py, path.clone(), "r")?.get()?),
        }
    }
}

/// Open `path` in mode `flags` (kvikio's `"r"`, `"w"`...) with the GIL released: a URL
/// interruptibly (opening it asks the server for the size), a local file again after a
/// signal other than Ctrl-C interrupts an open that waits (a FIFO nobody writes).
pub(crate) fn open(
    py: Python<'_>,
    path: std::path::PathBuf,
    flags: &str,
) -> BindResult<kvikpy_core::FileHandle> {
    if kvikpy_core::source::is_remote(&path) {
        let flags = flags.to_owned();
        let token = kvikpy_core::cancel::CancelToken::new();
        return interruptible_alone(py, &token, move || {
            kvikpy_core::FileHandle::open(path, &flags)
        });
    }
    let path = &path;
    loop {
        match without_gil(py, move || kvikpy_core::FileHandle::open(path, flags)) {
            Ok(inner) => return Ok(inner),
            Err(BindError::Engine(kvikpy_core::Error::Os { source, .. }))
                if source.raw_os_error() == Some(libc::EINTR) =>
            {
                py.check_signals()?
            }
            Err(e) => return Err(e),
        }
    }
}

impl FileHandle {
    /// The Python handle of a file the engine already opened (a remote file).
    pub fn from_core(inner: kvikpy_core::FileHandle) -> Self {
        Self { inner }
    }
}

impl Submit for FileHandle {
    fn submit(&self, py: Python<'_>, buf: &Bound<'_, PyAny>, call: &Call<'_>) -> Submitted {
        let task_size = task_size_arg(call.task_size)?;
        let file_offset = file_offset(call.file_offset)?;
        let access = match call.direction {
            Direction::Read => Access::Fill,
            Direction::Write => Access::Drain,
        };
        // A producer's pending work is waited for inside the submission's own release of
        // the GIL below, not in a release of its own.
        let pending = match call.completion {
            Completion::StreamOrdered(stream) => Pending::InStreamOrder(stream.as_raw()),
            _ => Pending::Deferred,
        };
        let taken = match &call.raw {
            Some(raw) => {
                self.inner.get().map_err(BindError::Engine)?; // a closed file first
                let taken = intake_with(buf, access, pending)?;
                taken.device_only(raw.method, raw.alternative)?;
                taken.select(raw.dev_offset, call.size, "dev_offset")?
            }
            None => intake_with(buf, access, pending)?.select(0, call.size, "offset")?,
        };
        let (span, wait) = (taken.span, taken.wait);
        let request = Request {
            direction: call.direction,
            span,
            file_offset,
            task_size,
            exact: call.exact,
            keepalive: Some(taken.keepalive),
        };
        let (inner, completion) = (&self.inner, call.completion);
        let future = without_gil(py, move || {
            if let Some(wait) = wait {
                wait.run()?;
            }
            let settings = kvikpy_core::settings::current()?;
            kvikpy_core::submit(&settings, inner, request, completion)
        })?;
        // A kvikpy.Buffer remembers where in the stream a stream-ordered read's bytes
        // land, for its consumers.
        if let (Direction::Read, Completion::StreamOrdered(stream), Span::Device(device)) =
            (call.direction, completion, span)
        {
            if let Ok(buffer) = buf.cast::<Buffer>() {
                let storage = buffer.get().span().1;
                let (ordinal, stream) = (device.ordinal, stream.as_raw());
                without_gil(py, move || mark_ready(&storage, ordinal, stream))?;
            }
        }
        Ok((future, span))
    }
}

// The methods written out, then the read and write entry points, one a row.
io_pymethods! {
impl FileHandle {
    #[new]
    fn new(py: Python<'_>, path: std::path::PathBuf, flags: &str) -> BindResult<Self> {
        Ok(Self {
            inner: open(py, path, flags)?,
        })
    }

    fn close(&self) {
        self.inner.close();
    }

    #[getter]
    fn closed(&self) -> bool {
        self.inner.is_closed()
    }

    /// Which source reads the file (`"posix"` or `"cufile"`) and why it was chosen.
    #[getter]
    fn backend(&self) -> (&'static str, String) {
        let (name, why) = self.inner.backend();
        (name, why.to_owned())
    }

    #[getter]
    fn path(&self) -> std::path::PathBuf {
        self.inner.path().to_path_buf()
    }

    fn fileno(&self) -> BindResult<i32> {
        let source = self.inner.get()?;
        source.descriptor().ok_or_else(|| {
            BindError::Engine(kvikpy_core::Error::UnsupportedOperation(format!(
                "the {} source of '{}' has no file descriptor",
                source.name(),
                source.path().display()
            )))
        })
    }

    fn open_flags(&self) -> BindResult<i32> {
        Ok(self.inner.get()?.status_flags()?)
    }

    fn nbytes(&self) -> BindResult<u64> {
        Ok(self.inner.get()?.size()?)
    }

    /// The size for sizing `what`; `ValueError` for a pseudo-file that reports 0 bytes
    /// but has content.
    fn size_for(&self, what: &str) -> BindResult<u64> {
        let settings = kvikpy_core::settings::current()?;
        Ok(self.inner.get()?.size_for(what, &settings)?)
    }

    /// What the file holds for a read of `size` bytes at `offset` (to the end for
    /// `None`), cut to what it has (`numpy.fromfile`'s `count`): `(bytes, whether the
    /// file may end before them, the bytes themselves where the file had to be read to
    /// its end to be sized)`; `ValueError` for a device or pipe read to its end.
    #[pyo3(signature = (offset, size=None))]
    fn extent(
        &self,
        py: Python<'_>,
        offset: u64,
        size: Option<u64>,
    ) -> BindResult<(u64, bool, Option<Py<PyBytes>>)> {
        let settings = kvikpy_core::settings::current()?;
        let source = self.inner.get()?;
        let want = Want {
            offset,
            size,
            strict: false,
            device: false,
        };
        let name = source.path().to_string_lossy().into_owned();
        let found = without_gil(py, move || extent(&*source, want, &name, &settings))?;
        Ok(match found {
            Extent::Sized(n) => (n, false, None),
            Extent::Open(n) => (n, true, None),
            Extent::Content(bytes) => (
                bytes.len() as u64,
                false,
                Some(PyBytes::new(py, &bytes).unbind()),
            ),
        })
    }

    /// Allocate the file's first `size` bytes for the writes that follow (best effort;
    /// see the engine's `FileHandle::reserve`).
    fn reserve(&self, py: Python<'_>, size: u64) -> BindResult<()> {
        let settings = kvikpy_core::settings::current()?;
        let inner = &self.inner;
        without_gil(py, move || inner.reserve(size, &settings))
    }

    fn is_direct_io_supported(&self) -> BindResult<bool> {
        Ok(self.inner.get()?.direct_io_supported())
    }
}
    // Split into tasks of `task_size` bytes on the pool: a future, or the count at once.
    tuned(file_offset) {
        pread -> Future = Call::new(Direction::Read, Completion::Future);
        pwrite -> Future = Call::new(Direction::Write, Completion::Future);
        read -> usize = Call::new(Direction::Read, Completion::Blocking);
        write -> usize = Call::new(Direction::Write, Completion::Blocking);
    }
    // `size` bytes or an OSError (the file shrank after it was sized), not a short count.
    exact(file_offset) {
        pread_exact -> Future = Call::new(Direction::Read, Completion::Future);
        read_exact -> usize = Call::new(Direction::Read, Completion::Blocking);
    }
    // kvikio's raw calls: device memory only; host memory is pointed to the method named.
    raw {
        raw_read -> usize = Direction::Read, "read";
        raw_write -> usize = Direction::Write, "write";
    }
    // The same, ordered in a CUDA stream: the call returns at once.
    raw_async {
        raw_read_async -> StreamFuture = Direction::Read, "pread";
        raw_write_async -> StreamFuture = Direction::Write, "pwrite";
    }
}
