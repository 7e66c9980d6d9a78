"""kvikpy.numpy.fromfile / tofile against numpy.fromfile / ndarray.tofile."""

from __future__ import annotations

import io

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


# --- open file objects, as numpy.fromfile / ndarray.tofile take them ---------------------


@pytest.mark.parametrize("dtype", ["u1", "int64", "float32", STRUCT])
def test_fromfile_reads_an_open_file_object(data_file, dtype):
    with open(data_file, "rb") as fh:
        got = knp.fromfile(fh, dtype=dtype)
    expected = np.fromfile(data_file, dtype=dtype)
    assert got.tobytes() == expected.tobytes()


@pytest.mark.parametrize(("skip", "count", "offset"), [(0, -1, 0), (16, 3, 8), (5, 10, 3)])
def test_fromfile_starts_at_the_file_position_and_moves_it_like_numpy(
    data_file, skip, count, offset
):
    with open(data_file, "rb") as fh:
        fh.read(skip)  # buffered: the object's position is not the descriptor's
        got = knp.fromfile(fh, dtype="i2", count=count, offset=offset)
        ours_after = fh.tell()
        following = fh.read(4)
    with open(data_file, "rb") as fh:
        fh.read(skip)
        expected = np.fromfile(fh, dtype="i2", count=count, offset=offset)
        theirs_after = fh.tell()
        assert following == fh.read(4)
    assert got.tobytes() == expected.tobytes()
    assert ours_after == theirs_after


def test_fromfile_takes_any_object_with_fileno(data_file):
    import tempfile

    with tempfile.TemporaryFile() as tmp:  # not an io.FileIO on every platform
        tmp.write(data_file.read_bytes())
        tmp.seek(0)
        assert knp.fromfile(tmp, dtype="u1").tobytes() == data_file.read_bytes()


def test_fromfile_takes_a_wrapper_that_forwards_fileno(data_file):
    # NamedTemporaryFile's object forwards fileno() through __getattr__: from Python
    # 3.12 an isinstance check against a runtime-checkable protocol does not see it.
    import tempfile

    with tempfile.NamedTemporaryFile() as tmp:
        assert "fileno" not in type(tmp).__dict__
        tmp.write(data_file.read_bytes())
        tmp.seek(0)
        assert knp.fromfile(tmp, dtype="u1").tobytes() == data_file.read_bytes()


def test_fromfile_sees_what_a_file_object_has_not_flushed_yet(tmp_path):
    path = tmp_path / "pending.bin"
    with open(path, "w+b") as fh:
        fh.write(b"\x01\x02\x03\x04")  # still in Python's buffer
        fh.seek(0)
        assert knp.fromfile(fh, dtype="u1").tolist() == [1, 2, 3, 4]


def test_fromfile_refuses_a_file_object_opened_for_writing(tmp_path):
    with (
        open(tmp_path / "w.bin", "wb") as fh,
        pytest.raises(io.UnsupportedOperation, match="Operation not permitted") as info,
    ):
        knp.fromfile(fh, dtype="u1")
    assert isinstance(info.value, RuntimeError)


def test_tofile_writes_into_a_file_object_where_it_stands_like_ndarray_tofile(tmp_path):
    ary = np.random.default_rng(68).random(100)
    for name, write in (("ours", knp.tofile), ("theirs", lambda a, fh: a.tofile(fh))):
        with open(tmp_path / name, "wb") as fh:
            fh.write(b"header")
            write(ary, fh)
            fh.write(b"trailer")
    assert (tmp_path / "ours").read_bytes() == (tmp_path / "theirs").read_bytes()
    assert (tmp_path / "ours").read_bytes()[6:-7] == ary.tobytes()


def test_tofile_into_a_file_object_does_not_truncate(file_with):
    path = file_with(random_bytes(1000, seed=69))
    before = path.read_bytes()
    with open(path, "r+b") as fh:
        fh.seek(100)
        knp.tofile(np.arange(10, dtype="u1"), fh)
        assert fh.tell() == 110
    assert path.read_bytes() == before[:100] + bytes(range(10)) + before[110:]


def test_tofile_refuses_a_file_object_opened_for_reading(file_with):
    path = file_with(random_bytes(100, seed=70))
    before = path.read_bytes()
    with open(path, "rb") as fh, pytest.raises(io.UnsupportedOperation) as info:
        knp.tofile(np.arange(10, dtype="u1"), fh)
    assert isinstance(info.value, RuntimeError)
    assert path.read_bytes() == before


@pytest.mark.parametrize("bad", [1.5, None, 3])
def test_a_file_that_is_neither_path_nor_file_object_is_a_type_error(bad):
    for call in (lambda: knp.fromfile(bad), lambda: knp.tofile(np.zeros(1), bad)):
        with pytest.raises(TypeError, match="path"):
            call()


# --- LikeWrapper: numpy.fromfile itself reads through kvikpy ---------------------------


@pytest.mark.parametrize("dtype", ["u1", "int64", "float32", "float64"])
def test_likewrapper_routes_numpy_fromfile_through_kvikpy(tmp_path, dtype):
    """kvikio's test_fromfile, with numpy arrays."""
    path = str(tmp_path / "like.bin")
    src = np.arange(100, dtype=dtype)
    src.tofile(path)
    like = knp.LikeWrapper(like=np.empty(()))
    for got in (
        np.fromfile(path, dtype, like=like),
        np.fromfile(path, dtype=dtype, like=like),
        np.fromfile(file=path, dtype=dtype, like=like),
    ):
        assert type(got) is np.ndarray
        np.testing.assert_array_equal(got, src)
    np.testing.assert_array_equal(np.fromfile(path, dtype=dtype, count=58, like=like), src[:58])
    got = np.fromfile(path, dtype=dtype, offset=src.itemsize, like=like)
    np.testing.assert_array_equal(got, src[1:])
    assert len(np.fromfile(path, dtype=dtype, offset=1, count=10, like=like)) == 10
    got = np.fromfile(path, dtype="u1", offset=7, like=like)
    np.testing.assert_array_equal(got, src.view("u1")[7:])
    with open(path, "rb") as fh:
        np.testing.assert_array_equal(np.fromfile(file=fh, dtype=dtype, like=like), src)


def test_likewrapper_errors_are_kvikpy_s(tmp_path):
    """numpy.fromfile would parse text and accept count=-42 as "all": these errors show the
    call went through kvikpy (kvikio's test_fromfile_error)."""
    path = tmp_path / "one.bin"
    np.arange(1, dtype="u1").tofile(path)
    like = knp.LikeWrapper(like=np.empty(1, dtype="u1"))
    with pytest.raises(FileNotFoundError, match="no file"):
        np.fromfile("no file", like=like)
    with pytest.raises(NotImplementedError, match=r"Non-default value of the `sep`"):
        np.fromfile(file=path, sep=",", like=like)
    with pytest.raises(ValueError, match=r"[Nn]egative dimensions are not allowed"):
        np.fromfile(file=path, like=like, count=-42)


def test_likewrapper_leaves_other_numpy_functions_alone():
    like = knp.LikeWrapper(np.empty(0))
    got = np.empty(3, like=like)
    assert type(got) is np.ndarray and got.shape == (3,)
    np.testing.assert_array_equal(np.array([1, 2], like=like), [1, 2])
    assert "numpy.ndarray" in repr(like)
