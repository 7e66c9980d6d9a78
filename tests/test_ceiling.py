"""The pread ceilings the benchmarks compare against (the whole-file read and the copy wall)
read every byte once, correctly."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import o_direct_supported

from kvikpy import _lib


@pytest.mark.parametrize(("threads", "piece"), [(1, 4096), (3, 65536), (4, 1 << 20)])
def test_ceiling_reads_every_byte(tmp_path: Path, threads: int, piece: int) -> None:
    data = np.random.default_rng(threads).integers(0, 256, (3 << 20) + 5, dtype=np.uint8)
    p = tmp_path / "c.bin"
    data.tofile(p)
    seconds, nbytes, total = _lib.pread_ceiling(str(p), threads, piece)
    assert nbytes == data.size and total == int(data.sum(dtype=np.int64)) and seconds > 0
    if o_direct_supported(p):
        _, _, total_direct = _lib.pread_ceiling(str(p), threads, 1 << 20, direct=True)
        assert total_direct == total


def test_ceiling_rejects_bad_arguments(tmp_path: Path) -> None:
    p = tmp_path / "c.bin"
    p.write_bytes(b"abc")
    with pytest.raises(ValueError, match="threads"):
        _lib.pread_ceiling(str(p), 0, 4096)
    with pytest.raises(ValueError, match="multiple"):
        _lib.pread_ceiling(str(p), 1, 1000, direct=True)
    with pytest.raises(FileNotFoundError):
        _lib.pread_ceiling(str(tmp_path / "missing"), 1, 4096)


@pytest.mark.parametrize(("threads", "piece"), [(1, 4096), (3, 65536), (4, 1 << 20)])
def test_copy_wall_reads_every_piece_of_every_file(
    tmp_path: Path, threads: int, piece: int
) -> None:
    rng = np.random.default_rng(threads)
    paths, sample, size = [], 0, 0
    for k, n in enumerate([(3 << 20) + 5, 70_000, 0]):
        data = rng.integers(0, 256, n, dtype=np.uint8)
        p = tmp_path / f"w{k}.bin"
        data.tofile(p)
        paths.append(str(p))
        sample += int(data[::4096].sum(dtype=np.int64))
        size += n
    seconds, nbytes, total = _lib.copy_wall(paths, threads, piece)
    assert (nbytes, total) == (size, sample) and seconds > 0
    with pytest.raises(ValueError, match="multiple of 4096"):
        _lib.copy_wall(paths, threads, 1000)
    with pytest.raises(FileNotFoundError):
        _lib.copy_wall([*paths, str(tmp_path / "missing")], threads, piece)
