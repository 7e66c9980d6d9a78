"""``kvikpy.read`` and ``kvikpy.write``: a file or a byte range to or from the GPU in one call."""

from __future__ import annotations

import os
from typing import Any

import kvikpy._lib as _lib
from kvikpy import _args, _devices, _paths
from kvikpy._cuda_streams import stream_handle
from kvikpy._dtypes import DTypeLike, ShapeLike, parse_shape, resolve_dtype
from kvikpy.cufile import BufferLike, CuFile, engine_future

__all__ = ["cuda_available", "device_count", "read", "write"]


def cuda_available() -> bool:
    """Whether a CUDA driver is loaded and reports at least one GPU."""
    return bool(_lib.cuda_available())


def device_count() -> int:
    """The number of CUDA GPUs (0 when there is no driver)."""
    return int(_lib.device_count())


def read(
    path: _paths.StrPath,
    *,
    offset: int = 0,
    size: int | None = None,
    device: str | int = "cuda",
    stream: Any = None,
    dtype: DTypeLike = "uint8",
    shape: ShapeLike | None = None,
    progress: bool = False,
) -> _lib.Buffer:
    """Read a file, or ``size`` bytes of it at ``offset``, into new GPU or host memory.

    Parameters
    ----------
    path
        The file: a local path, or a remote file's URL (``http://``, ``https://``,
        ``s3://``, ``webhdfs://``; see :class:`kvikpy.RemoteFile`), read with parallel
        range requests.
    offset
        Where the range starts, in bytes from the start of the file; default 0. An offset
        past the end of the file raises ``ValueError``.
    size
        How many bytes to read; ``None`` (the default) reads from ``offset`` to the end of
        the file. A range that ends past the end of the file raises ``ValueError``. A file
        whose size says nothing of its end (a device such as ``/dev/zero``, a pipe) is
        read for exactly ``size`` bytes; without ``size`` it raises ``ValueError``, and a
        pseudo-file that reports 0 bytes (``/proc``, ``/sys``) is read to its end, up to
        64 MiB (``ValueError`` beyond: pass ``size``).
    device
        ``"cuda"`` (the current device), ``"cuda:N"`` or ``N``, or ``"cpu"`` for host
        memory (ordinary pages, huge pages for large reads: pinning each
        result would cost far more than the read).
    stream
        Read in this CUDA stream's order (a handle or a torch/CuPy stream): the call
        returns at once, and work queued on ``stream`` afterwards sees the bytes. Without
        a stream the call returns when the bytes have landed.
    dtype
        The element type consumers see: a numpy dtype or its name, ``"bfloat16"`` (or
        ``ml_dtypes.bfloat16``, JAX's), or a torch dtype (``torch.float16``; recognised
        without importing torch); default ``uint8``. The bytes are not converted. DLPack
        carries booleans, integers, float16/32/64, bfloat16 and complex64/128 in native
        byte order; anything else raises ``ValueError``. bfloat16 reaches torch and JAX as
        their bfloat16 (DLPack's ``kDLBfloat``); numpy has none, so :attr:`Buffer.dtype`
        is ``ml_dtypes.bfloat16`` where ml_dtypes is installed and ``numpy.dtype('V2')``
        (raw 2-byte items) otherwise.
    shape
        The shape consumers see: an int or a sequence of ints, one of which may be ``-1``
        for as many items as fit (as in numpy's ``reshape``). ``None`` (the default) is
        1-D with as many items of ``dtype`` as the bytes hold; otherwise the shape times
        the item size must equal the bytes read exactly.
    progress
        Show a progress bar (text on stderr; tqdm's widget in Jupyter with ipywidgets);
        not with ``stream``.

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
        For a negative ``offset`` or ``size``, a range past the end of the file, a dtype
        DLPack cannot carry, or a shape that does not fit the range.
    OverflowError
        For a range that ends past ``2**63 - 1``.
    TypeError
        For an ``offset`` or ``size`` that is not an integer (a float, a string, a bool),
        a ``dtype`` that is no data type, or a ``shape`` that is not made of ints.

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
    ordinal = _devices.resolve(device)
    if stream is not None and ordinal is None:
        raise ValueError("stream= orders GPU reads; it cannot be used with device='cpu'")

    offset = _args.non_negative("offset", offset)
    if size is not None:
        size = _args.non_negative("size", size)
        _args.end("the range", offset, size)
    dt = resolve_dtype(dtype)  # imports numpy: deferred, so `import kvikpy` stays fast
    dims = None if shape is None else parse_shape(shape)  # a malformed one fails early
    name = _paths.fspath(path)
    # One call into the engine: it opens the file, sizes the range (a file whose size
    # says nothing of its end too: a device, a pipe, a /proc pseudo-file), allocates,
    # reads, and views the bytes as ``dt`` items of ``dims``.
    item = (dt.typestr, dt.code, dt.itemsize * 8, dt.name)
    handle = None if stream is None else stream_handle(stream)
    shown = _paths.redact_url(name) if _paths.is_url(name) else None  # for messages
    buf, future = _lib.read_file(
        name, offset, size, ordinal, item, dims, handle, wait=not progress, shown=shown
    )
    if future is not None:
        from kvikpy._progress import follow_future

        # The engine fails the read (OSError) if the file shrank since it was sized.
        follow_future(lambda: future, buf.nbytes, f"read {os.path.basename(name)}")
    return buf


def write(path: _paths.StrPath, buf: BufferLike, *, offset: int = 0, progress: bool = False) -> int:
    """Write all of ``buf`` (host or GPU memory) to ``path`` at ``offset``.

    The file is created if missing and otherwise not truncated, so bytes outside
    ``[offset, offset + nbytes)`` are kept. It is written whole or not at all: the call
    writes a new file under a temporary name beside ``path`` (starting from a copy of the
    existing file where some of its bytes stay) and renames it over ``path`` once every
    byte is written, synced first with the ``write_sync`` setting. If the write fails (a
    full disk, Ctrl-C, a bad buffer), ``path`` is exactly as it was, or still absent, and
    no temporary file is left. Arguments are checked before anything is created.

    Parameters
    ----------
    path
        The file.
    buf
        Any contiguous buffer: a numpy array, ``bytes``, a CUDA array (torch, CuPy,
        JAX) or a :class:`kvikpy.Buffer`.
    offset
        Where in the file the first byte goes: an integer from 0 (``TypeError`` for
        anything else, ``ValueError`` for a negative one, ``OverflowError`` where the
        write would end past ``2**63 - 1``).
    progress
        Show a progress bar of the bytes written (see :func:`read`).

    Returns
    -------
    int
        The bytes written.

    Examples
    --------
    >>> kvikpy.write("weights.bin", torch.randn(1024, 1024, device="cuda"))
    4194304
    """
    # Every argument is checked before the file is created: bad input changes nothing.
    offset = _args.non_negative("offset", offset)
    nbytes = _lib.buffer_nbytes(buf)  # refuse a bad buffer before the file is created
    _args.end("the write", offset, nbytes)
    # Written whole or not at all; the bytes outside the range stay (CuFile._one_shot).
    with CuFile._one_shot(path, span=(offset, nbytes)) as f:
        if not progress:
            return f.write(buf, file_offset=offset)
        from kvikpy._progress import follow_future

        name = os.path.basename(_paths.fspath(path))
        return follow_future(
            lambda: engine_future(f.pwrite(buf, file_offset=offset)), nbytes, f"write {name}"
        )
