"""The write tuning knobs, environment only (``KVIKPY_WRITE_CHUNK_SIZE``,
``KVIKPY_WRITE_PREALLOCATE``): a malformed value is an error naming the variable; with
them set, writes of several tasks still write exactly their bytes, wherever they start,
and preallocation extends a file only to the write's end. Host memory here; GPU memory in
tests/gpu/test_write_knobs_gpu.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import run_python

WRITE = r"""
import os, sys
import numpy as np
import kvikpy
path, offset, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
before = bytes(range(256)) * 64  # 16 KiB already in the file
with open(path, "wb") as fh:
    fh.write(before)
data = np.random.default_rng(n + offset).integers(0, 256, n, dtype=np.uint8)
with kvikpy.defaults.set({"num_threads": 8, "task_size": 1 << 20}):
    with kvikpy.CuFile(path, "r+") as f:
        assert f.write(data, file_offset=offset) == n
want = bytearray(before)
want[len(want):] = bytes(max(0, offset - len(want)))
want[offset : offset + n] = data.tobytes()
got = open(path, "rb").read()
assert len(got) == max(len(before), offset + n), (len(got), offset + n)
assert got == bytes(want)
print("ok")
"""


@pytest.mark.parametrize("offset", [0, 1, 4096, 12_345, 40_000])
@pytest.mark.parametrize(
    "knobs",
    [
        {},
        {"KVIKPY_WRITE_PREALLOCATE": "0"},
        {"KVIKPY_WRITE_PREALLOCATE": "1", "KVIKIO_AUTO_DIRECT_IO_WRITE": "0"},
        {"KVIKPY_WRITE_CHUNK_SIZE": "65537"},
    ],
)
def test_writes_of_several_tasks_write_exactly_their_bytes(
    tmp_path: Path, offset: int, knobs: dict[str, str]
) -> None:
    path = str(tmp_path / "out.bin")
    done = run_python(WRITE, path, str(offset), str((5 << 20) + 4097), env=knobs)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ok"


@pytest.mark.parametrize(
    ("var", "value"),
    [("KVIKPY_WRITE_CHUNK_SIZE", "4 MiB"), ("KVIKPY_WRITE_PREALLOCATE", "maybe")],
)
def test_a_malformed_knob_names_the_variable(var: str, value: str) -> None:
    done = run_python("import kvikpy; kvikpy.defaults.get('task_size')", env={var: value})
    assert done.returncode != 0
    assert var in done.stderr and value in done.stderr
