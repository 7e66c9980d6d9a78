"""Batch reads into host memory (runs without a GPU): read_many and read_ranges against
os.pread, error handling in both modes, Arrow large_binary export, lifetimes."""

from __future__ import annotations

import gc
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kvikpy
from kvikpy import _lib

pa = pytest.importorskip("pyarrow")
nd = pytest.importorskip("nanoarrow.device")


def make_files(folder: Path, sizes: list[int], seed: int = 0) -> tuple[list[Path], list[bytes]]:
    rng = np.random.default_rng(seed)
    paths, blobs = [], []
    for i, n in enumerate(sizes):
        data = rng.integers(1, 256, n, dtype=np.uint8).tobytes()
        p = folder / f"f{i:05d}.bin"
        p.write_bytes(data)
        paths.append(p)
        blobs.append(data)
    return paths, blobs


def element_bytes(batch: kvikpy.Batch, i: int) -> bytes:
    return np.from_dlpack(batch[i]).tobytes()


@pytest.mark.parametrize("count", [0, 1, 7])
def test_read_many_matches_the_files(tmp_path, count):
    sizes = [(i * 7919) % 20000 for i in range(count)]
    paths, blobs = make_files(tmp_path, sizes, seed=count)
    batch = kvikpy.read_many(paths, device="cpu")
    assert len(batch) == count
    assert batch.offsets.tolist() == [0, *np.cumsum(sizes).tolist()]
    assert batch.sizes.tolist() == sizes
    for i, data in enumerate(blobs):
        assert element_bytes(batch, i) == data
    assert [np.from_dlpack(b).tobytes() for b in batch] == blobs
    assert batch.buffer.nbytes == sum(sizes)


def test_ten_thousand_small_files_and_empty_ones(tmp_path):
    sizes = [0 if i % 97 == 0 else 1 + i % 700 for i in range(10_000)]
    paths, blobs = make_files(tmp_path, sizes, seed=1)
    batch = kvikpy.read_many(paths, device="cpu")
    assert len(batch) == 10_000
    flat = np.from_dlpack(batch.buffer).tobytes()
    assert flat == b"".join(blobs)
    assert element_bytes(batch, 0) == b"" and element_bytes(batch, 9_999) == blobs[-1]
    # One bad path among the 10,000 raises with that path and leaves nothing allocated.
    assert_missing_file_raises_and_frees(paths, 7321, tmp_path / "not-there.bin")


def test_large_files_are_split_over_threads(tmp_path):
    sizes = [5 << 20, 3, (2 << 20) + 17]
    paths, blobs = make_files(tmp_path, sizes, seed=2)
    with kvikpy.defaults.set({"num_threads": 4, "bounce_buffer_size": 1 << 20}):
        batch = kvikpy.read_many(paths, device="cpu")
    assert [element_bytes(batch, i) for i in range(3)] == blobs


def assert_missing_file_raises_and_frees(paths, at, missing):
    """read_many of ``paths`` with ``missing`` inserted at index ``at`` raises
    FileNotFoundError naming it, and leaves no buffer alive."""
    gc.collect()  # a failure's traceback keeps frames (and their buffers) until collected
    gc.collect()  # buffers of earlier tests still in cycles go first
    base = _lib.live_buffers()
    with pytest.raises(FileNotFoundError) as info:
        kvikpy.read_many([*paths[:at], missing, *paths[at:]], device="cpu")
    assert info.value.filename == str(missing)
    gc.collect()
    assert _lib.live_buffers() == base


def test_a_missing_file_raises_naming_it_and_frees_everything(tmp_path):
    paths, _ = make_files(tmp_path, [100] * 5)
    assert_missing_file_raises_and_frees(paths, 2, tmp_path / "missing.bin")


def test_a_directory_raises_is_a_directory(tmp_path):
    paths, _ = make_files(tmp_path, [10])
    with pytest.raises(IsADirectoryError) as info:
        kvikpy.read_many([paths[0], tmp_path], device="cpu")
    assert info.value.filename == str(tmp_path)


def test_skip_mode_lists_failures_and_keeps_indices(tmp_path):
    paths, blobs = make_files(tmp_path, [10, 20, 30])
    names = [paths[0], tmp_path / "gone", paths[1], tmp_path, paths[2]]
    batch = kvikpy.read_many(names, device="cpu", errors="skip")
    assert len(batch) == 5
    assert sorted(batch.failures) == [1, 3]
    assert isinstance(batch.failures[1], FileNotFoundError)
    assert isinstance(batch.failures[3], IsADirectoryError)
    assert batch.sizes.tolist() == [10, 0, 20, 0, 30]
    assert [element_bytes(batch, i) for i in (0, 2, 4)] == blobs
    with pytest.raises(FileNotFoundError):
        batch[1]
    arr = pa.array(batch)
    assert arr.null_count == 2
    assert arr.to_pylist() == [blobs[0], None, blobs[1], None, blobs[2]]
    assert "2 failed" in repr(batch)


def test_bad_arguments(tmp_path):
    paths, _ = make_files(tmp_path, [10])
    with pytest.raises(ValueError, match="errors must be"):
        kvikpy.read_many(paths, device="cpu", errors="ignore")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="device"):
        kvikpy.read_many(paths, device="tpu")
    batch = kvikpy.read_many(paths, device="cpu")
    with pytest.raises(IndexError):
        batch[1]
    assert element_bytes(batch, -1) == paths[0].read_bytes()


def test_read_ranges_overlapping_and_out_of_order(tmp_path):
    (path,), (data,) = make_files(tmp_path, [1 << 20])
    ranges = [(5000, 100), (0, 10), (4990, 200), (0, 0), ((1 << 20) - 1, 1), (17, 65536)]
    batch = kvikpy.read_ranges(path, ranges, device="cpu")
    assert len(batch) == len(ranges)
    for i, (offset, size) in enumerate(ranges):
        assert element_bytes(batch, i) == data[offset : offset + size]
    arrays = (np.array([r[0] for r in ranges]), np.array([r[1] for r in ranges]))
    again = kvikpy.read_ranges(path, arrays, device="cpu")
    assert np.from_dlpack(again.buffer).tobytes() == np.from_dlpack(batch.buffer).tobytes()


def test_a_range_past_the_end_raises_value_error_naming_it(tmp_path):
    (path,), _ = make_files(tmp_path, [1000])
    with pytest.raises(ValueError, match=r"range 1 \(offset 990, size 11\)"):
        kvikpy.read_ranges(path, [(0, 10), (990, 11)], device="cpu")
    with pytest.raises(ValueError, match="negative"):
        kvikpy.read_ranges(path, [(-1, 10)], device="cpu")
    with pytest.raises(TypeError, match="range 0"):
        kvikpy.read_ranges(path, [(1, 2, 3)], device="cpu")
    with pytest.raises(ValueError, match="differ in length"):
        kvikpy.read_ranges(path, (np.array([1, 2]), np.array([3])), device="cpu")
    with pytest.raises(FileNotFoundError):
        kvikpy.read_ranges(tmp_path / "nope", [(0, 1)], device="cpu")
    assert len(kvikpy.read_ranges(path, [], device="cpu")) == 0


@settings(max_examples=40, deadline=None)
@given(
    file_size=st.integers(0, 300_000),
    picks=st.lists(st.tuples(st.floats(0, 1), st.floats(0, 1)), max_size=30),
    threads=st.integers(1, 6),
)
def test_ranges_match_os_pread(tmp_path_factory, file_size, picks, threads):
    folder = tmp_path_factory.mktemp("ranges")
    (path,), _ = make_files(folder, [file_size], seed=file_size)
    ranges = []
    for a, b in picks:
        offset = int(a * file_size)
        ranges.append((offset, int(b * (file_size - offset))))
    with kvikpy.defaults.set({"num_threads": threads, "bounce_buffer_size": 64 << 10}):
        batch = kvikpy.read_ranges(path, ranges, device="cpu")
    fd = os.open(path, os.O_RDONLY)
    try:
        for i, (offset, size) in enumerate(ranges):
            assert element_bytes(batch, i) == os.pread(fd, size, offset)
    finally:
        os.close(fd)


def test_arrow_large_binary_export(tmp_path):
    paths, blobs = make_files(tmp_path, [3, 0, 4096, 17])
    batch = kvikpy.read_many(paths, device="cpu")
    arr = pa.array(batch)
    assert arr.type == pa.large_binary()
    assert arr.to_pylist() == blobs
    assert arr.buffers()[2].address == batch.buffer.ptr  # the data is not copied
    dev = nd.c_device_array(batch)
    assert dev.device_type == nd.DeviceType.CPU
    assert dev.array.length == 4 and dev.array.n_buffers == 3
    assert pa.DataType._import_from_c_capsule(batch.__arrow_c_schema__()) == pa.large_binary()


def test_element_views_keep_the_batch_alive(tmp_path):
    paths, blobs = make_files(tmp_path, [100, 200])
    gc.collect()  # buffers of earlier tests still in cycles go first
    base = _lib.live_buffers()
    batch = kvikpy.read_many(paths, device="cpu")
    view = batch[1]
    arr = pa.array(batch)
    del batch
    gc.collect()
    assert np.from_dlpack(view).tobytes() == blobs[1]
    assert arr.to_pylist() == blobs
    del view, arr
    gc.collect()
    assert _lib.live_buffers() == base


@pytest.mark.parametrize("order", [(0, 1, 2), (2, 1, 0), (1, 0, 2), (1, 2, 0)])
def test_batch_arrow_releases_run_once_in_any_order(tmp_path, order):
    paths, _ = make_files(tmp_path, [10, 20])
    gc.collect()  # buffers of earlier tests still in cycles go first
    base = _lib.live_buffers()
    batch = kvikpy.read_many([paths[0], tmp_path / "gone", paths[1]], device="cpu", errors="skip")
    held = [batch, batch.__arrow_c_array__()[1], batch.__arrow_c_device_array__()[1]]
    del batch
    for i in order:
        held[i] = None
        gc.collect()
    assert _lib.live_buffers() == base


def test_stream_is_checked_even_though_the_read_completes_first(tmp_path):
    paths, _ = make_files(tmp_path, [10])
    with pytest.raises(ValueError, match="stream="):
        kvikpy.read_many(paths, device="cpu", stream=0)
