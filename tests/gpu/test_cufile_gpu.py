"""cuFile on the GPU machine.

With the real libcufile (the default there): it loads and its driver opens, but it
registers no file (no nvidia-fs, no /run/udev), so AUTO falls back to POSIX per file with
the reason, OFF raises cuFile's error, the driver API works, ``info`` explains, and the
process exits cleanly with files open and futures pending.

Through kvikpy's stand-in libcufile (a test library, not NVIDIA's; see
tests/gpu/cufile_standin_cases.py): the cuFile source itself, in a subprocess with
``KVIKPY_CUFILE_LIBRARY`` naming the stand-in.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import random_bytes, run_python

import kvikpy
from kvikpy import CompatMode, _lib

pytestmark = [pytest.mark.gpu, pytest.mark.cufile]

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent


def _real_library() -> bool:
    return _lib.cufile_status()["standin"] is None


@pytest.fixture
def data_file(tmp_path):
    data = random_bytes((1 << 20) + 333, seed=71)
    path = tmp_path / "d.bin"
    path.write_bytes(data)
    return path, data


def test_auto_falls_back_per_file_with_the_reason(data_file):
    if not _real_library():
        pytest.skip("the stand-in is loaded in this process")
    path, data = data_file
    cupy = pytest.importorskip("cupy")
    with kvikpy.defaults.set("compat_mode", CompatMode.AUTO), kvikpy.CuFile(path) as f:
        name, why = f.backend
        out = cupy.empty(len(data), dtype=cupy.uint8)
        assert f.read(out) == len(data)
    assert out.get().tobytes() == data
    assert name == "posix"
    if os.access("/run/udev", os.R_OK | os.X_OK):
        assert "cuFile refused the file: " in why and "(50" in why, why
    else:
        assert why == (
            "compat_mode is AUTO and cuFile is not usable here: /run/udev is not readable "
            "(cuFile needs udev to find devices)"
        )


def test_off_raises_cufiles_own_error(data_file):
    if not _real_library():
        pytest.skip("the stand-in is loaded in this process")
    path, data = data_file
    with (
        kvikpy.defaults.set("compat_mode", CompatMode.OFF),
        pytest.raises(kvikpy.CuFileError, match=r"compat_mode is OFF") as info,
    ):
        kvikpy.CuFile(path, "r")
    # Measured on these machines: HANDLE_NOT_REGISTERED (5027).
    assert "(in cuFileHandleRegister)" in str(info.value), info.value
    assert path.read_bytes() == data


def test_driver_api_and_properties():
    d = kvikpy.cufile_driver
    major, minor = d.libcufile_version()
    assert (major, minor) >= (1, 0)
    d.driver_open()
    d.driver_close()
    assert isinstance(d.get("is_gds_available"), bool)
    for name in ("major_version", "minor_version", "poll_thresh_size", "per_buffer_cache_size"):
        assert isinstance(d.get(name), int) and d.get(name) >= 0
    assert isinstance(d.get("allow_compat_mode"), bool)
    with pytest.raises(KeyError, match="read-only"):
        d.set("major_version", 2077)
    before = d.get("poll_thresh_size")
    with d.set("poll_thresh_size", 1024):
        assert d.get("poll_thresh_size") == 1024
        with d.set({"poll_thresh_size": 2048, "poll_mode": True}):
            assert d.get("poll_thresh_size") == 2048 and d.get("poll_mode") is True
        assert d.get("poll_thresh_size") == 1024
    assert d.get("poll_thresh_size") == before


def test_info_explains():
    gds = kvikpy.info()["gds"]
    assert gds["library"] is not None and gds["libcufile_version"] is not None
    assert isinstance(gds["properties"], dict)
    if _real_library() and not os.path.exists("/proc/driver/nvidia-fs"):
        assert gds["usable"] is False
        assert gds["reason"].startswith("the nvidia-fs kernel module is not loaded")
    r = subprocess.run(
        [sys.executable, "-m", "kvikpy", "info"], capture_output=True, text=True, check=False
    )
    assert r.returncode == 0, r.stderr
    assert "cuFile    " in r.stdout and "libcufile" in r.stdout


def test_exit_with_open_files_and_pending_futures_is_clean(tmp_path):
    path = tmp_path / "big.bin"
    path.write_bytes(random_bytes(32 << 20, seed=9))
    code = (
        "import sys, cupy, kvikpy\n"
        "kvikpy.cufile_driver.get('poll_mode')  # the driver is open\n"
        "files = [kvikpy.CuFile(sys.argv[1]) for _ in range(3)]\n"
        "bufs = [cupy.empty(32 << 20, dtype=cupy.uint8) for _ in files]\n"
        "futs = [f.pread(b, task_size=1 << 20) for f, b in zip(files, bufs)]\n"
        "print('started', files[0].backend[0])\n"
    )
    r = run_python(code, str(path))
    assert r.returncode == 0, r.stderr
    assert r.stdout.startswith("started") and r.stderr == "", r.stderr


def standin_path() -> Path | None:
    """The stand-in libcufile: ``$KVIKPY_CUFILE_STANDIN`` or ``.gpu/libcufile_standin.so``."""
    named = os.environ.get("KVIKPY_CUFILE_STANDIN")
    candidate = Path(named) if named else ROOT / ".gpu" / "libcufile_standin.so"
    return candidate if candidate.is_file() else None


def test_cufile_source_through_the_standin(tmp_path):
    """The cuFile source's cases (alignment splits, thresholds, EOF, errors, batches, async
    with streams, registration, exit) in a subprocess that loads the stand-in."""
    lib = standin_path()
    if lib is None:
        pytest.skip("no stand-in libcufile (KVIKPY_CUFILE_STANDIN or .gpu/libcufile_standin.so)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVIKIO_")}
    env["KVIKPY_CUFILE_LIBRARY"] = str(lib)
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            str(HERE / "cufile_standin_cases.py"),
        ],
        env=env,
        cwd=str(ROOT),
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
    )
    assert r.returncode == 0, r.stdout[-6000:] + r.stderr[-3000:]
    assert " passed" in r.stdout and " failed" not in r.stdout, r.stdout[-3000:]


def test_host_reads_never_need_cufile(data_file):
    path, data = data_file
    b = np.empty(len(data), dtype=np.uint8)
    with kvikpy.CuFile(path) as f:
        assert f.read(b) == len(data)
    assert b.tobytes() == data
