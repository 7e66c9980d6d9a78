"""Arrow PyCapsule interface of kvikpy buffers (host side, runs without a GPU): pyarrow
and nanoarrow consume them without a copy, the C structs hold what the Arrow C (device)
data interface says, and every release runs exactly once whatever the drop order."""

from __future__ import annotations

import ctypes
import gc
import itertools
import os
from pathlib import Path

import numpy as np
import pytest

import kvikpy
from kvikpy import _lib

pa = pytest.importorskip("pyarrow")
na = pytest.importorskip("nanoarrow")
nd = pytest.importorskip("nanoarrow.device")


class ArrowArray(ctypes.Structure):
    _fields_ = [
        ("length", ctypes.c_int64),
        ("null_count", ctypes.c_int64),
        ("offset", ctypes.c_int64),
        ("n_buffers", ctypes.c_int64),
        ("n_children", ctypes.c_int64),
        ("buffers", ctypes.POINTER(ctypes.c_void_p)),
        ("children", ctypes.c_void_p),
        ("dictionary", ctypes.c_void_p),
        ("release", ctypes.c_void_p),
        ("private_data", ctypes.c_void_p),
    ]


class ArrowDeviceArray(ctypes.Structure):
    _fields_ = [
        ("array", ArrowArray),
        ("device_id", ctypes.c_int64),
        ("device_type", ctypes.c_int32),
        ("sync_event", ctypes.c_void_p),
        ("reserved", ctypes.c_int64 * 3),
    ]


_get_pointer = ctypes.pythonapi.PyCapsule_GetPointer
_get_pointer.restype = ctypes.c_void_p
_get_pointer.argtypes = [ctypes.py_object, ctypes.c_char_p]


def struct_of(capsule, name: bytes, kind):
    return kind.from_address(_get_pointer(capsule, name))


def host_buffer(tmp_path: Path, n: int) -> tuple[kvikpy.Buffer, bytes]:
    data = os.urandom(n)
    p = tmp_path / "d.bin"
    p.write_bytes(data)
    return kvikpy.read(p, device="cpu"), data


def address(buf) -> int:
    return np.frombuffer(buf, dtype=np.uint8).ctypes.data


def test_pyarrow_array_is_zero_copy_and_outlives_the_buffer(tmp_path):
    base = _lib.live_buffers()
    buf, data = host_buffer(tmp_path, 100_003)
    arr = pa.array(buf)
    assert arr.type == pa.uint8()
    assert len(arr) == len(data) and arr.null_count == 0
    assert arr.buffers()[1].address == address(buf)  # no copy
    del buf
    gc.collect()
    assert _lib.live_buffers() == base + 1  # pyarrow holds the memory
    assert arr.buffers()[1].to_pybytes()[: len(data)] == data
    del arr
    gc.collect()
    assert _lib.live_buffers() == base


def test_schema_capsule(tmp_path):
    buf, _ = host_buffer(tmp_path, 10)
    assert pa.DataType._import_from_c_capsule(buf.__arrow_c_schema__()) == pa.uint8()
    assert na.c_schema(buf).format == "C"


def test_nanoarrow_reads_the_host_array_field_by_field(tmp_path):
    buf, data = host_buffer(tmp_path, 4097)
    for array in (na.c_array(buf), nd.c_device_array(buf).array):
        assert array.length == len(data)
        assert (array.null_count, array.offset, array.n_buffers, array.n_children) == (0, 0, 2, 0)
        assert array.buffers == (0, address(buf))
    device = nd.c_device_array(buf)
    assert device.device_type == nd.DeviceType.CPU
    assert device.device_id == -1
    assert bytes(na.Array(buf).to_pylist()) == data


def test_c_structs_match_the_interface(tmp_path):
    buf, _ = host_buffer(tmp_path, 333)
    _, array_capsule = buf.__arrow_c_array__()
    a = struct_of(array_capsule, b"arrow_array", ArrowArray)
    assert (a.length, a.null_count, a.offset, a.n_buffers, a.n_children) == (333, 0, 0, 2, 0)
    assert a.buffers[0] is None and a.buffers[1] == address(buf)
    assert not a.children and not a.dictionary and a.release and a.private_data
    _, device_capsule = buf.__arrow_c_device_array__()
    d = struct_of(device_capsule, b"arrow_device_array", ArrowDeviceArray)
    assert (d.array.length, d.array.n_buffers) == (333, 2)
    assert d.array.buffers[1] == address(buf)
    assert (d.device_type, d.device_id) == (1, -1)  # ARROW_DEVICE_CPU
    assert d.sync_event is None  # host bytes need no wait
    assert list(d.reserved) == [0, 0, 0]
    assert ctypes.sizeof(ArrowDeviceArray) == 128


@pytest.mark.parametrize("order", list(itertools.permutations(range(3))))
def test_releases_run_once_whatever_the_drop_order(tmp_path, order):
    base = _lib.live_buffers()
    buf, _ = host_buffer(tmp_path, 1000)
    things = [buf, *buf.__arrow_c_array__(), *buf.__arrow_c_device_array__()]
    held = [things[0], things[2], things[4]]  # buffer, array, device array
    del things, buf
    for i in order:
        held[i] = None
        gc.collect()
        assert _lib.live_buffers() == base + (1 if any(x is not None for x in held) else 0)
    assert _lib.live_buffers() == base


def test_consumers_that_take_the_array_over_release_it(tmp_path):
    base = _lib.live_buffers()
    buf, data = host_buffer(tmp_path, 2048)
    schema, array = buf.__arrow_c_array__()
    imported = pa.Array._import_from_c_capsule(schema, array)  # moves the array out
    del buf, schema, array
    gc.collect()
    assert _lib.live_buffers() == base + 1
    assert imported.to_numpy().tobytes() == data
    del imported
    gc.collect()
    assert _lib.live_buffers() == base


def test_unknown_device_keywords_raise_not_implemented(tmp_path):
    buf, _ = host_buffer(tmp_path, 8)
    buf.__arrow_c_device_array__(None, future_option=None)  # None is allowed
    with pytest.raises(NotImplementedError, match="future_option"):
        buf.__arrow_c_device_array__(future_option=1)


def test_typed_buffers_export_their_bytes(tmp_path):
    data = os.urandom(1024)
    p = tmp_path / "f.bin"
    p.write_bytes(data)
    typed = kvikpy.read(p, device="cpu", dtype="float32", shape=(16, 16))
    arr = pa.array(typed)
    assert arr.type == pa.uint8() and len(arr) == 1024  # the bytes, whatever the dtype
    assert arr.to_numpy().tobytes() == data
