"""kvikio's test_basic_io checks that need a GPU, on kvikpy: bounce_buffer_free after a
device write in compat mode, errors on misuse with CuPy arrays, and page-cache info of a
file written from GPU memory."""

from __future__ import annotations

import io
import os
from pathlib import Path

import pytest

import kvikpy

cupy = pytest.importorskip("cupy")


def test_bounce_buffer_free_after_a_device_write(tmp_path: Path) -> None:
    """kvikio's test_bounce_buffer_free: one thread, one small write, one buffer pooled,
    reported as the bounce_buffer_size it served."""
    filename = tmp_path / "test-file"
    kvikpy.bounce_buffer_free()
    compat = {"compat_mode": kvikpy.CompatMode.ON, "num_threads": 1}
    with kvikpy.defaults.set(compat), kvikpy.CuFile(filename, "w") as f:
        with kvikpy.defaults.set({"bounce_buffer_size": 1024}):
            f.write(cupy.arange(10))
            assert kvikpy.bounce_buffer_free() == 1024
            assert kvikpy.bounce_buffer_free() == 0
            f.write(cupy.arange(10))
        with kvikpy.defaults.set({"bounce_buffer_size": 2048}):
            f.write(cupy.arange(10))
            assert kvikpy.bounce_buffer_free() == 2048
            assert kvikpy.bounce_buffer_free() == 0


def test_bounce_buffer_free_after_a_device_read(tmp_path: Path) -> None:
    filename = tmp_path / "test-file"
    filename.write_bytes(os.urandom(100))
    kvikpy.bounce_buffer_free()
    settings = {"compat_mode": kvikpy.CompatMode.ON, "num_threads": 1, "bounce_buffer_size": 3000}
    with kvikpy.defaults.set(settings), kvikpy.CuFile(filename) as f:
        a = cupy.empty(100, dtype="u1")
        assert f.read(a) == 100
        assert kvikpy.bounce_buffer_free() == 3000


def test_incorrect_open_mode_error_with_cupy(tmp_path: Path) -> None:
    filename = tmp_path / "test-file"
    filename.write_bytes(bytes(80))
    with kvikpy.CuFile(filename, "r") as f:
        with pytest.raises(RuntimeError, match="Operation not permitted") as info:
            f.write(cupy.arange(10))
        assert isinstance(info.value, io.UnsupportedOperation)
    refused = pytest.raises(RuntimeError, match="Operation not permitted")
    with kvikpy.CuFile(filename, "w") as f, refused:
        f.read(cupy.arange(10))


def test_get_page_cache_info_of_a_file_written_from_the_gpu(tmp_path: Path) -> None:
    """kvikio's test_get_page_cache_info."""
    with pytest.raises(RuntimeError, match="Unable to open file"):
        kvikpy.get_page_cache_info(tmp_path / "nonexistent_file")
    with pytest.raises(ValueError):
        kvikpy.get_page_cache_info(123.456)  # type: ignore[arg-type]
    with pytest.raises(ValueError):
        kvikpy.get_page_cache_info(["path_in_a_list"])  # type: ignore[arg-type]
    test_file = tmp_path / "test_file"
    with kvikpy.CuFile(test_file, "w") as f:
        f.write(cupy.linspace(1.0, 10000.0, num=10000))
    page = os.sysconf("SC_PAGESIZE")
    with open(test_file, "rb") as fh:
        for arg in (test_file, str(test_file), fh.fileno(), fh):
            cached, total = kvikpy.get_page_cache_info(arg)
            assert total == -(-80_000 // page)
            assert 0 <= cached <= total
