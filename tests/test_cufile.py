"""CuFile: open modes, paths, descriptors, closing, repr, and the errors raised for files."""

from __future__ import annotations

import errno
import fcntl
import gc
import io
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from conftest import o_direct_supported, random_bytes

import kvikpy

DATA = random_bytes(10_000, seed=1)

# mode -> (O_ACCMODE, readable, writable, truncates)
VALID_MODES = {
    "r": (os.O_RDONLY, True, False, False),
    "rb": (os.O_RDONLY, True, False, False),
    "r+": (os.O_RDWR, True, True, False),
    "r+b": (os.O_RDWR, True, True, False),
    "rb+": (os.O_RDWR, True, True, False),
    "w": (os.O_WRONLY, False, True, True),
    "wb": (os.O_WRONLY, False, True, True),
    "w+": (os.O_RDWR, True, True, True),
    "w+b": (os.O_RDWR, True, True, True),
    "wb+": (os.O_RDWR, True, True, True),
}

INVALID_MODES = [
    "",
    "a",
    "a+",
    "ab",
    "x",
    "x+",
    "xb",
    "rw",
    "wr",
    "r++",
    "rbb",
    "R",
    "W",
    "q",
    "wa",
    "w+a",
    "wx",
    "r+w",
    "rt",
    "wt",
    " r",
    "r ",
]


def fd_count() -> int:
    return len(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("mode", list(VALID_MODES))
def test_valid_modes(file_with, mode):
    access, readable, writable, truncates = VALID_MODES[mode]
    path = file_with(DATA)
    with kvikpy.CuFile(path, mode) as f:
        flags = f.open_flags()
        assert flags == fcntl.fcntl(f.fileno(), fcntl.F_GETFL)
        assert flags & os.O_ACCMODE == access
        assert not flags & os.O_DIRECT, "fileno()/open_flags() describe the buffered descriptor"
        assert f.nbytes() == (0 if truncates else len(DATA))
        if readable and not truncates:
            buf = bytearray(len(DATA))
            assert f.read(buf) == len(DATA)
            assert bytes(buf) == DATA
        if writable:
            new = random_bytes(100, seed=2)
            assert f.write(new, file_offset=5) == 100
    on_disk = path.read_bytes()
    if truncates:
        assert on_disk == bytes(5) + random_bytes(100, seed=2)
    elif writable:
        assert on_disk == DATA[:5] + random_bytes(100, seed=2) + DATA[105:]
    else:
        assert on_disk == DATA


@pytest.mark.parametrize("mode", ["w", "wb", "w+", "w+b"])
def test_w_modes_create_missing_file(tmp_path, mode):
    path = tmp_path / "new.bin"
    with kvikpy.CuFile(path, mode) as f:
        assert f.nbytes() == 0
        assert f.write(DATA) == len(DATA)
    assert path.read_bytes() == DATA
    umask = os.umask(0o022)
    os.umask(umask)
    assert path.stat().st_mode & 0o777 == 0o644 & ~umask


@pytest.mark.parametrize("mode", INVALID_MODES)
def test_invalid_mode_on_existing_file_raises_and_leaves_it_unchanged(file_with, mode):
    path = file_with(DATA)
    with pytest.raises(ValueError) as info:
        kvikpy.CuFile(path, mode)
    message = str(info.value)
    assert "mode" in message
    assert f'"{mode}"' in message or f"'{mode}'" in message, message
    assert "'r'" in message and "'w+'" in message, "the message lists the accepted modes"
    assert path.read_bytes() == DATA


@pytest.mark.parametrize("mode", INVALID_MODES)
def test_invalid_mode_on_missing_file_creates_nothing(tmp_path, mode):
    path = tmp_path / "missing.bin"
    with pytest.raises(ValueError):
        kvikpy.CuFile(path, mode)
    assert not path.exists()
    assert list(tmp_path.iterdir()) == []


def test_default_mode_is_read_only(file_with):
    path = file_with(DATA)
    with kvikpy.CuFile(path) as f:
        assert f.open_flags() & os.O_ACCMODE == os.O_RDONLY
        with pytest.raises(io.UnsupportedOperation):
            f.write(b"x")
    assert path.read_bytes() == DATA


class _PathLike:
    def __init__(self, path: Path) -> None:
        self._path = path

    def __fspath__(self) -> str:
        return str(self._path)


@pytest.mark.parametrize("kind", [str, Path, _PathLike])
def test_path_types(file_with, kind):
    path = file_with(DATA)
    with kvikpy.CuFile(kind(path), "r") as f:
        buf = bytearray(len(DATA))
        assert f.read(buf) == len(DATA)
        assert bytes(buf) == DATA
        assert str(path) in repr(f)


def test_path_of_wrong_type_raises_type_error():
    with pytest.raises(TypeError):
        kvikpy.CuFile(12345, "r")  # type: ignore[arg-type]


def test_context_manager_returns_the_file_and_closes_it(file_with):
    path = file_with(DATA)
    f = kvikpy.CuFile(path)
    with f as g:
        assert g is f
        assert not f.closed
    assert f.closed


def test_context_manager_closes_on_exception_and_propagates_it(file_with):
    path = file_with(DATA)
    with pytest.raises(ZeroDivisionError), kvikpy.CuFile(path) as f:
        raise ZeroDivisionError
    assert f.closed


def test_close_is_idempotent(file_with):
    f = kvikpy.CuFile(file_with(DATA))
    assert f.closed is False
    f.close()
    assert f.closed is True
    f.close()
    f.close()
    assert f.closed is True


def test_close_releases_both_descriptors(file_with):
    path = file_with(DATA)
    before = fd_count()
    files = [kvikpy.CuFile(path, "r+") for _ in range(20)]
    assert fd_count() > before
    fds = [f.fileno() for f in files]
    for f in files:
        f.close()
    assert fd_count() == before
    for fd in fds:
        with pytest.raises(OSError) as info:
            os.fstat(fd)
        assert info.value.errno == errno.EBADF


def test_dropping_an_open_file_releases_its_descriptors(file_with):
    path = file_with(DATA)
    before = fd_count()
    for _ in range(20):
        f = kvikpy.CuFile(path, "r")
        assert f.nbytes() == len(DATA)
    del f
    gc.collect()
    assert fd_count() == before


def test_fileno_is_the_files_descriptor(file_with):
    path = file_with(DATA)
    with kvikpy.CuFile(path, "r") as f:
        fd = f.fileno()
        assert isinstance(fd, int)
        st = os.fstat(fd)
        assert (st.st_dev, st.st_ino) == (path.stat().st_dev, path.stat().st_ino)
        assert os.pread(fd, 100, 50) == DATA[50:150]


def test_nbytes_is_the_file_size_and_follows_writes(file_with):
    path = file_with(DATA)
    with kvikpy.CuFile(path, "r+") as f:
        assert f.nbytes() == len(DATA) == os.path.getsize(path)
        f.write(b"abc", file_offset=len(DATA) + 10)
        assert f.nbytes() == len(DATA) + 13 == os.path.getsize(path)
        os.truncate(path, 7)
        assert f.nbytes() == 7


def test_is_direct_io_supported_matches_an_o_direct_probe(file_with):
    path = file_with(DATA)
    with kvikpy.CuFile(path) as f:
        supported = f.is_direct_io_supported()
        assert isinstance(supported, bool)
        assert supported == o_direct_supported(path)


def test_is_direct_io_supported_on_tmpfs_matches_probe(tmpfs_dir):
    path = tmpfs_dir / "f.bin"
    path.write_bytes(DATA)
    with kvikpy.CuFile(path, "r+") as f:
        assert f.is_direct_io_supported() == o_direct_supported(path)


def test_repr_mentions_path_mode_and_state(file_with):
    path = file_with(DATA)
    f = kvikpy.CuFile(path, "r+")
    r = repr(f)
    assert str(path) in r
    assert "r+" in r
    assert "open" in r
    f.close()
    r = repr(f)
    assert str(path) in r
    assert "closed" in r


# ---------------------------------------------------------------------------------------
# Errors are Python's own


@pytest.mark.parametrize("mode", ["r", "rb", "r+"])
def test_missing_file_raises_file_not_found(tmp_path, mode):
    path = tmp_path / "missing.bin"
    with pytest.raises(FileNotFoundError) as info:
        kvikpy.CuFile(path, mode)
    assert info.value.errno == errno.ENOENT
    assert info.value.filename == str(path)
    assert not path.exists()


@pytest.mark.parametrize("mode", ["w", "w+"])
def test_w_in_missing_directory_raises_file_not_found(tmp_path, mode):
    path = tmp_path / "no-such-dir" / "f.bin"
    with pytest.raises(FileNotFoundError) as info:
        kvikpy.CuFile(str(path), mode)
    assert info.value.errno == errno.ENOENT
    assert info.value.filename == str(path)


@pytest.mark.parametrize("mode", ["r", "rb", "r+", "w", "w+"])
def test_directory_raises_is_a_directory(tmp_path, mode):
    d = tmp_path / "d"
    d.mkdir()
    (d / "inside").write_bytes(DATA)
    with pytest.raises(IsADirectoryError) as info:
        kvikpy.CuFile(d, mode)
    assert info.value.errno == errno.EISDIR
    assert info.value.filename == str(d)
    assert d.is_dir()
    assert (d / "inside").read_bytes() == DATA


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores file permissions")
@pytest.mark.parametrize("mode", ["r", "r+", "w", "w+"])
def test_no_permission_raises_permission_error(file_with, mode):
    path = file_with(DATA)
    path.chmod(0)
    try:
        with pytest.raises(PermissionError) as info:
            kvikpy.CuFile(path, mode)
        assert info.value.errno == errno.EACCES
        assert info.value.filename == str(path)
    finally:
        path.chmod(0o644)
    assert path.read_bytes() == DATA


@pytest.mark.parametrize("mode", ["r+", "w", "w+"])
def test_immutable_file_raises_permission_error_even_for_root(file_with, mode):
    """EPERM (chattr +i) maps to PermissionError too; this variant also runs as root."""
    chattr = shutil.which("chattr")
    if chattr is None:
        pytest.skip("chattr is not installed")
    path = file_with(DATA)
    done = subprocess.run([chattr, "+i", str(path)], capture_output=True, check=False)
    if done.returncode != 0:
        pytest.skip(f"cannot make files immutable here: {done.stderr!r}")
    try:
        with pytest.raises(PermissionError) as info:
            kvikpy.CuFile(path, mode)
        assert info.value.errno in (errno.EPERM, errno.EACCES)
        assert info.value.filename == str(path)
    finally:
        subprocess.run([chattr, "-i", str(path)], check=True)
    assert path.read_bytes() == DATA


@pytest.mark.parametrize("method", ["read", "pread"])
@pytest.mark.parametrize("mode", ["w", "wb"])
def test_reading_a_write_only_file_raises_unsupported_operation(tmp_path, method, mode):
    path = tmp_path / "f.bin"
    with kvikpy.CuFile(path, mode) as f:
        f.write(DATA)
        sentinel = random_bytes(1000, seed=3)
        buf = bytearray(sentinel)
        with pytest.raises(io.UnsupportedOperation) as info:
            result = getattr(f, method)(buf)
            if method == "pread":
                result.get()
        assert isinstance(info.value, OSError)
        assert bytes(buf) == sentinel
    assert path.read_bytes() == DATA


@pytest.mark.parametrize("method", ["write", "pwrite"])
@pytest.mark.parametrize("mode", ["r", "rb"])
def test_writing_a_read_only_file_raises_unsupported_operation(file_with, method, mode):
    path = file_with(DATA)
    with kvikpy.CuFile(path, mode) as f:
        with pytest.raises(io.UnsupportedOperation) as info:
            result = getattr(f, method)(random_bytes(5000, seed=4), file_offset=100)
            if method == "pwrite":
                result.get()
        assert isinstance(info.value, OSError)
        with pytest.raises(io.UnsupportedOperation):
            f.write(random_bytes(5000, seed=4), file_offset=len(DATA) + 100)
    assert path.read_bytes() == DATA


CLOSED_CALLS = {
    "read": lambda f: f.read(bytearray(10)),
    "write": lambda f: f.write(b"0123456789"),
    "pread": lambda f: f.pread(bytearray(10)).get(),
    "pwrite": lambda f: f.pwrite(b"0123456789").get(),
    "nbytes": lambda f: f.nbytes(),
    "fileno": lambda f: f.fileno(),
    "open_flags": lambda f: f.open_flags(),
    "is_direct_io_supported": lambda f: f.is_direct_io_supported(),
    "raw_read": lambda f: f.raw_read(bytearray(10)),
    "raw_write": lambda f: f.raw_write(b"0123456789"),
    "raw_read_async": lambda f: f.raw_read_async(bytearray(10), None),
    "raw_write_async": lambda f: f.raw_write_async(b"0123456789", None),
}


@pytest.mark.parametrize("call", list(CLOSED_CALLS))
def test_io_on_a_closed_file_raises_value_error(file_with, call):
    path = file_with(DATA)
    f = kvikpy.CuFile(path, "r+")
    f.close()
    with pytest.raises(ValueError, match=r"^I/O operation on closed file"):
        CLOSED_CALLS[call](f)
    assert path.read_bytes() == DATA


RAW_CALLS = {
    "raw_read": lambda f, b: f.raw_read(b),
    "raw_write": lambda f, b: f.raw_write(b),
    "raw_read_async": lambda f, b: f.raw_read_async(b, None),
    "raw_write_async": lambda f, b: f.raw_write_async(b, None),
}


@pytest.mark.parametrize("call", list(RAW_CALLS))
@pytest.mark.parametrize(
    "make_buf",
    [
        lambda: bytearray(random_bytes(100, seed=5)),
        lambda: np.frombuffer(bytearray(random_bytes(800, seed=5)), dtype=np.float64),
        lambda: memoryview(bytearray(random_bytes(100, seed=5))),
    ],
    ids=["bytearray", "ndarray", "memoryview"],
)
def test_raw_calls_reject_host_buffers(file_with, call, make_buf):
    path = file_with(DATA)
    buf = make_buf()
    before = bytes(memoryview(buf))
    with kvikpy.CuFile(path, "r+") as f, pytest.raises(ValueError) as info:
        RAW_CALLS[call](f, buf)
    assert "host" in str(info.value)
    assert bytes(memoryview(buf)) == before
    assert path.read_bytes() == DATA


@pytest.mark.parametrize("call", list(RAW_CALLS))
def test_raw_calls_reject_non_buffers(file_with, call):
    path = file_with(DATA)
    with kvikpy.CuFile(path, "r+") as f, pytest.raises(TypeError):
        RAW_CALLS[call](f, [1, 2, 3])
    assert path.read_bytes() == DATA
