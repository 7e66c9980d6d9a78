"""Device reads straight from the page cache (``page_cache_dma``): which reads take that
path, that they return the right bytes at every offset, and that they fall back to the
bounce buffers when the pages are not resident or the setting is off."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from conftest import random_file, task_lengths

import kvikpy
from kvikpy import _lib

torch = pytest.importorskip("torch")

MiB = 1 << 20


@pytest.mark.parametrize("offset", [0, 1, 4095, 4096 + 7, (3 * MiB) + 1])
@pytest.mark.parametrize("threads", [1, 4, 16])
def test_resident_reads_dma_from_the_page_cache(tmp_path: Path, offset: int, threads: int):
    n = 12 * MiB + 123
    p, data = random_file(tmp_path, n, seed=offset + threads)
    size = 8 * MiB + 5
    for enabled in (True, False):
        t = torch.full((size + 2,), 0xAB, dtype=torch.uint8, device="cuda")
        before = _lib.page_cache_dma_bytes()
        with (
            kvikpy.defaults.set(
                {"num_threads": threads, "task_size": 2 * MiB, "page_cache_dma": enabled}
            ),
            kvikpy.CuFile(p) as f,
        ):
            # Into an odd device address too: t[1:] starts one byte in.
            assert f.read(t[1 : size + 1], file_offset=offset) == size
        moved = _lib.page_cache_dma_bytes() - before
        got = t.cpu().numpy().tobytes()
        assert got[1 : size + 1] == data[offset : offset + size]
        assert got[0] == got[-1] == 0xAB  # nothing written outside the range
        # Tasks under 1 MiB (an unaligned edge) are not worth mapping.
        mapped = sum(n for n in task_lengths(offset, size, 2 * MiB) if n >= MiB)
        # Only a one-thread pool maps (pinning does not scale with threads).
        assert moved == (mapped if enabled and threads == 1 else 0)
        assert mapped >= size - 2 * MiB


def test_read_across_the_end_of_the_file_is_short(tmp_path: Path):
    n = 6 * MiB + 777
    p, data = random_file(tmp_path, n, seed=1)
    start = n - (2 * MiB + 5)
    t = torch.full((4 * MiB,), 0xAB, dtype=torch.uint8, device="cuda")
    before = _lib.page_cache_dma_bytes()
    with kvikpy.defaults.set(num_threads=1), kvikpy.CuFile(p) as f:
        assert f.read(t, file_offset=start) == 2 * MiB + 5
    assert _lib.page_cache_dma_bytes() - before == 2 * MiB + 5
    got = t.cpu().numpy()
    assert got[: 2 * MiB + 5].tobytes() == data[start:]
    assert (got[2 * MiB + 5 :] == 0xAB).all()


def test_small_reads_use_the_bounce_buffers(tmp_path: Path):
    p, data = random_file(tmp_path, 3 * MiB, seed=2)
    t = torch.empty(MiB - 1, dtype=torch.uint8, device="cuda")
    before = _lib.page_cache_dma_bytes()
    with kvikpy.defaults.set(num_threads=1), kvikpy.CuFile(p) as f:
        assert f.read(t, file_offset=5) == MiB - 1
    assert _lib.page_cache_dma_bytes() == before
    assert t.cpu().numpy().tobytes() == data[5 : MiB + 4]


def test_files_not_in_the_page_cache_fall_back(tmp_path: Path):
    n = 32 * MiB
    p, data = random_file(tmp_path, n, seed=3)
    fd = os.open(p, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    t = torch.empty(n, dtype=torch.uint8, device="cuda")
    before = _lib.page_cache_dma_bytes()
    with kvikpy.defaults.set({"num_threads": 1, "task_size": 4 * MiB}), kvikpy.CuFile(p) as f:
        assert f.read(t) == n
    moved = _lib.page_cache_dma_bytes() - before
    assert t.cpu().numpy().tobytes() == data
    if moved == n:
        pytest.skip("this file system kept the pages despite POSIX_FADV_DONTNEED")
    # The first task found its pages missing and read through the bounce buffers.
    assert moved <= n - 4 * MiB


def test_pool_reads_and_futures_take_the_path(tmp_path: Path):
    n = 40 * MiB + 4097
    p, data = random_file(tmp_path, n, seed=4)
    t = torch.empty(n, dtype=torch.uint8, device="cuda")
    before = _lib.page_cache_dma_bytes()
    with kvikpy.defaults.set({"num_threads": 1, "task_size": 16 * MiB}), kvikpy.CuFile(p) as f:
        assert f.pread(t).get() == n
    assert min(task_lengths(0, n, 16 * MiB)) >= MiB  # every task is worth mapping
    assert _lib.page_cache_dma_bytes() - before == n
    assert t.cpu().numpy().tobytes() == data
