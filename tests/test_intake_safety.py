"""No buffer a user can pass crashes the process or panics: objects' pointers are never
read or written as file bytes, and malformed ``__cuda_array_interface__`` dicts and
DLPack capsules give a ``TypeError``/``ValueError`` naming what is wrong, before any I/O
and without touching the file."""

from __future__ import annotations

import ctypes
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import random_bytes
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kvikpy
import kvikpy.numpy

FILE_SIZE = 8192
ARENA = 1 << 16  # every pointer a generated interface names lies inside this array


# Every entry point that takes a buffer, as (name, call(path, buf)).
def _cufile(method: str, *args: Any) -> Callable[[Path, Any], Any]:
    def call(path: Path, buf: Any) -> Any:
        with kvikpy.CuFile(path, "r+") as f:
            out = getattr(f, method)(buf, *args)
            return out.get() if method in ("pread", "pwrite") else out

    return call


ENTRY_POINTS: dict[str, Callable[[Path, Any], Any]] = {
    "CuFile.read": _cufile("read"),
    "CuFile.pread": _cufile("pread"),
    "CuFile.write": _cufile("write"),
    "CuFile.pwrite": _cufile("pwrite"),
    "CuFile.raw_read": _cufile("raw_read"),
    "CuFile.raw_write": _cufile("raw_write"),
    "CuFile.raw_read_async": _cufile("raw_read_async", 0),
    "CuFile.raw_write_async": _cufile("raw_write_async", 0),
    "kvikpy.write": lambda path, buf: kvikpy.write(path, buf),
    "kvikpy.numpy.tofile": lambda path, buf: kvikpy.numpy.tofile(buf, path),
}


class ProducerError(Exception):
    """Raised by a test array's own ``__dlpack__``: passed through to the caller."""


ALLOWED = (TypeError, ValueError, kvikpy.KvikpyError, OSError, ProducerError)


def check_no_crash(path: Path, entry: str, buf: Any) -> None:
    """Call ``entry`` with ``buf``: it may succeed or raise an allowed error, never a panic;
    on error the file is unchanged."""
    before = path.read_bytes()
    try:
        ENTRY_POINTS[entry](path, buf)
    except ALLOWED as e:
        assert not isinstance(e, kvikpy.InternalError), f"{entry} panicked: {e}"
        assert path.read_bytes() == before, f"{entry} changed the file although it failed"
    except BaseException as e:  # PanicException is a BaseException
        pytest.fail(f"{entry} raised {type(e).__module__}.{type(e).__name__}: {e}")


@pytest.fixture
def data_file(tmp_path: Path) -> Path:
    path = tmp_path / "data.bin"
    path.write_bytes(random_bytes(FILE_SIZE, seed=11))
    return path


# --- Python objects -----------------------------------------------------------------------

OBJECT_ARRAYS = {
    "object": lambda: np.empty(10, dtype=object),
    "object with values": lambda: np.array([1, "a", None, 2.5] * 4, dtype=object),
    "structured with an object field": lambda: np.zeros(10, dtype=[("a", "i4"), ("b", "O")]),
    "nested object field": lambda: np.zeros(4, dtype=[("s", [("x", "f8"), ("o", "O")])]),
    "memoryview of objects": lambda: memoryview(np.empty(6, dtype=object)),
}


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
@pytest.mark.parametrize("kind", sorted(OBJECT_ARRAYS))
def test_object_buffers_are_refused_before_any_io(data_file, entry, kind):
    buf = OBJECT_ARRAYS[kind]()
    before = data_file.read_bytes()
    with pytest.raises(TypeError, match="Python objects"):
        ENTRY_POINTS[entry](data_file, buf)
    assert data_file.read_bytes() == before
    del buf  # freeing the objects must not crash (the bug wrote file bytes over them)


def test_new_files_are_not_created_for_a_refused_buffer(tmp_path):
    for name, call in [
        ("w.bin", lambda p: kvikpy.write(p, np.empty(3, dtype=object))),
        ("t.bin", lambda p: kvikpy.numpy.tofile(np.empty(3, dtype=object), p)),
    ]:
        with pytest.raises(TypeError):
            call(tmp_path / name)
        assert not (tmp_path / name).exists()


def test_reading_into_an_object_array_does_not_kill_the_process(data_file):
    # The original crash: numpy freed objects whose pointers were file bytes (SIGSEGV).
    code = (
        "import numpy, kvikpy, gc\n"
        "a = numpy.empty(10, dtype=object)\n"
        f"try:\n    kvikpy.CuFile({str(data_file)!r}).read(a)\n"
        "except TypeError as e:\n    print('refused:', e)\n"
        "del a; gc.collect(); print('alive')\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert "refused:" in done.stdout and "alive" in done.stdout


def test_plain_data_formats_still_work(data_file):
    data = data_file.read_bytes()
    for dtype in [
        "u1",
        "i2",
        "<f4",
        ">f8",
        "c16",
        "?",
        "S4",
        "U2",
        "V8",
        [("a", "i4"), ("b", "f4")],
    ]:
        buf = np.zeros(FILE_SIZE // np.dtype(dtype).itemsize, dtype=dtype)
        with kvikpy.CuFile(data_file) as f:
            assert f.read(buf) == buf.nbytes
        assert buf.tobytes() == data[: buf.nbytes]


# --- malformed __cuda_array_interface__ ------------------------------------------------------


class CudaArrayLike:
    def __init__(self, interface: Any) -> None:
        self.__cuda_array_interface__ = interface


ARENA_ARRAY = np.frombuffer(bytearray(random_bytes(ARENA, seed=5)), dtype=np.uint8)
ARENA_PTR = ARENA_ARRAY.ctypes.data

# Values that are valid: small enough that a valid dict never describes memory past the
# arena, whatever the entry point does with it.
valid_fields = {
    "data": st.tuples(st.integers(ARENA_PTR, ARENA_PTR + 64), st.booleans()),
    "shape": st.lists(st.integers(0, 6), min_size=0, max_size=3).map(tuple),
    "typestr": st.sampled_from(["|u1", "<i2", "<f4", "<f8", "|b1", ">u4", "<c8"]),
    "strides": st.none(),
    "version": st.sampled_from([2, 3]),
    "stream": st.none(),
}
invalid_fields = {
    "data": st.sampled_from(
        [
            None,
            5,
            (),
            (ARENA_PTR,),
            (ARENA_PTR, False, 1),
            (-1, False),
            ("p", False),
            (ARENA_PTR, "no"),
            (2**70, False),
            [ARENA_PTR, False],
            (0, False),
        ]
    ),
    "shape": st.sampled_from(
        [
            None,
            4,
            [4],
            (-1,),
            (4, -2),
            (2**62, 2**62),
            (2**64,),
            ("a",),
            (1.5,),
            (True,),
            (2**40, 2**40, 2**40),
        ]
    ),
    "typestr": st.sampled_from(
        [
            "u",
            "<f",
            "",
            "<",
            "|O8",
            "<O8",
            "xf4",
            "<q4",
            "<f-4",
            "<f0",
            "<f4x",
            "<f 4",
            3,
            None,
            b"<f4",
            "<U",
            "|V",
        ]
    ),
    "strides": st.sampled_from([(), (1,), (1, 1, 1, 1), ("a",), 4, [1], (2**70,), (1.0,)]),
    "version": st.sampled_from(["3", -1, 2**40, None]),
    "stream": st.sampled_from([-1, "s", 1.5, 2**70]),
    "mask": st.sampled_from([ARENA_PTR, (ARENA_PTR, False), True]),
    "descr": st.sampled_from([[("", "|O8")], [("a", "<f4"), ("b", [("c", "|O8")])]]),
}


@st.composite
def malformed_interfaces(draw: st.DrawFn) -> Any:
    if draw(st.integers(0, 20)) == 0:
        return draw(st.sampled_from([None, 3, "dict", [("shape", (4,))], (1, 2)]))
    fields = {k: draw(v) for k, v in valid_fields.items()}
    bad = draw(st.lists(st.sampled_from(sorted(invalid_fields)), min_size=1, max_size=3))
    for key in bad:
        fields[key] = draw(invalid_fields[key])
    for key in draw(st.lists(st.sampled_from(sorted(fields)), max_size=2)):
        fields.pop(key, None)  # a missing field
    return fields


SAFETY = settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@SAFETY
@given(interface=malformed_interfaces(), entry=st.sampled_from(sorted(ENTRY_POINTS)))
def test_malformed_cuda_array_interfaces_never_panic(data_file, interface, entry):
    check_no_crash(data_file, entry, CudaArrayLike(interface))


@pytest.mark.parametrize(
    ("field", "value", "error"),
    [
        ("strides", (), TypeError),
        ("strides", (1,), TypeError),
        ("typestr", "u", ValueError),
        ("typestr", "<f", ValueError),
        ("typestr", "|O8", TypeError),
        ("shape", (-1,), TypeError),
        ("shape", (2**62, 2**62), ValueError),
        ("data", (ARENA_PTR,), TypeError),
    ],
)
def test_each_malformed_field_is_named(data_file, field, value, error):
    interface = {"data": (ARENA_PTR, False), "shape": (4, 4), "typestr": "|u1", "version": 3}
    interface[field] = value
    pattern = rf"__cuda_array_interface__\['{field}'\]|more bytes"
    with kvikpy.CuFile(data_file, "r+") as f, pytest.raises(error, match=pattern):
        f.read(CudaArrayLike(interface))


# --- malformed DLPack capsules ----------------------------------------------------------------


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("device", DLDevice),
        ("ndim", ctypes.c_int32),
        ("dtype", DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)),
        ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


class DLManagedTensor(ctypes.Structure):
    _fields_ = [
        ("dl_tensor", DLTensor),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
    ]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [
        ("major", ctypes.c_uint32),
        ("minor", ctypes.c_uint32),
        ("manager_ctx", ctypes.c_void_p),
        ("deleter", ctypes.c_void_p),
        ("flags", ctypes.c_uint64),
        ("dl_tensor", DLTensor),
    ]


_capsule_new = ctypes.pythonapi.PyCapsule_New
_capsule_new.restype = ctypes.py_object
_capsule_new.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


class DLPackLike:
    """An array whose ``__dlpack__`` returns a hand-built capsule (no deleter: the
    structures live as long as this object)."""

    def __init__(self, device: Any, make: Callable[[], Any]) -> None:
        self._device = device
        self._make = make

    def __dlpack_device__(self) -> Any:
        return self._device

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self._make()


@st.composite
def malformed_dlpack(draw: st.DrawFn) -> DLPackLike:
    keep: list[Any] = []
    # ndim never exceeds the shape array's 3 entries: DLPack's contract, which no
    # consumer can check (reading past it is the producer's bug, not a malformed value).
    ndim = draw(st.sampled_from([0, 1, 2, 3, -1]))
    dims = draw(
        st.lists(st.sampled_from([0, 1, 3, 8, -1, 2**62, 2**63 - 1]), min_size=3, max_size=3)
    )
    if ndim in (1, 2, 3) and draw(st.booleans()):
        dims = [d if 0 <= d <= 8 else 2 for d in dims]  # a valid shape for this one
    shape = (ctypes.c_int64 * 3)(*dims)
    strides = (ctypes.c_int64 * 3)(
        *draw(st.lists(st.sampled_from([1, 0, -1, 3, 2**62]), min_size=3, max_size=3))
    )
    keep += [shape, strides]
    bits = draw(st.sampled_from([8, 16, 32, 1, 0, 7, 255]))
    lanes = draw(st.sampled_from([1, 0, 4, 65535]))
    items = 1
    for d in dims[: max(ndim, 0)]:
        items *= max(d, 0)
    if items >= 0 and (bits * lanes) % 8 == 0 and items * bits * lanes // 8 > ARENA - 64:
        lanes, bits = 1, 8  # keep any well-formed capsule inside the arena
    tensor = DLTensor(
        data=draw(st.sampled_from([ARENA_PTR, ARENA_PTR + 3, None])),
        device=DLDevice(
            draw(st.sampled_from([1, 2, 3, 13, 99])), draw(st.sampled_from([0, 1, -1]))
        ),
        ndim=ndim,
        dtype=DLDataType(draw(st.sampled_from([0, 1, 2, 3, 4, 5, 6, 200])), bits, lanes),
        shape=ctypes.cast(shape, ctypes.POINTER(ctypes.c_int64)) if draw(st.booleans()) else None,
        strides=ctypes.cast(strides, ctypes.POINTER(ctypes.c_int64))
        if draw(st.booleans())
        else None,
        byte_offset=draw(st.sampled_from([0, 1, 64])),
    )
    returned = draw(st.sampled_from(["legacy", "versioned", "wrong name", "int", "none", "raise"]))

    def make() -> Any:
        if returned == "legacy":
            managed = DLManagedTensor(dl_tensor=tensor)
            keep.append(managed)
            return _capsule_new(ctypes.addressof(managed), b"dltensor", None)
        if returned == "versioned":
            managed = DLManagedTensorVersioned(major=1, minor=0, flags=0, dl_tensor=tensor)
            keep.append(managed)
            return _capsule_new(ctypes.addressof(managed), b"dltensor_versioned", None)
        if returned == "wrong name":
            managed = DLManagedTensor(dl_tensor=tensor)
            keep.append(managed)
            return _capsule_new(ctypes.addressof(managed), b"used_dltensor", None)
        if returned == "int":
            return 42
        if returned == "none":
            return None
        raise ProducerError("this __dlpack__ fails")

    device = draw(
        st.one_of(
            st.just((tensor.device.device_type, tensor.device.device_id)),
            st.sampled_from([None, "cuda", (2,), (2, 0, 0), ("a", 0), 2.0]),
        )
    )
    obj = DLPackLike(device, make)
    obj._keep = keep  # type: ignore[attr-defined]
    return obj


@SAFETY
@given(obj=malformed_dlpack(), entry=st.sampled_from(sorted(ENTRY_POINTS)))
def test_malformed_dlpack_capsules_never_panic(data_file, obj, entry):
    check_no_crash(data_file, entry, obj)


def _huge_capsule() -> DLPackLike:
    """A well-formed host capsule whose shape claims 2^62 bytes at a real pointer."""
    dims = (ctypes.c_int64 * 1)(2**62)
    tensor = DLTensor(
        data=ARENA_PTR,
        device=DLDevice(1, 0),
        ndim=1,
        dtype=DLDataType(1, 8, 1),
        shape=ctypes.cast(dims, ctypes.POINTER(ctypes.c_int64)),
        strides=None,
        byte_offset=0,
    )
    keep: list[Any] = [dims]

    def make() -> Any:
        managed = DLManagedTensor(dl_tensor=tensor)
        keep.append(managed)
        return _capsule_new(ctypes.addressof(managed), b"dltensor", None)

    obj = DLPackLike((1, 0), make)
    obj._keep = keep  # type: ignore[attr-defined]
    return obj


@pytest.mark.parametrize("entry", sorted(ENTRY_POINTS))
@pytest.mark.parametrize("form", ["dlpack", "cuda array interface"])
def test_a_buffer_claiming_more_than_an_address_space_is_refused(data_file, entry, form):
    """A producer whose shape claims 2^62 bytes used to get a request split into 2^40
    tasks (a write: the process grew until the kernel killed it); it is refused up front,
    the file untouched."""
    if form == "dlpack":
        buf: Any = _huge_capsule()
    else:
        interface = {"data": (ARENA_PTR, False), "shape": (2**62,), "typestr": "|u1", "version": 3}
        buf = CudaArrayLike(interface)
    before = data_file.read_bytes()
    with pytest.raises(ValueError, match="reaches past the largest address any process can have"):
        ENTRY_POINTS[entry](data_file, buf)
    assert data_file.read_bytes() == before


# --- which interface is used ------------------------------------------------------------


class BothInterfaces:
    """A CUDA array interface over the arena plus a ``__dlpack__`` that records the stream
    it is asked to order its work before, then fails."""

    def __init__(self, interface: dict[str, Any]) -> None:
        self.__cuda_array_interface__ = interface
        self.asked: list[Any] = []

    def __dlpack__(self, **kwargs: Any) -> Any:
        self.asked.append(kwargs.get("stream"))
        raise ProducerError("this __dlpack__ only records its stream")

    def __dlpack_device__(self) -> tuple[int, int]:
        return (2, 0)


def test_an_interface_without_a_stream_key_defers_to_dlpack_on_the_legacy_stream(data_file):
    # torch's interface (version 2) names no stream: its pending kernels are waited for
    # through DLPack, asked to order them before the legacy default stream (1).
    v2 = BothInterfaces(
        {"data": (ARENA_PTR, False), "shape": (16,), "typestr": "|u1", "version": 2}
    )
    with kvikpy.CuFile(data_file) as f, pytest.raises(ProducerError):
        f.read(v2)
    assert v2.asked == [1]


def test_an_interface_whose_stream_is_none_is_taken_at_its_word(data_file):
    v3 = BothInterfaces(
        {"data": (ARENA_PTR, False), "shape": (16,), "typestr": "|u1", "version": 3, "stream": None}
    )
    with kvikpy.CuFile(data_file) as f:
        if kvikpy.cuda_available():
            assert f.read(v3) == 16  # the arena is host memory: the driver routes it there
            assert ARENA_ARRAY[:16].tobytes() == data_file.read_bytes()[:16]
        else:  # the interface was used: its pointer needs the driver to be routed
            with pytest.raises(kvikpy.errors.CudaUnavailableError):
                f.read(v3)
    assert v3.asked == []
