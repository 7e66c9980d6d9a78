"""Chunk reads for :class:`kvikpy.zarr.GDSStore`: byte requests become kvikpy batch reads,
and the gets zarr issues concurrently are gathered into one batch.

zarr reads an array by starting many ``store.get`` coroutines at once (up to its
``async.concurrency``, per mini-batch of chunks). Reading each in its own thread, as
``LocalStore`` does, costs one allocation, one read and, for GPU buffers, one transfer per
chunk. Here each get only queues its request on the event loop's :class:`Gatherer` and
waits; a moment later (once the coroutines started with it have queued theirs) the
gatherer hands every queued request to one :func:`read_requests` call in a worker thread:
one kvikpy batch read (one pass on the pool, one allocation, few DMAs), whose elements
become the buffers the gets return.
"""

from __future__ import annotations

import asyncio
import importlib
import weakref
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from zarr.abc.store import ByteRequest, OffsetByteRequest, RangeByteRequest, SuffixByteRequest
from zarr.core.buffer import Buffer, BufferPrototype

import kvikpy._lib as _lib
from kvikpy.zarr import _rounds

# Each element starts on a 256-byte boundary: nvCOMP wants aligned inputs, and the views
# zarr makes of uncompressed chunks (float64 and the like) are then aligned too.
ALIGN = 256

# Errors that mean "no such key" to zarr (LocalStore returns None for them).
MISSING = (FileNotFoundError, IsADirectoryError, NotADirectoryError)


@dataclass(frozen=True)
class Request:
    """One get: a file, where its bytes start, how many (``None``: to the end) and where
    they go (a GPU ordinal, or ``None`` for host memory)."""

    path: str
    start: int
    from_end: bool
    size: int | None
    ordinal: int | None
    prototype: BufferPrototype


def gpu_ordinal(prototype: BufferPrototype) -> int | None:
    """The GPU that ``prototype``'s buffers live on (CuPy's current device), or ``None``
    for host buffers. zarr's GPU buffers are ``zarr.core.buffer.gpu.Buffer`` (what
    ``zarr.config.enable_gpu()`` selects); any other buffer class is read into host
    memory and handed to it as a numpy array."""
    from zarr.core.buffer import gpu

    if isinstance(prototype.buffer, type) and issubclass(prototype.buffer, gpu.Buffer):
        cupy: Any = importlib.import_module("cupy")
        return int(cupy.cuda.runtime.getDevice())
    return None


def request(path: Path, prototype: BufferPrototype, byte_range: ByteRequest | None) -> Request:
    """The :class:`Request` for ``byte_range`` of ``path``, with zarr's semantics: a range
    reaching past the end of the file is cut there, one starting past it is empty.

    Raises
    ------
    TypeError
        For anything that is not one of zarr's byte requests (zarr's store tests expect
        "Unexpected byte_range, got ...").
    ValueError
        For a negative offset, suffix or range.
    """
    ordinal = gpu_ordinal(prototype)
    name = str(path)
    match byte_range:
        case None:
            return Request(name, 0, False, None, ordinal, prototype)
        case RangeByteRequest(start=start, end=end):
            if start < 0 or end < start:
                raise ValueError(
                    f"a byte range must satisfy 0 <= start <= end, got start={start}, end={end}"
                )
            return Request(name, start, False, end - start, ordinal, prototype)
        case OffsetByteRequest(offset=offset):
            if offset < 0:
                raise ValueError(f"a byte offset must be non-negative, got {offset}")
            return Request(name, offset, False, None, ordinal, prototype)
        case SuffixByteRequest(suffix=suffix):
            if suffix < 0:
                raise ValueError(f"a byte suffix must be non-negative, got {suffix}")
            if suffix == 0:  # the last 0 bytes
                return Request(name, 0, False, 0, ordinal, prototype)
            return Request(name, suffix, True, None, ordinal, prototype)
    raise TypeError(
        f"Unexpected byte_range, got {byte_range!r}: pass a RangeByteRequest, "
        "OffsetByteRequest, SuffixByteRequest or None"
    )


def read_requests(requests: Sequence[Request]) -> list[Buffer | BaseException | None]:
    """Read every request, those for the same memory (one GPU, or the host) in one kvikpy
    batch read each; blocks. Each result is the request's buffer (of its prototype), or
    ``None`` for a missing key, or the exception reading it raised."""
    out: list[Buffer | BaseException | None] = [None] * len(requests)
    by_place: dict[int | None, list[int]] = {}
    for i, r in enumerate(requests):
        by_place.setdefault(r.ordinal, []).append(i)
    for ordinal, indices in by_place.items():
        group = [requests[i] for i in indices]
        try:
            results = _read_group(group, ordinal)
        except BaseException as e:  # the whole batch failed (allocation, CUDA)
            results = [e] * len(group)
        for i, result in zip(indices, results, strict=True):
            out[i] = result
    return out


def _read_group(
    group: Sequence[Request], ordinal: int | None
) -> list[Buffer | BaseException | None]:
    ranges = [(r.path, r.start, r.from_end, r.size) for r in group]
    buffer, offsets, lengths, failed = _lib.read_file_ranges_batch(ranges, ordinal, True, ALIGN)
    failures = dict(failed)
    results: list[Buffer | BaseException | None] = []
    for i, r in enumerate(group):
        error = failures.get(i)
        if error is not None:
            results.append(None if isinstance(error, MISSING) else error)
        else:
            results.append(_as_zarr_buffer(buffer, offsets[i], lengths[i], r))
    return results


def _as_zarr_buffer(buffer: _lib.Buffer, offset: int, length: int, r: Request) -> Buffer:
    """Element ``[offset, offset + length)`` of a batch as a buffer of the request's
    prototype, without a copy (the view keeps the batch's allocation alive)."""
    if length == 0:
        return r.prototype.buffer.create_zero_length()
    view = buffer.view("|u1", 1, 8, [length], offset, length)
    if r.ordinal is not None:
        cupy: Any = importlib.import_module("cupy")
        with cupy.cuda.Device(r.ordinal):
            return r.prototype.buffer.from_array_like(cupy.from_dlpack(view))
    import numpy as np

    host: Any = view  # host memory: the buffer protocol
    return r.prototype.buffer.from_array_like(np.frombuffer(host, dtype=np.uint8))


class Gatherer(_rounds.Rounds[Request, "Buffer | None"]):
    """Collects the gets started together on one event loop and reads each round of them
    in one batch (:func:`read_requests`, in a worker thread) while the next round
    gathers."""

    def dispatch(self, batch: list[tuple[Request, asyncio.Future[Buffer | None]]]) -> None:
        requests = [r for r, _ in batch]
        _rounds.settle_in_thread(self.loop, [f for _, f in batch], read_requests, requests)


_gatherers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Gatherer] = (
    weakref.WeakKeyDictionary()
)


def gatherer() -> Gatherer:
    """The running event loop's :class:`Gatherer` (one per loop, shared by every store)."""
    return _rounds.for_running_loop(_gatherers, Gatherer)
