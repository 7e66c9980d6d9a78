"""File handles and futures with kvikio's API: :class:`CuFile` and :class:`IOFuture`."""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Callable, Generator, Iterable, Iterator
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeAlias

import kvikpy._lib as _lib
from kvikpy import _paths
from kvikpy._cuda_streams import stream_handle
from kvikpy._open_file import OpenFile
from kvikpy._page_cache import (
    clear_page_cache,
    drop_file_page_cache,
    drop_system_page_cache,
    get_page_cache_info,
)

if TYPE_CHECKING:
    import asyncio

    from typing_extensions import Buffer as BufferProtocol  # collections.abc.Buffer in 3.12

__all__ = [
    "CuFile",
    "IOFuture",
    "IOFutureStream",
    "clear_page_cache",
    "drop_file_page_cache",
    "drop_system_page_cache",
    "get_page_cache_info",
    "wait_all",
]

OpenMode: TypeAlias = Literal["r", "rb", "r+", "r+b", "rb+", "w", "wb", "w+", "w+b"]
"""The modes :class:`CuFile` opens files with."""

# kvikpy's own mode (the engine's OpenFlags::CREATE_KEEP), not one of kvikio's: read and
# write, the file created if missing and never truncated (O_CREAT without O_TRUNC).
_CREATE_KEEP = "r+:create"


class CudaArray(Protocol):
    """GPU memory described by the CUDA Array Interface (CuPy, Numba, torch...)."""

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]: ...


class DLPackArray(Protocol):
    """Memory exported through DLPack (numpy, torch, CuPy, JAX, :class:`kvikpy.Buffer`)."""

    def __dlpack__(self) -> Any: ...


BufferLike: TypeAlias = "BufferProtocol | CudaArray | DLPackArray"
"""What reads and writes take: a buffer-protocol object (``bytes``, ``bytearray``,
``memoryview``, numpy arrays), a CUDA array, or a DLPack exporter."""


class IOFuture:
    """A read or write that may still be running.

    Returned by :meth:`CuFile.pread` and :meth:`CuFile.pwrite`. :meth:`get` blocks (without
    holding the GIL, and interruptibly with Ctrl-C) and returns the number of bytes
    transferred; calling it again returns the same number. The future can also be awaited
    in asyncio code and in Jupyter's running event loop::

        n = await f.pread(buf)

    The buffer and file stay valid for as long as the operation runs, even if the future
    or the file object is dropped first.

    In a child made by ``os.fork()`` (or multiprocessing's "fork" start method) while the
    operation ran, it can never finish (the threads running it stay in the parent): there
    :meth:`done` is True and :meth:`get` raises ``RuntimeError`` at once, unless it had
    finished before the fork.
    """

    __slots__ = ("_handle",)

    def __init__(self, handle: _lib.Future) -> None:
        """Wrap an operation started by the engine (made by :class:`CuFile`, not by hand).

        Parameters
        ----------
        handle
            The engine's handle of the running operation.
        """
        self._handle = handle

    def get(self) -> int:
        """Wait for the operation and return the number of bytes read or written.

        Raises the operation's error (for example ``OSError``) if it failed. Ctrl-C
        interrupts the wait (KeyboardInterrupt) and cancels a remote read: its requests
        stop within tens of milliseconds (its buffer stays in use until they have), and
        a later ``get()`` raises ``kvikpy.errors.RemoteConnectionError`` ("cancelled").
        Local reads and writes cannot be cancelled; they run to their end. In a forked
        child, an operation started before the fork raises ``RuntimeError``.
        """
        return self._handle.get()

    def done(self) -> bool:
        """Return True if the operation has finished (successfully or not)."""
        return self._handle.done()

    def add_done_callback(self, fn: Callable[[IOFuture], object]) -> None:
        """Call ``fn(future)`` once the operation has finished.

        Parameters
        ----------
        fn
            Called with this future as its only argument; its return value is ignored.

        Notes
        -----
        If it has already finished, ``fn`` runs at once in this thread; otherwise it runs in
        the I/O thread that finishes the operation, so it should be quick and thread-safe
        (to reach an event loop, use ``loop.call_soon_threadsafe``). Exceptions raised by
        ``fn`` are reported through ``sys.unraisablehook``.
        """
        self._handle.add_done_callback(lambda: fn(self))

    def __await__(self) -> Generator[Any, None, int]:
        yield from _until_done(self)
        return self.get()

    def __repr__(self) -> str:
        return f"<kvikpy.IOFuture {'done' if self.done() else 'pending'}>"

    def _repr_html_(self) -> str:
        """A table for notebooks: pending with the bytes moved so far, or done with the
        byte count, or failed with the error (shown, not raised)."""
        from kvikpy._display import future_rows, html_table

        return html_table("kvikpy.IOFuture", future_rows(self._handle))


def _until_done(future: Any) -> Generator[Any, None, None]:
    """Wait in the running asyncio loop until ``future`` (anything with ``done()`` and
    ``add_done_callback(fn)``, ``fn`` called with the future from any thread) is done."""
    if future.done():
        return
    import asyncio  # deferred: asyncio costs ~40 ms of `import kvikpy`

    loop = asyncio.get_running_loop()
    waiter = loop.create_future()

    def wake(_: Any) -> None:
        # RuntimeError: the loop was closed in the meantime; nobody is waiting.
        with contextlib.suppress(RuntimeError):
            loop.call_soon_threadsafe(_resolve, waiter)

    future.add_done_callback(wake)
    yield from waiter.__await__()


def _resolve(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


def wait_all(futures: Iterable[IOFuture]) -> list[int]:
    """Wait for every future; return their byte counts in order.

    Parameters
    ----------
    futures
        The futures to wait for (any iterable of :class:`IOFuture`).

    Returns
    -------
    list[int]
        The bytes each one transferred, in the order given.

    Notes
    -----
    All futures are waited for before any error is raised, so no operation is left running
    behind the exception; the first failure (in order) is then raised.
    """
    futures = list(futures)
    results: list[int] = []
    first_error: BaseException | None = None
    for fut in futures:
        try:
            results.append(fut.get())
        except Exception as exc:
            results.append(0)
            if first_error is None:
                first_error = exc
    if first_error is not None:
        raise first_error
    return results


class IOFutureStream:
    """A stream-ordered read or write, from :meth:`CuFile.raw_read_async` or
    :meth:`CuFile.raw_write_async`.

    The transfer runs after the work queued on its stream before the call, and work queued
    on the stream afterwards sees its bytes (reads) or may reuse the buffer (writes): the
    ordering is enforced on the GPU, so the call returns at once and no thread blocks.
    """

    __slots__ = ("_handle",)

    def __init__(self, handle: _lib.StreamFuture) -> None:
        """Wrap a stream-ordered transfer (made by :class:`CuFile`, not by hand).

        Parameters
        ----------
        handle
            The engine's handle of the transfer.
        """
        self._handle = handle

    def check_bytes_done(self) -> int:
        """Wait for the transfer and the stream to reach it; return the bytes moved."""
        return self._handle.check_bytes_done()

    def done(self) -> bool:
        """Return True if kvikpy's part of the transfer has finished."""
        return self._handle.done()

    @property
    def stream(self) -> int:
        """The raw ``CUstream`` handle the transfer is ordered in."""
        return self._handle.stream

    def __repr__(self) -> str:
        state = "done" if self.done() else "pending"
        return f"<kvikpy.IOFutureStream stream={self.stream:#x} {state}>"


def _reopen(path: str, flags: OpenMode) -> CuFile:
    """A pickled :class:`CuFile` in the unpickling process: ``"w"`` modes become ``"r+"``
    (keep the bytes, still writable), others stay."""
    if flags.startswith("w"):
        flags = "r+b" if "b" in flags else "r+"
    return CuFile(path, flags)


class CuFile(OpenFile):
    """A file opened for parallel reads and writes into host or GPU memory.

    Parameters
    ----------
    file
        Path of the file.
    flags
        ``"r"`` (read), ``"r+"`` (read and write), ``"w"`` (create or truncate, write) or
        ``"w+"`` (create or truncate, read and write), each optionally with ``"b"``.

    Raises
    ------
    FileNotFoundError
        If the file does not exist (modes ``"r"`` and ``"r+"``).
    PermissionError
        If the file may not be opened in this mode.
    IsADirectoryError
        If the path is a directory.
    OSError
        For any other failure to open the file.
    ValueError
        For any other mode (``"a"`` included).

    Notes
    -----
    Reads that reach the end of the file return the short count (0 at or past the end);
    they never raise for it. All methods raise ``ValueError("I/O operation on closed
    file")`` after :meth:`close`. ``CuFile`` is a context manager.

    An open ``CuFile`` pickles (to multiprocessing or Dask workers) as its absolute path
    and mode, and the worker opens the file again; it has no file position to carry, as
    every read and write names its offset. ``"w"`` and ``"w+"`` files are reopened
    ``"r+"``, so that a worker never truncates the file; a closed ``CuFile`` refuses to
    pickle (``TypeError``).

    Examples
    --------
    >>> import numpy as np, kvikpy
    >>> a = np.arange(100, dtype="uint8")
    >>> with kvikpy.CuFile("/tmp/kvikpy-doctest", "w") as f:
    ...     f.write(a)
    100
    >>> b = np.empty_like(a)
    >>> with kvikpy.CuFile("/tmp/kvikpy-doctest", "r") as f:
    ...     f.read(b)
    100
    """

    # A remote file's URL, kept as given (the engine's path would collapse its "//").
    _url: str | None = None

    def __init__(self, file: _paths.StrPath, flags: OpenMode = "r") -> None:
        name = _paths.fspath(file)
        self._handle = _lib.FileHandle(name, flags)
        self._flags: OpenMode = flags
        # Every URL has "://"; the substring test spares local paths the scheme check.
        if "://" in name and _paths.is_url(name):
            self._url = name

    @classmethod
    def _create_keep(cls, file: _paths.StrPath) -> CuFile:
        """Open ``file`` to read and write, creating it if missing and never truncating
        it, in one ``open(2)`` (for :func:`kvikpy.write`: no other process can create or
        remove the file between a check and the open). It reports, and pickles, as
        ``"r+"``: the file exists once it is open."""
        return cls._open_raw(file, _CREATE_KEEP, "r+")

    @classmethod
    def _open_raw(cls, file: _paths.StrPath, mode: str, reported: OpenMode) -> CuFile:
        """Open ``file`` with one of the engine's own modes, reporting (and pickling) as
        ``reported``."""
        self = cls.__new__(cls)
        self._handle = _lib.FileHandle(_paths.fspath(file), mode)
        self._flags = reported
        return self

    @classmethod
    @contextlib.contextmanager
    def _one_shot(
        cls, file: _paths.StrPath, span: tuple[int, int] | None = None, sync: bool | None = None
    ) -> Iterator[CuFile]:
        """``file`` written by one call (:func:`kvikpy.write`, :func:`kvikpy.numpy.tofile`,
        :func:`kvikpy.arrow.write_ipc` through pyarrow), whole or not at all.

        The body writes a new file under a temporary name beside ``file``: empty for a
        whole new file (``span`` None), or, for a write of ``span = (offset, nbytes)``
        that leaves some of ``file``'s bytes in place, a copy of ``file``. It takes
        ``file``'s place only once the body has finished (synced to the disk first if
        ``sync``, or by default with the ``write_sync`` setting); if the body raises (a
        full disk, an interrupt, a bad source), the temporary file is removed and
        ``file`` is exactly as it was, or still absent. A path naming something other
        than a regular file (a device, a pipe) cannot be replaced and is written in
        place."""
        name = _paths.fspath(file)
        try:
            st: os.stat_result | None = os.stat(name)
        except FileNotFoundError:
            st = None
        keep = span is not None and st is not None and (span[0] > 0 or st.st_size > sum(span))
        if st is not None and not stat.S_ISREG(st.st_mode):
            f = cls._create_keep(file) if keep else CuFile(file, "w")
            try:
                yield f
            finally:
                f.close()
            return
        replacement = _lib.Replacement(name, keep)
        try:
            with CuFile(replacement.path, "r+") as f:
                yield f
        except BaseException:
            replacement.abort()
            raise
        if sync is None:
            sync = bool(_lib.get_setting("write_sync"))
        replacement.commit(sync)

    def fileno(self) -> int:
        """The file descriptor (the one without O_DIRECT)."""
        return self._handle.fileno()

    def open_flags(self) -> int:
        """The descriptor's flags, as ``fcntl(fd, F_GETFL)`` reports them (see open(2))."""
        return self._handle.open_flags()

    def nbytes(self) -> int:
        """The size of the file in bytes."""
        return self._handle.nbytes()

    def is_direct_io_supported(self) -> bool:
        """Whether the file's filesystem accepts O_DIRECT (used when ``auto_direct_io_*``)."""
        return self._handle.is_direct_io_supported()

    @property
    def backend(self) -> tuple[str, str]:
        """Which source reads and writes the file, and why it was chosen at open.

        ``("cufile", why)``: GPU transfers of at least ``gds_threshold`` bytes go through
        cuFile (GPUDirect Storage); ``("posix", why)``: every transfer goes through POSIX
        I/O (pinned bounce buffers for GPU memory). The choice follows kvikio's
        ``compat_mode`` rule, for example ``("posix", "compat_mode is AUTO and cuFile
        refused the file: HANDLE_NOT_REGISTERED (5027) file descriptor is not
        registered (in cuFileHandleRegister)")``. Kept after :meth:`close`.
        """
        return self._handle.backend

    @property
    def path(self) -> str:
        """The path the file was opened with (a remote file's URL, as given but for its
        password, shown as ``***``)."""
        if self._url is not None:
            return _paths.redact_url(self._url)
        return _paths.fspath(self._handle.path)

    @property
    def mode(self) -> OpenMode:
        """The mode the file was opened with (``"r"``, ``"w+"``...)."""
        return self._flags

    def __reduce__(self) -> tuple[Any, tuple[str, OpenMode]]:
        """Pickle support (multiprocessing, Dask): the worker reopens the file by its
        absolute path. A file opened with ``"w"`` or ``"w+"`` is reopened ``"r+"``, so
        unpickling never truncates what was written before; a closed file refuses."""
        if self.closed:
            raise TypeError(
                f"cannot pickle the closed {self!r}: there is nothing to reopen; pickle "
                "its path instead, or pickle it while it is open"
            )
        return (_reopen, (self._url or os.path.abspath(self.path), self._flags))

    def __repr__(self) -> str:
        from kvikpy._display import cufile_repr

        return cufile_repr(self)

    def _repr_html_(self) -> str:
        from kvikpy._display import cufile_rows, html_table

        return html_table("kvikpy.CuFile", cufile_rows(self))

    def pread(
        self,
        buf: BufferLike,
        size: int | None = None,
        file_offset: int = 0,
        task_size: int | None = None,
    ) -> IOFuture:
        """Start reading ``size`` bytes at ``file_offset`` into ``buf``; return a future.

        Parameters
        ----------
        buf
            A writable, contiguous buffer: host memory (``bytearray``, numpy array...) or
            GPU memory (torch tensor, CuPy array, anything with
            ``__cuda_array_interface__`` or CUDA ``__dlpack__``, ``kvikpy.Buffer``).
        size
            Bytes to read; default the buffer's size. Larger than the buffer is an error.
        file_offset
            Where in the file to start.
        task_size
            Split the read into tasks of this many bytes run on the thread pool (exactly:
            a size passed here is the split); default ``defaults.get("task_size")``, which
            a small request may cut finer to spread it over idle threads.

        Returns
        -------
        IOFuture
            Resolves to the bytes read: short if the file ends first.
        """
        return IOFuture(self._handle.pread(buf, size, file_offset, task_size))

    def pwrite(
        self,
        buf: BufferLike,
        size: int | None = None,
        file_offset: int = 0,
        task_size: int | None = None,
    ) -> IOFuture:
        """Start writing ``size`` bytes of ``buf`` at ``file_offset``; return a future.

        Writing past the end extends the file.

        Parameters
        ----------
        buf
            A contiguous buffer, read-only allowed: host memory (``bytes``, numpy array...)
            or GPU memory (torch tensor, CuPy array, anything with
            ``__cuda_array_interface__`` or CUDA ``__dlpack__``, ``kvikpy.Buffer``).
        size
            Bytes to write; default the buffer's size. Larger than the buffer is an error.
        file_offset
            Where in the file to start.
        task_size
            Split the write into tasks of this many bytes run on the thread pool (exactly:
            a size passed here is the split); default ``defaults.get("task_size")``, which
            a small request may cut finer to spread it over idle threads.

        Returns
        -------
        IOFuture
            Resolves to the bytes written.
        """
        return IOFuture(self._handle.pwrite(buf, size, file_offset, task_size))

    def read(
        self,
        buf: BufferLike,
        size: int | None = None,
        file_offset: int = 0,
        task_size: int | None = None,
    ) -> int:
        """Read into ``buf`` and return the number of bytes read (blocking :meth:`pread`).

        Parameters
        ----------
        buf
            A writable, contiguous buffer in host or GPU memory (as for :meth:`pread`).
        size
            Bytes to read; default the buffer's size. Larger than the buffer is an error.
        file_offset
            Where in the file to start.
        task_size
            Split the read into tasks of this many bytes run on the thread pool (exactly:
            a size passed here is the split); default ``defaults.get("task_size")``, which
            a small request may cut finer to spread it over idle threads.

        Returns
        -------
        int
            The bytes read: short if the file ends first, 0 at or past the end.
        """
        return self._handle.read(buf, size, file_offset, task_size)

    def write(
        self,
        buf: BufferLike,
        size: int | None = None,
        file_offset: int = 0,
        task_size: int | None = None,
    ) -> int:
        """Write ``buf`` and return the number of bytes written (blocking :meth:`pwrite`).

        Parameters
        ----------
        buf
            A contiguous buffer in host or GPU memory, read-only allowed (as for
            :meth:`pwrite`).
        size
            Bytes to write; default the buffer's size. Larger than the buffer is an error.
        file_offset
            Where in the file to start.
        task_size
            Split the write into tasks of this many bytes run on the thread pool (exactly:
            a size passed here is the split); default ``defaults.get("task_size")``, which
            a small request may cut finer to spread it over idle threads.

        Returns
        -------
        int
            The bytes written.
        """
        return self._handle.write(buf, size, file_offset, task_size)

    def raw_read(
        self, buf: BufferLike, size: int | None = None, file_offset: int = 0, dev_offset: int = 0
    ) -> int:
        """Read into device memory in one call in this thread, without the thread pool.

        Device memory only: host buffers raise ``ValueError`` (use :meth:`read`).

        Parameters
        ----------
        buf
            Writable, contiguous GPU memory (torch tensor, CuPy array, ``kvikpy.Buffer``...).
        size
            Bytes to read; default the rest of the buffer after ``dev_offset``.
        file_offset
            Where in the file to start.
        dev_offset
            Where in ``buf`` the bytes land, in bytes from its start.

        Returns
        -------
        int
            The bytes read: short if the file ends first.
        """
        return self._handle.raw_read(buf, size, file_offset, dev_offset)

    def raw_write(
        self, buf: BufferLike, size: int | None = None, file_offset: int = 0, dev_offset: int = 0
    ) -> int:
        """Write from device memory in one call in this thread, without the thread pool.

        Device memory only: host buffers raise ``ValueError`` (use :meth:`write`).

        Parameters
        ----------
        buf
            Contiguous GPU memory (torch tensor, CuPy array, ``kvikpy.Buffer``...).
        size
            Bytes to write; default the rest of the buffer after ``dev_offset``.
        file_offset
            Where in the file to start.
        dev_offset
            Where in ``buf`` the bytes start, in bytes from its start.

        Returns
        -------
        int
            The bytes written.
        """
        return self._handle.raw_write(buf, size, file_offset, dev_offset)

    def raw_read_async(
        self,
        buf: BufferLike,
        stream: Any,
        size: int | None = None,
        file_offset: int = 0,
        dev_offset: int = 0,
    ) -> IOFutureStream:
        """Read into device memory in ``stream``'s order; returns at once.

        The read starts after the work already queued on ``stream`` and work queued on it
        later sees the bytes. Device memory only.

        Parameters
        ----------
        buf
            Writable, contiguous GPU memory (torch tensor, CuPy array, ``kvikpy.Buffer``...).
        stream
            The CUDA stream to order the read in: a raw ``CUstream`` handle (an int) or a
            stream object of PyTorch, CuPy, Numba or CUDA Python.
        size
            Bytes to read; default the rest of the buffer after ``dev_offset``.
        file_offset
            Where in the file to start.
        dev_offset
            Where in ``buf`` the bytes land, in bytes from its start.

        Returns
        -------
        IOFutureStream
            :meth:`IOFutureStream.check_bytes_done` waits and returns the bytes read.
        """
        return IOFutureStream(
            self._handle.raw_read_async(buf, stream_handle(stream), size, file_offset, dev_offset)
        )

    def raw_write_async(
        self,
        buf: BufferLike,
        stream: Any,
        size: int | None = None,
        file_offset: int = 0,
        dev_offset: int = 0,
    ) -> IOFutureStream:
        """Write from device memory in ``stream``'s order; returns at once.

        The write reads the buffer after the work already queued on ``stream``; work
        queued later may overwrite the buffer. Device memory only.

        Parameters
        ----------
        buf
            Contiguous GPU memory (torch tensor, CuPy array, ``kvikpy.Buffer``...).
        stream
            The CUDA stream to order the write in: a raw ``CUstream`` handle (an int) or a
            stream object of PyTorch, CuPy, Numba or CUDA Python.
        size
            Bytes to write; default the rest of the buffer after ``dev_offset``.
        file_offset
            Where in the file to start.
        dev_offset
            Where in ``buf`` the bytes start, in bytes from its start.

        Returns
        -------
        IOFutureStream
            :meth:`IOFutureStream.check_bytes_done` waits and returns the bytes written.
        """
        return IOFutureStream(
            self._handle.raw_write_async(buf, stream_handle(stream), size, file_offset, dev_offset)
        )


def engine_handle(f: CuFile) -> _lib.FileHandle:
    """The engine's handle behind ``f``, for kvikpy's own modules that call it directly
    (exact reads, sizes worded for the caller); not part of the public API."""
    return f._handle


def engine_future(future: IOFuture) -> _lib.Future:
    """The engine's handle behind ``future`` (see :func:`engine_handle`)."""
    return future._handle
