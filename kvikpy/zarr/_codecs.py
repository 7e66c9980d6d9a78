"""zstd and lz4 chunks decoded on the GPU by nvCOMP, many chunks in one batch call.

zarr (3.1) decodes compressed chunks on the CPU even under ``zarr.config.enable_gpu()``:
each chunk is copied to the host, decoded there and copied back. The codecs here are
zarr's own (same names, same metadata, same encoding on the CPU) with one change: when a
batch of chunks to decode is in GPU memory and nvCOMP's Python package
(``nvidia-nvcomp-cu13``, the kvikpy wheel's ``nvcomp`` extra) is installed, the whole batch is
decoded by one nvCOMP call on the GPU. Otherwise they decode exactly as zarr's codecs do.
``crc32c`` (the checksum of sharded arrays' shard indexes) is zarr's too, except that
under zarr's GPU mode it hands zarr its result as a CUDA array: zarr's own wraps a numpy
array in a GPU buffer and warns about the copy that needs, on every sharded read.

:func:`register_codecs` puts them in zarr's codec registry and selects them in zarr's
configuration for ``zstd``, ``numcodecs.zstd``, ``numcodecs.lz4`` and ``crc32c``; ``import
kvikpy.zarr`` calls it. Where zarr has a GPU codec of its own for a name, zarr's stays.
"""

from __future__ import annotations

import asyncio
import dataclasses
import importlib
import weakref
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import zarr
from zarr.abc.codec import BytesBytesCodec
from zarr.codecs import Crc32cCodec as _ZarrCrc32c
from zarr.codecs import ZstdCodec as _ZarrZstd
from zarr.codecs.numcodecs import LZ4 as _ZarrLZ4
from zarr.codecs.numcodecs import Zstd as _ZarrNumcodecsZstd
from zarr.core.array_spec import ArraySpec
from zarr.core.buffer import Buffer
from zarr.core.buffer.cpu import buffer_prototype as cpu_buffer_prototype
from zarr.registry import register_codec

from kvikpy._nvcomp import _Decoder as _Decoder  # re-exported: tests patch it here
from kvikpy._nvcomp import _decoder, nvcomp
from kvikpy.zarr import _rounds

# numcodecs' LZ4 puts the decoded size (4 bytes, little-endian) before an LZ4 block.
LZ4_HEADER = 4


def _on_gpu(chunks: list[Buffer]) -> int | None:
    """The GPU holding every chunk, or ``None`` unless all are zarr GPU buffers on one."""
    from zarr.core.buffer import gpu

    if not chunks or not all(isinstance(c, gpu.Buffer) for c in chunks):
        return None
    arrays: list[Any] = [c.as_array_like() for c in chunks]
    devices = {int(a.device.id) for a in arrays}
    return devices.pop() if len(devices) == 1 else None


# Fewer chunks than this decode on the CPU: nvCOMP decodes each zstd or lz4 chunk (one
# frame) with a small part of the GPU, so a call's throughput grows with its chunks and a
# handful of large chunks decode faster on the CPU.
MIN_GPU_BATCH = 8

DecodeKey = tuple[str, int, int]  # (algorithm, GPU ordinal, header bytes to skip)


class _DecodeGatherer(_rounds.Rounds[tuple[DecodeKey, list[Any]], Any]):
    """Gathers the decodes started together on one event loop (the mini-batches of one
    array read, or many single-chunk reads) into one nvCOMP call per algorithm and GPU,
    as the store gathers their reads. A future gives its sources' decoded arrays, or
    ``None`` where the round had too few chunks for the GPU."""

    def dispatch(
        self, batch: list[tuple[tuple[DecodeKey, list[Any]], asyncio.Future[Any]]]
    ) -> None:
        groups: dict[DecodeKey, list[tuple[list[Any], asyncio.Future[Any]]]] = {}
        for (key, sources), future in batch:
            groups.setdefault(key, []).append((sources, future))
        for (algorithm, ordinal, header), members in groups.items():
            if sum(len(src) for src, _ in members) < MIN_GPU_BATCH:
                for _, future in members:
                    if not future.done():
                        future.set_result(None)
                continue
            _rounds.settle_in_thread(
                self.loop,
                [f for _, f in members],
                _decode_members,
                algorithm,
                ordinal,
                [src for src, _ in members],
                header,
            )


def _decode_members(
    algorithm: str, ordinal: int, members: list[list[Any]], header: int
) -> list[list[Any]]:
    """One nvCOMP call for every member's sources; each member's share of the outputs."""
    decoded = _decoder(algorithm, ordinal).decode([a for m in members for a in m], header)
    out, at = [], 0
    for m in members:
        out.append(decoded[at : at + len(m)])
        at += len(m)
    return out


_decode_gatherers: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _DecodeGatherer] = (
    weakref.WeakKeyDictionary()
)


def _decode_gatherer() -> _DecodeGatherer:
    return _rounds.for_running_loop(_decode_gatherers, _DecodeGatherer)


async def _gpu_decode(
    algorithm: str,
    header: int,
    chunk_bytes_and_specs: Iterable[tuple[Buffer | None, ArraySpec]],
    cpu_decode: Callable[
        [Iterable[tuple[Buffer | None, ArraySpec]]], Awaitable[Iterable[Buffer | None]]
    ],
) -> Iterable[Buffer | None]:
    """Decode a batch with nvCOMP where it is on one GPU and nvCOMP is installed (gathered
    with the decodes started with it), else with ``cpu_decode`` (zarr's own)."""
    items = list(chunk_bytes_and_specs)
    present = [i for i, (b, _) in enumerate(items) if b is not None and len(b) > 0]
    chunks = [items[i][0] for i in present]
    ordinal = _on_gpu([c for c in chunks if c is not None])
    if nvcomp() is None or ordinal is None or len(present) != sum(b is not None for b, _ in items):
        return await cpu_decode(items)
    sources = [c.as_array_like() for c in chunks if c is not None]
    decoded = await _decode_gatherer().submit(((algorithm, ordinal, header), sources))
    if decoded is None:  # too few chunks for the GPU to pay off
        return await cpu_decode(items)
    out: list[Buffer | None] = [None] * len(items)
    for i, arr in zip(present, decoded, strict=True):
        out[i] = items[i][1].prototype.buffer.from_array_like(arr)
    return out


class ZstdCodec(_ZarrZstd):
    """zarr's ``zstd`` codec; batches of chunks in GPU memory decode on the GPU through
    nvCOMP (one call per batch). Encoding, metadata and CPU decoding are zarr's."""

    async def decode(
        self, chunk_bytes_and_specs: Iterable[tuple[Buffer | None, ArraySpec]]
    ) -> Iterable[Buffer | None]:
        return await _gpu_decode("zstd", 0, chunk_bytes_and_specs, super().decode)


class NumcodecsZstd(_ZarrNumcodecsZstd):
    """zarr's ``numcodecs.zstd`` codec, decoded on the GPU as :class:`ZstdCodec` is."""

    async def decode(
        self, chunk_bytes_and_specs: Iterable[tuple[Buffer | None, ArraySpec]]
    ) -> Iterable[Buffer | None]:
        return await _gpu_decode("zstd", 0, chunk_bytes_and_specs, super().decode)


class NumcodecsLZ4(_ZarrLZ4):
    """zarr's ``numcodecs.lz4`` codec (numcodecs' LZ4: a 4-byte size, then an LZ4 block);
    batches of chunks in GPU memory decode on the GPU through nvCOMP's LZ4."""

    async def decode(
        self, chunk_bytes_and_specs: Iterable[tuple[Buffer | None, ArraySpec]]
    ) -> Iterable[Buffer | None]:
        return await _gpu_decode("lz4", LZ4_HEADER, chunk_bytes_and_specs, super().decode)


def _on_gpu_prototype(spec: ArraySpec) -> bool:
    """Whether ``spec`` asks for zarr's GPU buffers (``zarr.config.enable_gpu()``)."""
    from zarr.core.buffer import gpu

    buffer = spec.prototype.buffer
    return isinstance(buffer, type) and issubclass(buffer, gpu.Buffer)


def _as_gpu_buffer(host: Buffer, spec: ArraySpec) -> Buffer:
    """A host buffer's bytes as a buffer of ``spec``'s GPU prototype: copied to the GPU
    first (CuPy), so zarr's GPU buffer wraps a CUDA array instead of copying (and
    warning) itself."""
    cupy: Any = importlib.import_module("cupy")
    return spec.prototype.buffer.from_array_like(cupy.asarray(host.as_numpy_array()))


class Crc32cCodec(_ZarrCrc32c):
    """zarr's ``crc32c`` codec (the checksum of every shard index). zarr's own computes
    the checksum in host memory and wraps the result in the buffer class asked for: under
    ``zarr.config.enable_gpu()`` a GPU buffer made from a numpy array, which zarr warns
    about ("falling back to slow copy based path") on every sharded read. This one runs
    zarr's codec into host memory and hands zarr a CUDA array; on the CPU it is zarr's."""

    def _decode_sync(self, chunk_bytes: Buffer, chunk_spec: ArraySpec) -> Buffer:
        if not _on_gpu_prototype(chunk_spec):
            return super()._decode_sync(chunk_bytes, chunk_spec)
        host_spec = dataclasses.replace(chunk_spec, prototype=cpu_buffer_prototype)
        return _as_gpu_buffer(super()._decode_sync(chunk_bytes, host_spec), chunk_spec)

    def _encode_sync(self, chunk_bytes: Buffer, chunk_spec: ArraySpec) -> Buffer | None:
        if not _on_gpu_prototype(chunk_spec):
            return super()._encode_sync(chunk_bytes, chunk_spec)
        host_spec = dataclasses.replace(chunk_spec, prototype=cpu_buffer_prototype)
        host = super()._encode_sync(chunk_bytes, host_spec)
        return None if host is None else _as_gpu_buffer(host, chunk_spec)


# The codec names kvikpy's classes serve, and zarr's classes they replace.
CODECS: dict[str, type[BytesBytesCodec]] = {
    "crc32c": Crc32cCodec,
    "zstd": ZstdCodec,
    "numcodecs.zstd": NumcodecsZstd,
    "numcodecs.lz4": NumcodecsLZ4,
}


def zarr_has_gpu_codec(name: str) -> bool:
    """Whether zarr's configuration already selects a GPU (nvCOMP) codec for ``name``
    (later zarr releases may ship their own); kvikpy's then stays out of its way."""
    selected = str(zarr.config.get("codecs", {}).get(name, ""))
    return "nvcomp" in selected.lower() or ".gpu." in selected


def register_codecs() -> dict[str, str]:
    """Register kvikpy's GPU-decoding codecs with zarr and select them in zarr's
    configuration, for every codec name where zarr selects no GPU codec of its own.

    Called by ``import kvikpy.zarr``; call it again after ``zarr.config.reset()``. On the
    CPU, and wherever nvCOMP is not installed, the selected codecs behave exactly as
    zarr's (they are subclasses that only add the GPU batch decode).

    Returns
    -------
    dict
        The codec names now served by kvikpy, and the class each selects.
    """
    selected: dict[str, str] = {}
    for name, cls in CODECS.items():
        if zarr_has_gpu_codec(name):
            continue
        qualname = f"{cls.__module__}.{cls.__qualname__}"
        register_codec(name, cls, qualname=qualname)
        selected[name] = qualname
    if selected:
        # The whole `codecs` table: a dotted key would split "numcodecs.lz4" in two.
        codecs = dict(zarr.config.get("codecs", {}))
        codecs.update(selected)
        zarr.config.set({"codecs": codecs})
    return selected
