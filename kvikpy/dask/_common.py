"""What kvikpy.dask's constructors share: argument checks, the device's array module, and
the graph of read-group tasks with one cheap task per chunk."""

from __future__ import annotations

import math
import operator
import os
from collections.abc import Callable, Sequence
from typing import Any

import dask.array as da
import numpy as np
from dask.highlevelgraph import HighLevelGraph
from dask.task_spec import Task, TaskRef

import kvikpy
from kvikpy import _devices, _paths

#: A chunk's place in the grid of chunks.
BlockIndex = tuple[int, ...]

#: The default read groups: at most this many bytes ...
GROUP_BYTES = 256 << 20
#: ... and at most this many chunks per read ...
GROUP_CHUNKS = 32
#: ... while an array of many chunks still makes at least this many reads.
MIN_READS = 16

_CUPY_MISSING = (
    "device={device!r} makes CuPy chunks, and CuPy is not installed; install the CuPy "
    "wheel of your CUDA version (`pip install cupy-cuda12x` or `cupy-cuda13x`), or use "
    "device='cpu' for numpy chunks"
)


def check_dtype(dtype: Any, device: str) -> np.dtype[Any]:
    """``dtype`` as a numpy dtype that raw bytes can be viewed as, on ``device``."""
    try:
        dt: np.dtype[Any] = np.dtype(dtype)
    except Exception as e:  # TypeError mostly; odd spellings give others
        raise ValueError(
            f"dtype={dtype!r} is not a numpy data type; pass one or its name "
            "('float32', '<i8', 'complex64' ...)"
        ) from e
    if dt.hasobject:
        raise ValueError(
            f"dtype {dt} holds Python objects, which raw bytes cannot; pass a fixed-size "
            "type ('float32', 'S16', a structured dtype of such fields ...)"
        )
    if dt.itemsize == 0:
        raise ValueError(
            f"dtype {dt.str!r} has 0-byte items; give the size ('S16', 'U8', 'V4' ...)"
        )
    if device != "cpu":
        if dt.kind not in "biufc" or dt.fields is not None or dt.subdtype is not None:
            raise ValueError(
                f"dtype {dt} cannot be a CuPy array's type (device={device!r}): CuPy holds "
                "booleans, integers, floats and complex numbers; read with device='cpu' "
                "for numpy chunks of this type"
            )
        if not dt.isnative:
            raise ValueError(
                f"dtype {dt.str!r} is in the other byte order, which CuPy does not hold "
                f"(device={device!r}); read the native {dt.newbyteorder('=').str!r} and "
                "swap the bytes afterwards, or use device='cpu'"
            )
    return dt


def check_shape(shape: Any, what: str = "shape") -> tuple[int, ...]:
    """``shape`` (an int or a sequence of ints) as a tuple of sizes (0 or more)."""
    wrong = ValueError(f"{what} must be an int or a sequence of ints (sizes), got {shape!r}")
    if isinstance(shape, bool | str | bytes):
        raise wrong
    try:
        dims = [operator.index(shape)]
    except TypeError:
        if not isinstance(shape, Sequence | np.ndarray):
            raise wrong from None
        dims = []
        for d in shape:
            if isinstance(d, bool | np.bool_):
                raise wrong from None
            try:
                dims.append(operator.index(d))
            except TypeError:
                raise wrong from None
    if any(d < 0 for d in dims):
        raise ValueError(f"{what} {tuple(dims)} has a negative size; sizes are 0 or more")
    return tuple(dims)


def check_device(device: Any) -> str:
    """``device`` as ``"cpu"``, ``"cuda"`` or ``"cuda:N"``; checked for spelling only (the
    workers, not the client, need the GPU)."""
    try:
        parsed = _devices.parse(device)
    except (TypeError, ValueError):
        raise ValueError(
            f"device must be 'cpu' (numpy chunks), 'cuda' (CuPy chunks on each worker's "
            f"current GPU) or 'cuda:N', got {device!r}"
        ) from None
    if isinstance(parsed, int):
        if parsed < 0:
            raise ValueError(f"device {device!r} names a negative GPU number")
        return f"cuda:{parsed}"
    return parsed


def check_positive(value: Any, name: str) -> int:
    """A positive int argument."""
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < 1:
        raise ValueError(f"{name} must be a positive int, got {value!r}")
    return int(value)


def file_size(name: str) -> int:
    """The size of a local file or of a remote one (one request); errors are the file's."""
    if _paths.is_url(name):
        with kvikpy.RemoteFile.open(name) as f:
            return f.nbytes()
    return os.stat(name).st_size


def file_stamp(name: str) -> tuple[int, int]:
    """What identifies a file's version for a graph's name: size and modification time
    (the size alone for remote files)."""
    if _paths.is_url(name):
        return file_size(name), 0
    st = os.stat(name)
    return st.st_size, st.st_mtime_ns


def default_group(chunk_nbytes: int, nchunks: int) -> int:
    """How many chunks one read takes by default: groups of at most ``GROUP_BYTES`` and
    ``GROUP_CHUNKS`` chunks, and at least ``MIN_READS`` reads when there are that many
    chunks."""
    by_bytes = GROUP_BYTES // max(chunk_nbytes, 1)
    by_reads = math.ceil(nchunks / MIN_READS)
    return max(1, min(GROUP_CHUNKS, by_bytes, by_reads))


def array_module(device: str) -> Any:
    """numpy for ``"cpu"``, CuPy (imported now) for a GPU."""
    if device == "cpu":
        return np
    try:
        import cupy  # type: ignore[import-not-found, unused-ignore]
    except ImportError as e:
        raise ImportError(_CUPY_MISSING.format(device=device), name="cupy") from e
    return cupy


def meta(device: str, dtype: np.dtype[Any], ndim: int) -> Any:
    """An empty array of the chunks' type (numpy or CuPy), dtype and dimensions."""
    return array_module(device).empty((0,) * ndim, dtype=dtype)


def flat_bytes(batch: kvikpy.Batch, device: str) -> Any:
    """A batch's whole allocation as a 1-d ``uint8`` array (numpy or CuPy), no copy."""
    if device == "cpu":
        return batch.buffer.to_numpy()
    return array_module(device).from_dlpack(batch.buffer)


def view(flat: Any, start: int, shape: tuple[int, ...], dtype: np.dtype[Any], order: str) -> Any:
    """The ``shape`` array of ``dtype`` laid out in ``order`` from byte ``start`` of
    ``flat`` (a view)."""
    nbytes = math.prod(shape) * dtype.itemsize
    return flat[start : start + nbytes].view(dtype).reshape(shape, order=order)


def cuda_context(device: str) -> Any:
    """A context making ``device``'s GPU CuPy's current one (``"cuda:N"``), or nothing."""
    import contextlib

    if device.startswith("cuda:"):
        return array_module(device).cuda.Device(int(device[5:]))
    return contextlib.nullcontext()


def grouped_array(
    name: str,
    read_name: str,
    chunks: tuple[tuple[int, ...], ...],
    groups: Sequence[Sequence[BlockIndex]],
    read: Callable[..., tuple[Any, ...]],
    read_args: Callable[[Sequence[BlockIndex]], tuple[Any, ...]],
    dtype: np.dtype[Any],
    meta_array: Any,
) -> da.Array:
    """A dask array whose chunks come from read-group tasks.

    Group ``g`` is one task, key ``(read_name, g)``, calling ``read(*read_args(blocks))``,
    which returns one array per block of the group, in order; chunk ``blocks[k]`` of the
    array is a task taking item ``k`` of that tuple (a cheap task that dask places on the
    worker holding the group).
    """
    layer_read: dict[Any, Any] = {}
    layer_chunks: dict[Any, Any] = {}
    for g, blocks in enumerate(groups):
        key = (read_name, g)
        layer_read[key] = Task(key, read, *read_args(blocks))
        ref = TaskRef(key)
        for k, idx in enumerate(blocks):
            chunk_key = (name, *idx)
            layer_chunks[chunk_key] = Task(chunk_key, operator.getitem, ref, k)
    graph = HighLevelGraph(
        {read_name: layer_read, name: layer_chunks},
        {read_name: set(), name: {read_name}},
    )
    return da.Array(graph, name, chunks, dtype=dtype, meta=meta_array)  # type: ignore[no-untyped-call]
