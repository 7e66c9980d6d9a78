"""Memory-mapped reads with kvikio's API: :class:`Mmap`.

A region of a file is mapped once, when the :class:`Mmap` is made; reads then copy out of
the mapping into host memory (numpy arrays, ``bytearray``, ``memoryview``...) or GPU
memory (CuPy, torch...), on kvikpy's thread pool like :class:`kvikpy.CuFile`'s. Worth it
where many small, scattered ranges of one file are read again and again: pages come in
on demand and stay mapped, and no read pays for opening the file.

This module is named after kvikio's ``kvikio.mmap``; Python's own :mod:`mmap` module is
unaffected (``import mmap`` still finds it).
"""

from __future__ import annotations

import os

import kvikpy._lib as _lib
from kvikpy._closing import ClosedOnExit
from kvikpy.cufile import BufferLike, IOFuture

__all__ = ["Mmap"]


class Mmap(ClosedOnExit):
    """A file region mapped read-only, read into host or GPU memory.

    Parameters
    ----------
    file_path
        Path of the file.
    flags
        ``"r"`` (or ``"rb"``): mapping is for reading only. Writing modes (``"w"``,
        ``"a"``, ``"+"``) raise ``ValueError``, as in kvikio.
    initial_map_size
        Bytes to map; ``None`` maps from ``initial_map_offset`` to the end of the file.
    initial_map_offset
        Where in the file the mapped region starts.
    mode
        Permission bits for a created file (kvikio's argument; nothing is ever created,
        since only reading is supported).
    map_flags
        Flags for ``mmap(2)``: ``mmap.MAP_PRIVATE`` (the default) or ``mmap.MAP_SHARED``,
        optionally with ``MAP_POPULATE`` (read the whole region in at once),
        ``MAP_NORESERVE``, ``MAP_LOCKED`` or ``MAP_NONBLOCK``.

    Raises
    ------
    OSError
        The file cannot be opened (``FileNotFoundError``, ``PermissionError``...), or
        ``mmap`` refused it.
    IndexError
        The region does not lie inside the file: ``initial_map_offset`` at or past its
        end, or ``initial_map_offset + initial_map_size`` past it.
    ValueError
        ``initial_map_size`` is 0, ``flags`` is not ``"r"``, ``map_flags`` holds flags
        that would not map the file where kvikpy chooses (``MAP_FIXED``,
        ``MAP_ANONYMOUS``...), or a number is negative.

    Notes
    -----
    Reads must lie inside the mapped region. A file that shrinks after it was mapped is
    an ``OSError`` on the next read that reaches the missing bytes, never a crash: kvikpy
    has the kernel copy out of the mapping, which reports missing pages instead of
    raising SIGBUS. An empty file maps nothing; reads of 0 bytes at offset 0 succeed.

    Examples
    --------
    >>> import numpy as np, kvikpy
    >>> np.arange(1024, dtype="u1").tofile("/tmp/kvikpy-mmap-doc.bin")
    >>> with kvikpy.Mmap("/tmp/kvikpy-mmap-doc.bin", initial_map_offset=256) as m:
    ...     out = np.empty(16, dtype="u1")
    ...     m.read(out, size=16, offset=512)
    16
    >>> int(out[0])
    0
    """

    __slots__ = ("_handle",)

    def __init__(
        self,
        file_path: str | os.PathLike[str],
        flags: str = "r",
        initial_map_size: int | None = None,
        initial_map_offset: int = 0,
        mode: int = 0o644,
        map_flags: int | None = None,
    ) -> None:
        self._handle = _lib.MmapHandle(
            os.fspath(file_path), flags, initial_map_size, initial_map_offset, mode, map_flags
        )

    def initial_map_size(self) -> int:
        """Size in bytes of the region mapped when the handle was made: 0 for an empty file
        and once the handle is closed (as kvikio)."""
        return self._handle.initial_map_size()

    def initial_map_offset(self) -> int:
        """File offset of the region mapped when the handle was made: 0 once the handle is
        closed (as kvikio)."""
        return self._handle.initial_map_offset()

    def file_size(self) -> int:
        """The file's current size in bytes: 0 once the handle is closed (as kvikio)."""
        return self._handle.file_size()

    def close(self) -> None:
        """Unmap the region and close the file; does nothing if already closed.

        Reads still running finish first on their own reference to the mapping.
        """
        self._handle.close()

    def closed(self) -> bool:
        """True once :meth:`close` has been called (a method, as in kvikio)."""
        return self._handle.closed()

    def read(self, buf: BufferLike, size: int | None = None, offset: int = 0) -> int:
        """Read ``size`` bytes at file offset ``offset`` into ``buf`` and wait for them.

        Large reads are split over the thread pool, with the calling thread helping.

        Parameters
        ----------
        buf
            Host or GPU memory to fill from its start: anything :meth:`kvikpy.CuFile.read`
            takes.
        size
            Bytes to read; ``None`` reads from ``offset`` to the end of the file.
        offset
            File offset of the first byte.

        Returns
        -------
        int
            The number of bytes read (``size``).

        Raises
        ------
        IndexError
            ``offset`` is past the end of the file, or the range lies outside the mapped
            region (kvikio's rule: with ``size=None`` that is to the end of the *file*).
        ValueError
            ``buf`` is smaller than the bytes asked for (kvikio would overrun it).
        kvikpy.MmapClosedError
            The handle is closed (a ``ValueError`` and a ``RuntimeError``).
        OSError
            The file shrank since it was mapped and no longer has the bytes.
        """
        return self._handle.read(buf, size, offset)

    def pread(
        self,
        buf: BufferLike,
        size: int | None = None,
        offset: int = 0,
        task_size: int | None = None,
    ) -> IOFuture:
        """Start reading ``size`` bytes at file offset ``offset`` into ``buf``, in
        parallel on the thread pool.

        Parameters
        ----------
        buf
            Host or GPU memory to fill from its start.
        size
            Bytes to read; ``None`` reads from ``offset`` to the end of the file.
        offset
            File offset of the first byte.
        task_size
            Most bytes one pool task copies; ``None`` for the ``task_size`` setting.

        Returns
        -------
        IOFuture
            Its :meth:`~kvikpy.IOFuture.get` returns the number of bytes read. The
            buffer and the mapping stay valid until the read finishes, even if the
            future or this handle is dropped or closed first.

        Raises
        ------
        IndexError
            As :meth:`read`, before anything starts.
        ValueError
            As :meth:`read`, before anything starts.
        kvikpy.MmapClosedError
            The handle is closed.
        """
        return IOFuture(self._handle.pread(buf, size, offset, task_size))

    def __repr__(self) -> str:
        if self.closed():
            return f"<kvikpy.Mmap {self._handle.path!r} closed>"
        start = self.initial_map_offset()
        return (
            f"<kvikpy.Mmap {self._handle.path!r} bytes {start}..{start + self.initial_map_size()}>"
        )
