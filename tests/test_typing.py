"""What a user's type checker sees: a small script that uses kvikpy, checked with
``mypy --strict`` (precise types, not ``Any``: ``Buffer.dtype`` is a numpy dtype,
``to_numpy()`` an ndarray, open modes a ``Literal``, buffers buffer-like objects) and then
run, so the asserted types are the ones at run time too; and mistakes mypy must catch."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

GOOD = """
from typing import Any, assert_type

import numpy as np
import numpy.typing as npt

import kvikpy
from kvikpy.cufile import OpenMode

path = "data.bin"
np.arange(64, dtype=np.float32).tofile(path)

buf = kvikpy.read(path, device="cpu", dtype="float32", shape=(-1, 8))
assert_type(buf, kvikpy.Buffer)
assert_type(buf.dtype, np.dtype[Any])
arr = buf.to_numpy()
assert_type(arr, npt.NDArray[Any])
assert_type(buf.shape, tuple[int, ...])
assert_type(buf.nbytes, int)
half = kvikpy.read(path, device="cpu", dtype=np.float16, shape=[np.int64(128)])
assert_type(half.to_numpy().sum(), Any)

with kvikpy.CuFile(path, "r+") as f:
    assert_type(f, kvikpy.CuFile)
    assert_type(f.mode, OpenMode)
    out = np.empty(64, dtype=np.float32)
    assert_type(f.read(out), int)                      # numpy: DLPack / buffer protocol
    assert_type(f.read(bytearray(16)), int)            # the buffer protocol
    assert_type(f.read(memoryview(bytearray(16))), int)
    assert_type(f.read(buf), int)                      # a kvikpy.Buffer
    fut = f.pread(out, file_offset=0)
    assert_type(fut, kvikpy.IOFuture)
    assert_type(fut.get(), int)
    assert_type(f.write(b"\\x00" * 16, file_offset=256), int)
assert_type(kvikpy.write(path, out), int)
assert_type(kvikpy.wait_all([]), list[int])

batch = kvikpy.read_many([path, path], device="cpu")
assert_type(batch[0], kvikpy.Buffer)
assert_type(batch.sizes, np.ndarray)
print("ran", arr.shape, float(arr.sum()))
"""

BAD = """
import kvikpy

f = kvikpy.CuFile("data.bin", "a")
f.read(3)
f.read("text")
kvikpy.read("data.bin", shape="12")
kvikpy.CuFile("data.bin").mode.upper(1)
"""


def mypy(tmp_path: Path, source: str) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "user.py"
    script.write_text(source)
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--python-version",
            "3.11",
            "--cache-dir",
            str(tmp_path / ".mypy_cache"),
            "--no-error-summary",
            str(script),
        ],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=600,
        check=False,
    )


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return tmp_path_factory.mktemp("typing")


def test_a_strict_user_script_gets_precise_types(workdir):
    pytest.importorskip("mypy")
    r = mypy(workdir, GOOD)
    assert r.returncode == 0, r.stdout + r.stderr
    run = subprocess.run(
        [sys.executable, "user.py"],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stderr  # the asserted types hold at run time too
    assert run.stdout.startswith("ran (8, 8)")


def test_mypy_catches_a_bad_mode_a_non_buffer_and_a_bad_shape(workdir):
    pytest.importorskip("mypy")
    r = mypy(workdir, BAD)
    flagged = {int(m) for m in re.findall(r"user\.py:(\d+): error", r.stdout)}
    # line 4: mode "a"; 5: an int as buffer; 6: a str as buffer; 7: a str as shape;
    # 8: mode is a str Literal, whose .upper takes no argument
    assert flagged == {4, 5, 6, 7, 8}, r.stdout
