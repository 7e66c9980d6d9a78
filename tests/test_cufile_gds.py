"""cuFile without libcufile (this machine and CI): kvikio's compat-mode decision per file,
the driver API, the registration no-ops and what ``info`` says."""

from __future__ import annotations

import json

import numpy as np
import pytest
from conftest import random_bytes, run_python

import kvikpy
from kvikpy import CompatMode, _lib

pytestmark = pytest.mark.skipif(
    _lib.cufile_status()["library"] is not None, reason="libcufile loads here"
)


@pytest.fixture
def data_file(tmp_path):
    data = random_bytes(70_000, seed=13)
    path = tmp_path / "d.bin"
    path.write_bytes(data)
    return path, data


def test_auto_falls_back_to_posix_with_the_reason(data_file):
    path, data = data_file
    with kvikpy.defaults.set("compat_mode", CompatMode.AUTO), kvikpy.CuFile(path) as f:
        name, why = f.backend
        buf = np.empty(len(data), dtype=np.uint8)
        assert f.read(buf) == len(data)
    assert buf.tobytes() == data
    assert name == "posix"
    assert why.startswith("compat_mode is AUTO and cuFile is not usable here: libcufile")
    assert f.backend == (name, why)  # kept after close
    assert f._handle.backend == f.backend


def test_on_is_posix(data_file):
    with kvikpy.defaults.set("compat_mode", CompatMode.ON), kvikpy.CuFile(data_file[0]) as f:
        assert f.backend == ("posix", "compat_mode is ON")


@pytest.mark.parametrize("mode", ["r", "r+", "w"])
def test_off_is_a_clear_error(data_file, mode):
    path, data = data_file
    with (
        kvikpy.defaults.set("compat_mode", CompatMode.OFF),
        pytest.raises(kvikpy.CuFileError) as info,
    ):
        kvikpy.CuFile(path, mode)
    assert isinstance(info.value, RuntimeError) and isinstance(info.value, kvikpy.KvikpyError)
    text = str(info.value)
    assert f"compat_mode is OFF, so '{path}' must go through cuFile" in text
    assert "libcufile is not installed" in text and "set compat_mode to AUTO" in text
    assert path.read_bytes() == data  # the refused open did not truncate ("w" is refused)
    with kvikpy.defaults.set("compat_mode", CompatMode.OFF), pytest.raises(kvikpy.CuFileError):
        kvikpy.CuFile(path.with_name("missing"), "r")  # cuFile is checked before the file


def test_off_through_every_entry_point(data_file):
    path, _ = data_file
    with kvikpy.defaults.set("compat_mode", CompatMode.OFF):
        with pytest.raises(kvikpy.CuFileError):
            kvikpy.read(path, device="cpu")
        with pytest.raises(kvikpy.CuFileError):
            kvikpy.read_ranges(path, [(0, 10)], device="cpu")


def test_is_compat_mode_preferred_as_kvikio():
    assert kvikpy.defaults.is_compat_mode_preferred(CompatMode.ON)
    assert not kvikpy.defaults.is_compat_mode_preferred(CompatMode.OFF)
    assert kvikpy.defaults.is_compat_mode_preferred(CompatMode.AUTO)  # no libcufile
    with kvikpy.defaults.set("compat_mode", CompatMode.OFF):
        assert kvikpy.defaults.compat_mode() is False
    with kvikpy.defaults.set("compat_mode", CompatMode.AUTO):
        assert kvikpy.defaults.compat_mode() is True


def test_cufile_driver_without_libcufile():
    d = kvikpy.cufile_driver
    assert d.libcufile_version() == (0, 0)
    assert d.get("is_gds_available") is False
    for name in ("major_version", "poll_mode", "poll_thresh_size", "max_device_cache_size"):
        with pytest.raises(kvikpy.CuFileError, match="libcufile is not installed"):
            d.get(name)
    for call in (d.driver_open, d.driver_close, d.initialize):
        with pytest.raises(RuntimeError, match="cuFile is not available"):
            call()
    with pytest.raises(KeyError, match="read-only"):
        d.set("major_version", 2077)
    with pytest.raises(KeyError):
        d.set("nonexistent_property", 1)
    with pytest.raises(KeyError):
        d.get("nonexistent_property")
    with pytest.raises(kvikpy.CuFileError):
        d.set("poll_thresh_size", 1024)
    with pytest.raises(ValueError, match=r"kvikpy\.cufile_driver\.set"):
        d.set(1, 2, 3)


def test_registration_is_a_no_op_without_cufile():
    buf = bytearray(b"\x07" * 4096)
    with kvikpy.defaults.set("compat_mode", CompatMode.AUTO):
        kvikpy.memory_register(buf)
        kvikpy.memory_deregister(buf)
        kvikpy.stream_register(0, 0)
        kvikpy.stream_deregister(0)
    assert buf == bytearray(b"\x07" * 4096)
    with kvikpy.defaults.set("compat_mode", CompatMode.OFF), pytest.raises(kvikpy.CuFileError):
        kvikpy.memory_register(buf)  # OFF asks for cuFile, which is missing


def test_info_dict_explains_gds():
    d = kvikpy.info()
    gds = d["gds"]
    assert gds["usable"] is False and gds["library"] is None and gds["standin"] is None
    assert gds["reason"].startswith("libcufile is not installed")
    if kvikpy.cuda_available():
        assert d["gpu_io"] == "POSIX, pinned bounce buffers"
    else:
        assert d["gpu_io"].startswith("none: CUDA is not available")
    json.dumps(d)


def test_standin_variable_naming_a_missing_file_is_reported(tmp_path):
    missing = tmp_path / "nope.so"
    code = (
        "import json, kvikpy; g = kvikpy.info()['gds']; "
        "f = kvikpy.CuFile(__import__('sys').argv[1], 'w'); print(json.dumps([g, f.backend]))"
    )
    r = run_python(code, str(tmp_path / "o.bin"), env={"KVIKPY_CUFILE_LIBRARY": str(missing)})
    assert r.returncode == 0, r.stderr
    gds, backend = json.loads(r.stdout)
    assert gds["reason"].startswith(f"KVIKPY_CUFILE_LIBRARY={missing} cannot be loaded")
    assert backend[0] == "posix" and "KVIKPY_CUFILE_LIBRARY" in backend[1]


def test_exit_with_open_files_and_pending_futures_is_clean(tmp_path):
    path = tmp_path / "big.bin"
    path.write_bytes(random_bytes(8 << 20, seed=5))
    code = (
        "import sys, numpy as np, kvikpy\n"
        "kvikpy.defaults.set({'task_size': 1 << 16, 'num_threads': 2})\n"
        "f = kvikpy.CuFile(sys.argv[1]); b = np.empty(8 << 20, np.uint8)\n"
        "futs = [f.pread(b) for _ in range(4)]\n"
        "print(f.backend[0])\n"
    )
    r = run_python(code, str(path))
    assert r.returncode == 0 and r.stdout.strip() == "posix" and r.stderr == "", r.stderr
