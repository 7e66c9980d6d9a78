"""``kvikpy.read`` and ``kvikpy.write``: a file or a byte range to or from the GPU in one call."""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING, Any

from kvikpy import _lib, _paths
from kvikpy._streams import stream_handle
from kvikpy.cufile import CuFile
from kvikpy.errors import CudaUnavailableError

if TYPE_CHECKING:
    import numpy.typing as npt

__all__ = ["cuda_available", "device_count", "read", "write"]

# numpy dtype kind -> DLPack type code
_DLPACK_CODES = {"i": 0, "u": 1, "f": 2, "c": 5, "b": 6}


def cuda_available() -> bool:
    """Whether a CUDA driver is loaded and reports at least one GPU."""
    return bool(_lib.cuda_available())


def device_count() -> int:
    """The number of CUDA GPUs (0 when there is no driver)."""
    return int(_lib.device_count())


def _device(device: str | int, option: str = "device") -> int:
    """The CUDA ordinal for ``device``, or -1 for host memory.

    ``option`` is how the caller spells the argument in its errors: ``"device"`` for the
    Python API (``device='cpu'``), ``"--device"`` for the command line (``--device cpu``).
    """

    def spelled(value: object) -> str:
        return f"{option} {value}" if option.startswith("-") else f"{option}={value!r}"

    if isinstance(device, bool):
        raise TypeError("device must be 'cuda', 'cuda:N', an int or 'cpu', not a bool")
    if isinstance(device, int):
        ordinal = device
    elif device == "cpu":
        return -1
    elif device == "cuda":
        ordinal = None
    elif isinstance(device, str) and device.startswith("cuda:") and device[5:].isdigit():
        ordinal = int(device[5:])
    else:
        raise ValueError(f"device must be 'cuda', 'cuda:N', an int or 'cpu', got {device!r}")
    if not _lib.cuda_available():
        raise CudaUnavailableError(
            f"{spelled(device)} needs a GPU, but CUDA is not available "
            f"({_lib.cuda_unavailable_reason()}); use {spelled('cpu')} to read into host memory"
        )
    if ordinal is None:
        return int(_lib.current_device())
    count = _lib.device_count()
    if not 0 <= ordinal < count:
        valid = spelled("cuda:0") + ("" if count == 1 else f" to {spelled(f'cuda:{count - 1}')},")
        raise ValueError(
            f"CUDA device {ordinal} does not exist: this machine has {count} GPU(s); "
            f"use {valid} or {spelled('cpu')}"
        )
    return ordinal


def read(
    path: str | os.PathLike[str],
    *,
    offset: int = 0,
    size: int | None = None,
    device: str | int = "cuda",
    stream: Any = None,
    dtype: npt.DTypeLike = "uint8",
    shape: tuple[int, ...] | int | None = None,
    progress: bool = False,
) -> _lib.Buffer:
    """Read a file, or ``size`` bytes of it at ``offset``, into new GPU or host memory.

    Parameters
    ----------
    path
        The file.
    offset
        Where the range starts, in bytes from the start of the file; default 0. An offset
        past the end of the file raises ``ValueError``.
    size
        How many bytes to read; ``None`` (the default) reads from ``offset`` to the end of
        the file. A range that ends past the end of the file raises ``ValueError``.
    device
        ``"cuda"`` (the current device), ``"cuda:N"`` or ``N``, or ``"cpu"`` for host
        memory (ordinary pages, huge pages for large reads: pinning each
        result would cost far more than the read).
    stream
        Read in this CUDA stream's order (a handle or a torch/CuPy stream): the call
        returns at once, and work queued on ``stream`` afterwards sees the bytes. Without
        a stream the call returns when the bytes have landed.
    dtype
        The element type consumers see (a numpy dtype or its name: integers, floats,
        complex, ``bool``); default ``uint8``. The bytes are not converted.
    shape
        The shape consumers see: a tuple, or an int for 1-D. ``None`` (the default) is
        1-D with as many items of ``dtype`` as the bytes hold; otherwise the shape times
        the item size must equal the bytes read exactly.
    progress
        Show a tqdm progress bar (tqdm must be installed); not with ``stream``.

    Returns
    -------
    kvikpy.Buffer
        Hand it to ``torch.from_dlpack``, ``cupy.from_dlpack``, ``jax.dlpack.from_dlpack``
        or ``numpy.from_dlpack`` (host) without a copy.

    Raises
    ------
    kvikpy.CudaUnavailableError
        For a GPU device on a machine without CUDA (pass ``device="cpu"``).
    FileNotFoundError
        If the file does not exist.
    PermissionError
        If the file may not be read.
    IsADirectoryError
        If the path is a directory.
    ValueError
        For a range past the end of the file, or a dtype/shape that does not fit.

    Examples
    --------
    >>> import torch, kvikpy                                    # doctest: +SKIP
    >>> t = torch.from_dlpack(kvikpy.read("weights.bin", dtype="float16"))  # doctest: +SKIP
    """
    if stream is not None and progress:
        raise ValueError(
            "progress=True follows a blocking read, and with stream= the call returns at "
            "once; leave one of them out"
        )
    ordinal = _device(device)
    if stream is not None and ordinal < 0:
        raise ValueError("stream= orders GPU reads; it cannot be used with device='cpu'")

    if offset < 0:
        raise ValueError(f"offset must be non-negative, got {offset}")
    import numpy as np  # deferred: `import kvikpy` stays fast for torch/CuPy-only users

    dt = np.dtype(dtype)
    if dt.kind not in _DLPACK_CODES or dt.itemsize == 0:
        raise ValueError(
            f"dtype {dt} cannot be exported through DLPack; read the bytes (dtype='uint8') "
            "and view them as that type in your array library"
        )
    with CuFile(path, "r") as f:
        # A pseudo-file (/proc, /sys) reports 0 bytes: host reads read it to its end,
        # device reads get a clear error from size_for instead of empty data.
        content = None
        if ordinal < 0 and _paths.has_unsized_content(f.fileno()):
            content = _paths.read_to_end(f.fileno())
        file_size = f._handle.size_for("a device read") if content is None else len(content)
        if size is None:
            if offset > file_size:
                raise ValueError(
                    f"offset {offset} is past the end of {_paths.fspath(path)!r}, "
                    f"which has {file_size} bytes; pass an offset of at most {file_size}"
                )
            size = file_size - offset
        elif size < 0:
            raise ValueError(f"size must be non-negative, got {size}")
        elif offset + size > file_size:
            raise ValueError(
                f"bytes [{offset}, {offset + size}) reach past the end of "
                f"{_paths.fspath(path)!r}, which has {file_size} bytes; pass "
                f"size={file_size - offset} or less (or leave size out to read to the end)"
            )
        if shape is None:
            if size % dt.itemsize:
                raise ValueError(
                    f"{size} bytes are not a whole number of {dt} items ({dt.itemsize} bytes "
                    f"each); pass a size that is a multiple of {dt.itemsize}"
                )
            dims: tuple[int, ...] = (size // dt.itemsize,)
        else:
            dims = (shape,) if isinstance(shape, int) else tuple(shape)
            if math.prod(dims) * dt.itemsize != size:
                raise ValueError(
                    f"shape {dims} of {dt} needs {math.prod(dims) * dt.itemsize} bytes, "
                    f"but the range has {size}; pass a shape of {size // dt.itemsize} items "
                    f"in all, or size={math.prod(dims) * dt.itemsize}"
                )
        buf = _lib.Buffer.allocate(size, ordinal, False)
        got: int | None = None  # stream-ordered reads complete later, unchecked here
        if content is not None:
            host: Any = buf  # host memory, writable through the buffer protocol
            memoryview(host)[:] = content[offset : offset + size]
            got = size
        elif stream is not None and ordinal >= 0:
            f.raw_read_async(buf, stream_handle(stream), size, offset)
        elif progress:
            from kvikpy._progress import follow_future

            name = os.path.basename(_paths.fspath(path))
            got = follow_future(lambda: f.pread(buf, size, offset)._handle, size, f"read {name}")
        else:
            got = f.read(buf, size, offset)
        if got is not None and got != size:
            raise OSError(
                f"{_paths.fspath(path)!r} shrank while being read: got {got} of {size} bytes"
            )
    typestr = dt.str if dt.itemsize > 1 else "|" + dt.str[1:]
    return buf.view(typestr, _DLPACK_CODES[dt.kind], dt.itemsize * 8, list(dims))


def write(
    path: str | os.PathLike[str], buf: Any, *, offset: int = 0, progress: bool = False
) -> int:
    """Write all of ``buf`` (host or GPU memory) to ``path`` at ``offset``.

    The file is created if missing and otherwise not truncated, so bytes outside
    ``[offset, offset + nbytes)`` are kept.

    Parameters
    ----------
    path
        The file.
    buf
        Any contiguous buffer: a numpy array, ``bytes``, a CUDA array (torch, CuPy,
        JAX) or a :class:`kvikpy.Buffer`.
    offset
        Where in the file the first byte goes.
    progress
        Show a tqdm progress bar of the bytes written (tqdm must be installed).

    Returns
    -------
    int
        The bytes written.

    Examples
    --------
    >>> kvikpy.write("weights.bin", torch.randn(1024, 1024, device="cuda"))
    4194304
    """
    _lib.buffer_nbytes(buf)  # refuse a bad buffer before the file is created
    mode = "r+" if os.path.exists(path) else "w"
    with CuFile(path, mode) as f:
        if not progress:
            return f.write(buf, file_offset=offset)
        from kvikpy._progress import follow_future

        name = os.path.basename(_paths.fspath(path))
        return follow_future(
            lambda: f.pwrite(buf, file_offset=offset)._handle, _nbytes(buf), f"write {name}"
        )


def _nbytes(buf: Any) -> int | None:
    """The size of a buffer for a progress bar's total (None when it cannot tell)."""
    n = getattr(buf, "nbytes", None)
    if isinstance(n, int):
        return n
    try:
        return memoryview(buf).nbytes
    except TypeError:
        return None
