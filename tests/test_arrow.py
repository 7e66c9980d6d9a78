"""Arrow PyCapsule interface of kvikpy buffers (host side, runs without a GPU): pyarrow
and nanoarrow consume them without a copy as arrays of the buffer's dtype (nested
fixed-size lists for 2-D and higher shapes), the C structs hold what the Arrow C (device)
data interface says, and every release runs exactly once whatever the drop order."""

from __future__ import annotations

import ctypes
import gc
import itertools
import math
import os
from pathlib import Path

import numpy as np
import pytest
from conftest import random_file
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kvikpy
from kvikpy import _lib

pa = pytest.importorskip("pyarrow")
na = pytest.importorskip("nanoarrow")
nd = pytest.importorskip("nanoarrow.device")


class ArrowArray(ctypes.Structure):
    pass


ArrowArray._fields_ = [
    ("length", ctypes.c_int64),
    ("null_count", ctypes.c_int64),
    ("offset", ctypes.c_int64),
    ("n_buffers", ctypes.c_int64),
    ("n_children", ctypes.c_int64),
    ("buffers", ctypes.POINTER(ctypes.c_void_p)),
    ("children", ctypes.POINTER(ctypes.POINTER(ArrowArray))),
    ("dictionary", ctypes.c_void_p),
    ("release", ctypes.c_void_p),
    ("private_data", ctypes.c_void_p),
]
_RELEASE_ARRAY = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


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
    gc.collect()  # buffers of earlier tests still in cycles go first
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
    gc.collect()  # buffers of earlier tests still in cycles go first
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
    gc.collect()  # buffers of earlier tests still in cycles go first
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


# numpy dtype -> the Arrow type its buffers export as, and its C format string. Booleans
# export as uint8 (one byte each, zero-copy): Arrow's boolean is bit-packed.
TYPES = {
    "int8": (pa.int8(), "c"),
    "int16": (pa.int16(), "s"),
    "int32": (pa.int32(), "i"),
    "int64": (pa.int64(), "l"),
    "uint8": (pa.uint8(), "C"),
    "uint16": (pa.uint16(), "S"),
    "uint32": (pa.uint32(), "I"),
    "uint64": (pa.uint64(), "L"),
    "float16": (pa.float16(), "e"),
    "float32": (pa.float32(), "f"),
    "float64": (pa.float64(), "g"),
    "bool": (pa.uint8(), "C"),
}


def typed_buffer(tmp_path: Path, dtype: str, shape: tuple[int, ...], seed: int = 0):
    """A host buffer of ``dtype`` and ``shape`` read from random bytes, and numpy's view
    of the same bytes."""
    dt = np.dtype(dtype)
    p, data = random_file(tmp_path, math.prod(shape) * dt.itemsize, seed)
    return kvikpy.read(p, dtype=dt, shape=shape, device="cpu"), np.frombuffer(data, dt).reshape(
        shape
    )


def arrow_shape(arr) -> tuple[int, ...]:
    """The shape an array's type and length describe: its length, then each nested
    fixed-size list's size."""
    dims, t = [len(arr)], arr.type
    while pa.types.is_fixed_size_list(t):
        dims.append(t.list_size)
        t = t.value_type
    return tuple(dims)


def innermost(arr):
    """The values under every level of fixed-size list."""
    while pa.types.is_fixed_size_list(arr.type):
        arr = arr.values
    return arr


def expected_type(dtype: str, shape: tuple[int, ...]):
    t = TYPES[dtype][0]
    for d in reversed(shape[1:]):
        t = pa.list_(t, d)
    return t


def expected_formats(dtype: str, shape: tuple[int, ...]) -> list[str]:
    return [f"+w:{d}" for d in shape[1:]] + [TYPES[dtype][1]]


def schema_formats(schema) -> list[str]:
    """The format strings of a nanoarrow schema and its first children, outermost first."""
    formats = [schema.format]
    while schema.n_children:
        assert schema.n_children == 1 and schema.child(0).name == "item"
        schema = schema.child(0)
        formats.append(schema.format)
    return formats


@pytest.mark.parametrize("dtype", list(TYPES))
def test_a_typed_buffer_exports_its_arrow_type_without_a_copy(tmp_path, dtype):
    buf, view = typed_buffer(tmp_path, dtype, (257,))
    arr = pa.array(buf)
    assert arr.type == TYPES[dtype][0] and len(arr) == 257 and arr.null_count == 0
    assert arr.buffers()[1].address == buf.ptr  # no copy
    values = arr.to_numpy(zero_copy_only=True)
    assert values.dtype == (np.uint8 if dtype == "bool" else view.dtype)
    assert values.tobytes() == view.tobytes()
    assert pa.DataType._import_from_c_capsule(buf.__arrow_c_schema__()) == arr.type
    assert na.c_schema(buf).format == TYPES[dtype][1]
    assert nd.c_device_array(buf).schema.format == TYPES[dtype][1]


def test_the_issue_example_float32_is_a_float_array(tmp_path):
    buf, view = typed_buffer(tmp_path, "float32", (1024,))
    arr = pa.array(buf)
    assert type(arr) is pa.FloatArray
    np.testing.assert_array_equal(arr.to_numpy(), view)  # NaNs compare equal here


def test_bool_buffers_export_their_bytes_as_uint8(tmp_path):
    p = tmp_path / "b.bin"
    p.write_bytes(bytes([0, 1, 1, 0, 2, 255, 1]))
    buf = kvikpy.read(p, dtype="bool", device="cpu")
    arr = pa.array(buf)
    assert arr.type == pa.uint8() and arr.buffers()[1].address == buf.ptr
    assert arr.to_pylist() == [0, 1, 1, 0, 2, 255, 1]  # the bytes, as numpy stores them
    assert arr.cast(pa.bool_()).to_pylist() == np.frombuffer(buf, dtype=bool).tolist()


@pytest.mark.parametrize("shape", [(6, 4), (3, 2, 4), (2, 3, 1, 2, 2), (0, 5), (5, 0), (1, 1)])
def test_shapes_export_as_nested_fixed_size_lists_that_keep_the_shape(tmp_path, shape):
    buf, view = typed_buffer(tmp_path, "float32", shape)
    arr = pa.array(buf)
    assert arr.type == expected_type("float32", shape)
    assert arrow_shape(arr) == shape  # the shape is recoverable from the array
    flat = arr
    for _ in shape[1:]:
        flat = flat.flatten()
    assert flat.to_numpy().reshape(shape).tobytes() == view.tobytes()
    if view.size:
        assert innermost(arr).buffers()[1].address == buf.ptr  # no copy at any level
        assert arr.to_pylist()[-1] == view[-1].tolist() or np.isnan(view[-1]).any()
    assert schema_formats(na.c_schema(buf)) == expected_formats("float32", shape)


def test_a_zero_dimensional_buffer_is_one_element_long(tmp_path):
    buf, view = typed_buffer(tmp_path, "int64", ())
    arr = pa.array(buf)
    assert arr.type == pa.int64() and arr.to_pylist() == [int(view)]


@pytest.mark.parametrize(
    ("dtype", "match"),
    [
        ("complex64", "complex64 has no Arrow type.*float32"),
        ("complex128", "complex128 has no Arrow type.*float64"),
        # Other byte orders and long doubles never reach a Buffer: kvikpy.read refuses
        # them (DLPack cannot carry them either), see test_dtypes.py.
    ],
)
def test_dtypes_arrow_lacks_raise_type_error(tmp_path, dtype, match):
    p, _ = random_file(tmp_path, 64)
    buf = kvikpy.read(p, dtype=dtype, device="cpu")
    with pytest.raises(TypeError, match=match):
        pa.array(buf)
    with pytest.raises(TypeError, match=match):
        buf.__arrow_c_schema__()
    with pytest.raises(TypeError, match=match):
        buf.__arrow_c_device_array__()
    assert pa.array(kvikpy.read(p, dtype="uint8", device="cpu")).type == pa.uint8()  # the advice


def test_complex_pairs_as_the_error_advises(tmp_path):
    p, data = random_file(tmp_path, 8 * 16)
    arr = pa.array(kvikpy.read(p, dtype="float32", shape=(16, 2), device="cpu"))
    pairs = arr.flatten().to_numpy().view(np.complex64)
    assert pairs.tobytes() == np.frombuffer(data, dtype=np.complex64).tobytes()


def test_an_inner_dimension_too_long_for_arrow_raises(tmp_path):
    p = tmp_path / "empty.bin"
    p.write_bytes(b"")
    buf = kvikpy.read(p, dtype="uint8", shape=(0, 1 << 31), device="cpu")
    with pytest.raises(ValueError, match="fixed-size list"):
        pa.array(buf)


def test_nested_c_structs_match_the_interface(tmp_path):
    buf, _ = typed_buffer(tmp_path, "int16", (4, 3, 5))
    for capsule, name, kind in [
        (buf.__arrow_c_array__()[1], b"arrow_array", ArrowArray),
        (buf.__arrow_c_device_array__()[1], b"arrow_device_array", ArrowDeviceArray),
    ]:
        a = struct_of(capsule, name, kind)
        a = a if kind is ArrowArray else a.array
        lengths = []
        for _ in range(2):  # two levels of fixed-size list: validity only, one child
            assert (a.null_count, a.offset, a.n_buffers, a.n_children) == (0, 0, 1, 1)
            assert a.buffers[0] is None and a.release and a.private_data
            lengths.append(a.length)
            a = a.children[0].contents
        assert (a.n_buffers, a.n_children, a.buffers[0], a.buffers[1]) == (2, 0, None, buf.ptr)
        assert not a.children
        assert [*lengths, a.length] == [4, 12, 60]


def test_a_child_moved_out_keeps_the_memory_after_its_parent_is_released(tmp_path):
    gc.collect()  # buffers of earlier tests still in cycles go first
    base = _lib.live_buffers()
    buf, view = typed_buffer(tmp_path, "uint16", (8, 4))
    _, capsule = buf.__arrow_c_array__()
    parent = struct_of(capsule, b"arrow_array", ArrowArray)
    child = ArrowArray()
    ctypes.pointer(child)[0] = parent.children[0].contents  # move the child out ...
    parent.children[0].contents.release = None  # ... as the interface says
    del buf
    _RELEASE_ARRAY(parent.release)(ctypes.addressof(parent))
    assert not parent.release
    gc.collect()
    assert _lib.live_buffers() == base + 1  # the moved child still holds the memory
    assert ctypes.string_at(child.buffers[1], child.length * 2) == view.tobytes()
    del capsule
    gc.collect()
    assert _lib.live_buffers() == base + 1
    _RELEASE_ARRAY(child.release)(ctypes.addressof(child))
    assert _lib.live_buffers() == base


@pytest.mark.parametrize("order", list(itertools.permutations(range(3))))
def test_nested_releases_run_once_whatever_the_drop_order(tmp_path, order):
    gc.collect()  # buffers of earlier tests still in cycles go first
    base = _lib.live_buffers()
    buf, view = typed_buffer(tmp_path, "float64", (3, 4, 5))
    imported = pa.array(buf)
    _, device_array = buf.__arrow_c_device_array__()
    held = [buf, imported, device_array]
    del buf, device_array
    assert innermost(imported).to_numpy().tobytes() == view.tobytes()
    del imported
    for i in order:
        held[i] = None
        gc.collect()
        assert _lib.live_buffers() == base + (1 if any(x is not None for x in held) else 0)


@settings(
    max_examples=80,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    dtype=st.sampled_from(list(TYPES)),
    shape=st.lists(st.integers(0, 6), max_size=4).map(tuple),
    seed=st.integers(0, 1 << 16),
)
def test_any_dtype_and_shape_exports_numpys_view_of_the_bytes(tmp_path, dtype, shape, seed):
    buf, view = typed_buffer(tmp_path, dtype, shape, seed)
    arr = pa.array(buf)
    assert arr.type == expected_type(dtype, shape)
    assert arrow_shape(arr) == (shape or (1,))
    values = innermost(arr).to_numpy(zero_copy_only=True)
    assert values.dtype == (np.uint8 if dtype == "bool" else view.dtype)
    assert values.reshape(shape).tobytes() == view.tobytes()
    if view.size:
        assert innermost(arr).buffers()[1].address == buf.ptr
    assert schema_formats(nd.c_device_array(buf).schema) == expected_formats(dtype, shape)
