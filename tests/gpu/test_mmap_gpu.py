"""kvikpy.Mmap into GPU memory (torch and CuPy): bytes verified against the file, through
the bounce ring and, for resident pages with one thread, by DMA straight from the
mapping; nothing written outside the destination; kvikio's errors on device buffers."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import random_file

import kvikpy

torch = pytest.importorskip("torch")

MiB = 1 << 20


@pytest.mark.parametrize("n", [1, 4095, 65_536 + 3, (4 << 20) + 17, (24 << 20) + 4097])
@pytest.mark.parametrize("parallel", [False, True])
@pytest.mark.parametrize("threads", [1, 8])
def test_read_into_torch(tmp_path: Path, n: int, parallel: bool, threads: int) -> None:
    path, data = random_file(tmp_path, n, seed=n % 251)
    t = torch.full((n + 2,), 0xAB, dtype=torch.uint8, device="cuda")
    # torch's __cuda_array_interface__ (version 2) names no stream: the fill must be done
    # before kvikpy's copies, which run on streams of their own.
    torch.cuda.synchronize()
    with (
        kvikpy.defaults.set({"num_threads": threads, "task_size": MiB}),
        kvikpy.Mmap(path) as m,
    ):
        # Into an odd device address: t[1:] starts one byte in.
        got = m.pread(t[1 : n + 1]).get() if parallel else m.read(t[1 : n + 1])
    assert got == n
    out = t.cpu().numpy()
    assert out[1 : n + 1].tobytes() == data
    assert out[0] == out[-1] == 0xAB


@pytest.mark.parametrize("task_size", [1024, 12345, 4 * MiB])
def test_region_reads_into_cupy(tmp_path: Path, task_size: int) -> None:
    cupy = pytest.importorskip("cupy")
    n = 8 * MiB + 11
    path, data = random_file(tmp_path, n, seed=3)
    start, size = 3 * MiB + 7, 2 * MiB + 5
    a = cupy.zeros(size, dtype=cupy.uint8)
    with kvikpy.Mmap(path, "r", size + 100, start) as m:
        assert m.pread(a, size, start, task_size).get() == size
        assert cupy.asnumpy(a).tobytes() == data[start : start + size]
        b = cupy.zeros(100, dtype=cupy.uint8)
        assert m.read(b, 100, start + size) == 100
        assert cupy.asnumpy(b).tobytes() == data[start + size : start + size + 100]
        with pytest.raises(IndexError, match="Read is out of bound"):
            m.read(b, 101, start + size)
        with pytest.raises(ValueError, match="buffer has 100 bytes"):
            m.read(b, 101, start)


def test_closed_and_empty(tmp_path: Path) -> None:
    path, _ = random_file(tmp_path, 4096)
    t = torch.zeros(4096, dtype=torch.uint8, device="cuda")
    m = kvikpy.Mmap(path)
    m.close()
    with pytest.raises(RuntimeError, match="Cannot read from a closed MmapHandle"):
        m.read(t)
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    with kvikpy.Mmap(empty) as e:
        assert e.read(t) == 0
    assert not t.any().item()


def test_many_ranges_match_numpy(tmp_path: Path) -> None:
    n = 6 * MiB
    path, data = random_file(tmp_path, n, seed=9)
    expected = np.frombuffer(data, dtype=np.uint8)
    rng = np.random.default_rng(1)
    t = torch.empty(n, dtype=torch.uint8, device="cuda")
    with kvikpy.defaults.set(num_threads=8), kvikpy.Mmap(path) as m:
        futures = []
        starts, lengths = rng.integers(0, n, 64), rng.integers(1, 256 << 10, 64)
        for offset, size in zip(starts, lengths, strict=True):
            offset, size = int(offset), int(min(size, n - offset))
            futures.append((offset, size, m.pread(t[offset : offset + size], size, offset)))
        for _, size, fut in futures:
            assert fut.get() == size
        got = t.cpu().numpy()
    for offset, size, _ in futures:
        assert (got[offset : offset + size] == expected[offset : offset + size]).all()
