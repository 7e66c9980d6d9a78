"""kvikpy.read / kvikpy.write / kvikpy.Buffer on host memory, and CUDA-less behaviour."""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
from conftest import crossings, random_bytes
from hypothesis import example, given, settings
from hypothesis import strategies as st

import kvikpy
from kvikpy import _args
from kvikpy._cuda_streams import stream_handle


def test_read_cpu_round_trip(tmp_path: Path) -> None:
    data = random_bytes(100_003, seed=5)
    p = tmp_path / "d.bin"
    p.write_bytes(data)
    buf = kvikpy.read(p, device="cpu")
    assert isinstance(buf, kvikpy.Buffer)
    assert buf.nbytes == len(data) and buf.device == "cpu" and buf.shape == (len(data),)
    assert bytes(memoryview(buf)) == data
    assert np.from_dlpack(buf).tobytes() == data
    part = kvikpy.read(p, device="cpu", offset=10, size=100)
    assert bytes(memoryview(part)) == data[10:110]
    assert kvikpy.read(p, device="cpu", offset=len(data)).nbytes == 0
    out = tmp_path / "o.bin"
    assert kvikpy.write(out, buf) == len(data)
    assert out.read_bytes() == data
    assert kvikpy.write(out, b"xyz", offset=2) == 3
    assert out.read_bytes() == data[:2] + b"xyz" + data[5:]


def test_read_cpu_typed(tmp_path: Path) -> None:
    a = np.random.default_rng(0).standard_normal((7, 5))
    p = tmp_path / "a.bin"
    a.tofile(p)
    buf = kvikpy.read(p, device="cpu", dtype="float64", shape=(7, 5))
    assert buf.typestr == "<f8" and buf.shape == (7, 5)
    assert np.array_equal(np.asarray(memoryview(buf)), a)
    assert np.array_equal(np.from_dlpack(buf), a)
    with pytest.raises(ValueError, match="whole number"):
        kvikpy.read(p, device="cpu", size=13, dtype="float64")
    with pytest.raises(ValueError, match="needs"):
        kvikpy.read(p, device="cpu", dtype="float64", shape=(6, 5))
    with pytest.raises(ValueError, match="DLPack"):
        kvikpy.read(p, device="cpu", dtype="M8[s]")


def test_read_range_errors_name_the_file_size(tmp_path: Path) -> None:
    p = tmp_path / "d.bin"
    p.write_bytes(random_bytes(1000))
    with pytest.raises(ValueError, match="1000 bytes"):
        kvikpy.read(p, device="cpu", offset=900, size=200)
    with pytest.raises(ValueError, match="1000 bytes"):
        kvikpy.read(p, device="cpu", offset=1001)
    with pytest.raises(ValueError, match="non-negative"):
        kvikpy.read(p, device="cpu", offset=-1)
    with pytest.raises(FileNotFoundError):
        kvikpy.read(tmp_path / "missing", device="cpu")
    with pytest.raises(ValueError, match="device must be"):
        kvikpy.read(p, device="tpu")
    with pytest.raises(ValueError, match="stream"):
        kvikpy.read(p, device="cpu", stream=0)


@pytest.mark.skipif("kvikpy.cuda_available()")
def test_gpu_without_cuda_says_to_use_cpu(tmp_path: Path) -> None:
    p = tmp_path / "d.bin"
    original = random_bytes(10)
    p.write_bytes(original)
    assert kvikpy.device_count() == 0
    with pytest.raises(kvikpy.CudaUnavailableError, match="device='cpu'") as info:
        kvikpy.read(p)
    assert isinstance(info.value, kvikpy.KvikpyError) and isinstance(info.value, RuntimeError)
    with pytest.raises(kvikpy.CudaUnavailableError):
        kvikpy.read(p, device="cuda:0")

    class FakeCai:
        __cuda_array_interface__ = {  # noqa: RUF012
            "shape": (10,),
            "typestr": "|u1",
            "data": (1 << 40, False),
            "version": 2,
        }

    with kvikpy.CuFile(p) as f, pytest.raises(kvikpy.CudaUnavailableError):
        f.read(FakeCai())
    assert p.read_bytes() == original


def test_buffer_dlpack_export_rules(tmp_path: Path) -> None:
    p = tmp_path / "d.bin"
    p.write_bytes(random_bytes(64))
    buf = kvikpy.read(p, device="cpu")
    assert buf.__dlpack_device__() == (1, 0)
    with pytest.raises(BufferError, match="stream"):
        buf.__dlpack__(stream=1)
    with pytest.raises(BufferError, match="copy"):
        buf.__dlpack__(copy=True)
    with pytest.raises(BufferError):
        buf.__dlpack__(dl_device=(2, 0))
    legacy = buf.__dlpack__()
    versioned = buf.__dlpack__(max_version=(1, 0))
    assert "dltensor" in repr(legacy) and "dltensor_versioned" in repr(versioned)
    del legacy, versioned  # unconsumed capsules free their tensors
    with pytest.raises(AttributeError):
        _ = buf.__cuda_array_interface__
    view = buf.view("<u4", 1, 32, [16])
    assert view.nbytes == 64 and np.from_dlpack(view).dtype == np.uint32
    with pytest.raises(ValueError):
        buf.view("<u4", 1, 32, [17])
    assert "64 B on cpu" in repr(buf)


@pytest.mark.parametrize(
    ("typestr", "code", "bits"),
    [("<u4", 1, 16), ("<u", 1, 32), ("u4", 1, 32), ("!u4", 1, 32), ("<4u", 1, 32), ("<u0", 1, 0)],
)
def test_a_view_refuses_a_dtype_it_cannot_parse(typestr: str, code: int, bits: int) -> None:
    """The typestr is parsed once, when the view is made: a malformed one, or one whose
    item size disagrees with the bit width, is a ValueError there, not at an export."""
    from kvikpy import _lib

    buf = _lib.Buffer.allocate(64, None, False)
    with pytest.raises(ValueError, match="is not an item type"):
        buf.view(typestr, code, bits, [16])


def test_host_memory_is_none_not_a_sentinel() -> None:
    """``ordinal=None`` is host memory; -1 is no longer a way to say it."""
    from kvikpy import _lib

    buf = _lib.Buffer.allocate(16, None, False)
    assert (buf.device, buf.is_pinned, buf.nbytes) == ("cpu", False, 16)
    with pytest.raises(OverflowError):
        _lib.Buffer.allocate(16, -1, False)


def test_stream_handles() -> None:
    assert stream_handle(None) == 0
    assert stream_handle(7) == 7

    class Torchish:
        cuda_stream = 0x1234

    class Cupyish:
        ptr = 0x5678

    class Protocol:
        def __cuda_stream__(self) -> tuple[int, int]:
            return (0, 0x9ABC)

    assert stream_handle(Torchish()) == 0x1234
    assert stream_handle(Cupyish()) == 0x5678
    assert stream_handle(Protocol()) == 0x9ABC
    with pytest.raises(TypeError):
        stream_handle("stream")
    with pytest.raises(ValueError):
        stream_handle(-1)
    with pytest.raises(TypeError):
        stream_handle(True)


def test_a_host_allocation_that_cannot_be_made_is_a_memory_error():
    from kvikpy import _lib

    with pytest.raises(MemoryError):
        _lib.Buffer.allocate(1 << 60, None, False)


def test_write_keeps_the_bytes_around_its_range(tmp_path: Path) -> None:
    """An existing file is written in place: the bytes before and after the range stay."""
    data = random_bytes(10_000, seed=61)
    p = tmp_path / "keep.bin"
    p.write_bytes(data)
    assert kvikpy.write(p, np.full(100, 7, dtype=np.uint8), offset=4_000) == 100
    assert p.read_bytes() == data[:4_000] + bytes([7] * 100) + data[4_100:]
    assert kvikpy.write(p, b"tail", offset=len(data) + 2) == 4  # past the end: a hole
    assert p.read_bytes() == data[:4_000] + bytes([7] * 100) + data[4_100:] + b"\0\0tail"


def test_write_creates_a_missing_file(tmp_path: Path) -> None:
    p = tmp_path / "new.bin"
    assert kvikpy.write(p, b"abc", offset=3) == 3
    assert p.read_bytes() == b"\0\0\0abc"
    with pytest.raises(FileNotFoundError):
        kvikpy.write(tmp_path / "no-such-dir" / "f.bin", b"abc")


@pytest.mark.parametrize("exists", [True, False])
def test_write_does_not_decide_from_a_look_at_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exists: bool
) -> None:
    """Another process may create or remove the file at any moment, so write opens it in
    one call (O_CREAT without O_TRUNC) instead of choosing a mode from a check first. Here
    every check lies, as a check made just before the other process acted would: a file
    created meanwhile must not be truncated, one removed meanwhile must be created."""
    import os

    p = tmp_path / "raced.bin"
    if exists:
        p.write_bytes(b"0123456789")
    monkeypatch.setattr(os.path, "exists", lambda path: not exists)
    monkeypatch.setattr(os.path, "isfile", lambda path: not exists)
    assert kvikpy.write(p, b"ab", offset=4) == 2
    assert p.read_bytes() == (b"0123ab6789" if exists else b"\0\0\0\0ab")


def test_write_opens_read_write_without_truncating(tmp_path: Path) -> None:
    """The open kvikpy.write uses: read and write (O_RDWR), reported as mode ``r+``."""
    import os

    p = tmp_path / "f.bin"
    p.write_bytes(b"xyz")
    with kvikpy.CuFile._create_keep(p) as f:
        assert f.open_flags() & os.O_ACCMODE == os.O_RDWR
        assert f.mode == "r+"
        assert f.nbytes() == 3  # not truncated by the open
    with kvikpy.CuFile._create_keep(tmp_path / "g.bin") as f:
        assert f.nbytes() == 0
    assert (tmp_path / "g.bin").exists()


def test_a_host_read_crosses_into_the_engine_once(tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(bytes(range(256)) * 16)
    kvikpy.read(path, device="cpu", dtype="uint16")  # warm: first calls import modules
    for kwargs in ({}, {"offset": 16, "size": 64, "shape": (4, -1)}):
        read = functools.partial(kvikpy.read, path, device="cpu", dtype="u2", **kwargs)
        calls = crossings(read)
        assert calls == ["read_file"], calls


_INTEGER_LIKE = st.one_of(
    st.integers(min_value=-(2**66), max_value=2**66),
    st.booleans(),
    st.floats(allow_nan=False),
    st.text(max_size=3),
    st.none(),
    st.complex_numbers(max_magnitude=10),
    st.integers(min_value=-(2**63), max_value=2**63 - 1).map(np.int64),
    st.integers(min_value=0, max_value=2**64 - 1).map(np.uint64),
    st.booleans().map(np.bool_),
)


@settings(max_examples=300, deadline=None)
@given(value=_INTEGER_LIKE)
@example(value=-(2**63) - 1)  # negative before it is out of range
@example(value=2**63)
@example(value=np.bool_(True))
def test_the_python_api_and_the_extension_take_integers_alike(value: object) -> None:
    """The integer rule is written twice, once per side of the boundary (``kvikpy._args``
    for the pure-Python APIs, the extension's argument conversion for ``CuFile`` and the
    rest): both take the same values and refuse the others with the same exception."""

    def outcome(check: Callable[[], object]) -> str:
        try:
            check()
        except (TypeError, ValueError, OverflowError) as e:
            return type(e).__name__
        return "taken"

    python = outcome(lambda: _args.non_negative("offset", value))
    with kvikpy.CuFile(Path(__file__)) as f:
        extension = outcome(lambda: f.read(bytearray(0), file_offset=value))
    assert python == extension, (value, python, extension)
