"""kvikio's ``kvikio.numpy``: ``numpy.fromfile`` / ``ndarray.tofile`` counterparts that read
and write through kvikpy, and :class:`LikeWrapper`, which makes ``numpy.fromfile`` itself
read through kvikpy into the array type of your choice (a CuPy array on the GPU)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt

import kvikpy._lib as _lib
from kvikpy import _args, _paths
from kvikpy.cufile import CuFile, OpenMode, engine_handle
from kvikpy.errors import FileTypeError, UnsupportedOperationError

__all__ = ["FileLike", "LikeWrapper", "fromfile", "tofile"]


#: An open file object backed by an operating-system file: anything with ``fileno()``
#: (``open(...)``, ``tempfile.TemporaryFile()``, ``tempfile.NamedTemporaryFile()``...).
FileLike: TypeAlias = _paths.HasFileno


#: What :func:`fromfile` and :func:`tofile` take as ``file``.
File: TypeAlias = "_paths.StrPath | FileLike"


class LikeWrapper:
    """Makes ``numpy.fromfile`` read through kvikpy, into an array of ``like``'s type.

    Pass it as ``like=`` (numpy's ``__array_function__`` protocol): ``numpy.fromfile``
    then calls :func:`fromfile` with ``like=like``, so the file lands in a new array of
    ``like``'s kind, straight into GPU memory for a CuPy ``like``. Every other numpy
    function given it as ``like=`` runs as numpy's own, unchanged.

    Parameters
    ----------
    like
        An array of the type to return (``cupy.empty(0)``, ``numpy.empty(0)``...).

    Examples
    --------
    >>> import numpy as np
    >>> from kvikpy.numpy import LikeWrapper
    >>> np.arange(10).tofile("/tmp/kvikpy-like")
    >>> np.fromfile("/tmp/kvikpy-like", dtype=int, like=LikeWrapper(np.empty(0)))
    array([0, 1, 2, 3, 4, 5, 6, 7, 8, 9])

    With CuPy, ``np.fromfile(path, dtype=int, like=LikeWrapper(cupy.empty(0)))`` (or
    ``cupy.fromfile(...)`` with the same ``like``) returns a CuPy array.
    """

    def __init__(self, like: Any) -> None:
        self._like = like

    def __array_function__(
        self,
        func: Callable[..., Any],
        types: Iterable[type],
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
    ) -> Any:
        if func is not np.fromfile:
            return func(*args, **kwargs)
        return fromfile(*args, like=self._like, **kwargs)

    def __repr__(self) -> str:
        return f"LikeWrapper({type(self._like).__module__}.{type(self._like).__qualname__})"


def _is_path(file: object) -> bool:
    return isinstance(file, str | bytes | os.PathLike)


def _opened(file: File, mode: OpenMode) -> tuple[CuFile, FileLike | None, int]:
    """A :class:`CuFile` on ``file``, the file object given (if one was), and where its
    I/O starts: 0 for a path; the object's current position for a file object, whose
    descriptor is reopened through ``/proc/self/fd`` (the same file, even renamed or
    deleted) after its buffered data is flushed."""
    if _is_path(file):
        return CuFile(file, mode), None, 0  # type: ignore[arg-type]  # narrowed by _is_path
    if _paths.has_fileno(file):
        # The reopened descriptor could read or write what the object itself may not.
        allowed = getattr(file, "readable" if mode == "r" else "writable", None)
        if callable(allowed) and not allowed():
            raise UnsupportedOperationError(
                f"Operation not permitted: the file object was not opened for "
                f"{'reading' if mode == 'r' else 'writing'} (mode "
                f"{getattr(file, 'mode', '?')!r})"
            )
        flush = getattr(file, "flush", None)
        if callable(flush):
            flush()
        fd = file.fileno()
        tell = getattr(file, "tell", None)
        start = int(tell()) if callable(tell) else os.lseek(fd, 0, os.SEEK_CUR)
        return CuFile(f"/proc/self/fd/{fd}", mode), file, start
    raise FileTypeError(
        f"file must be a path (str, bytes or os.PathLike) or an open file object with "
        f"fileno(), not {type(file).__name__}"
    )


def _advance(file: FileLike | None, position: int) -> None:
    """Move a given file object past the bytes read or written, as numpy does."""
    seek = getattr(file, "seek", None)
    if callable(seek):
        seek(position)


def fromfile(
    file: File,
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
        A path, or an open file object (anything with ``fileno()``): reading starts at its
        current position plus ``offset``, and leaves it after the last item read, as
        ``numpy.fromfile`` does.
    dtype
        Data type of the returned array.
    count
        Number of items to read; ``-1`` reads every whole item from ``offset`` to the end.
        If the file holds fewer, the array is shorter, as with ``numpy.fromfile``. A file
        whose size says nothing of its end (``/dev/zero``, a pipe) needs a ``count``; a
        pseudo-file that reports 0 bytes (``/proc``) is read to its end, up to 64 MiB.
    sep
        Only ``""`` (binary) is supported; text parsing raises ``NotImplementedError``.
    offset
        Byte offset where reading starts (from the file object's position, for one).
    like
        An array whose type decides the returned array's type (numpy's ``like=``
        protocol); default a numpy array. A CuPy array reads into GPU memory.

    Examples
    --------
    >>> import numpy as np, kvikpy.numpy
    >>> np.arange(4, dtype="int32").tofile("/tmp/kvikpy-fromfile")
    >>> kvikpy.numpy.fromfile("/tmp/kvikpy-fromfile", dtype="int32")
    array([0, 1, 2, 3], dtype=int32)
    """
    if sep != "":
        raise NotImplementedError(
            "Non-default value of the `sep` argument is not supported: kvikpy.numpy.fromfile "
            "reads binary files only (sep=''); use numpy.fromfile for text files"
        )
    offset = _args.non_negative("offset", offset)
    count = _args.integer("count", count)
    dt = np.dtype(dtype)
    if dt.itemsize == 0:
        raise ValueError(f"cannot read items of zero size ({dt})")
    if count < -1:
        # numpy's (and kvikio's) words, for code that matches them.
        raise ValueError(
            f"negative dimensions are not allowed: count must be -1 (all items) or "
            f"non-negative, got {count}"
        )
    if count != -1:
        _args.end("the items", offset, count * dt.itemsize)
    f, given, start = _opened(file, "r")
    with f:
        start += offset
        want = None if count == -1 else count * dt.itemsize
        # The engine sizes the read: the items asked for, cut to what the file has; a file
        # with no size (a device, a pipe) is read for the items asked for, never more
        # (/dev/zero never ends), and a /proc pseudo-file to its end (up to a bound); a
        # device or pipe without count is refused.
        nbytes, open_ended, content = engine_handle(f).extent(start, want)
        if open_ended:
            part = bytearray(nbytes)
            content = bytes(part[: f.read(part, file_offset=start)])
        available = (nbytes if content is None else len(content)) // dt.itemsize
        n = available if count == -1 else min(count, available)
        out = np.empty((n,), dtype=dt) if like is None else np.empty((n,), dtype=dt, like=like)
        nbytes = n * dt.itemsize
        # A byte view reads every dtype, datetimes included (they export no buffer).
        view = out.view(np.uint8)
        if content is None:
            f.read(view, size=nbytes, file_offset=start)
        else:
            view[...] = np.frombuffer(content, np.uint8, nbytes)
    _advance(given, start + nbytes)
    return out


def tofile(ary: Any, file: File) -> None:
    """Write ``ary`` to ``file`` in C order, like ``ndarray.tofile``.

    Arrays that are not C-contiguous (Fortran-ordered, strided) are copied to C order
    first, as ``ndarray.tofile`` does; CuPy arrays stay on the GPU for that copy.

    Parameters
    ----------
    ary
        The array to write: numpy, CuPy, or any contiguous host or GPU buffer.
    file
        A path, created if missing and truncated if present; or an open file object,
        written at its current position (nothing is truncated) and left after the bytes
        written, as ``ndarray.tofile`` does.
    """
    if hasattr(ary, "__array_function__"):
        ary = np.ascontiguousarray(ary, like=ary)
        if ary.dtype.kind in "mM":
            ary = ary.view(np.uint8)
    nbytes = _lib.buffer_nbytes(ary)  # refuse a bad buffer before the file is truncated
    if _is_path(file):
        # A path is replaced whole, or left as it was if the write fails.
        with CuFile._one_shot(file) as f:  # type: ignore[arg-type]
            f.write(ary)
        return
    # A file object is written where it stands, never truncated.
    f, given, start = _opened(file, "r+")
    with f:
        f.write(ary, file_offset=start)
    _advance(given, start + nbytes)
