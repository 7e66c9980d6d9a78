"""kvikpy.dask: dask arrays whose chunks kvikpy reads.

Round trips against numpy (the synchronous scheduler, then a real two-process
``distributed.LocalCluster``), the proof that a group of chunks is one batch read (in the
graph and in the calls made), a worker killed mid-computation, and bad inputs refused
before any task runs. The GPU tests need CuPy (and dask_cuda with two GPUs for the
multi-GPU one)."""

from __future__ import annotations

import math
import os
import signal
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

dask = pytest.importorskip("dask")
distributed = pytest.importorskip("distributed")

import dask.array as da  # noqa: E402
from conftest import run_python  # noqa: E402

import kvikpy  # noqa: E402
import kvikpy.dask  # noqa: E402

SYNC = {"scheduler": "sync"}


def _data(shape: tuple[int, ...], dtype: Any, seed: int = 0) -> np.ndarray:
    """Random non-zero data of ``shape`` and ``dtype`` (from random bytes)."""
    dt = np.dtype(dtype)
    n = math.prod(shape)
    raw = np.random.default_rng(seed).integers(1, 256, n * dt.itemsize, dtype=np.uint8)
    if dt.kind == "f" or dt.kind == "c":  # finite values, so == compares them
        return np.random.default_rng(seed).uniform(1, 2, n).astype(dt).reshape(shape)
    if dt.kind == "b":
        return np.random.default_rng(seed).integers(0, 2, n).astype(bool).reshape(shape)
    return raw.view(dt).reshape(shape)


def _same(got: Any, expected: np.ndarray) -> None:
    """Same shape, dtype and bytes (NaNs of random bytes included)."""
    assert got.shape == expected.shape and got.dtype == expected.dtype
    assert np.asarray(got).tobytes() == expected.tobytes()


def _write(path: Path, a: np.ndarray, order: str = "C", header: int = 0) -> Path:
    """``a`` written raw in ``order`` after ``header`` bytes of 0xAB."""
    with open(path, "wb") as f:
        f.write(b"\xab" * header)
        f.write(a.tobytes(order=order))  # type: ignore[arg-type]
    return path


# ---------------------------------------------------------------------------------------
# The optional dependency


def test_import_kvikpy_does_not_import_dask() -> None:
    r = run_python("import sys, kvikpy; print(sorted(m for m in sys.modules if 'dask' in m))")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_without_dask_the_import_says_what_to_install() -> None:
    r = run_python(
        "import sys\n"
        "sys.modules['dask'] = None\n"
        "import kvikpy\n"
        "try:\n"
        "    import kvikpy.dask\n"
        "except ImportError as e:\n"
        "    print(e.name, '|', e)\n"
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("dask |")
    assert "pip install 'dask[array]' distributed" in r.stdout
    assert "<kvikpy wheel>[dask]" in r.stdout


# ---------------------------------------------------------------------------------------
# from_raw round trips (synchronous scheduler)

RAW_CASES = [
    # shape, dtype, chunks, order, offset, chunks_per_read
    pytest.param((1001,), "float64", 100, "C", 0, 3, id="1d-last-chunk-partial"),
    pytest.param((1001,), "int16", "auto", "C", 0, None, id="1d-auto"),
    pytest.param((50, 33), "float32", (7, 33), "C", 0, 4, id="2d-contiguous-chunks"),
    pytest.param((50, 33), "float32", (7, 10), "C", 0, 4, id="2d-row-chunks"),
    pytest.param((50, 33), "uint8", (50, 1), "C", 0, 5, id="2d-column-chunks"),
    pytest.param((13, 7, 5), "int16", (4, 3, 2), "C", 24, 5, id="3d-odd-offset"),
    pytest.param((13, 7, 5), "complex64", (13, 7, 2), "C", 0, 2, id="3d-last-axis-split"),
    pytest.param((13, 7, 5), ">i4", (5, 7, 5), "C", 3, 1, id="big-endian-unaligned-offset"),
    pytest.param((101,), "S3", 10, "C", 7, 4, id="3-byte-items"),
    pytest.param((40, 9), [("a", "<u2"), ("b", "f4")], (8, 9), "C", 0, 2, id="structured"),
    pytest.param((31, 17), "bool", (10, 5), "C", 0, 3, id="bool"),
    pytest.param((50, 33), "float64", (7, 10), "F", 0, 4, id="fortran-2d"),
    pytest.param((13, 7, 5), "int32", (13, 3, 2), "F", 16, 3, id="fortran-3d-contiguous"),
    pytest.param((13, 7, 5), "int32", "auto", "F", 0, None, id="fortran-auto"),
    pytest.param((0, 5), "float32", (4, 5), "C", 0, None, id="empty"),
    pytest.param((), "float64", (), "C", 8, None, id="scalar"),
]


@pytest.mark.parametrize(("shape", "dtype", "chunks", "order", "offset", "per_read"), RAW_CASES)
def test_from_raw_round_trip(
    tmp_path: Path,
    shape: tuple[int, ...],
    dtype: Any,
    chunks: Any,
    order: str,
    offset: int,
    per_read: int | None,
) -> None:
    a = _data(shape, dtype)
    path = _write(tmp_path / "a.bin", a, order, offset)
    x = kvikpy.dask.from_raw(
        path, dtype, shape, chunks, offset=offset, order=order, chunks_per_read=per_read
    )
    assert x.shape == a.shape and x.dtype == a.dtype
    assert type(x._meta) is np.ndarray
    with dask.config.set(SYNC):
        _same(x.compute(), a)
        # every chunk on its own, with the right shape, dtype and layout
        for idx in np.ndindex(*x.numblocks) if x.ndim else ():
            block = x.blocks[idx]
            expected = a[tuple(slice(s.start, s.stop) for s in _block_slices(x, idx))]
            _same(block.compute(), expected)


def _block_slices(x: da.Array, idx: tuple[int, ...]) -> list[slice]:
    out = []
    for axis, i in zip(x.chunks, idx, strict=True):
        start = sum(axis[:i])
        out.append(slice(start, start + axis[i]))
    return out


def test_auto_chunks_span_the_trailing_axes(tmp_path: Path) -> None:
    a = _data((3000, 200), "float64")
    path = _write(tmp_path / "a.bin", a)
    with dask.config.set({"array.chunk-size": "1MiB"}):
        x = kvikpy.dask.from_raw(path, "float64", a.shape)
        f = kvikpy.dask.from_raw(path, "float64", a.shape, order="F")
    assert x.chunks[1] == (200,) and len(x.chunks[0]) > 1
    assert f.chunks[0] == (3000,) and len(f.chunks[1]) > 1
    np.testing.assert_array_equal(x.compute(**SYNC), a)


def test_a_chunk_is_an_aligned_contiguous_view_of_its_groups_allocation(tmp_path: Path) -> None:
    from kvikpy.dask._raw import read_raw_group

    a = _data((20, 12), "float64")
    path = _write(tmp_path / "a.bin", a)
    boxes = (((0, 5), (0, 6)), ((0, 5), (6, 12)), ((5, 10), (0, 6)))
    chunks = read_raw_group(str(path), np.dtype("float64"), (20, 12), 0, "C", "cpu", boxes)
    for c, box in zip(chunks, boxes, strict=True):
        assert c.flags.c_contiguous and c.flags.writeable and c.flags.aligned
        np.testing.assert_array_equal(c, a[slice(*box[0]), slice(*box[1])])
    assert np.shares_memory(chunks[0].base, chunks[2].base)  # one allocation


def test_from_raw_reads_a_url(tmp_path: Path) -> None:
    from remote_servers import serve

    from kvikpy._http_server import RangeRequestHandler

    a = _data((64, 10), "int32")
    _write(tmp_path / "a.bin", a, header=4)
    with serve(RangeRequestHandler, directory=str(tmp_path)) as base:
        x = kvikpy.dask.from_raw(f"{base}/a.bin", "int32", a.shape, (10, 5), offset=4)
        np.testing.assert_array_equal(x.compute(**SYNC), a)
        with pytest.raises(ValueError, match=r"holds 2,564 bytes.*needs 2,568 bytes \(4 more\)"):
            kvikpy.dask.from_raw(f"{base}/a.bin", "int32", (64, 10), offset=8)


# ---------------------------------------------------------------------------------------
# Batching: N chunks are ceil(N / chunks_per_read) read tasks and read_ranges calls


@pytest.fixture
def counted_reads(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """Every kvikpy.read_ranges / read_many call made in this process: (kind, elements)."""
    calls: list[tuple[str, int]] = []
    read_ranges, read_many = kvikpy.read_ranges, kvikpy.read_many

    def counting_ranges(path: Any, ranges: Any, **kw: Any) -> kvikpy.Batch:
        batch = read_ranges(path, ranges, **kw)
        calls.append(("ranges", len(batch)))
        return batch

    def counting_many(paths: Any, **kw: Any) -> kvikpy.Batch:
        batch = read_many(paths, **kw)
        calls.append(("many", len(batch)))
        return batch

    monkeypatch.setattr(kvikpy, "read_ranges", counting_ranges)
    monkeypatch.setattr(kvikpy, "read_many", counting_many)
    return calls


def _read_layer(x: da.Array) -> dict[Any, Any]:
    (read_name,) = (n for n in x.dask.layers if n.startswith("kvikpy-read-"))
    return dict(x.dask.layers[read_name])


@pytest.mark.parametrize(("chunks", "per_read"), [(100, 3), (100, 1), (7, 8), (1000, 4)])
def test_n_chunks_are_ceil_n_over_chunks_per_read_batch_reads_1d(
    tmp_path: Path, counted_reads: list[tuple[str, int]], chunks: int, per_read: int
) -> None:
    a = _data((1000,), "float32")
    path = _write(tmp_path / "a.bin", a)
    x = kvikpy.dask.from_raw(path, "float32", a.shape, chunks, chunks_per_read=per_read)
    n = x.npartitions
    groups = math.ceil(n / per_read)
    # in the graph: one read task per group, one cheap task per chunk depending on it
    read_layer = _read_layer(x)
    assert len(read_layer) == groups
    chunk_layer = dict(x.dask.layers[x.name])
    assert len(chunk_layer) == n
    assert all(len(t.dependencies) == 1 for t in chunk_layer.values())
    assert {d for t in chunk_layer.values() for d in t.dependencies} == set(read_layer)
    # when computed: one read_ranges call per group, and a 1-d group is one merged range
    np.testing.assert_array_equal(x.compute(**SYNC), a)
    assert counted_reads == [("ranges", 1)] * groups


def test_2d_chunk_groups_are_one_read_each(
    tmp_path: Path, counted_reads: list[tuple[str, int]]
) -> None:
    a = _data((60, 40), "int64")
    path = _write(tmp_path / "a.bin", a)
    x = kvikpy.dask.from_raw(path, "int64", a.shape, (6, 10), chunks_per_read=5)
    assert x.npartitions == 40
    assert len(_read_layer(x)) == 8
    assert float(x.sum().compute(**SYNC)) == float(a.sum())
    assert [kind for kind, _ in counted_reads] == ["ranges"] * 8
    # a (6, 10) chunk of rows of 40 is 6 ranges of 80 bytes; where a group goes on from
    # chunk (i, 3) to chunk (i + 1, 0), the last row of the one ends where the first row
    # of the other starts, and the two ranges merge: 8 of the 9 such steps are inside a
    # group (groups of 5 chunks in the order 0..39; step 19 -> 20 crosses groups)
    assert sum(n for _, n in counted_reads) == 40 * 6 - 8


def test_from_files_groups_are_one_read_many_each(
    tmp_path: Path, counted_reads: list[tuple[str, int]]
) -> None:
    arrays = [_data((5, 3), "int32", seed=i) for i in range(7)]
    paths = [_write(tmp_path / f"f{i}.bin", a) for i, a in enumerate(arrays)]
    x = kvikpy.dask.from_files(paths, "int32", (5, 3), files_per_read=3)
    assert x.shape == (7, 5, 3) and x.chunks == ((1,) * 7, (5,), (3,))
    assert len(_read_layer(x)) == 3
    np.testing.assert_array_equal(x.compute(**SYNC), np.stack(arrays))
    assert sorted(counted_reads) == [("many", 1), ("many", 3), ("many", 3)]


def test_default_chunks_per_read_keeps_groups_and_reads_in_bounds(tmp_path: Path) -> None:
    a = _data((4096, 64), "float32")  # 1 MiB
    path = _write(tmp_path / "a.bin", a)
    small = kvikpy.dask.from_raw(path, "float32", a.shape, (16, 64))  # 256 chunks of 4 KiB
    assert len(_read_layer(small)) == 16  # 16 chunks per read, 16 reads
    few = kvikpy.dask.from_raw(path, "float32", a.shape, (1024, 64))  # 4 chunks
    assert len(_read_layer(few)) == 4


# ---------------------------------------------------------------------------------------
# from_files and from_zarr


@pytest.mark.parametrize("order", ["C", "F"])
def test_from_files_round_trip(tmp_path: Path, order: str) -> None:
    arrays = [_data((6, 4, 3), "float64", seed=i) for i in range(5)]
    paths = [_write(tmp_path / f"f{i}.bin", a, order) for i, a in enumerate(arrays)]
    x = kvikpy.dask.from_files(paths, "float64", (6, 4, 3), order=order)  # type: ignore[arg-type]
    expected = np.stack(arrays)
    np.testing.assert_array_equal(x.compute(**SYNC), expected)
    np.testing.assert_array_equal(x[2:4, 1].compute(**SYNC), expected[2:4, 1])


@pytest.fixture
def zarr_root(tmp_path: Path) -> tuple[Path, np.ndarray, np.ndarray]:
    """A zarr store written by zarr on the CPU: an array at the root's ``data`` and one in
    the group ``g/inner``."""
    zarr = pytest.importorskip("zarr", minversion="3.0.8")
    root = tmp_path / "store.zarr"
    a = _data((45, 20), "float32")
    b = _data((30,), "int64", seed=1)
    group = zarr.open_group(str(root), mode="w")
    data = group.create_array("data", shape=a.shape, chunks=(10, 7), dtype=a.dtype)
    data[...] = a
    inner = group.create_group("g").create_array("inner", shape=b.shape, chunks=(8,), dtype=b.dtype)
    inner[...] = b
    return root, a, b


def test_from_zarr_round_trip(zarr_root: tuple[Path, np.ndarray, np.ndarray]) -> None:
    root, a, b = zarr_root
    x = kvikpy.dask.from_zarr(str(root), "data")
    assert x.chunks == ((10, 10, 10, 10, 5), (7, 7, 6))
    np.testing.assert_array_equal(x.compute(**SYNC), a)
    y = kvikpy.dask.from_zarr(root / "g" / "inner", chunks=16)  # a path, larger chunks
    assert y.chunks == ((16, 14),)
    np.testing.assert_array_equal(y.compute(**SYNC), b)
    # a store, and an array already open
    import zarr

    from kvikpy.zarr import GDSStore

    store = GDSStore(root, read_only=True)
    np.testing.assert_array_equal(kvikpy.dask.from_zarr(store, "data").compute(**SYNC), a)
    z = zarr.open_array(store=store, path="g/inner", mode="r")
    np.testing.assert_array_equal(kvikpy.dask.from_zarr(z).compute(**SYNC), b)


def test_plain_dask_from_zarr_over_a_gds_store(
    zarr_root: tuple[Path, np.ndarray, np.ndarray],
) -> None:
    import zarr

    from kvikpy.zarr import GDSStore

    root, a, _ = zarr_root
    z = zarr.open_array(store=GDSStore(root, read_only=True), path="data", mode="r")
    x = da.from_zarr(z)
    np.testing.assert_array_equal(x.compute(**SYNC), a)
    np.testing.assert_array_equal(x[3:17, 5:9].compute(**SYNC), a[3:17, 5:9])


def test_from_zarr_refuses_a_url_and_component_with_an_open_array(
    zarr_root: tuple[Path, np.ndarray, np.ndarray],
) -> None:
    import zarr

    root, _, _ = zarr_root
    with pytest.raises(ValueError, match="is a URL"):
        kvikpy.dask.from_zarr("s3://bucket/store.zarr")
    z = zarr.open_array(str(root), path="data", mode="r")
    with pytest.raises(ValueError, match="already open"):
        kvikpy.dask.from_zarr(z, "data")
    with pytest.raises(ValueError, match="not device='cuda:1'"):
        kvikpy.dask.from_zarr(root, "data", device="cuda:1")


# ---------------------------------------------------------------------------------------
# Bad inputs: ValueError before any task exists


@pytest.fixture
def no_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("read before the inputs were checked")

    monkeypatch.setattr(kvikpy, "read_ranges", refuse)
    monkeypatch.setattr(kvikpy, "read_many", refuse)


BAD_RAW = [
    pytest.param({"shape": (100, 11)}, r"holds 4,000 bytes.*needs 4,400 bytes \(400 more\)"),
    pytest.param({"offset": 8}, r"from offset 8 needs 4,008 bytes \(8 more\)"),
    pytest.param({"dtype": "float64"}, r"needs 8,000 bytes"),
    pytest.param({"dtype": "notadtype"}, r"not a numpy data type"),
    pytest.param({"dtype": object}, r"Python objects"),
    pytest.param({"dtype": "S0"}, r"0-byte items"),
    pytest.param({"chunks": (30, 30, 30)}, r"do not fit|do not add up"),
    pytest.param({"chunks": ((50, 40), 10)}, r"do not fit|do not add up"),
    pytest.param({"chunks": "lots"}, r"do not fit"),
    pytest.param({"order": "K"}, r"order must be 'C'"),
    pytest.param({"offset": -1}, r"offset must be an int"),
    pytest.param({"shape": (10, -10)}, r"negative size"),
    pytest.param({"shape": "10"}, r"shape must be"),
    pytest.param({"chunks_per_read": 0}, r"chunks_per_read must be a positive int"),
    pytest.param({"device": "gpu"}, r"device must be 'cpu'"),
    pytest.param({"device": "cuda", "dtype": ">f4"}, r"other byte order"),
    pytest.param({"device": "cuda", "dtype": "S4"}, r"cannot be a CuPy array's type"),
]


@pytest.mark.usefixtures("no_reads")
@pytest.mark.parametrize(("change", "message"), BAD_RAW)
def test_from_raw_refuses_bad_inputs_up_front(
    tmp_path: Path, change: dict[str, Any], message: str
) -> None:
    path = _write(tmp_path / "a.bin", _data((100, 10), "float32"))  # 4,000 bytes
    args: dict[str, Any] = {"dtype": "float32", "shape": (100, 10), "chunks": 10}
    args.update(change)
    with pytest.raises(ValueError, match=message):
        kvikpy.dask.from_raw(path, **args)


@pytest.mark.usefixtures("no_reads")
def test_from_raw_missing_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        kvikpy.dask.from_raw(tmp_path / "missing.bin", "float32", 10)


@pytest.mark.usefixtures("no_reads")
def test_from_files_refuses_bad_inputs_up_front(tmp_path: Path) -> None:
    good = [_write(tmp_path / f"f{i}.bin", _data((4, 4), "int16", seed=i)) for i in range(5)]
    short = _write(tmp_path / "short.bin", _data((15,), "int16"))
    with pytest.raises(ValueError, match=r"1 of 6 files do not hold .*short.bin \(30 bytes\)"):
        kvikpy.dask.from_files([*good, short], "int16", (4, 4))
    with pytest.raises(ValueError, match="at least one path"):
        kvikpy.dask.from_files([], "int16", (4, 4))
    with pytest.raises(ValueError, match="files_per_read"):
        kvikpy.dask.from_files(good, "int16", (4, 4), files_per_read=-2)
    with pytest.raises(ValueError, match="not a numpy data type"):
        kvikpy.dask.from_files(good, "int17", (4, 4))


def test_a_file_that_shrank_after_the_array_was_made_fails_the_read(tmp_path: Path) -> None:
    a = _data((100,), "float64")
    path = _write(tmp_path / "a.bin", a)
    x = kvikpy.dask.from_raw(path, "float64", a.shape, 10, chunks_per_read=2)
    path.write_bytes(a.tobytes()[:400])
    with pytest.raises(ValueError, match=r"past the end|reach"):
        x.compute(**SYNC)


# ---------------------------------------------------------------------------------------
# A real cluster: two worker processes


@pytest.fixture(scope="module")
def client() -> Iterator[Any]:
    """A LocalCluster of two single-threaded worker processes, for the whole module."""
    cluster = distributed.LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        # A free loopback port: None still serves the scheduler's metrics on 8787, and
        # another cluster on the machine (a parallel test worker's) may hold it.
        dashboard_address="127.0.0.1:0",
        memory_limit="2GiB",
    )
    with cluster, distributed.Client(cluster) as c:
        c.wait_for_workers(2, timeout=60)
        yield c


@pytest.fixture(scope="module")
def big(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray]:
    """A 2000 x 300 float64 file (4.8 MB)."""
    a = _data((2000, 300), "float64", seed=5)
    return _write(tmp_path_factory.mktemp("dask") / "big.bin", a), a


def test_cluster_sums_means_and_slices(client: Any, big: tuple[Path, np.ndarray]) -> None:
    path, a = big
    x = kvikpy.dask.from_raw(path, "float64", a.shape, (100, 60), chunks_per_read=4)
    total, mean0, mean1, part = client.compute(
        [x.sum(), x.mean(axis=0), x.mean(axis=1), x[123:1456:7, 17:250]], sync=True
    )
    np.testing.assert_allclose(total, a.sum(), rtol=1e-12)
    np.testing.assert_allclose(mean0, a.mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(mean1, a.mean(axis=1), rtol=1e-12)
    np.testing.assert_array_equal(part, a[123:1456:7, 17:250])
    f = kvikpy.dask.from_files([path, path], "float64", a.shape)
    np.testing.assert_allclose(f.sum(axis=(1, 2)).compute(), [a.sum()] * 2, rtol=1e-12)


def test_cluster_reads_each_group_once_and_its_chunks_stay_there(
    client: Any, big: tuple[Path, np.ndarray]
) -> None:
    path, a = big
    x = kvikpy.dask.from_raw(path, "float64", a.shape, (50, 300), chunks_per_read=5)
    assert x.npartitions == 40
    x = x.persist()
    distributed.wait(x, timeout=60)
    workers = {w for ws in client.who_has(x).values() for w in ws}
    assert len(workers) == 2  # both workers read
    # the read tasks are gone (released once their chunks were handed out) and every
    # chunk of a group sits on the worker that read the group
    holders = client.who_has(x)
    for g in range(8):
        group = {holders[(x.name, 5 * g + k, 0)] for k in range(5)}
        assert len(group) == 1, f"group {g}'s chunks are on {group}"
    np.testing.assert_array_equal(x.compute(), a)
    del x


def test_cluster_from_zarr(client: Any, zarr_root: tuple[Path, np.ndarray, np.ndarray]) -> None:
    root, a, b = zarr_root
    x = kvikpy.dask.from_zarr(root, "data")
    np.testing.assert_array_equal(x.compute(), a)
    assert float(x.sum().compute()) == pytest.approx(float(a.sum()), rel=1e-6)
    y = kvikpy.dask.from_zarr(root, "g/inner")
    np.testing.assert_array_equal(y.compute(), b)


def _slowly(block: np.ndarray) -> np.ndarray:
    time.sleep(0.05)
    return block


@pytest.mark.timeout(300)
def test_a_worker_killed_mid_computation(client: Any, big: tuple[Path, np.ndarray]) -> None:
    """SIGKILL one worker process while a computation runs: the scheduler recomputes what
    it held (reads included) on the survivor and the nanny's replacement, and the result is
    right. The wait for the victim to hold data has no deadline of its own: it ends when
    the victim holds some, fails if the computation finishes first, and a cluster that
    never gets there fails through pytest-timeout."""
    path, a = big
    x = kvikpy.dask.from_raw(path, "float64", a.shape, (20, 300), chunks_per_read=4)
    y = x.map_blocks(_slowly, dtype=x.dtype)  # 100 blocks, 50 ms each: ~2.5 s per worker
    before = client.run(os.getpid)
    future = client.compute(y.sum(axis=0))
    victim = sorted(before)[0]

    def victim_holds_data() -> bool:
        return len(client.has_what().get(victim, ())) > 0

    while not victim_holds_data():
        assert not future.done(), "finished before a worker could be killed"
        time.sleep(0.02)
    os.kill(before[victim], signal.SIGKILL)
    result = future.result(timeout=90)
    np.testing.assert_allclose(result, a.sum(axis=0), rtol=1e-12)
    # the worker did die, and the cluster is back to two workers for what follows
    client.wait_for_workers(2, timeout=60)
    after = client.run(os.getpid)
    assert before[victim] not in after.values()


# ---------------------------------------------------------------------------------------
# GPUs (not run without CuPy and a GPU)


@pytest.mark.gpu
def test_cuda_chunks(tmp_path: Path, zarr_root: tuple[Path, np.ndarray, np.ndarray]) -> None:
    cupy = pytest.importorskip("cupy")
    a = _data((300, 40), "float32")
    path = _write(tmp_path / "a.bin", a)
    for device in ("cuda", "cuda:0"):
        x = kvikpy.dask.from_raw(path, "float32", a.shape, (32, 40), device=device)
        assert type(x._meta) is cupy.ndarray
        blocks = [x.blocks[i].compute(**SYNC) for i in range(x.numblocks[0])]
        assert all(type(b) is cupy.ndarray and b.dtype == a.dtype for b in blocks)
        np.testing.assert_array_equal(cupy.asnumpy(x.compute(**SYNC)), a)
        np.testing.assert_allclose(float(x.sum().compute(**SYNC)), a.sum(), rtol=1e-5)
    y = kvikpy.dask.from_raw(path, "float32", a.shape, (32, 7), order="F", device="cuda")
    np.testing.assert_array_equal(
        cupy.asnumpy(y.compute(**SYNC)), a.ravel().reshape(a.shape, order="F")
    )
    paths = [_write(tmp_path / f"f{i}.bin", a[i : i + 10]) for i in range(3)]
    f = kvikpy.dask.from_files(paths, "float32", (10, 40), device="cuda")
    np.testing.assert_array_equal(
        cupy.asnumpy(f.compute(**SYNC)), np.stack([a[i : i + 10] for i in range(3)])
    )
    root, za, _ = zarr_root
    z = kvikpy.dask.from_zarr(root, "data", device="cuda")
    assert type(z._meta) is cupy.ndarray
    out = z.compute(**SYNC)
    assert type(out) is cupy.ndarray
    np.testing.assert_array_equal(cupy.asnumpy(out), za)


@pytest.mark.multi_gpu
# Receiving a CuPy result makes distributed import numba.cuda, which warns about NumPy's
# generic timedelta unit at import (numba-cuda with NumPy 2.5): not kvikpy's warning.
@pytest.mark.filterwarnings(
    "ignore:The 'generic' unit for NumPy timedelta is deprecated:DeprecationWarning"
)
def test_one_worker_per_gpu_with_dask_cuda(tmp_path: Path) -> None:
    cupy = pytest.importorskip("cupy")
    dask_cuda = pytest.importorskip("dask_cuda")
    a = _data((4000, 256), "float32")
    path = _write(tmp_path / "a.bin", a)
    with (
        dask_cuda.LocalCUDACluster(
            CUDA_VISIBLE_DEVICES="0,1", dashboard_address="127.0.0.1:0"
        ) as cluster,
        distributed.Client(cluster) as c,
    ):
        c.wait_for_workers(2, timeout=120)
        x = kvikpy.dask.from_raw(path, "float32", a.shape, (250, 256), device="cuda")
        x = x.persist()
        distributed.wait(x, timeout=120)
        holders = {w for ws in c.who_has(x).values() for w in ws}
        assert len(holders) == 2
        # each worker's device 0 is a different physical GPU, and holds chunks
        buses = c.run(lambda: cupy.cuda.Device(0).pci_bus_id)
        assert len(set(buses.values())) == 2
        # the chunks each worker holds are CuPy arrays, in its GPU's memory
        # (only this array's chunks: a read group's tuple may linger until released)
        name = x.name
        kinds = c.run(
            lambda dask_worker: sorted(
                {
                    type(v).__module__.split(".")[0]
                    for k, v in dask_worker.data.items()
                    if isinstance(k, tuple) and k[0] == name
                }
            )
        )
        assert all(kinds[w] == ["cupy"] for w in holders), kinds
        np.testing.assert_allclose(float(x.sum().compute()), a.sum(dtype=np.float64), rtol=1e-4)
        np.testing.assert_array_equal(cupy.asnumpy(x[1234:2345:3].compute()), a[1234:2345:3])


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
