"""The file-per-call loop (open a small file, read it whole, close) and small blocking
reads: right bytes, no descriptor left behind, and no system call beyond the open, one
``fstat``, the read and the close (no ``futex`` wake-ups of threads that are not waiting)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import kvikpy


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc")
def test_a_loop_over_small_files_reads_each_and_leaves_no_descriptor(tmp_path: Path) -> None:
    count, size = 300, 4096
    rng = np.random.default_rng(3)
    data = rng.integers(0, 256, size=(count, size), dtype=np.uint8)
    paths = []
    for i in range(count):
        p = tmp_path / f"{i:04d}.bin"
        p.write_bytes(data[i].tobytes())
        paths.append(str(p))
    out = np.zeros((count, size), dtype=np.uint8)
    before = _open_fds()
    for i, p in enumerate(paths):
        with kvikpy.CuFile(p, "r") as f:
            assert f.read(out[i]) == size
    assert _open_fds() == before
    np.testing.assert_array_equal(out, data)


def test_a_local_path_with_a_url_separator_inside_is_a_local_file(tmp_path: Path) -> None:
    folder = tmp_path / "x:"
    folder.mkdir()
    (folder / "f.bin").write_bytes(b"local bytes")
    name = str(folder) + "//f.bin"  # ".../x://f.bin": "://" inside, not a scheme
    buf = bytearray(11)
    with kvikpy.CuFile(name, "r") as f:
        assert f.read(buf) == 11
        assert f.path == str(folder / "f.bin")  # a local path, "//" collapsed
    assert bytes(buf) == b"local bytes"


def test_futures_waited_from_other_threads_all_finish(tmp_path: Path) -> None:
    p = tmp_path / "f.bin"
    p.write_bytes(os.urandom(1 << 20))
    with kvikpy.CuFile(p, "r") as f:
        for _ in range(50):
            buf = bytearray(1 << 20)
            future = f.pread(buf, task_size=64 << 10)
            results: list[int] = []

            def wait(fut: kvikpy.IOFuture = future, into: list[int] = results) -> None:
                into.append(fut.get())

            waiters = [threading.Thread(target=wait) for _ in range(3)]
            for w in waiters:
                w.start()
            for w in waiters:
                w.join(timeout=30)
                assert not w.is_alive(), "a waiter was never woken"
            assert results == [1 << 20] * 3
            assert bytes(buf) == p.read_bytes()


_STRACED = """
import sys
import numpy as np
import kvikpy
paths, buf = sys.argv[1:], np.zeros(4096, dtype=np.uint8)
for p in paths:  # warm-up: the pool, the settings, every lazy initialisation
    with kvikpy.CuFile(p, "r") as f:
        f.read(buf)
sys.stdout.write("MARK\\n")
sys.stdout.flush()
for p in paths:
    with kvikpy.CuFile(p, "r") as f:
        f.read(buf)
sys.stdout.write("DONE\\n")
sys.stdout.flush()
"""


@pytest.mark.skipif(shutil.which("strace") is None, reason="needs strace")
def test_a_small_read_makes_no_futex_call_and_an_open_one_fstat(tmp_path: Path) -> None:
    count = 200
    paths = []
    for i in range(count):
        p = tmp_path / f"{i:04d}.bin"
        p.write_bytes(os.urandom(4096))
        paths.append(str(p))
    trace = tmp_path / "trace.txt"
    run = subprocess.run(
        [
            "strace",
            "-f",
            "-e",
            "trace=futex,fstat,newfstatat,statx,write",
            "-o",
            str(trace),
            sys.executable,
            "-c",
            _STRACED,
            *paths,
        ],
        capture_output=True,
        text=True,
        timeout=240,
    )
    if run.returncode != 0 and "ptrace" in run.stderr.lower():
        pytest.skip(f"strace cannot trace here: {run.stderr.strip()[:200]}")
    assert run.returncode == 0, run.stderr
    lines = trace.read_text().splitlines()
    marks = [i for i, line in enumerate(lines) if "MARK" in line or "DONE" in line]
    assert len(marks) == 2, lines[-20:]
    timed = lines[marks[0] + 1 : marks[1]]
    futexes = [line for line in timed if "futex(" in line]
    stats = [line for line in timed if "stat" in line.split("(")[0]]
    # Before: two futex wake-ups per read (the future's waiters, the in-flight count),
    # though no thread waited on either.
    assert len(futexes) < count // 10, futexes[:10]
    assert len(stats) <= count, stats[:10]
