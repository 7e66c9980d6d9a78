"""Device writes with many threads (a whole task per chunk by default) and with the write
tuning knobs (``KVIKPY_WRITE_CHUNK_SIZE``, ``KVIKPY_WRITE_PREALLOCATE``): exactly the
tensor's bytes reach the file, at aligned and unaligned offsets, with tasks larger than
a bounce buffer, and through O_DIRECT or the page cache. Each case in a fresh process
(the knobs are read from the environment once)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import run_python

pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

WRITE = r"""
import sys
import numpy as np
import torch
import kvikpy
path, offset, n, task, threads = sys.argv[1], *map(int, sys.argv[2:6])
data = np.random.default_rng(n + offset).integers(0, 256, n, dtype=np.uint8)
t = torch.from_numpy(data).cuda()
with kvikpy.defaults.set({"num_threads": threads, "task_size": task}):
    with kvikpy.CuFile(path, "w") as f:
        assert f.write(t, file_offset=offset) == n
    with kvikpy.CuFile(path, "r+") as f:  # the same again, asynchronously
        assert f.pwrite(t, file_offset=offset).get() == n
got = np.fromfile(path, dtype=np.uint8)
assert got.size == offset + n, (got.size, offset + n)
assert not got[:offset].any()
assert np.array_equal(got[offset:], data)
print("ok")
"""

KNOBS = [
    {},
    {"KVIKPY_WRITE_CHUNK_SIZE": str(4 << 20)},
    {"KVIKPY_WRITE_CHUNK_SIZE": "65537"},
    {"KVIKPY_WRITE_PREALLOCATE": "1"},
    {"KVIKIO_AUTO_DIRECT_IO_WRITE": "0"},
]


@pytest.mark.parametrize(
    "knobs", KNOBS, ids=lambda k: ",".join(f"{a}={b}" for a, b in k.items()) or "defaults"
)
@pytest.mark.parametrize(
    ("offset", "task", "threads"),
    [(0, 16 << 20, 16), (4097, 16 << 20, 16), (0, 40 << 20, 16), (12_345, 4 << 20, 1)],
)
def test_device_writes_reach_the_file_exactly(
    tmp_path: Path, knobs: dict[str, str], offset: int, task: int, threads: int
) -> None:
    n = (70 << 20) + 4097
    args = (str(tmp_path / "out.bin"), str(offset), str(n), str(task), str(threads))
    done = run_python(WRITE, *args, env=knobs, timeout=240)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
