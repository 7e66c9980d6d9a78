"""Batches spread over several devices (kvikpy.spread): the balancing rule, the device
map, the SpreadBatch sequence, and errors. Host memory here; two GPUs in
tests/gpu/test_spread_gpu.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import random_file
from hypothesis import given
from hypothesis import strategies as st

import kvikpy
from kvikpy.batch import SpreadBatch
from kvikpy.spread import balance


@given(st.lists(st.integers(0, 10**9), max_size=60), st.integers(1, 8))
def test_balance_gives_consecutive_runs_of_similar_bytes(sizes: list[int], devices: int) -> None:
    where = balance(sizes, devices)
    assert len(where) == len(sizes)
    assert where == sorted(where)  # runs of consecutive elements
    assert all(0 <= k < devices for k in where)
    total = sum(sizes)
    if total:
        # No device gets more than its share plus the largest element.
        for k in range(devices):
            got = sum(s for s, w in zip(sizes, where, strict=True) if w == k)
            assert got <= total / devices + max(sizes)


def test_balance_by_count_without_sizes() -> None:
    assert balance([0] * 6, 2) == [0, 0, 0, 1, 1, 1]
    assert balance([0] * 3, 4) == [0, 1, 2]


def test_mapped_batch_on_the_host(tmp_path: Path) -> None:
    files = [random_file(tmp_path, n, seed=n, name=f"f{n}") for n in (10, 4096, 1, 70_000)]
    batch = kvikpy.read_many([p for p, _ in files], device={i: "cpu" for i in range(4)})
    assert isinstance(batch, SpreadBatch)
    assert len(batch) == 4 and batch.sizes == [10, 4096, 1, 70_000]
    assert [bytes(b) for b in batch] == [d for _, d in files]
    assert batch.device_of(-1) == "cpu" and batch.indices == {"cpu": [0, 1, 2, 3]}
    assert list(batch.parts) == ["cpu"] and batch.failures == {}
    assert "4 elements on 1 devices" in repr(batch)
    with pytest.raises(IndexError, match="out of range"):
        batch[4]


def test_ranges_on_a_device_list(tmp_path: Path) -> None:
    path, data = random_file(tmp_path, 100_000, seed=3)
    ranges = [(5, 10), (99_990, 10), (0, 0), (1000, 50_000)]
    batch = kvikpy.read_ranges(path, ranges, device=["cpu"])
    assert [bytes(b) for b in batch] == [data[o : o + n] for o, n in ranges]


def test_skipped_failures_keep_their_index(tmp_path: Path) -> None:
    good, data = random_file(tmp_path, 100, seed=1)
    batch = kvikpy.read_many(
        [good, tmp_path / "missing", good], device={0: "cpu", 1: "cpu", 2: "cpu"}, errors="skip"
    )
    assert list(batch.failures) == [1]
    assert isinstance(batch.failures[1], FileNotFoundError)
    assert bytes(batch[2]) == data
    with pytest.raises(FileNotFoundError):
        batch[1]


def test_bad_spreads(tmp_path: Path) -> None:
    path, _ = random_file(tmp_path, 100)
    with pytest.raises(ValueError, match="elements \\[1\\] have none"):
        kvikpy.read_many([path, path], device={0: "cpu"})
    with pytest.raises(ValueError, match="keys \\[5\\] are not element indices"):
        kvikpy.read_many([path], device={0: "cpu", 5: "cpu"})
    with pytest.raises(ValueError, match="names a device twice"):
        kvikpy.read_many([path], device=["cpu", "cpu"])
    with pytest.raises(ValueError, match="lists no devices"):
        kvikpy.read_ranges(path, [(0, 1)], device=[])
    with pytest.raises(ValueError, match="stream= belongs to one GPU"):
        kvikpy.read_many([path], device=["cpu"], stream=0)
    with pytest.raises(FileNotFoundError):
        kvikpy.read_many([tmp_path / "nope"], device=["cpu"])


def test_chunks_over_a_device_list(tmp_path: Path) -> None:
    path, data = random_file(tmp_path, 100_003, seed=5)
    with kvikpy.iter_chunks(path, 10_000, device=["cpu"], depth=1) as it:
        assert b"".join(bytes(c) for c in it) == data
    with pytest.raises(ValueError, match="names a device twice"):
        kvikpy.iter_chunks(path, 10, device=["cpu", "cpu"])
    with pytest.raises(ValueError, match="lists no devices"):
        kvikpy.iter_chunks(path, 10, device=[])
