"""``numpy.fromfile`` / ``ndarray.tofile`` counterparts that read and write through kvikpy."""

from __future__ import annotations

from typing import Any

import numpy as np
import numpy.typing as npt

from kvikpy import _lib, _paths
from kvikpy.cufile import CuFile

__all__ = ["fromfile", "tofile"]


def fromfile(
    file: _paths.StrPath,
    dtype: npt.DTypeLike = float,
    count: int = -1,
    sep: str = "",
    offset: int = 0,
    *,
    like: Any = None,
) -> Any:
    """Read a binary file into a new 1-D array, like ``numpy.fromfile``.

    Parameters
    ----------
    file
        Path of the file.
    dtype
        Data type of the returned array.
    count
        Number of items to read; ``-1`` reads every whole item from ``offset`` to the end.
        If the file holds fewer, the array is shorter, as with ``numpy.fromfile``.
    sep
        Only ``""`` (binary) is supported; text parsing raises ``NotImplementedError``.
    offset
        Byte offset in the file where reading starts.
    like
        An array whose type decides the returned array's type (numpy's ``like=``
        protocol); default a numpy array.

    Examples
    --------
    >>> import numpy as np, kvikpy.numpy
    >>> np.arange(4, dtype="int32").tofile("/tmp/kvikpy-fromfile")
    >>> kvikpy.numpy.fromfile("/tmp/kvikpy-fromfile", dtype="int32")
    array([0, 1, 2, 3], dtype=int32)
    """
    if sep != "":
        raise NotImplementedError(
            "kvikpy.numpy.fromfile reads binary files only (sep=''); "
            "use numpy.fromfile for text files"
        )
    if offset < 0:
        raise ValueError(f"offset must be non-negative, got {offset}")
    dt = np.dtype(dtype)
    if dt.itemsize == 0:
        raise ValueError(f"cannot read items of zero size ({dt})")
    if count < -1:
        raise ValueError(f"count must be -1 (all) or non-negative, got {count}")
    with CuFile(file, "r") as f:
        file_size = f.nbytes()
        content = None
        if file_size == 0 and _paths.has_content(f.fileno()):
            # A pseudo-file (/proc, /sys) reports 0 bytes: read it to its end instead.
            content = _paths.read_to_end(f.fileno())
            file_size = len(content)
        available = max(file_size - offset, 0) // dt.itemsize
        n = available if count == -1 else min(count, available)
        out = np.empty((n,), dtype=dt) if like is None else np.empty((n,), dtype=dt, like=like)
        # A byte view reads every dtype, datetimes included (they export no buffer).
        view = out.view(np.uint8)
        if content is None:
            f.read(view, size=n * dt.itemsize, file_offset=offset)
        else:
            view[...] = np.frombuffer(content, np.uint8, n * dt.itemsize, offset)
    return out


def tofile(ary: Any, file: _paths.StrPath) -> None:
    """Write ``ary`` to ``file`` in C order, replacing the file, like ``ndarray.tofile``.

    Arrays that are not C-contiguous (Fortran-ordered, strided) are copied to C order
    first, as ``ndarray.tofile`` does; CuPy arrays stay on the GPU for that copy.

    Parameters
    ----------
    ary
        The array to write: numpy, CuPy, or any contiguous host or GPU buffer.
    file
        Path of the file; created if missing, truncated if present.
    """
    if hasattr(ary, "__array_function__"):
        ary = np.ascontiguousarray(ary, like=ary)
        if ary.dtype.kind in "mM":
            ary = ary.view(np.uint8)
    _lib.buffer_nbytes(ary)  # refuse a bad buffer before the file is truncated
    with CuFile(file, "w") as f:
        f.write(ary)
