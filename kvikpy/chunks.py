"""Streaming a file in consecutive chunks, reading ahead while the caller works."""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Iterator
from typing import Any

import kvikpy._lib as _lib
from kvikpy import _args, _devices, _paths
from kvikpy._closing import ClosedOnExit
from kvikpy.cufile import CuFile, engine_handle

#: Reads in flight at least when chunks take several devices in turn (and at least one
#: per device): with one read per device, each device's pool idled at the end of every
#: chunk (one process onto two H100s, 256 MiB chunks: 62.6 GB/s with two reads in
#: flight, 71.9 with four; onto four, 80.9 with four and 73.8 with eight).
SPREAD_AHEAD = 4


class ChunkIterator(Iterator[_lib.Buffer], ClosedOnExit):
    """Consecutive chunks of a file as :class:`kvikpy.Buffer` s, read ``depth`` ahead.

    Returned by :func:`iter_chunks`, not made directly; also a context manager that
    closes the file.

    Parameters
    ----------
    path
        The file.
    chunk_size
        Bytes per chunk (the last chunk may be shorter).
    ordinal
        The CUDA device to read into, or ``None`` for host memory; a list of devices
        takes them in turn, chunk ``k`` on ``ordinal[k % len(ordinal)]``.
    depth
        How many chunks are read ahead.
    progress
        Show a progress bar of the bytes read.
    """

    def __init__(
        self,
        path: str,
        chunk_size: int,
        ordinal: int | list[int | None] | None,
        depth: int,
        progress: bool = False,
    ):
        self._file = CuFile(path, "r")
        try:
            self._size = engine_handle(self._file).size_for("iter_chunks")
        except BaseException:
            self._file.close()
            raise
        self._bar: Any = None
        if progress:
            from kvikpy._progress import bar

            try:
                self._bar = bar(self._size, f"iter_chunks {os.path.basename(path)}")
            except BaseException:
                self._file.close()
                raise
        # A chunk larger than the file would allocate memory no chunk ever fills.
        self._chunk = max(min(chunk_size, self._size), 1)
        self._ordinals = ordinal if isinstance(ordinal, list) else [ordinal]
        self._ordinal = self._ordinals[0] if len(self._ordinals) == 1 else None
        n = len(self._ordinals)
        self._depth = max(depth, n, SPREAD_AHEAD) if n > 1 else depth
        self._chunks = 0  # chunks started so far: the next one's device is its turn
        self._next_offset = 0  # of the next chunk to start reading
        self._pending: deque[tuple[_lib.Buffer, int, _lib.Future]] = deque()
        self._owned: list[_lib.Buffer] = []  # every allocation the iterator made
        self._device: dict[int, int | None] = {}  # id of an owned buffer -> its device
        self._allocations = 0

    @property
    def allocations(self) -> int:
        """Buffers allocated so far: ``depth + 2`` when each chunk is dropped by the time
        the one after next is asked for; more only while the caller keeps chunks."""
        return self._allocations

    def _free_buffer(self, busy: set[int], ordinal: int | None) -> _lib.Buffer:
        for buf in self._owned:
            # Only the iterator's own reference: no chunk view, export or read holds it.
            if id(buf) not in busy and buf._holders == 1 and self._device[id(buf)] == ordinal:
                return buf
        buf = _lib.Buffer.allocate(self._chunk, ordinal, False)
        self._allocations += 1
        self._owned.append(buf)
        self._device[id(buf)] = ordinal
        return buf

    def _fill(self) -> None:
        """Keep ``depth`` reads in flight."""
        while len(self._pending) < self._depth and self._next_offset < self._size:
            busy = {id(b) for b, _, _ in self._pending}
            ordinal = self._ordinals[self._chunks % len(self._ordinals)]
            buf = self._free_buffer(busy, ordinal)
            self._chunks += 1
            n = min(self._chunk, self._size - self._next_offset)
            # Exact: the engine fails the read if the file shrank since it was sized.
            future = engine_handle(self._file).pread_exact(buf, n, self._next_offset)
            self._pending.append((buf, n, future))
            self._next_offset += n
        # Let go of buffers beyond the ring's depth + 2 once the caller has let go of them
        # too (they were allocated while the caller kept chunks).
        busy = {id(b) for b, _, _ in self._pending}
        for b in [b for b in self._owned if id(b) not in busy and b._holders == 1]:
            if len(self._owned) <= self._depth + 2 * len(self._ordinals):
                break
            self._owned.remove(b)
            del self._device[id(b)]

    def __iter__(self) -> ChunkIterator:
        return self

    def __next__(self) -> _lib.Buffer:
        if self._file.closed:
            raise StopIteration
        self._fill()
        if not self._pending:
            self.close()
            raise StopIteration
        buf, n, future = self._pending.popleft()
        future.get()
        view = buf.view("|u1", 1, 8, [n], 0, n)
        if self._bar is not None:
            self._bar.update(n)
        self._fill()  # start the next reads before the caller works on this chunk
        return view

    def __arrow_c_stream__(self, requested_schema: Any = None) -> Any:
        """The remaining chunks of a host iterator (``device="cpu"``) as an Arrow C stream
        (``arrow_array_stream`` capsule), without a copy: record batches with one
        ``uint8`` column, ``bytes``, one batch per chunk, so
        ``pyarrow.RecordBatchReader.from_stream(it)`` and ``pyarrow.table(it)`` work; or
        plain ``uint8`` arrays when ``requested_schema`` asks for ``uint8``
        (``pyarrow.chunked_array(it, type=pyarrow.uint8())``). The consumer's
        ``get_next`` advances this same iterator. GPU iterators raise ``BufferError``:
        use ``__arrow_c_device_stream__``."""
        if len(self._ordinals) > 1:
            raise BufferError(
                "this iterator takes several devices in turn; an Arrow stream holds one "
                "device's memory: iterate it instead"
            )
        if self._ordinal is not None:
            raise BufferError(
                f"this iterator reads into the memory of GPU {self._ordinal}, which the "
                "Arrow C stream interface cannot describe; use __arrow_c_device_stream__, "
                'or iterate with device="cpu"'
            )
        return _lib.host_stream_capsule(self, requested_schema)

    def __arrow_c_device_stream__(self, requested_schema: Any = None, **kwargs: Any) -> Any:
        """The remaining chunks as an Arrow C device stream (``arrow_device_array_stream``
        capsule) of ``uint8`` arrays, one per chunk, on this iterator's device. The
        consumer's ``get_next`` advances this same iterator."""
        _lib.check_device_kwargs("__arrow_c_device_stream__", kwargs)
        if len(self._ordinals) > 1:
            raise BufferError(
                "this iterator takes several devices in turn; an Arrow device stream holds "
                "one device's memory: iterate it instead"
            )
        return _lib.device_stream_capsule(self, self._ordinal is not None)

    def close(self) -> None:
        """Wait for reads still running, then close the file."""
        for _, _, future in self._pending:
            future.get()
        self._pending.clear()
        self._file.close()
        if self._bar is not None:
            self._bar.close()
            self._bar = None

    def __repr__(self) -> str:
        return (
            f"<kvikpy.ChunkIterator {self._chunk:,}-byte chunks, at byte "
            f"{self._next_offset:,} of {self._size:,}>"
        )


def iter_chunks(
    path: _paths.StrPath,
    chunk_size: int,
    *,
    device: str | int | list[str | int] | tuple[str | int, ...] = "cuda",
    depth: int = 2,
    progress: bool = False,
) -> ChunkIterator:
    """Iterate over a file in consecutive chunks of ``chunk_size`` bytes (the last may be
    shorter), reading the next ``depth`` chunks while the caller works on the current
    one, so a file many times larger than GPU memory streams at disk or PCIe speed.

    A chunk is never overwritten while anything still holds it (the chunk itself, a
    tensor made from it with DLPack, an Arrow export): the iterator reuses a buffer only
    once nothing but itself refers to it, and otherwise allocates a new one. A plain
    ``for chunk in iter_chunks(...)`` loop therefore cycles through ``depth + 2``
    buffers; keeping chunks costs memory, never correctness.

    Parameters
    ----------
    path
        The file.
    chunk_size
        Bytes per chunk (a positive integer); a chunk size larger than the file reads
        the file in one chunk of its size.
    device
        ``"cuda"``, ``"cuda:N"``, an int, or ``"cpu"``; a list of devices
        (``["cuda:0", "cuda:1"]``) takes them in turn, chunk ``k`` on device
        ``k % len(device)`` (each chunk's ``device`` says where it is), and reads at
        least four chunks ahead, and one per device. Such an iterator has no Arrow
        stream export.
    depth
        Chunks read ahead (a positive integer).
    progress
        Show a progress bar of the bytes delivered (see :func:`kvikpy.read`).

    Examples
    --------
    >>> for chunk in kvikpy.iter_chunks("huge.bin", 256 << 20):  # doctest: +SKIP
    ...     total += cupy.from_dlpack(chunk).sum()
    """
    chunk_size = _args.positive("chunk_size", chunk_size)
    depth = _args.positive("depth", depth)
    if isinstance(device, (list, tuple)):
        if not device:
            raise ValueError("device= lists no devices; give at least one")
        ordinals = [_devices.resolve(d) for d in device]
        if len(set(ordinals)) != len(ordinals):
            raise ValueError(f"device= names a device twice: {list(device)!r}")
        return ChunkIterator(_paths.fspath(path), chunk_size, ordinals, depth, progress)
    return ChunkIterator(_paths.fspath(path), chunk_size, _devices.resolve(device), depth, progress)


__all__ = ["ChunkIterator", "iter_chunks"]
