"""kvikpy.zarr on the GPU: zarr's StoreTests with GPU buffers, arrays read into CuPy
through GDSStore, and zstd/lz4 chunks decoded by nvCOMP in batches, byte for byte as the
CPU codecs decode them."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

cupy = pytest.importorskip("cupy")
zarr = pytest.importorskip("zarr", minversion="3.0.8")

import numcodecs  # noqa: E402
import test_zarr_store  # noqa: E402  (its class, imported as a module: not collected twice)
import zarr.codecs  # noqa: E402, F811
import zarr.codecs.numcodecs as znc  # noqa: E402
import zarr.storage  # noqa: E402
from zarr.abc.store import RangeByteRequest, SuffixByteRequest  # noqa: E402
from zarr.core.buffer import default_buffer_prototype, gpu  # noqa: E402

import kvikpy.zarr  # noqa: E402
from kvikpy.zarr import GDSStore, _codecs  # noqa: E402

pytestmark = [
    pytest.mark.filterwarnings("ignore:Numcodecs codecs are not in the Zarr version 3"),
    # zarr's own code may still wrap host arrays in GPU buffers elsewhere (its StoreTests'
    # helpers); the tests of sharded reads below turn this warning back into an error.
    pytest.mark.filterwarnings("ignore:Creating a zarr.buffer.gpu.Buffer with an array"),
]

# zarr's warning when a GPU buffer is made from an array without __cuda_array_interface__
# (it then copies the array to the GPU itself).
SLOW_COPY = "Creating a zarr.buffer.gpu.Buffer with an array"

needs_nvcomp = pytest.mark.skipif(
    not kvikpy.zarr.nvcomp_available(),
    reason="needs nvCOMP's Python package (pip install nvidia-nvcomp-cu13)",
)


@pytest.fixture
def gpu_mode():
    with zarr.config.enable_gpu():
        yield


class TestGDSStoreOnGPU(test_zarr_store.TestGDSStoreOnCPU):
    """zarr's StoreTests with GPU buffers: every get lands in GPU memory (the CPU class's
    store set-up and checks, run under zarr's GPU mode)."""

    buffer_cls = gpu.Buffer  # type: ignore[assignment]

    @pytest.fixture(autouse=True)
    def _gpu_buffers(self, gpu_mode):
        assert default_buffer_prototype().buffer is gpu.Buffer


async def test_gets_land_in_gpu_memory_without_a_host_copy(tmp_path, gpu_mode):
    data = np.random.default_rng(0).bytes(1 << 20)
    (tmp_path / "k").write_bytes(data)
    store = GDSStore(tmp_path)
    got = await store.get("k", default_buffer_prototype())
    assert isinstance(got, gpu.Buffer)
    assert isinstance(got.as_array_like(), cupy.ndarray)
    assert got.to_bytes() == data
    part = await store.get("k", default_buffer_prototype(), RangeByteRequest(100, 5000))
    assert part.to_bytes() == data[100:5000]
    tail = await store.get("k", default_buffer_prototype(), SuffixByteRequest(77))
    assert tail.to_bytes() == data[-77:]


async def test_set_writes_gpu_buffers(tmp_path, gpu_mode):
    data = cupy.arange(100_000, dtype=cupy.uint8)
    store = GDSStore(tmp_path)
    await store.set("a/b", gpu.Buffer(data))
    assert (tmp_path / "a/b").read_bytes() == cupy.asnumpy(data).tobytes()


def random_walk(n: int, seed: int = 0) -> np.ndarray:
    """float32 data that compresses 2-4x (as the benchmark's)."""
    steps = np.random.default_rng(seed).standard_normal(n).astype("float32")
    return np.cumsum(steps, dtype="float32").round(1)


COMPRESSORS = {
    "raw": lambda: None,
    "zstd": lambda: zarr.codecs.ZstdCodec(level=3),
    "zstd-checksum": lambda: zarr.codecs.ZstdCodec(level=1, checksum=True),
    "numcodecs-zstd": lambda: znc.Zstd(level=2),
    "numcodecs-lz4": lambda: znc.LZ4(),
}


def write_array(root: Path, compressor: str, shards=None) -> np.ndarray:
    data = random_walk(300 * 1000).reshape(300, 1000)
    a = zarr.create_array(
        zarr.storage.LocalStore(root),  # written on the CPU, by zarr alone
        name="a",
        shape=data.shape,
        chunks=(50, 250),
        shards=shards,
        dtype="float32",
        compressors=COMPRESSORS[compressor](),
    )
    a[:] = data
    return data


@pytest.mark.parametrize("compressor", sorted(COMPRESSORS))
@pytest.mark.parametrize("shards", [None, (150, 500)], ids=["chunks", "shards"])
def test_arrays_read_into_cupy_equal_the_cpu_read(tmp_path, compressor, shards):
    data = write_array(tmp_path, compressor, shards)
    with kvikpy.zarr.enable_gpu():
        a = zarr.open_array(GDSStore(tmp_path, read_only=True), path="a", mode="r")
        whole = a[:]
        part = a[17:233, 123:877]
    assert isinstance(whole, cupy.ndarray)
    np.testing.assert_array_equal(cupy.asnumpy(whole), data)
    np.testing.assert_array_equal(cupy.asnumpy(part), data[17:233, 123:877])


@needs_nvcomp
@pytest.mark.parametrize("compressor", ["zstd", "zstd-checksum", "numcodecs-zstd", "numcodecs-lz4"])
def test_compressed_chunks_decode_in_nvcomp_batches(tmp_path, compressor, monkeypatch):
    """With nvCOMP, a GPU read decodes its chunks in batches (zarr's concurrent
    mini-batches gathered into few nvCOMP calls), never on the CPU."""
    data = write_array(tmp_path, compressor)
    calls: list[int] = []
    real = _codecs._Decoder.decode

    def counting(self, sources, header):  # calls through: counts the batches
        calls.append(len(sources))
        return real(self, sources, header)

    monkeypatch.setattr(_codecs._Decoder, "decode", counting)
    with kvikpy.zarr.enable_gpu(batch_size=8):
        got = zarr.open_array(GDSStore(tmp_path), path="a", mode="r")[:]
    np.testing.assert_array_equal(cupy.asnumpy(got), data)
    assert sum(calls) == 24  # 6 x 4 chunks, every one on the GPU
    assert len(calls) <= 3  # at most one call per mini-batch of 8


@needs_nvcomp
@pytest.mark.parametrize("algorithm", ["zstd", "lz4"])
@pytest.mark.parametrize("level", [1, 9])
def test_nvcomp_decodes_byte_for_byte_as_numcodecs(algorithm, level):
    """Chunks of several sizes (odd sizes, 4 MiB) encoded by numcodecs on the CPU, decoded
    in one nvCOMP batch: the same bytes as numcodecs' decode."""
    sizes = [1, 1000, 4097, 1 << 20, 4 << 20, 12345]
    raw = [random_walk(n // 4 + 1, seed=i).tobytes()[:n] for i, n in enumerate(sizes)]
    if algorithm == "zstd":
        codec = numcodecs.Zstd(level=level)
        header = 0
    else:
        codec = numcodecs.LZ4(acceleration=level)
        header = _codecs.LZ4_HEADER
    encoded = [codec.encode(r) for r in raw]
    sources = [cupy.asarray(np.frombuffer(e, dtype=np.uint8)) for e in encoded]
    decoded = _codecs._decoder(algorithm, cupy.cuda.runtime.getDevice()).decode(sources, header)
    assert [cupy.asnumpy(d).tobytes() for d in decoded] == [bytes(codec.decode(e)) for e in encoded]


@needs_nvcomp
def test_misaligned_sources_are_packed(tmp_path):
    """Sources that start off nvCOMP's alignment (views at odd offsets) still decode."""
    codec = numcodecs.Zstd(level=3)
    raw = [random_walk(10_000, seed=i).tobytes() for i in range(4)]
    blob = b"".join(b"x" + codec.encode(r) for r in raw)
    whole = cupy.asarray(np.frombuffer(blob, dtype=np.uint8))
    sources, at = [], 0
    for r in raw:
        n = len(codec.encode(r))
        sources.append(whole[at + 1 : at + 1 + n])
        at += 1 + n
    decoded = _codecs._decoder("zstd", cupy.cuda.runtime.getDevice()).decode(sources, 0)
    assert [cupy.asnumpy(d).tobytes() for d in decoded] == raw


@needs_nvcomp
def test_single_chunk_reads_are_gathered_into_one_decode(tmp_path, monkeypatch):
    """Many single-chunk reads awaited together decode in one nvCOMP call; a lone chunk
    decodes on the CPU (fewer than MIN_GPU_BATCH chunks)."""
    import asyncio

    from zarr.core.sync import sync

    data = write_array(tmp_path, "zstd")
    calls: list[int] = []
    real = _codecs._Decoder.decode
    monkeypatch.setattr(
        _codecs._Decoder, "decode", lambda self, s, h: (calls.append(len(s)), real(self, s, h))[1]
    )
    with kvikpy.zarr.enable_gpu():
        arr = zarr.open_array(GDSStore(tmp_path), path="a", mode="r")

        async def each_chunk():
            return await asyncio.gather(
                *(
                    arr._async_array.getitem((slice(r, r + 50), slice(c, c + 250)))
                    for r in range(0, 300, 50)
                    for c in range(0, 1000, 250)
                )
            )

        parts = sync(each_chunk())
        lone = arr[:50, :250]
    # The 24 reads are gathered into one or a few batch reads, and their decodes with
    # them: a few nvCOMP calls, not 24 (a round under MIN_GPU_BATCH would go to the CPU).
    assert 1 <= len(calls) <= 3 and sum(calls) >= 16
    got = cupy.asnumpy(cupy.concatenate([cupy.concatenate(parts[i : i + 4], axis=1)
                                         for i in range(0, 24, 4)]))  # fmt: skip
    np.testing.assert_array_equal(got, data)
    np.testing.assert_array_equal(cupy.asnumpy(lone), data[:50, :250])


async def test_kvikio_style_basic_read(tmp_path):
    """kvikio's own first zarr test, in kvikpy's words: written by LocalStore, read by
    GDSStore in zarr's GPU mode."""
    src = zarr.storage.LocalStore(tmp_path)
    arr = zarr.create_array(src, name="a", shape=(10,), dtype="u4", zarr_format=3)
    arr[:5] = 0
    arr[5:] = 1
    store = GDSStore(tmp_path, read_only=True)
    assert await store.exists("a/zarr.json")
    with zarr.config.enable_gpu():
        result = zarr.open_array(store, path="a", zarr_format=3)[:]
    assert isinstance(result, cupy.ndarray)
    cupy.testing.assert_array_equal(result, cupy.array([0] * 5 + [1] * 5, dtype="uint32"))


@pytest.mark.parametrize("index_location", ["end", "start"])
@pytest.mark.parametrize("compressor", ["raw", "zstd"])
def test_sharded_arrays_read_on_the_gpu_without_zarrs_slow_copy_warning(
    tmp_path, index_location, compressor
):
    """A sharded zarr 3 array written by zarr alone, read through GDSStore under zarr's GPU
    mode: whole shards, partial shards (the shard index read on its own, then byte ranges)
    and one chunk, with zarr's "slow copy based path" warning an error. kvikpy's crc32c
    codec (the shard index's checksum) hands zarr CUDA arrays; zarr's own wraps a numpy
    array in a GPU buffer and warns on every shard."""
    from zarr.codecs.sharding import ShardingCodecIndexLocation

    data = random_walk(300 * 1000).reshape(300, 1000)
    a = zarr.create_array(
        zarr.storage.LocalStore(tmp_path),
        name="a",
        shape=data.shape,
        chunks=(50, 250),
        shards={"shape": (150, 500), "index_location": ShardingCodecIndexLocation(index_location)},
        dtype="float32",
        compressors=COMPRESSORS[compressor](),
    )
    a[:] = data
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=SLOW_COPY)
        with zarr.config.enable_gpu():
            b = zarr.open_array(GDSStore(tmp_path, read_only=True), path="a", mode="r")
            whole = b[:]
            part = b[17:233, 123:877]
            one = b[60:70, 260:270]
    for got in (whole, part, one):
        assert isinstance(got, cupy.ndarray)
    np.testing.assert_array_equal(cupy.asnumpy(whole), data)
    np.testing.assert_array_equal(cupy.asnumpy(part), data[17:233, 123:877])
    np.testing.assert_array_equal(cupy.asnumpy(one), data[60:70, 260:270])


def test_crc32c_encodes_and_decodes_into_cuda_arrays(gpu_mode):
    """kvikpy's crc32c codec under zarr's GPU mode: GPU buffers backed by CuPy arrays,
    made without zarr's slow-copy warning, with zarr's bytes."""
    from zarr.codecs import Crc32cCodec as ZarrCrc32c
    from zarr.core.array_spec import ArrayConfig, ArraySpec
    from zarr.core.buffer import cpu
    from zarr.core.dtype import UInt8

    spec = ArraySpec(
        shape=(1000,),
        dtype=UInt8(),
        fill_value=0,
        config=ArrayConfig(order="C", write_empty_chunks=False),
        prototype=default_buffer_prototype(),
    )
    raw = np.random.default_rng(3).integers(0, 256, 1000, dtype=np.uint8)
    codec = _codecs.Crc32cCodec()
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=SLOW_COPY)
        encoded = codec._encode_sync(gpu.Buffer(cupy.asarray(raw)), spec)
        assert encoded is not None
        decoded = codec._decode_sync(encoded, spec)
    for buf in (encoded, decoded):
        assert isinstance(buf, gpu.Buffer)
        assert isinstance(buf.as_array_like(), cupy.ndarray)
    theirs = ZarrCrc32c()._encode_sync(cpu.Buffer.from_array_like(raw), _host(spec))
    assert theirs is not None
    assert encoded.to_bytes() == theirs.to_bytes()
    assert decoded.to_bytes() == raw.tobytes()
    # zarr's own codec takes the slow path this test guards against (the check is live).
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ZarrCrc32c()._decode_sync(encoded, spec)
    assert any(SLOW_COPY in str(w.message) for w in caught)


def _host(spec):
    import dataclasses

    from zarr.core.buffer.cpu import buffer_prototype

    return dataclasses.replace(spec, prototype=buffer_prototype)
