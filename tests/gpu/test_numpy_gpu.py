"""kvikpy.numpy with CuPy: ``LikeWrapper`` makes ``numpy.fromfile`` (and
``cupy.fromfile``) return CuPy arrays read by kvikpy; ``fromfile`` and ``tofile`` move
GPU arrays through paths and open file objects."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from kvikpy.numpy import LikeWrapper, fromfile, tofile

cupy = pytest.importorskip("cupy")


@pytest.mark.parametrize("dtype", ["u1", "int64", "float32", "float64"])
def test_numpy_fromfile_with_likewrapper_returns_cupy(tmp_path: Path, dtype: str) -> None:
    path = str(tmp_path / "like.bin")
    src = np.arange(100, dtype=dtype)
    src.tofile(path)
    like = LikeWrapper(like=cupy.empty(()))
    got = np.fromfile(path, dtype=dtype, like=like)
    assert isinstance(got, cupy.ndarray)
    np.testing.assert_array_equal(cupy.asnumpy(got), src)
    got = np.fromfile(file=path, dtype=dtype, count=58, offset=src.itemsize, like=like)
    assert isinstance(got, cupy.ndarray)
    np.testing.assert_array_equal(cupy.asnumpy(got), src[1:59])
    with open(path, "rb") as fh:
        got = np.fromfile(fh, dtype=dtype, like=like)
    np.testing.assert_array_equal(cupy.asnumpy(got), src)


def test_cupy_fromfile_with_likewrapper(tmp_path: Path) -> None:
    path = str(tmp_path / "cupy.bin")
    src = np.random.default_rng(5).random(1000)
    src.tofile(path)
    got = cupy.fromfile(path, dtype="f8", like=LikeWrapper(cupy.empty(())))
    assert isinstance(got, cupy.ndarray)
    np.testing.assert_array_equal(cupy.asnumpy(got), src)


def test_likewrapper_errors_come_from_kvikpy(tmp_path: Path) -> None:
    path = tmp_path / "one.bin"
    np.arange(1, dtype="u1").tofile(path)
    like = LikeWrapper(like=cupy.arange(1, dtype="u1"))
    with pytest.raises(FileNotFoundError, match="no file"):
        np.fromfile("no file", like=like)
    with pytest.raises(NotImplementedError, match=r"Non-default value of the `sep`"):
        np.fromfile(file=path, sep=",", like=like)
    with pytest.raises(ValueError, match=r"[Nn]egative dimensions are not allowed"):
        np.fromfile(file=path, like=like, count=-42)


@pytest.mark.parametrize("dtype", ["u1", "int64", "float32", "float64"])
def test_tofile_of_cupy_arrays(tmp_path: Path, dtype: str) -> None:
    """kvikio's test_tofile with CuPy: contiguous and strided arrays, path and file object."""
    path = tmp_path / "tofile.bin"
    src = cupy.arange(100, dtype=dtype)
    tofile(src, path)
    np.testing.assert_array_equal(np.fromfile(path, dtype=dtype), cupy.asnumpy(src))
    tofile(src[::2], path)
    np.testing.assert_array_equal(np.fromfile(path, dtype=dtype), cupy.asnumpy(src[::2]))
    with open(path, "wb") as fh:
        fh.write(b"head")
        tofile(src, fh)
        fh.write(b"tail")
    raw = path.read_bytes()
    assert raw[:4] == b"head" and raw[-4:] == b"tail"
    assert raw[4:-4] == cupy.asnumpy(src).tobytes()


def test_fromfile_into_cupy_from_a_file_object_position(tmp_path: Path) -> None:
    path = tmp_path / "pos.bin"
    src = np.arange(64, dtype="int32")
    src.tofile(path)
    with open(path, "rb") as fh:
        fh.seek(16)
        got = fromfile(fh, dtype="int32", count=8, like=cupy.empty(0))
        assert fh.tell() == 16 + 32
    assert isinstance(got, cupy.ndarray)
    np.testing.assert_array_equal(cupy.asnumpy(got), src[4:12])
