"""kvikpy.numpy.fromfile / tofile against numpy.fromfile / ndarray.tofile."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import random_bytes

import kvikpy.numpy as knp

SIZE = 10_007  # not a multiple of any item size
STRUCT = [("a", "<i2"), ("b", "f8")]
DTYPES = ["u1", "i2", "<i4", ">i4", "f4", "float64", "complex128", "V3", STRUCT]


@pytest.fixture
def data_file(file_with):
    return file_with(random_bytes(SIZE, seed=61))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("count", [-1, 0, 1, 7, 1000, SIZE, 10**9])
@pytest.mark.parametrize("offset", [0, 1, 3, 8, 4096, SIZE - 1, SIZE])
def test_fromfile_matches_numpy(data_file, dtype, count, offset):
    expected = np.fromfile(data_file, dtype=dtype, count=count, offset=offset)
    got = knp.fromfile(data_file, dtype=dtype, count=count, offset=offset)
    assert type(got) is np.ndarray
    assert got.dtype == expected.dtype
    assert got.shape == expected.shape
    assert got.tobytes() == expected.tobytes()


@pytest.mark.parametrize("dtype", ["M8[s]", "m8[ns]"])
@pytest.mark.parametrize(("count", "offset"), [(-1, 0), (5, 3)])
def test_fromfile_datetime_dtypes_match_numpy(data_file, dtype, count, offset):
    """datetime64/timedelta64 arrays cannot export a buffer, but numpy.fromfile reads them."""
    expected = np.fromfile(data_file, dtype=dtype, count=count, offset=offset)
    got = knp.fromfile(data_file, dtype=dtype, count=count, offset=offset)
    assert got.dtype == expected.dtype
    assert got.view(np.uint8).tobytes() == expected.view(np.uint8).tobytes()


def test_fromfile_default_dtype_is_float(data_file):
    got = knp.fromfile(data_file)
    expected = np.fromfile(data_file)
    assert got.dtype == np.float64
    assert got.tobytes() == expected.tobytes()


def test_fromfile_positional_arguments_and_str_path(data_file):
    got = knp.fromfile(str(data_file), "i4", 5, "", 2)
    expected = np.fromfile(str(data_file), "i4", 5, "", 2)
    np.testing.assert_array_equal(got, expected)


def test_fromfile_like_numpy_array(data_file):
    got = knp.fromfile(data_file, dtype="f8", like=np.empty(0))
    assert type(got) is np.ndarray
    assert got.tobytes() == np.fromfile(data_file, dtype="f8").tobytes()


def test_fromfile_empty_file(file_with):
    path = file_with(b"", "empty.bin")
    got = knp.fromfile(path, dtype="i4")
    assert got.shape == (0,)
    assert got.dtype == np.int32


def test_fromfile_text_mode_is_not_implemented(data_file):
    with pytest.raises(NotImplementedError):
        knp.fromfile(data_file, dtype="f8", sep=",")
    with pytest.raises(NotImplementedError):
        knp.fromfile(data_file, sep=" ")


def test_fromfile_missing_file(tmp_path):
    with pytest.raises(FileNotFoundError):
        knp.fromfile(tmp_path / "missing.bin")


@pytest.mark.parametrize("kwargs", [{"offset": -1}, {"count": -2}])
def test_fromfile_bad_arguments(data_file, kwargs):
    with pytest.raises(ValueError):
        knp.fromfile(data_file, dtype="u1", **kwargs)


def _arrays():
    rng = np.random.default_rng(62)
    return {
        "u1": rng.integers(0, 256, 1001, dtype=np.uint8),
        "i4": rng.integers(-(2**31), 2**31 - 1, 333, dtype=np.int32),
        "f8": rng.random(257),
        "c8": (rng.random(10) + 1j * rng.random(10)).astype(np.complex64),
        "2d-C": rng.random((13, 7)),
        "empty": np.empty(0),
        "scalar": np.array(rng.random()),
    }


@pytest.mark.parametrize("name", list(_arrays()))
def test_tofile_matches_ndarray_tofile(tmp_path, name):
    ary = _arrays()[name]
    ours = tmp_path / "ours.bin"
    theirs = tmp_path / "theirs.bin"
    knp.tofile(ary, ours)
    ary.tofile(theirs)
    assert ours.read_bytes() == theirs.read_bytes()
    np.testing.assert_array_equal(knp.fromfile(ours, dtype=ary.dtype), ary.ravel())


def test_tofile_replaces_an_existing_longer_file(file_with):
    path = file_with(random_bytes(100_000, seed=63))
    ary = np.random.default_rng(64).random(10)
    knp.tofile(ary, path)
    assert path.read_bytes() == ary.tobytes()


def test_tofile_fortran_array_writes_c_order_like_ndarray_tofile(tmp_path):
    """ndarray.tofile (and kvikio.numpy.tofile) always write C order."""
    ary = np.asfortranarray(np.random.default_rng(65).random((13, 7)))
    knp.tofile(ary, tmp_path / "ours.bin")
    ary.tofile(tmp_path / "theirs.bin")
    assert (tmp_path / "ours.bin").read_bytes() == (tmp_path / "theirs.bin").read_bytes()


def test_tofile_non_contiguous_array_like_ndarray_tofile(tmp_path):
    """ndarray.tofile (and kvikio.numpy.tofile) accept strided arrays."""
    ary = np.random.default_rng(66).random(1000)[::3]
    knp.tofile(ary, tmp_path / "ours.bin")
    ary.tofile(tmp_path / "theirs.bin")
    assert (tmp_path / "ours.bin").read_bytes() == (tmp_path / "theirs.bin").read_bytes()


def test_tofile_then_fromfile_roundtrip(tmp_path):
    ary = np.random.default_rng(67).standard_normal(123_457).astype(np.float32)
    knp.tofile(ary, tmp_path / "f.bin")
    np.testing.assert_array_equal(knp.fromfile(tmp_path / "f.bin", dtype=np.float32), ary)
