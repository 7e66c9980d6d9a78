"""Device reads by residency (``auto_direct_io_read="auto"``, the default): cold, warm and
half-warm files read into GPU memory give the file's bytes, the uncached parts with
O_DIRECT into the pinned bounce buffers, the cached ones from the page cache (by DMA
from the cached pages with one thread)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import PAGE, o_direct_supported, random_file

import kvikpy
from kvikpy import _lib

cupy = pytest.importorskip("cupy")

MiB = 1 << 20
FILE_LEN = 24 * MiB + 1234
WHOLE_BLOCKS = FILE_LEN // PAGE * PAGE
HALF = FILE_LEN // 2 // PAGE * PAGE


def cached_pages(path: Path) -> int:
    return kvikpy.get_page_cache_info(str(path))[0]


def make(path: Path, state: str) -> None:
    kvikpy.drop_file_page_cache(str(path))
    if state in ("warm", "half"):
        path.read_bytes()
    if state == "half":
        kvikpy.drop_file_page_cache(str(path), HALF)
    expected = {"cold": 0, "warm": -(-FILE_LEN // PAGE), "half": HALF // PAGE}[state]
    assert cached_pages(path) == expected


@pytest.mark.parametrize("threads", [1, 4, 16])
@pytest.mark.parametrize("state", ["cold", "warm", "half"])
@pytest.mark.parametrize("mode", ["auto", True, False])
def test_device_reads_by_residency(tmp_path: Path, mode: object, state: str, threads: int) -> None:
    path, data = random_file(tmp_path, FILE_LEN, seed=threads)
    if not o_direct_supported(path):
        pytest.skip("no O_DIRECT on the temporary directory's file system")
    kvikpy.drop_file_page_cache(str(path))
    if cached_pages(path) != 0:
        pytest.skip("this file system keeps its pages after POSIX_FADV_DONTNEED")
    make(path, state)
    out = cupy.full(FILE_LEN + 3, 0xAB, dtype=cupy.uint8)
    direct_before, _ = _lib.read_path_counters()
    dma_before = _lib.page_cache_dma_bytes()
    settings = {"auto_direct_io_read": mode, "num_threads": threads, "task_size": 4 * MiB}
    with kvikpy.defaults.set(settings), kvikpy.CuFile(path) as f:
        assert f.read(out[1 : FILE_LEN + 1]) == FILE_LEN
    direct = _lib.read_path_counters()[0] - direct_before
    dma = _lib.page_cache_dma_bytes() - dma_before
    got = cupy.asnumpy(out)
    assert got[1 : FILE_LEN + 1].tobytes() == data
    assert got[0] == got[-1] == 0xAB
    assert np.all(got[FILE_LEN + 1 :] == 0xAB)
    if mode is False:
        assert direct == 0
    elif mode is True:
        # Every task's aligned middle (the edges of each bounce chunk excepted).
        assert direct >= WHOLE_BLOCKS - 8 * MiB or dma > 0
    elif state == "warm":
        assert direct == 0
    elif state == "cold":
        # All but the unaligned edges of chunks, by O_DIRECT.
        assert direct >= WHOLE_BLOCKS - 2 * MiB, direct
        assert cached_pages(path) < (FILE_LEN // PAGE) // 8
    else:
        # Never a warm page by O_DIRECT; most of the cold half by it. Not all: with the
        # tasks side by side, pages of the cold half can be in the cache by the time their
        # granules are probed (the kernel reads ahead from reads beside them), and those
        # are read from the cache. With 16 threads on a 64-core host, as little as 7.8 of
        # the 12 MiB went by O_DIRECT.
        assert (WHOLE_BLOCKS - HALF) // 2 <= direct <= WHOLE_BLOCKS - HALF, direct
