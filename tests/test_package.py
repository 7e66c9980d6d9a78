"""The package: version, exports, exception hierarchy, panics, kvikio compatibility and
host I/O without CUDA."""

from __future__ import annotations

import importlib.metadata
import os

import numpy as np
import pytest
from conftest import random_bytes, run_python

import kvikpy


def test_version_is_the_installed_distribution_version():
    assert isinstance(kvikpy.__version__, str)
    assert kvikpy.__version__
    assert kvikpy.__version__ == importlib.metadata.version("kvikpy")


def test_public_names():
    for name in kvikpy.__all__:
        assert hasattr(kvikpy, name), name
    for name in ("CuFile", "IOFuture", "defaults", "wait_all", "CompatMode", "numpy"):
        assert name in kvikpy.__all__


def test_exception_hierarchy():
    assert issubclass(kvikpy.KvikpyError, Exception)
    assert issubclass(kvikpy.ConfigError, kvikpy.KvikpyError)
    assert issubclass(kvikpy.ConfigError, ValueError)
    assert issubclass(kvikpy.InternalError, kvikpy.KvikpyError)
    assert issubclass(kvikpy.InternalError, RuntimeError)
    assert not issubclass(kvikpy.KvikpyError, (ValueError, RuntimeError, OSError))


@pytest.mark.parametrize("where", ["engine", "binding"])
def test_a_rust_panic_becomes_internal_error(where):
    with pytest.raises(kvikpy.InternalError) as info:
        kvikpy._lib._panic_for_tests(where)
    e = info.value
    assert isinstance(e, kvikpy.KvikpyError)
    assert isinstance(e, RuntimeError)
    assert isinstance(e, Exception), "pyo3's PanicException is a BaseException: must not leak"
    assert "deliberate panic" in str(e)
    assert type(e).__name__ != "PanicException"


def test_a_panic_is_catchable_by_except_exception_and_kvikpy_keeps_working(file_with):
    for _ in range(3):
        try:
            kvikpy._lib._panic_for_tests()
        except Exception as e:  # a BaseException would escape this
            assert isinstance(e, kvikpy.InternalError)
    data = random_bytes(1 << 20, seed=71)
    path = file_with(data)
    buf = bytearray(len(data))
    with kvikpy.CuFile(path) as f:
        assert f.pread(buf, task_size=4096).get() == len(data)
    assert bytes(buf) == data


def test_host_io_without_a_cuda_driver(file_with):
    """Host-memory I/O needs no CUDA driver: this machine has none, and a plain import, read
    and write work (the GPU-only paths are never touched)."""
    data = random_bytes(3 << 20, seed=72)
    path = file_with(data)
    r = run_python(
        "import sys, numpy as np, kvikpy\n"
        "a = np.empty(3 << 20, np.uint8)\n"
        "with kvikpy.CuFile(sys.argv[1], 'r+') as f:\n"
        "    assert f.read(a) == a.nbytes\n"
        "    assert f.pwrite(a[::-1].copy(), file_offset=a.nbytes).get() == a.nbytes\n"
        "print('ok', a[:4].tolist() == list(open(sys.argv[1], 'rb').read(4)))",
        str(path),
        env={"CUDA_VISIBLE_DEVICES": ""},
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["ok", "True"]
    assert path.read_bytes() == data + data[::-1]


def test_kvikio_style_roundtrip(tmp_path):
    """kvikio's README example with numpy instead of cupy, through ``import kvikpy as kvikio``."""
    import kvikpy as kvikio

    path = str(tmp_path / "kvikio-hello-world-file")
    a = np.random.default_rng(73).random(100)

    f = kvikio.CuFile(path, "w")
    # Write whole array to file
    f.write(a)
    f.close()

    b = np.empty_like(a)
    f = kvikio.CuFile(path, "r")
    # Read whole array from file
    f.read(b)
    assert all(a == b)
    f.close()

    # Use context manager
    c = np.empty_like(a)
    with kvikio.CuFile(path, "r") as f:
        f.read(c)
    assert all(a == c)

    # Non-blocking read
    d = np.empty_like(a)
    with kvikio.CuFile(path, "r") as f:
        future1 = f.pread(d[:50])
        future2 = f.pread(d[50:], file_offset=d[:50].nbytes)
        assert future1.get() == 400  # Wait for first read
        assert future2.get() == 400  # Wait for second read
    assert all(a == d)

    # kvikio's settings API
    with kvikio.defaults.set("num_threads", 2):
        assert kvikio.defaults.get("num_threads") == 2
    assert os.path.getsize(path) == a.nbytes


def test_import_is_light() -> None:
    """`import kvikpy` loads neither numpy nor asyncio (they load on first use), so a
    torch or CuPy user pays a few milliseconds, not numpy's import time."""
    r = run_python(
        "import sys, kvikpy\n"
        "print(sorted(m for m in ('numpy', 'asyncio') if m in sys.modules))\n"
        "kvikpy.numpy.fromfile\n"
        "print('numpy' in sys.modules)\n"
    )
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[:2] == ["[]", "True"]


def test_dir_shows_only_the_public_api():
    names = dir(kvikpy)
    public = [n for n in names if not n.startswith("__")]
    assert public == sorted(n for n in kvikpy.__all__ if not n.startswith("__"))
    for helper in (
        "Any",
        "TYPE_CHECKING",
        "annotations",
        "atexit",
        "importlib",
        "_lib",
        "_api",
        "_bounce_buffer_free",
        "cufile",
        "batch",
    ):
        assert helper not in names, helper
    assert {"__version__", "__doc__", "__name__", "__all__"} <= set(names)
    assert names == sorted(names)
    assert callable(kvikpy.numpy.fromfile)  # lazy submodules are listed and still load
