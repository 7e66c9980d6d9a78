"""``from_raw``: a dask array over an array stored raw in one file."""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any, Literal

import dask
import dask.array as da
import numpy as np
from dask.array.core import normalize_chunks
from dask.base import tokenize
from dask.utils import parse_bytes

import kvikpy
from kvikpy import _paths
from kvikpy.dask import _common
from kvikpy.dask._common import BlockIndex

#: A chunk's extent: ``(start, stop)`` along each axis.
Box = tuple[tuple[int, int], ...]


def from_raw(
    path: _paths.StrPath,
    dtype: Any,
    shape: int | Sequence[int],
    chunks: Any = "auto",
    *,
    offset: int = 0,
    order: Literal["C", "F"] = "C",
    device: str = "cpu",
    chunks_per_read: int | None = None,
    name: str | None = None,
) -> da.Array:
    """A dask array over an array stored raw (no header) in one file.

    Each chunk's bytes are a set of byte ranges of the file: one range when the chunk
    spans every trailing axis (C order; the leading ones in Fortran order), otherwise one
    range per row of the chunk. A group of ``chunks_per_read`` neighbouring chunks (in
    the file's order) is read by one task with one :func:`kvikpy.read_ranges` call: one
    allocation, one parallel pass on kvikpy's thread pool, neighbouring ranges merged.
    Each chunk is then a task that hands out its part of that allocation (a view, no
    copy) and that dask places on the worker that read it.

    Parameters
    ----------
    path
        The file: a local path or a URL kvikpy reads (``http(s)://``, ``s3://``,
        ``webhdfs://``). The graph holds the path; every worker opens the file itself,
        so it must be reachable under this name from every worker.
    dtype
        The items' numpy data type (``"float32"``, ``"<i8"`` ...), in the file's byte
        order.
    shape
        The array's shape (an int for 1-d).
    chunks
        Dask's chunk specification (``"auto"``, an int, a tuple per axis, ``-1`` for a
        whole axis ...). ``"auto"`` makes chunks of dask's ``array.chunk-size`` that span
        the trailing axes (the leading ones in Fortran order) where a row is small
        enough, so that each chunk is one contiguous range of the file.
    offset
        Where the array starts in the file, in bytes (to skip a header).
    order
        ``"C"`` (row-major) or ``"F"`` (column-major): how the file lays out the array.
        Chunks are arrays of the same order.
    device
        ``"cpu"``: numpy chunks in host memory. ``"cuda"``: CuPy chunks on each worker's
        current GPU (under ``dask_cuda`` every worker sees its own GPU as device 0).
        ``"cuda:N"``: CuPy chunks on GPU ``N`` of every worker.
    chunks_per_read
        How many neighbouring chunks one task reads in one batch read. ``None`` (the
        default) groups chunks up to 256 MiB and 32 chunks per read, while an array of
        many chunks still makes at least 16 reads (so that several workers share them).
        ``1`` reads every chunk on its own.
    name
        The dask name of the array's chunks (default: derived from the arguments and the
        file's size and modification time).

    Returns
    -------
    dask.array.Array
        Of ``shape`` and ``dtype``, with numpy or CuPy chunks.

    Raises
    ------
    ValueError
        Before any task exists: for a file shorter than ``offset`` plus the array's
        bytes, a dtype that raw bytes cannot hold, chunks that do not fit ``shape``, an
        unknown ``order`` or ``device``, a negative ``offset`` or a ``chunks_per_read``
        below 1.
    FileNotFoundError
        If the file does not exist (other ``OSError``\\ s for other reasons).
    ImportError
        For a GPU ``device`` without CuPy (the client makes CuPy's empty ``meta`` array).

    Examples
    --------
    >>> import dask.distributed, kvikpy.dask
    >>> client = dask.distributed.Client()
    >>> x = kvikpy.dask.from_raw("big.f32", "float32", (100_000, 1024))
    >>> x.mean(axis=0).compute()
    >>> g = kvikpy.dask.from_raw("big.f32", "float32", (100_000, 1024), device="cuda")
    """
    device = _common.check_device(device)
    dt = _common.check_dtype(dtype, device)
    dims = _common.check_shape(shape)
    if order not in ("C", "F"):
        raise ValueError(f"order must be 'C' (row-major) or 'F' (column-major), got {order!r}")
    if isinstance(offset, bool) or not isinstance(offset, int | np.integer) or offset < 0:
        raise ValueError(f"offset must be an int of 0 or more (bytes), got {offset!r}")
    offset = int(offset)
    normalized = _chunks(chunks, dims, dt, order)
    blocks = _blocks(normalized, order)
    if chunks_per_read is None:
        largest = math.prod(max(c, default=0) for c in normalized) * dt.itemsize
        per_read = _common.default_group(largest, len(blocks))
    else:
        per_read = _common.check_positive(chunks_per_read, "chunks_per_read")

    file = _paths.fspath(path)
    nbytes = math.prod(dims) * dt.itemsize
    size, mtime = _common.file_stamp(file)
    if size < offset + nbytes:
        shape_text = "x".join(map(str, dims)) or "a scalar"
        raise ValueError(
            f"{file} holds {size:,} bytes, but a {shape_text} array of {dt} "
            f"({dt.itemsize} bytes each) from offset {offset:,} needs {offset + nbytes:,} "
            f"bytes ({offset + nbytes - size:,} more); check dtype, shape and offset "
            "against how the file was written"
        )
    meta = _common.meta(device, dt, len(dims))

    token = tokenize(file, size, mtime, dt.str, dims, normalized, offset, order, device, per_read)
    name = name or f"from-raw-{token}"
    bounds = [list(itertools.accumulate(c, initial=0)) for c in normalized]
    groups = [blocks[i : i + per_read] for i in range(0, len(blocks), per_read)]

    def read_args(group: Sequence[BlockIndex]) -> tuple[Any, ...]:
        boxes = tuple(
            tuple((bounds[d][i], bounds[d][i + 1]) for d, i in enumerate(idx)) for idx in group
        )
        return (file, dt, dims, offset, order, device, boxes)

    return _common.grouped_array(
        name,
        f"kvikpy-read-{tokenize(name)}",
        normalized,
        groups,
        read_raw_group,
        read_args,
        dt,
        meta,
    )


def _chunks(
    chunks: Any, dims: tuple[int, ...], dt: np.dtype[Any], order: str
) -> tuple[tuple[int, ...], ...]:
    """Dask's normalized chunks; ``"auto"`` spans the trailing axes (leading for ``F``)
    where one row fits dask's ``array.chunk-size``."""
    if isinstance(chunks, str) and chunks == "auto" and len(dims) > 1:
        limit = parse_bytes(dask.config.get("array.chunk-size"))
        row = math.prod(dims[1:] if order == "C" else dims[:-1]) * dt.itemsize
        if row <= limit:
            rest = (-1,) * (len(dims) - 1)
            chunks = ("auto", *rest) if order == "C" else (*rest, "auto")
    try:
        normalized = normalize_chunks(chunks, dims, dtype=dt)  # type: ignore[no-untyped-call]
    except (TypeError, ValueError, NotImplementedError) as e:
        raise ValueError(
            f"chunks={chunks!r} do not fit an array of shape {dims}: {e}; pass 'auto', an "
            "int, or one size (or tuple of sizes adding up to the axis) per axis"
        ) from None
    normalized = tuple(tuple(int(c) for c in axis) for axis in normalized)
    if len(normalized) != len(dims) or any(
        sum(axis) != d for axis, d in zip(normalized, dims, strict=False)
    ):
        raise ValueError(
            f"chunks={chunks!r} do not add up to the shape {dims} (got {normalized}); "
            "the chunk sizes along each axis must add up to that axis's length"
        )
    return normalized


def _blocks(chunks: tuple[tuple[int, ...], ...], order: str) -> list[BlockIndex]:
    """Every chunk's index, in the order of its bytes in the file."""
    counts = [len(c) for c in chunks]
    if order == "C":
        return list(itertools.product(*(range(n) for n in counts)))
    return [idx[::-1] for idx in itertools.product(*(range(n) for n in reversed(counts)))]


def box_ranges(
    dims: tuple[int, ...], box: Box, offset: int, itemsize: int, order: str
) -> tuple[np.ndarray, np.ndarray]:
    """The byte ranges (offsets, sizes) holding ``box`` of a raw array, in the order of
    the box's own layout (``order``): one range per row the box does not span."""
    if order == "F":
        dims, box = dims[::-1], box[::-1]
    extents = [stop - start for start, stop in box]
    if 0 in extents:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    strides = [math.prod(dims[d + 1 :]) * itemsize for d in range(len(dims))]
    partial = [d for d, (start, stop) in enumerate(box) if (start, stop) != (0, dims[d])]
    if not partial:  # the whole array
        return np.array([offset], np.int64), np.array([math.prod(dims) * itemsize], np.int64)
    j = partial[-1]  # the innermost axis the box does not span: rows run along it
    offsets = np.array([offset + box[j][0] * strides[j]], np.int64)
    for d in range(j):
        along = np.arange(box[d][0], box[d][1], dtype=np.int64) * strides[d]
        offsets = (offsets[:, None] + along[None, :]).ravel()
    return offsets, np.full(offsets.shape, extents[j] * strides[j], np.int64)


def merge_ranges(offsets: np.ndarray, sizes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Ranges where each one that starts where the one before ends joins it."""
    if len(offsets) == 0:
        return offsets, sizes
    ends = offsets + sizes
    starts = np.flatnonzero(np.r_[True, offsets[1:] != ends[:-1]])
    lasts = np.r_[starts[1:] - 1, len(offsets) - 1]
    return offsets[starts], ends[lasts] - offsets[starts]


def read_raw_group(
    file: str,
    dt: np.dtype[Any],
    dims: tuple[int, ...],
    offset: int,
    order: str,
    device: str,
    boxes: tuple[Box, ...],
) -> tuple[Any, ...]:
    """Read the chunks ``boxes`` of a raw array with one :func:`kvikpy.read_ranges` call;
    one array (numpy or CuPy, a view of the one allocation) per box, in order.

    The task that :func:`from_raw`'s graph runs on a worker."""
    pieces = [box_ranges(dims, box, offset, dt.itemsize, order) for box in boxes]
    offsets, sizes = merge_ranges(
        np.concatenate([p[0] for p in pieces]), np.concatenate([p[1] for p in pieces])
    )
    shapes = [tuple(stop - start for start, stop in box) for box in boxes]
    xp = _common.array_module(device)
    with _common.cuda_context(device):
        if int(sizes.sum()) == 0:
            return tuple(xp.empty(s, dtype=dt, order=order) for s in shapes)
        batch = kvikpy.read_ranges(file, (offsets, sizes), device=device)
        flat = _common.flat_bytes(batch, device)
        out = []
        start = 0
        for s in shapes:
            out.append(_common.view(flat, start, s, dt, order))
            start += math.prod(s) * dt.itemsize
        return tuple(out)
