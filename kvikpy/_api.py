"""``kvikpy.read`` and ``kvikpy.write``: a file or a byte range to or from the GPU in one call."""

from __future__ import annotations

import math
import operator
import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol, SupportsIndex, TypeAlias

from kvikpy import _args, _devices, _lib, _paths
from kvikpy._streams import stream_handle
from kvikpy.cufile import BufferLike, CuFile

if TYPE_CHECKING:
    import numpy.typing as npt


class TorchDtype(Protocol):
    """A torch dtype (``torch.float16``...), described by what its type stubs declare, so
    that annotations need not import torch."""

    @property
    def is_floating_point(self) -> bool: ...
    @property
    def itemsize(self) -> int: ...


DTypeLike: TypeAlias = "npt.DTypeLike | TorchDtype"
"""What ``read`` takes as ``dtype``: numpy's dtype spellings (``"bfloat16"`` too) and
torch dtypes."""
ShapeLike: TypeAlias = "SupportsIndex | Sequence[SupportsIndex]"

__all__ = ["cuda_available", "device_count", "read", "write"]

# numpy dtype kind -> (DLPack type code, the item sizes in bytes DLPack consumers take)
_DLPACK_CODES = {
    "i": (0, (1, 2, 4, 8)),
    "u": (1, (1, 2, 4, 8)),
    "f": (2, (2, 4, 8)),
    "c": (5, (8, 16)),
    "b": (6, (1,)),
}
_BFLOAT16 = 4  # DLPack's kDLBfloat
# bfloat16's typestr: numpy has no bfloat16, so the items are raw 2-byte ones ('V2');
# ``Buffer.dtype`` reports ``ml_dtypes.bfloat16`` where ml_dtypes is installed.
BFLOAT16_TYPESTR = "<V2"
_MAX_DIM = (1 << 63) - 1


class _Dtype(NamedTuple):
    """How ``read`` describes its items to consumers."""

    name: str  # for messages
    typestr: str  # numpy's array-interface spelling
    code: int  # DLPack type code
    itemsize: int


def _torch_name(dtype: object) -> str | None:
    """``"float16"`` for ``torch.float16`` (and its aliases such as ``torch.half``),
    recognised by its string so that torch need not be imported; None for anything else."""
    if isinstance(dtype, str):
        return None
    text = str(dtype)
    prefix = "torch."
    if text.startswith(prefix) and text[len(prefix) :].isidentifier():
        return text[len(prefix) :]
    return None


def _resolve_dtype(dtype: object) -> _Dtype:
    """The item type ``read`` exports for ``dtype``: a numpy dtype or its spelling,
    ``"bfloat16"``, ``ml_dtypes.bfloat16`` (JAX's), or a torch dtype such as
    ``torch.float16``. TypeError for something that is no data type, ValueError for a
    data type that DLPack cannot carry."""
    import numpy as np

    spelled = _torch_name(dtype)
    if spelled is not None:
        dtype = spelled
    if dtype is None:
        dtype = "uint8"  # read's default
    if isinstance(dtype, str) and dtype.strip().lower() in ("bfloat16", "bf16"):
        return _Dtype("bfloat16", BFLOAT16_TYPESTR, _BFLOAT16, 2)
    try:
        dt = np.dtype(dtype)  # type: ignore[call-overload]
    except Exception as e:  # TypeError mostly; odd spellings give others
        if spelled is not None:
            raise ValueError(
                f"torch.{spelled} has no numpy or DLPack type kvikpy can export; read the "
                "bytes (dtype='uint8') and view them as that type in torch"
            ) from e
        raise TypeError(
            f"dtype={dtype!r} is not a data type: pass a numpy dtype or its name "
            "('float16', '<i4'...), 'bfloat16', or a torch dtype (torch.float16)"
        ) from e
    if dt.name == "bfloat16" and dt.itemsize == 2:  # ml_dtypes.bfloat16 (JAX, TensorFlow)
        return _Dtype("bfloat16", BFLOAT16_TYPESTR, _BFLOAT16, 2)
    code, sizes = _DLPACK_CODES.get(dt.kind, (None, ()))
    if code is None or dt.itemsize not in sizes or dt.fields is not None or dt.subdtype:
        raise ValueError(
            f"dtype {dt} ({dt.itemsize}-byte items) cannot be exported through DLPack, which "
            "carries booleans, integers of 1 to 8 bytes, float16/32/64, bfloat16 and "
            "complex64/128; read the bytes (dtype='uint8') and view them as that type in "
            "your array library"
        )
    if not dt.isnative:
        raise ValueError(
            f"dtype {dt.str!r} is in the other byte order, which DLPack cannot describe; "
            f"read with the native dtype {dt.newbyteorder('=').name!r} and swap the bytes "
            "afterwards (numpy: arr.byteswap())"
        )
    typestr = dt.str if dt.itemsize > 1 else "|" + dt.str[1:]
    return _Dtype(dt.name, typestr, code, dt.itemsize)


def _parse_shape(shape: object) -> list[int]:
    """``shape`` (an int or a sequence of ints, numpy integers included) as a list;
    TypeError for anything else, ValueError for negative dimensions other than one -1."""
    wrong = TypeError(f"shape must be an int or a sequence of ints, got {shape!r}")
    if isinstance(shape, bool) or type(shape).__name__ == "bool_":
        raise wrong
    try:
        dims = [operator.index(shape)]  # type: ignore[arg-type]
    except TypeError:
        if isinstance(shape, str | bytes) or not hasattr(shape, "__iter__"):
            raise wrong from None
        dims = []
        for d in shape:
            if isinstance(d, bool) or type(d).__name__ == "bool_":
                raise wrong from None
            try:
                dims.append(operator.index(d))
            except TypeError:
                raise wrong from None
    if any(d < -1 for d in dims) or dims.count(-1) > 1:
        raise ValueError(
            f"shape {tuple(dims)} has a negative dimension; dimensions are sizes (0 or more), "
            "with at most one -1 standing for as many items as fit"
        )
    if any(d > _MAX_DIM for d in dims):
        raise ValueError(f"shape {tuple(dims)} has a dimension above 2**63 - 1")
    return dims


def _fit_shape(dims: list[int] | None, size: int, dt: _Dtype) -> tuple[int, ...]:
    """The dimensions of ``size`` bytes of ``dt`` items: ``dims`` as given, one ``-1``
    inferred (as numpy's ``reshape`` does), or all the items in one dimension (None)."""
    if dims is None:
        if size % dt.itemsize:
            raise ValueError(
                f"{size} bytes are not a whole number of {dt.name} items ({dt.itemsize} bytes "
                f"each); pass a size that is a multiple of {dt.itemsize}"
            )
        return (size // dt.itemsize,)
    dims = list(dims)
    if -1 in dims:
        known = math.prod(d for d in dims if d != -1)
        items, rest = divmod(size, dt.itemsize)
        if known == 0 or rest or items % known:
            raise ValueError(
                f"shape {tuple(dims)} of {dt.name} cannot cover the range's {size} bytes "
                f"({items} whole items): the other dimensions multiply to {known}; pass a "
                "shape whose -1 works out to a whole number of items"
            )
        dims[dims.index(-1)] = items // known
    needed = math.prod(dims) * dt.itemsize
    if needed != size:
        raise ValueError(
            f"shape {tuple(dims)} of {dt.name} needs {needed} bytes, but the range has "
            f"{size}; pass a shape of {size // dt.itemsize} items in all (or -1 for one "
            f"dimension), or size={needed}"
        )
    return tuple(dims)


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
    dt = _resolve_dtype(dtype)  # imports numpy: deferred, so `import kvikpy` stays fast
    dims = None if shape is None else _parse_shape(shape)  # a malformed one fails early
    name = _paths.fspath(path)
    with CuFile(path, "r") as f:
        file_size = f.nbytes()
        content = None
        unsized = file_size == 0 and not _paths.is_url(name) and _paths.is_unsized(f.fileno())
        if unsized and size is None:
            # A device, a pipe, or a pseudo-file (/proc, /sys): host reads read a
            # pseudo-file to its end (up to a bound); devices and pipes, which may never
            # end, and device reads of pseudo-files (which cannot be sized) are refused.
            if ordinal is not None and _paths.special_kind(f.fileno()) is None:
                f._handle.size_for("a device read")
            content = _paths.read_to_end(f.fileno(), name)
            file_size = len(content)
        elif unsized:
            # Read exactly the bytes asked for, however long the file goes on.
            assert size is not None
            file_size = offset + size
        if size is None:
            if offset > file_size:
                raise ValueError(
                    f"offset {offset} is past the end of {name!r}, which has {file_size} "
                    f"bytes; pass an offset of at most {file_size}"
                )
            size = file_size - offset
        elif offset + size > file_size:
            raise ValueError(
                f"bytes [{offset}, {offset + size}) reach past the end of {name!r}, which "
                f"has {file_size} bytes; pass size={file_size - offset} or less (or leave "
                "size out to read to the end)"
            )
        fitted = _fit_shape(dims, size, dt)
        buf = _lib.Buffer.allocate(size, ordinal, False)
        if unsized:
            _read_unsized(f, buf, name, offset, size, content)
        elif stream is not None and ordinal is not None:
            f.raw_read_async(buf, stream_handle(stream), size, offset)
        elif progress:
            from kvikpy._progress import follow_future

            base = os.path.basename(name)
            # The engine fails the read (OSError) if the file shrank since it was sized.
            follow_future(lambda: f._handle.pread_exact(buf, size, offset), size, f"read {base}")
        else:
            f._handle.read_exact(buf, size, offset)
    return buf.view(dt.typestr, dt.code, dt.itemsize * 8, list(fitted))


def _read_unsized(
    f: CuFile, buf: _lib.Buffer, name: str, offset: int, size: int, content: bytes | None
) -> None:
    """Fill ``buf`` with ``size`` bytes at ``offset`` of a file whose size says nothing
    of its end (a device, a pipe, a pseudo-file): from ``content`` where the file was read
    to its end, else read there and then, never more than ``size`` bytes; ``ValueError``
    where the file ends first."""
    if buf.device == "cpu":
        if content is None:
            piece = _paths.read_range(f.fileno(), offset, size)
        else:
            piece = content[offset : offset + size]
        got = len(piece)
        if got == size:
            host: Any = buf  # host memory, writable through the buffer protocol
            memoryview(host)[:] = piece
    else:
        got = f._handle.read(buf, size, offset)
    if got < size:
        raise ValueError(
            f"bytes [{offset}, {offset + size}) reach past the end of {name!r}, which ended "
            f"after {offset + got} bytes; pass size={got} or less"
        )


def write(path: _paths.StrPath, buf: BufferLike, *, offset: int = 0, progress: bool = False) -> int:
    """Write all of ``buf`` (host or GPU memory) to ``path`` at ``offset``.

    The file is created if missing and otherwise not truncated, so bytes outside
    ``[offset, offset + nbytes)`` are kept. Arguments are checked before the file is
    created, and a file this call created is removed again if the write fails.

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
    # O_CREAT | O_EXCL, else the existing file without O_TRUNC (see CuFile._one_shot): a
    # file this call created is removed again if the write fails.
    with CuFile._one_shot(path, truncate=False) as f:
        if not progress:
            return f.write(buf, file_offset=offset)
        from kvikpy._progress import follow_future

        name = os.path.basename(_paths.fspath(path))
        return follow_future(
            lambda: f.pwrite(buf, file_offset=offset)._handle, nbytes, f"write {name}"
        )
