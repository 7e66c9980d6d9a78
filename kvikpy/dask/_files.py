"""``from_files``: many files of one array each, stacked into one dask array."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any, Literal

import dask.array as da
import numpy as np
from dask.base import tokenize

import kvikpy
from kvikpy import _paths
from kvikpy.dask import _common
from kvikpy.dask._common import BlockIndex


def from_files(
    paths: Iterable[_paths.StrPath],
    dtype: Any,
    shape: int | Sequence[int],
    *,
    order: Literal["C", "F"] = "C",
    device: str = "cpu",
    files_per_read: int | None = None,
    name: str | None = None,
) -> da.Array:
    """A dask array stacking many files, each holding one raw array of ``shape``.

    The result has shape ``(len(paths), *shape)`` and one chunk per file (chunk ``i``
    along the new leading axis is file ``i``, whole). A group of ``files_per_read``
    consecutive files is read by one task with one :func:`kvikpy.read_many` call (one
    allocation, one parallel pass); each chunk is then a cheap task handing out its
    file's part of that allocation, placed by dask on the worker that read it.

    Parameters
    ----------
    paths
        The files, in order: local paths or URLs kvikpy reads. Every worker opens them
        itself, by these names.
    dtype
        The items' numpy data type, in the files' byte order.
    shape
        The shape of the array each file holds; every file must hold exactly
        ``prod(shape) * itemsize`` bytes.
    order
        How each file lays out its array: ``"C"`` or ``"F"``.
    device
        ``"cpu"`` (numpy chunks), ``"cuda"`` (CuPy chunks on each worker's current GPU)
        or ``"cuda:N"``.
    files_per_read
        How many consecutive files one task reads in one batch. ``None`` (the default)
        groups files up to 256 MiB and 32 files per read while many files still make at
        least 16 reads; ``1`` reads every file on its own.
    name
        The dask name of the array's chunks (default: derived from the arguments and the
        files' sizes and modification times).

    Returns
    -------
    dask.array.Array
        Of shape ``(len(paths), *shape)``, chunks ``(1, *shape)``.

    Raises
    ------
    ValueError
        Before any task exists: for no paths, a file whose size is not the array's, a
        dtype that raw bytes cannot hold, an unknown ``order`` or ``device``, or a
        ``files_per_read`` below 1.
    FileNotFoundError
        If a file does not exist (other ``OSError``\\ s for other reasons).
    ImportError
        For a GPU ``device`` without CuPy.

    Examples
    --------
    >>> paths = sorted(glob.glob("frames/*.u16"))
    >>> x = kvikpy.dask.from_files(paths, "uint16", (2048, 2048))
    >>> x.max(axis=0).compute()
    """
    device = _common.check_device(device)
    dt = _common.check_dtype(dtype, device)
    dims = _common.check_shape(shape)
    if order not in ("C", "F"):
        raise ValueError(f"order must be 'C' (row-major) or 'F' (column-major), got {order!r}")
    files = [_paths.fspath(p) for p in paths]
    if not files:
        raise ValueError("from_files needs at least one path; got none")
    nbytes = math.prod(dims) * dt.itemsize
    if files_per_read is None:
        per_read = _common.default_group(nbytes, len(files))
    else:
        per_read = _common.check_positive(files_per_read, "files_per_read")
    stamps = [_common.file_stamp(f) for f in files]
    wrong = [(f, size) for f, (size, _) in zip(files, stamps, strict=True) if size != nbytes]
    if wrong:
        listed = ", ".join(f"{f} ({size:,} bytes)" for f, size in wrong[:3])
        more = f" and {len(wrong) - 3} more" if len(wrong) > 3 else ""
        raise ValueError(
            f"{len(wrong)} of {len(files)} files do not hold one {dt} array of shape "
            f"{dims} ({nbytes:,} bytes): {listed}{more}; every file must hold exactly one "
            "array of that shape and dtype"
        )
    meta = _common.meta(device, dt, len(dims) + 1)
    token = tokenize(files, stamps, dt.str, dims, order, device, per_read)
    name = name or f"from-files-{token}"
    chunks = ((1,) * len(files), *((d,) for d in dims))
    blocks: list[BlockIndex] = [(i,) + (0,) * len(dims) for i in range(len(files))]
    groups = [blocks[i : i + per_read] for i in range(0, len(blocks), per_read)]

    def read_args(group: Sequence[BlockIndex]) -> tuple[Any, ...]:
        return (tuple(files[idx[0]] for idx in group), dt, dims, order, device)

    return _common.grouped_array(
        name,
        f"kvikpy-read-{tokenize(name)}",
        chunks,
        groups,
        read_files_group,
        read_args,
        dt,
        meta,
    )


def read_files_group(
    files: tuple[str, ...],
    dt: np.dtype[Any],
    dims: tuple[int, ...],
    order: str,
    device: str,
) -> tuple[Any, ...]:
    """Read ``files`` with one :func:`kvikpy.read_many` call; one ``(1, *dims)`` array
    (numpy or CuPy, a view of the one allocation) per file, in order.

    The task that :func:`from_files`'s graph runs on a worker."""
    nbytes = math.prod(dims) * dt.itemsize
    xp = _common.array_module(device)
    with _common.cuda_context(device):
        if nbytes == 0:
            return tuple(xp.empty((1, *dims), dtype=dt, order=order) for _ in files)
        batch = kvikpy.read_many(files, device=device)
        for f, size in zip(files, batch.sizes.tolist(), strict=True):
            if size != nbytes:
                raise ValueError(
                    f"{f} now holds {size:,} bytes, not the {nbytes:,} of one {dt} array "
                    f"of shape {dims} (it changed after the dask array was made)"
                )
        flat = _common.flat_bytes(batch, device)
        starts = batch.offsets.tolist()
        return tuple(_common.view(flat, s, (1, *dims), dt, order) for s in starts[:-1])
