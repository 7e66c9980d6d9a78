"""kvikpy.zarr on the CPU: GDSStore passes zarr's own store test-suite, gathers
concurrent gets into one batch read, follows LocalStore's byte-range semantics, and the
zstd/lz4 codecs it selects decode as zarr's do (their GPU path is tests/gpu/)."""

from __future__ import annotations

import asyncio
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

zarr = pytest.importorskip("zarr", minversion="3.0.8")

import zarr.codecs  # noqa: E402, F811
import zarr.storage  # noqa: E402
from zarr.abc.store import (  # noqa: E402
    OffsetByteRequest,
    RangeByteRequest,
    SuffixByteRequest,
)
from zarr.core.buffer import cpu, default_buffer_prototype  # noqa: E402
from zarr.testing.store import StoreTests  # noqa: E402

import kvikpy.zarr  # noqa: E402
from kvikpy.zarr import GDSStore, _reads  # noqa: E402


class TestGDSStoreOnCPU(StoreTests[GDSStore, cpu.Buffer]):
    """zarr's StoreTests, with host buffers (the GPU run is tests/gpu/test_zarr_gpu.py)."""

    store_cls = GDSStore
    buffer_cls = cpu.Buffer

    async def get(self, store: GDSStore, key: str) -> cpu.Buffer:
        return self.buffer_cls.from_bytes((store.root / key).read_bytes())

    async def set(self, store: GDSStore, key: str, value: cpu.Buffer) -> None:  # type: ignore[override]
        path = store.root / key
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(value.to_bytes())

    @pytest.fixture
    def store_kwargs(self, tmp_path: Path) -> dict[str, object]:
        return {"root": tmp_path}

    def test_store_repr(self, store: GDSStore) -> None:
        assert repr(store) == f"GDSStore('file://{store.root.as_posix()}')"

    def test_store_supports_writes(self, store: GDSStore) -> None:
        assert store.supports_writes

    def test_store_supports_listing(self, store: GDSStore) -> None:
        assert store.supports_listing


class TestGDSStoreFollowingSymlinks(TestGDSStoreOnCPU):
    """zarr's StoreTests again with ``follow_symlinks=True`` (the key checks of the
    default are exercised by the class above; tests/test_untrusted_input.py has the
    hostile keys and links)."""

    @pytest.fixture
    def store_kwargs(self, tmp_path: Path) -> dict[str, object]:
        return {"root": tmp_path, "follow_symlinks": True}

    def test_store_repr(self, store: GDSStore) -> None:
        assert repr(store) == f"GDSStore('file://{store.root.as_posix()}', follow_symlinks=True)"


def put(root: Path, key: str, data: bytes) -> None:
    (root / key).parent.mkdir(parents=True, exist_ok=True)
    (root / key).write_bytes(data)


DATA = bytes(range(1, 201))


@pytest.mark.parametrize(
    ("byte_range", "expected"),
    [
        (None, DATA),
        (RangeByteRequest(10, 20), DATA[10:20]),
        (RangeByteRequest(190, 400), DATA[190:]),  # cut at the end of the file
        (RangeByteRequest(300, 400), b""),  # past the end: empty, as LocalStore
        (RangeByteRequest(5, 5), b""),
        (OffsetByteRequest(150), DATA[150:]),
        (OffsetByteRequest(500), b""),
        (SuffixByteRequest(7), DATA[-7:]),
        (SuffixByteRequest(1000), DATA),
        (SuffixByteRequest(0), b""),
    ],
)
async def test_byte_ranges_match_local_store(tmp_path, byte_range, expected):
    put(tmp_path, "c/0", DATA)
    proto = default_buffer_prototype()
    ours = await GDSStore(tmp_path).get("c/0", proto, byte_range)
    theirs = await zarr.storage.LocalStore(tmp_path).get("c/0", proto, byte_range)
    assert ours is not None and theirs is not None
    assert ours.to_bytes() == theirs.to_bytes() == expected


async def test_missing_keys_and_directories_are_none(tmp_path):
    put(tmp_path, "a/b", b"x")
    store = GDSStore(tmp_path)
    proto = default_buffer_prototype()
    assert await store.get("nope", proto) is None
    assert await store.get("a", proto) is None  # a directory
    assert await store.get("a/b/c", proto) is None  # below a file
    got = await store.get_partial_values(proto, [("a/b", None), ("nope", None), ("a", None)])
    assert [g if g is None else g.to_bytes() for g in got] == [b"x", None, None]


async def test_negative_ranges_are_refused(tmp_path):
    put(tmp_path, "k", b"abc")
    with pytest.raises(ValueError, match="start <= end"):
        await GDSStore(tmp_path).get("k", default_buffer_prototype(), RangeByteRequest(2, 1))


async def test_concurrent_gets_are_one_batch_read(tmp_path, monkeypatch):
    """Gets started together are read by one batch read, into one allocation, each
    element on a 256-byte boundary."""
    blobs = {f"c/{i}": os.urandom(1000 + 37 * i) for i in range(64)}
    for k, v in blobs.items():
        put(tmp_path, k, v)
    calls: list[int] = []
    real = _reads.read_requests

    def counting(requests):  # calls through: counts the batches
        calls.append(len(requests))
        return real(requests)

    monkeypatch.setattr(_reads, "read_requests", counting)
    store = GDSStore(tmp_path)
    proto = default_buffer_prototype()
    got = await asyncio.gather(*(store.get(k, proto) for k in blobs))
    assert [g.to_bytes() for g in got] == list(blobs.values())
    assert calls == [64]
    starts = [g.as_numpy_array().ctypes.data for g in got]
    assert all(s % _reads.ALIGN == 0 for s in starts)
    assert starts == sorted(starts)
    assert starts[-1] - starts[0] < sum(len(v) + _reads.ALIGN for v in blobs.values())


async def test_get_partial_values_is_one_batch_read(tmp_path, monkeypatch):
    for i in range(5):
        put(tmp_path, f"k{i}", bytes([i]) * 100)
    calls: list[int] = []
    real = _reads.read_requests
    monkeypatch.setattr(_reads, "read_requests", lambda rs: (calls.append(len(rs)), real(rs))[1])
    got = await GDSStore(tmp_path).get_partial_values(
        default_buffer_prototype(),
        [(f"k{i}", RangeByteRequest(i, 10 + i)) for i in range(5)],
    )
    assert calls == [5]
    assert [g.to_bytes() for g in got] == [bytes([i]) * 10 for i in range(5)]


async def test_set_replaces_atomically_and_exclusive_keeps(tmp_path):
    store = GDSStore(tmp_path)
    buf = cpu.Buffer.from_bytes
    await store.set("a/b", buf(b"first"))
    await store.set("a/b", buf(b"2nd"))
    assert (tmp_path / "a/b").read_bytes() == b"2nd"
    await store.set_if_not_exists("a/b", buf(b"third"))
    assert (tmp_path / "a/b").read_bytes() == b"2nd"
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["b"]  # no leftovers
    with pytest.raises(TypeError, match="must be a zarr Buffer"):
        await store.set("x", b"bytes")  # type: ignore[arg-type]


async def test_getsize_does_not_read(tmp_path):
    put(tmp_path, "k", b"x" * 12345)
    assert await GDSStore(tmp_path).getsize("k") == 12345


def test_pickles_and_compares_like_local_store(tmp_path):
    store = GDSStore(tmp_path, read_only=True)
    again = pickle.loads(pickle.dumps(store))
    assert again == store and again.read_only
    assert store != zarr.storage.LocalStore(tmp_path)


@pytest.mark.parametrize(
    "compressors",
    [
        None,
        zarr.codecs.ZstdCodec(level=3),
        zarr.codecs.ZstdCodec(level=1, checksum=True),
        zarr.codecs.BloscCodec(),
    ],
    ids=["raw", "zstd", "zstd-checksum", "blosc"],
)
@pytest.mark.parametrize("shards", [None, (400, 60)], ids=["chunks", "shards"])
def test_arrays_round_trip_through_the_store(tmp_path, compressors, shards):
    data = np.random.default_rng(0).standard_normal((1000, 120)).astype("float32")
    store = GDSStore(tmp_path)
    a = zarr.create_array(
        store,
        name="a",
        shape=data.shape,
        chunks=(100, 30),
        shards=shards,
        dtype=data.dtype,
        compressors=compressors,
    )
    a[:] = data
    b = zarr.open_array(GDSStore(tmp_path, read_only=True), path="a", mode="r")
    np.testing.assert_array_equal(b[:], data)
    np.testing.assert_array_equal(b[123:456, 7:99], data[123:456, 7:99])
    # The same bytes as zarr's LocalStore reads.
    c = zarr.open_array(zarr.storage.LocalStore(tmp_path, read_only=True), path="a", mode="r")
    np.testing.assert_array_equal(c[:], data)


@pytest.mark.filterwarnings("ignore:Numcodecs codecs are not in the Zarr version 3")
@pytest.mark.parametrize("codec", ["lz4", "zstd"])
def test_numcodecs_codecs_are_kvikpys_and_decode_as_zarrs(tmp_path, codec):
    import zarr.codecs.numcodecs as znc

    compressor = {"lz4": znc.LZ4(), "zstd": znc.Zstd(level=2)}[codec]
    data = np.cumsum(np.random.default_rng(1).standard_normal(50_000)).astype("float32")
    a = zarr.create_array(
        GDSStore(tmp_path), name="a", shape=data.shape, chunks=(4096,), dtype="f4",
        compressors=compressor,
    )  # fmt: skip
    a[:] = data
    b = zarr.open_array(GDSStore(tmp_path), path="a", mode="r")
    (used,) = b.metadata.codecs[1:]
    assert type(used) is {"lz4": kvikpy.zarr.NumcodecsLZ4, "zstd": kvikpy.zarr.NumcodecsZstd}[codec]
    np.testing.assert_array_equal(b[:], data)


def test_zstd_codec_is_selected_and_keeps_zarrs_metadata(tmp_path):
    assert zarr.config.get("codecs.zstd") == "kvikpy.zarr._codecs.ZstdCodec"
    a = zarr.create_array(
        GDSStore(tmp_path), name="a", shape=(10,), dtype="i4",
        compressors=zarr.codecs.ZstdCodec(level=5),
    )  # fmt: skip
    a[:] = np.arange(10)
    meta = (tmp_path / "a" / "zarr.json").read_text()
    assert '"name": "zstd"' in meta and "kvikpy" not in meta
    b = zarr.open_array(GDSStore(tmp_path), path="a", mode="r")
    assert isinstance(b.metadata.codecs[1], kvikpy.zarr.ZstdCodec)
    np.testing.assert_array_equal(b[:], np.arange(10))


def test_enable_gpu_sets_zarrs_configuration_and_restores_it():
    before = (zarr.config.get("buffer"), zarr.config.get("async.concurrency"))
    with kvikpy.zarr.enable_gpu(batch_size=8, concurrency=16):
        assert zarr.config.get("buffer") == "zarr.buffer.gpu.Buffer"
        assert zarr.config.get("codec_pipeline.batch_size") == 8
        assert zarr.config.get("async.concurrency") == 16
    assert (zarr.config.get("buffer"), zarr.config.get("async.concurrency")) == before
    with pytest.raises(ValueError, match="batch_size must be a positive int"):
        kvikpy.zarr.enable_gpu(batch_size=0)


@pytest.mark.parametrize("blocked", ["zarr", "zarr.storage"])
def test_without_zarr_the_import_error_names_the_package(blocked):
    code = (
        "import sys\n"
        f"sys.modules[{blocked!r}] = None\n"
        "try:\n"
        "    import kvikpy.zarr\n"
        "except ImportError as e:\n"
        "    print(e.name, '|', e)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.startswith("zarr |")
    assert "pip install 'zarr>=3'" in out
    assert "<kvikpy wheel>[zarr]" in out


def test_zarr_2_is_refused_with_a_clear_message():
    code = (
        "import zarr\n"
        "zarr.__version__ = '2.18.7'\n"
        "try:\n"
        "    import kvikpy.zarr\n"
        "except ImportError as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert "needs zarr 3, but zarr 2.18.7 is installed" in out
