"""Device reads and writes under the staging knob read from the environment
(``KVIKPY_READ_CHUNK_SIZE``: smaller read pieces over two pinned buffers): exactly the
file's bytes reach the GPU and the tensor's bytes the file, at aligned and unaligned
offsets, with one thread and with many. Each case in a fresh process (the knob is read
once)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import run_python

pytest.importorskip("torch")
pytestmark = pytest.mark.gpu

ROUND_TRIP = r"""
import sys
import numpy as np
import torch
import kvikpy
path, offset, n, threads = sys.argv[1], *map(int, sys.argv[2:5])
data = np.random.default_rng(n + offset).integers(0, 256, offset + n, dtype=np.uint8)
data.tofile(path)
with kvikpy.defaults.set({"num_threads": threads}):
    into = torch.zeros(n, dtype=torch.uint8, device="cuda")
    with kvikpy.CuFile(path, "r") as f:
        assert f.read(into, file_offset=offset) == n
        assert f.pread(into[1:], n - 1, offset + 1).get() == n - 1
    torch.cuda.synchronize()
    assert np.array_equal(into.cpu().numpy(), data[offset:]), "read"
    back = (into.flip(0) ^ 0x5A).contiguous()
    with kvikpy.CuFile(path, "r+") as f:
        assert f.write(back, file_offset=offset) == n
got = np.fromfile(path, dtype=np.uint8)
assert np.array_equal(got[:offset], data[:offset]), "before the write"
assert np.array_equal(got[offset:], back.cpu().numpy()), "written"
print("ok")
"""

KNOBS = [
    {"KVIKPY_READ_CHUNK_SIZE": str(1 << 20)},
    {"KVIKPY_READ_CHUNK_SIZE": "65537"},
    {"KVIKPY_READ_CHUNK_SIZE": str(2 << 20)},
]


@pytest.mark.parametrize("knobs", KNOBS, ids=lambda k: ",".join(f"{a}={b}" for a, b in k.items()))
@pytest.mark.parametrize(("offset", "threads"), [(0, 16), (4097, 16), (12_345, 1)])
def test_reads_and_writes_under_the_staging_knobs_move_every_byte(
    tmp_path: Path, knobs: dict[str, str], offset: int, threads: int
) -> None:
    n = (70 << 20) + 4097
    args = (str(tmp_path / "f.bin"), str(offset), str(n), str(threads))
    done = run_python(ROUND_TRIP, *args, env=knobs, timeout=240)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"
