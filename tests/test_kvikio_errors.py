"""Code written for kvikio keeps catching kvikpy's errors: every error raised where kvikio
raises ``RuntimeError`` is Python's own type *and* a ``RuntimeError`` (``kvikpy.errors``'
twins), negative sizes are ``ValueError`` and kvikio's ``OverflowError``, and messages
carry the phrases kvikio users match (``Unable to open file``, ``Operation not
permitted``, ``Non-CUDA buffers not supported``, ``negative value``)."""

from __future__ import annotations

import errno
import io
import os
from pathlib import Path

import numpy as np
import pytest

import kvikpy
from kvikpy import errors


def test_every_errno_maps_to_python_s_class_and_runtime_error():
    """The errno table against Python's own: ``type(OSError(n, ...))`` for each errno."""
    for n in range(1, 134):
        with pytest.raises(OSError) as info:
            kvikpy._lib._os_error_for_tests(n)
        e = info.value
        builtin = type(OSError(n, "x"))
        assert isinstance(e, builtin), f"errno {n}: {type(e).__name__} is no {builtin.__name__}"
        assert isinstance(e, RuntimeError) and isinstance(e, kvikpy.KvikpyError)
        assert e.errno == n and e.filename == "errno-test"
        if builtin is OSError:
            assert type(e) is errors.OSRuntimeError


def test_the_twin_classes_derive_from_both():
    twins = {
        errors.FileNotFoundRuntimeError: FileNotFoundError,
        errors.PermissionRuntimeError: PermissionError,
        errors.IsADirectoryRuntimeError: IsADirectoryError,
        errors.NotADirectoryRuntimeError: NotADirectoryError,
        errors.UnsupportedOperationError: io.UnsupportedOperation,
        errors.NegativeValueError: OverflowError,
    }
    for twin, builtin in twins.items():
        assert issubclass(twin, builtin)
        assert issubclass(twin, kvikpy.KvikpyError)
    for twin in list(twins)[:5]:
        assert issubclass(twin, RuntimeError)
    assert issubclass(errors.NegativeValueError, ValueError)
    assert issubclass(errors.FileTypeError, TypeError) and issubclass(
        errors.FileTypeError, ValueError
    )


# --- opening ----------------------------------------------------------------------------


def test_no_file_error_as_kvikio_s_test_expects(tmp_path: Path):
    """kvikio's test_no_file_error."""
    missing = tmp_path / "test-file"
    with pytest.raises(RuntimeError, match=r"Unable to open file.*No such file or directory"):
        kvikpy.CuFile(missing, "r")
    with pytest.raises(FileNotFoundError) as info:
        kvikpy.CuFile(missing, "r")
    assert info.value.errno == errno.ENOENT
    assert info.value.filename == str(missing)
    assert info.value.strerror.startswith("Unable to open file")


@pytest.mark.parametrize(
    ("make", "builtin"),
    [
        (lambda tmp: tmp, IsADirectoryError),
        (lambda tmp: Path("/etc/hostname/below-a-file"), NotADirectoryError),
        (lambda tmp: tmp / "missing" / "file", FileNotFoundError),
    ],
)
def test_open_failures_are_their_own_type_and_runtime_error(tmp_path, make, builtin):
    path = make(tmp_path)
    for mode in ("r", "w"):
        if builtin is IsADirectoryError and mode == "r":
            continue  # opening a directory read-only succeeds; reading it fails later
        with pytest.raises(builtin) as info:
            kvikpy.CuFile(path, mode)
        assert isinstance(info.value, RuntimeError)
        assert "Unable to open file" in str(info.value)


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores file permissions")
def test_permission_denied_is_permission_error_and_runtime_error(tmp_path):
    path = tmp_path / "locked"
    path.write_bytes(b"x")
    path.chmod(0)
    with pytest.raises(PermissionError) as info:
        kvikpy.CuFile(path)
    assert isinstance(info.value, RuntimeError)


def test_kvikpy_read_of_a_missing_file_is_runtime_error_too(tmp_path):
    with pytest.raises(RuntimeError, match="Unable to open file") as info:
        kvikpy.read(tmp_path / "missing.bin", device="cpu")
    assert isinstance(info.value, FileNotFoundError)


# --- reading and writing -----------------------------------------------------------------


def test_incorrect_open_mode_errors_as_kvikio_s_test_expects(tmp_path):
    """kvikio's test_incorrect_open_mode_error, with numpy arrays."""
    path = tmp_path / "test-file"
    np.arange(10).tofile(path)
    with kvikpy.CuFile(path, "r") as f:
        with pytest.raises(RuntimeError, match="Operation not permitted") as info:
            f.write(np.arange(10))
        assert isinstance(info.value, io.UnsupportedOperation)
        with pytest.raises(RuntimeError, match="Operation not permitted"):
            f.pwrite(np.arange(10)).get()
    with kvikpy.CuFile(path, "w") as f:
        with pytest.raises(RuntimeError, match="Operation not permitted") as info:
            f.read(np.arange(10))
        assert isinstance(info.value, io.UnsupportedOperation)
        with pytest.raises(io.UnsupportedOperation, match="opened write-only"):
            f.pread(np.arange(10)).get()


def test_raw_io_of_host_memory_as_kvikio_s_test_expects(tmp_path):
    """kvikio's test_raw_read_write_of_host_memory: a ValueError in both."""
    path = tmp_path / "test-file"
    a = np.arange(1024)
    no_host = pytest.raises(ValueError, match="Non-CUDA buffers not supported")
    with kvikpy.CuFile(path, "w") as f, no_host:
        f.raw_write(a)
    no_host = pytest.raises(ValueError, match="Non-CUDA buffers not supported")
    with kvikpy.CuFile(path, "r") as f, no_host:
        f.raw_read(a)


def test_a_write_beyond_the_largest_file_is_an_os_error_and_runtime_error(tmp_path):
    with kvikpy.CuFile(tmp_path / "huge", "w") as f, pytest.raises(OSError) as info:
        f.write(bytearray(16), file_offset=1 << 62)
    assert info.value.errno in (errno.EFBIG, errno.EINVAL)
    assert isinstance(info.value, RuntimeError)


# --- settings ---------------------------------------------------------------------------


SIZES = ["num_threads", "task_size", "gds_threshold", "bounce_buffer_size"]


@pytest.mark.parametrize("name", SIZES)
def test_negative_settings_are_value_and_overflow_errors(name):
    """kvikio's test_defaults: ``OverflowError`` matching ``negative value`` for -1."""
    before = kvikpy.defaults.get(name)
    for value in (-1, -(2**70)):
        with pytest.raises(OverflowError, match="negative value") as info:
            kvikpy.defaults.set(name, value)
        assert isinstance(info.value, ValueError)
        assert name in str(info.value)
        with pytest.raises(ValueError, match="negative value"):
            kvikpy.defaults.set(**{name: value})
    assert kvikpy.defaults.get(name) == before, "a refused value changes nothing"


@pytest.mark.parametrize("name", ["num_threads", "task_size", "bounce_buffer_size"])
def test_zero_sizes_ask_for_a_positive_integer(name):
    with pytest.raises(ValueError, match="positive integer") as info:
        kvikpy.defaults.set(name, 0)
    assert not isinstance(info.value, OverflowError)


def test_a_zero_gds_threshold_is_fine():
    with kvikpy.defaults.set("gds_threshold", 0):
        assert kvikpy.defaults.get("gds_threshold") == 0
