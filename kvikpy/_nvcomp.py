"""nvCOMP (NVIDIA's GPU compression library; the kvikpy wheel's ``nvcomp`` extra) for kvikpy:
loading its Python package where it is installed, and decoders that decode a batch of
zstd or lz4 buffers in GPU memory in one nvCOMP call. Used by :mod:`kvikpy.zarr`
(compressed chunks) and :mod:`kvikpy.arrow` (compressed IPC buffers)."""

from __future__ import annotations

import importlib
import importlib.util
import itertools
import threading
from functools import cache
from typing import Any


@cache
def nvcomp() -> Any | None:
    """nvCOMP's Python module (``nvidia.nvcomp``), or ``None`` where it is not installed
    or cannot load (no CUDA)."""
    try:
        return importlib.import_module("nvidia.nvcomp")
    except (ImportError, OSError):
        return None


class _Decoder:
    """One nvCOMP codec for one algorithm on one GPU, with its own CUDA stream.

    nvCOMP's codec objects keep scratch memory per call, so calls are serialised by a
    lock; the batch is the unit of parallelism.
    """

    def __init__(self, algorithm: str, ordinal: int) -> None:
        nv: Any = nvcomp()
        cupy: Any = importlib.import_module("cupy")
        self._cupy = cupy
        self._nv: Any = nv
        self._ordinal = ordinal
        with cupy.cuda.Device(ordinal):
            self._stream = cupy.cuda.Stream(non_blocking=True)
        assert nv is not None  # checked by the caller
        self._codec = nv.Codec(
            algorithm=algorithm,
            device_id=ordinal,
            cuda_stream=self._stream.ptr,
            bitstream_kind=nv.BitstreamKind.RAW,
        )
        self._align = max(1, int(self._codec.get_required_decompression_alignment()))
        self._lock = threading.Lock()

    def busy(self) -> bool:
        """Whether a call is running on this decoder now."""
        return self._lock.locked()

    def decode(self, sources: list[Any], header: int) -> list[Any]:
        """Decode ``sources`` (1-D uint8 CuPy arrays on this GPU, each skipping its first
        ``header`` bytes) in one nvCOMP batch call; the decoded chunks as uint8 CuPy
        arrays, ready on every stream when this returns."""
        cp = self._cupy
        with cp.cuda.Device(self._ordinal), self._lock:
            srcs = [s[header:] for s in sources]
            if any(s.data.ptr % self._align for s in srcs):
                srcs = self._pack(srcs)
            # The sources may still be being written on the caller's stream.
            self._stream.wait_event(cp.cuda.get_current_stream().record())
            batch = self._nv.as_arrays(srcs, self._stream.ptr)
            decoded = self._codec.decode(batch, data_type="|u1")
            self._stream.synchronize()
            return [cp.asarray(_Owned(decoded[i], decoded)) for i in range(len(srcs))]

    def decode_into(self, sources: list[Any], outputs: list[Any]) -> None:
        """Decode ``sources`` (1-D uint8 CuPy arrays on this GPU) into ``outputs`` (as
        many writable uint8 CuPy arrays, each exactly its source's decoded size) in one
        nvCOMP batch call; done on every stream when this returns."""
        cp = self._cupy
        with cp.cuda.Device(self._ordinal), self._lock:
            srcs = sources
            if any(s.data.ptr % self._align for s in srcs):
                srcs = self._pack(srcs)
            self._stream.wait_event(cp.cuda.get_current_stream().record())
            batch = self._nv.as_arrays(srcs, self._stream.ptr)
            out = self._nv.as_arrays(outputs, self._stream.ptr)
            self._codec.decode(batch, out=out)
            self._stream.synchronize()

    def _pack(self, srcs: list[Any]) -> list[Any]:
        """Copy ``srcs`` into one buffer with every start aligned as nvCOMP requires."""
        cp = self._cupy
        a = self._align
        starts, total = [], 0
        for s in srcs:
            total = -(-total // a) * a
            starts.append(total)
            total += s.nbytes
        packed = cp.empty(max(total, 1), dtype=cp.uint8)
        out = []
        for s, start in zip(srcs, starts, strict=True):
            dst = packed[start : start + s.nbytes]
            dst[...] = s
            out.append(dst)
        return out


class _Owned:
    """A view of one decoded chunk that keeps nvCOMP's batch (which owns the memory)
    alive for as long as the CuPy array made from it."""

    def __init__(self, view: Any, owner: Any) -> None:
        self.__cuda_array_interface__ = view.__cuda_array_interface__
        self._keep = (view, owner)


# Decoders per algorithm and GPU, each on its own stream, so that the mini-batches zarr
# decodes concurrently run side by side on the GPU (one nvCOMP call per mini-batch).
DECODERS_PER_GPU = 4
_decoders: dict[tuple[str, int], list[_Decoder]] = {}
_decoders_lock = threading.Lock()
_next = itertools.count()


def _decoder(algorithm: str, ordinal: int) -> _Decoder:
    """A decoder for ``algorithm`` on GPU ``ordinal``: an idle one if any, else the
    next in turn (its lock then queues the call)."""
    with _decoders_lock:
        pool = _decoders.get((algorithm, ordinal))
        if pool is None:
            pool = _decoders[(algorithm, ordinal)] = [
                _Decoder(algorithm, ordinal) for _ in range(DECODERS_PER_GPU)
            ]
    for d in pool:
        if not d.busy():
            return d
    return pool[next(_next) % len(pool)]


@cache
def cupy() -> Any | None:
    """CuPy, or ``None`` where it is not installed or cannot load (no CUDA)."""
    try:
        return importlib.import_module("cupy")
    except (ImportError, OSError):
        return None


def available() -> bool:
    """Whether buffers in GPU memory can be decoded by nvCOMP here: its Python package
    and CuPy (which views the buffers) both load."""
    return nvcomp() is not None and cupy() is not None


@cache
def installed() -> bool:
    """Whether nvCOMP's Python package and CuPy are installed: found, not loaded (a cheap
    check for choosing a route; :func:`available` loads them)."""
    try:
        found = importlib.util.find_spec("nvidia.nvcomp") is not None
        return found and importlib.util.find_spec("cupy") is not None
    except (ImportError, ValueError):
        return False
