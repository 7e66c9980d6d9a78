"""Paths as Python's ``open`` takes them (``str``, ``bytes``, ``os.PathLike`` of either,
names that are not UTF-8), and pseudo-files that report size 0 but have content."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from conftest import random_bytes
from test_safetensors import sample, write_safetensors

import kvikpy
import kvikpy.numpy
import kvikpy.safetensors

DATA = random_bytes(10_000, seed=21)


class BytesPathLike:
    def __init__(self, path: bytes) -> None:
        self._path = path

    def __fspath__(self) -> bytes:
        return self._path


@pytest.fixture(params=["str", "bytes", "pathlib", "bytes-pathlike", "non-utf8-bytes"])
def spelled(request, tmp_path):
    """A file holding DATA, and its path spelled one of the ways ``open`` accepts."""
    name = b"d\xff\xfe.bin" if request.param == "non-utf8-bytes" else b"data.bin"
    raw = os.fsencode(tmp_path) + b"/" + name
    with open(raw, "wb") as f:
        f.write(DATA)
    spelling = {
        "str": os.fsdecode(raw),
        "bytes": raw,
        "pathlib": Path(os.fsdecode(raw)),
        "bytes-pathlike": BytesPathLike(raw),
        "non-utf8-bytes": raw,
    }[request.param]
    return raw, spelling


def test_cufile_takes_the_path(spelled):
    raw, path = spelled
    buf = bytearray(len(DATA))
    with kvikpy.CuFile(path) as f:
        assert f.nbytes() == len(DATA)
        assert f.read(buf) == len(DATA)
    assert bytes(buf) == DATA
    assert os.fsencode(kvikpy.CuFile(path).path) == raw


def test_read_and_write_take_the_path(spelled):
    raw, path = spelled
    assert bytes(kvikpy.read(path, device="cpu")) == DATA
    assert kvikpy.write(path, b"XYZ", offset=5) == 3
    with open(raw, "rb") as f:
        assert f.read() == DATA[:5] + b"XYZ" + DATA[8:]


def test_numpy_helpers_take_the_path(spelled):
    raw, path = spelled
    assert kvikpy.numpy.fromfile(path, dtype="u1").tobytes() == DATA
    kvikpy.numpy.tofile(np.arange(10, dtype="i4"), path)
    with open(raw, "rb") as f:
        assert f.read() == np.arange(10, dtype="i4").tobytes()


def test_batches_and_chunks_take_the_path(spelled):
    _, path = spelled
    assert bytes(kvikpy.read_many([path, path], device="cpu")[1]) == DATA
    assert bytes(kvikpy.read_ranges(path, [(10, 20)], device="cpu")[0]) == DATA[10:30]
    chunks = b"".join(bytes(c) for c in kvikpy.iter_chunks(path, 4096, device="cpu"))
    assert chunks == DATA


def test_safetensors_takes_a_bytes_path(tmp_path):
    tensors = sample()
    write_safetensors(tmp_path / "m.safetensors", tensors)
    raw = os.fsencode(tmp_path / "m.safetensors")
    loaded = kvikpy.safetensors.load_file(raw, device="cpu", framework="numpy")
    assert set(loaded) == set(tensors)
    for name, value in tensors.items():
        np.testing.assert_array_equal(loaded[name], value)


def test_a_non_path_is_a_type_error():
    with pytest.raises(TypeError, match=r"str, bytes or os\.PathLike"):
        kvikpy.CuFile(3.5)  # type: ignore[arg-type]


# --- pseudo-files --------------------------------------------------------------------------

PSEUDO = "/proc/version"  # reports 0 bytes, has stable content


@pytest.fixture
def pseudo() -> bytes:
    if not os.path.exists(PSEUDO) or os.stat(PSEUDO).st_size != 0:
        pytest.skip(f"{PSEUDO} is not a size-0 pseudo-file here")
    with open(PSEUDO, "rb") as f:
        content = f.read()
    assert content
    return content


def test_a_host_read_of_a_pseudo_file_reads_to_its_end(pseudo):
    assert bytes(kvikpy.read(PSEUDO, device="cpu")) == pseudo
    assert bytes(kvikpy.read(PSEUDO, device="cpu", offset=3, size=5)) == pseudo[3:8]
    with pytest.raises(ValueError, match="past the end"):
        kvikpy.read(PSEUDO, device="cpu", offset=0, size=len(pseudo) + 1)


def test_numpy_fromfile_of_a_pseudo_file_reads_to_its_end(pseudo):
    assert kvikpy.numpy.fromfile(PSEUDO, dtype="u1").tobytes() == pseudo
    assert kvikpy.numpy.fromfile(PSEUDO, dtype="u1", offset=2, count=4).tobytes() == pseudo[2:6]


def test_cufile_reads_a_pseudo_file_into_a_buffer(pseudo):
    buf = bytearray(len(pseudo) + 10)
    with kvikpy.CuFile(PSEUDO) as f:
        assert f.read(buf) == len(pseudo)
    assert bytes(buf[: len(pseudo)]) == pseudo


@pytest.mark.parametrize(
    ("call", "what"),
    [
        (lambda: kvikpy.read_many([PSEUDO], device="cpu"), "a batch"),
        (lambda: kvikpy.read_ranges(PSEUDO, [(0, 4)], device="cpu"), "read_ranges"),
        (lambda: kvikpy.iter_chunks(PSEUDO, 4096, device="cpu"), "iter_chunks"),
    ],
)
def test_sized_reads_of_a_pseudo_file_say_why_they_cannot(pseudo, call, what):
    with pytest.raises(ValueError, match=f"reports a size of 0 bytes but has content.*{what}"):
        call()


def test_a_skipped_batch_reports_the_pseudo_file_as_a_failure(pseudo, tmp_path):
    (tmp_path / "ok.bin").write_bytes(DATA)
    batch = kvikpy.read_many([tmp_path / "ok.bin", PSEUDO], device="cpu", errors="skip")
    assert bytes(batch[0]) == DATA
    assert 1 in dict(batch.failures)


def test_empty_regular_files_are_still_empty(tmp_path):
    (tmp_path / "e.bin").write_bytes(b"")
    assert kvikpy.read(tmp_path / "e.bin", device="cpu").nbytes == 0
    assert kvikpy.read_many([tmp_path / "e.bin"], device="cpu")[0].nbytes == 0


@pytest.mark.gpu
def test_a_device_read_of_a_pseudo_file_says_why_it_cannot(pseudo):
    with pytest.raises(ValueError, match="reports a size of 0 bytes but has content"):
        kvikpy.read(PSEUDO, device="cuda")


def test_the_url_schemes_are_the_engines():
    """One list of URL schemes: Python's is_url asks the engine's, in any letter case."""
    from kvikpy import _lib
    from kvikpy._paths import is_url

    schemes = _lib.url_schemes()
    assert schemes == ["http", "https", "s3", "webhdfs"]
    for scheme in schemes:
        assert is_url(f"{scheme}://host/key") and is_url(f"{scheme.upper()}://host/key")
    assert not is_url("ftp://host/key") and not is_url("/data/http://x")
