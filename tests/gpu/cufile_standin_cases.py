"""The cuFile source through kvikpy's stand-in libcufile (a test library that implements
cuFile's C API with pread/pwrite and CUDA copies; not NVIDIA's libcufile, and no GPUDirect
Storage). Run by tests/gpu/test_cufile_gpu.py in a subprocess with
``KVIKPY_CUFILE_LIBRARY`` naming the stand-in; not collected by the main suite (the name
does not start with ``test_``)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import random_bytes
from hypothesis import given, settings
from hypothesis import strategies as st

import kvikpy
from kvikpy import CompatMode, _lib

pytestmark = [pytest.mark.gpu, pytest.mark.cufile]
cupy = pytest.importorskip("cupy")
torch = pytest.importorskip("torch")

SIZE = (3 << 20) + 4321
DATA = random_bytes(SIZE, seed=1313)
UDEV = os.access("/run/udev", os.R_OK | os.X_OK)


@pytest.fixture(autouse=True, scope="module")
def _standin_only():
    if not os.environ.get("KVIKPY_CUFILE_LIBRARY"):
        pytest.skip("run through test_cufile_gpu.py, which names the stand-in")
    assert _lib.cufile_status()["standin"], "KVIKPY_CUFILE_LIBRARY did not load the stand-in"


@pytest.fixture(scope="module")
def data_path(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("standin") / "data.bin"
    path.write_bytes(DATA)
    return path


@pytest.fixture(autouse=True)
def _cufile_mode():
    with kvikpy.defaults.set({"compat_mode": CompatMode.OFF, "gds_threshold": 4096}):
        yield


def test_the_standin_is_reported_everywhere(data_path):
    gds = kvikpy.info()["gds"]
    assert gds["standin"] and gds["library"].endswith(".so")
    with kvikpy.CuFile(data_path) as f:
        name, why = f.backend
    assert name == "cufile" and why == (
        "compat_mode is OFF and the file is registered with cuFile (the test stand-in library)"
    )
    r = subprocess.run([sys.executable, "-m", "kvikpy", "info"], capture_output=True, text=True)
    assert "kvikpy's test stand-in, not NVIDIA's libcufile" in r.stdout


def test_auto_picks_cufile_where_the_system_allows(data_path):
    with kvikpy.defaults.set("compat_mode", CompatMode.AUTO), kvikpy.CuFile(data_path) as f:
        name, why = f.backend
    if UDEV:
        assert name == "cufile", why
    else:
        assert name == "posix" and "/run/udev is not readable" in why
    with kvikpy.defaults.set("compat_mode", CompatMode.ON), kvikpy.CuFile(data_path) as f:
        assert f.backend == ("posix", "compat_mode is ON")


@settings(max_examples=40, deadline=None)
@given(
    offset=st.integers(0, SIZE - 1),
    size=st.integers(1, 1 << 20),
    threshold=st.sampled_from([4096, 1 << 20, 16 << 20]),
    task=st.sampled_from([4096 * 3 + 5, 1 << 18, 4 << 20]),
)
def test_reads_match_pread_across_alignments_and_thresholds(
    data_path, offset, size, threshold, task
):
    """Unaligned heads and tails (POSIX through the ring), aligned middles (cuFile), below
    gds_threshold (POSIX only), short at the end of the file."""
    out = cupy.full(size, 0xA5, dtype=cupy.uint8)
    with (
        kvikpy.defaults.set({"gds_threshold": threshold, "task_size": task}),
        kvikpy.CuFile(data_path) as f,
    ):
        n = f.read(out, file_offset=offset)
    fd = os.open(data_path, os.O_RDONLY)
    try:
        expected = os.pread(fd, size, offset)
    finally:
        os.close(fd)
    assert n == len(expected)
    got = out.get()
    assert got[:n].tobytes() == expected
    assert (got[n:] == 0xA5).all()  # nothing written past the end of the file


@settings(max_examples=25, deadline=None)
@given(offset=st.integers(0, 1 << 20), size=st.integers(1, (2 << 20) + 9))
def test_writes_land_byte_exact(tmp_path_factory, offset, size):
    path = tmp_path_factory.mktemp("w") / "w.bin"
    base = random_bytes(offset + size + 100, seed=size)
    path.write_bytes(base)
    src = np.frombuffer(random_bytes(size, seed=offset + 1), dtype=np.uint8)
    with kvikpy.CuFile(path, "r+") as f:
        assert f.backend[0] == "cufile"
        assert f.write(cupy.asarray(src), file_offset=offset) == size
    expected = base[:offset] + src.tobytes() + base[offset + size :]
    assert path.read_bytes() == expected


def test_pread_futures_and_raw_calls(data_path):
    out = torch.empty(SIZE, dtype=torch.uint8, device="cuda")
    with kvikpy.CuFile(data_path) as f:
        assert f.pread(out, task_size=1 << 20).get() == SIZE
        assert bytes(out.cpu().numpy()) == DATA
        part = cupy.zeros(1 << 20, dtype=cupy.uint8)
        assert f.raw_read(part, file_offset=8192) == 1 << 20
        assert part.get().tobytes() == DATA[8192 : 8192 + (1 << 20)]
        tail = cupy.zeros(8192, dtype=cupy.uint8)
        assert f.raw_read(tail, file_offset=SIZE - 100) == 100  # short at the end


def test_async_reads_and_writes_on_streams(data_path, tmp_path):
    for stream_kind in ("cupy", "torch"):
        if stream_kind == "cupy":
            stream = cupy.cuda.Stream(non_blocking=True)
            out = cupy.zeros(SIZE, dtype=cupy.uint8)
        else:
            stream = torch.cuda.Stream()
            out = torch.zeros(SIZE, dtype=torch.uint8, device="cuda")
        with kvikpy.CuFile(data_path) as f:
            fut = f.raw_read_async(out, stream)
            assert fut.check_bytes_done() == SIZE
        got = out.get() if stream_kind == "cupy" else out.cpu().numpy()
        assert got.tobytes() == DATA
    src = cupy.asarray(np.frombuffer(DATA, dtype=np.uint8))
    stream = cupy.cuda.Stream(non_blocking=True)
    path = tmp_path / "async.bin"
    with kvikpy.CuFile(path, "w") as f:
        assert f.raw_write_async(src, stream, file_offset=4096).check_bytes_done() == SIZE
    assert path.read_bytes() == b"\0" * 4096 + DATA


def test_batches_into_gpu_memory(data_path, tmp_path):
    paths = []
    for i, n in enumerate([1, 4096, 70_001, (1 << 20) + 3]):
        p = tmp_path / f"f{i}.bin"
        p.write_bytes(random_bytes(n, seed=i + 40))
        paths.append(p)
    batch = kvikpy.read_many(paths, device=0)
    whole = bytes(cupy.asarray(batch.buffer).get())
    assert whole == b"".join(p.read_bytes() for p in paths)
    ranges = [(0, 4096), (5, 100_000), (SIZE - 7, 7), (1 << 20, 2 << 20)]
    batch = kvikpy.read_ranges(data_path, ranges, device=0)
    got = bytes(cupy.asarray(batch.buffer).get())
    assert got == b"".join(DATA[o : o + n] for o, n in ranges)


def test_registration_api():
    buf = cupy.arange(1 << 20, dtype=cupy.uint8)
    kvikpy.memory_register(buf)
    kvikpy.memory_register(buf)  # already registered: accepted, as kvikio does
    kvikpy.memory_deregister(buf)
    with pytest.raises(kvikpy.CuFileError, match=r"\(in cuFileBufDeregister\)"):
        kvikpy.memory_deregister(buf)  # cuFile's own error for memory it does not know
    stream = cupy.cuda.Stream(non_blocking=True)
    kvikpy.stream_register(stream, 0)
    kvikpy.stream_deregister(stream)
    with kvikpy.defaults.set("compat_mode", CompatMode.ON):
        kvikpy.memory_deregister(buf)  # compat mode: a no-op


def test_errors(data_path, tmp_path):
    with kvikpy.CuFile(data_path) as f, pytest.raises(OSError):
        f.write(cupy.zeros(8192, dtype=cupy.uint8))  # opened "r"
    f = kvikpy.CuFile(data_path)
    f.close()
    with pytest.raises(ValueError, match="closed"):
        f.read(cupy.zeros(8192, dtype=cupy.uint8))
    with pytest.raises(FileNotFoundError):
        kvikpy.CuFile(tmp_path / "missing", "r")


def test_exit_with_open_files_and_pending_futures_is_clean(data_path):
    code = (
        "import sys, cupy, kvikpy\n"
        "kvikpy.defaults.set({'compat_mode': 'off', 'gds_threshold': 4096})\n"
        "files = [kvikpy.CuFile(sys.argv[1]) for _ in range(3)]\n"
        "assert all(f.backend[0] == 'cufile' for f in files)\n"
        "bufs = [cupy.empty(3 << 20, dtype=cupy.uint8) for _ in files]\n"
        "futs = [f.pread(b, task_size=1 << 16) for f, b in zip(files, bufs)]\n"
        "s = cupy.cuda.Stream(non_blocking=True)\n"
        "files[0].raw_read_async(bufs[0], s)\n"
        "print('started')\n"
    )
    r = subprocess.run(
        [sys.executable, "-c", code, str(data_path)], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0 and r.stdout == "started\n" and r.stderr == "", r.stderr
