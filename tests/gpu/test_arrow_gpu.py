"""Arrow C device data interface for GPU buffers: nanoarrow sees a CUDA array of the
buffer's dtype (nested fixed-size lists for 2-D and higher shapes) on the right device,
pointing at the buffer's own memory, the sync event is a live CUDA event, and releases run
exactly once."""

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

cupy = pytest.importorskip("cupy")
nd = pytest.importorskip("nanoarrow.device")
pa = pytest.importorskip("pyarrow")

from test_arrow import (  # noqa: E402
    TYPES,
    ArrowDeviceArray,
    expected_formats,
    expected_type,
    schema_formats,
    struct_of,
)


def device_buffer(tmp_path: Path, n: int, **kw) -> tuple[kvikpy.Buffer, bytes]:
    data = os.urandom(n)
    p = tmp_path / "d.bin"
    p.write_bytes(data)
    return kvikpy.read(p, **kw), data


def test_device_array_describes_the_gpu_bytes(tmp_path):
    buf, data = device_buffer(tmp_path, 1 << 20)
    d = nd.c_device_array(buf)
    assert d.device_type == nd.DeviceType.CUDA
    assert d.device_id == 0
    assert d.array.length == len(data) and d.array.buffers == (0, buf.ptr)
    _, capsule = buf.__arrow_c_device_array__()
    s = struct_of(capsule, b"arrow_device_array", ArrowDeviceArray)
    assert (s.device_type, s.device_id) == (2, 0)  # ARROW_DEVICE_CUDA
    assert s.array.buffers[1] == buf.ptr
    event = ctypes.c_void_p.from_address(s.sync_event).value
    assert event  # a CUevent consumers wait on; already complete for a blocking read
    cupy.cuda.runtime.eventSynchronize(event)
    assert cupy.asnumpy(cupy.from_dlpack(buf)).tobytes() == data


def test_stream_ordered_reads_export_an_event_on_their_stream(tmp_path):
    stream = cupy.cuda.Stream(non_blocking=True)
    buf, data = device_buffer(tmp_path, 8 << 20, stream=stream.ptr)
    _, capsule = buf.__arrow_c_device_array__()
    s = struct_of(capsule, b"arrow_device_array", ArrowDeviceArray)
    event = ctypes.c_void_p.from_address(s.sync_event).value
    cupy.cuda.runtime.eventSynchronize(event)  # the consumer's wait
    view = cupy.ndarray(
        len(data),
        dtype=cupy.uint8,
        memptr=cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(buf.ptr, len(data), buf), 0),
    )
    assert cupy.asnumpy(view).tobytes() == data


def test_host_array_interface_is_refused_for_gpu_memory(tmp_path):
    buf, _ = device_buffer(tmp_path, 100)
    with pytest.raises(BufferError, match="__arrow_c_device_array__"):
        buf.__arrow_c_array__()


@pytest.mark.parametrize("order", list(itertools.permutations(range(3))))
def test_device_releases_run_once(tmp_path, order):
    gc.collect()  # buffers of earlier tests still in cycles go first
    base = _lib.live_buffers()
    buf, _ = device_buffer(tmp_path, 4096)
    _, device_array = buf.__arrow_c_device_array__()
    held = [buf, device_array, nd.c_device_array(buf)]
    del buf, device_array
    for i in order:
        held[i] = None
        gc.collect()
    assert _lib.live_buffers() == base


def test_host_buffers_on_a_gpu_machine_go_to_pyarrow_without_a_copy(tmp_path):
    buf, data = device_buffer(tmp_path, 12345, device="cpu")
    assert not buf.is_pinned
    arr = pa.array(buf)
    assert arr.buffers()[1].address == buf.ptr
    assert arr.to_numpy().tobytes() == data


def gpu_typed_buffer(tmp_path: Path, dtype: str, shape: tuple[int, ...], seed: int = 0):
    """A GPU buffer of ``dtype`` and ``shape`` read from random bytes, and numpy's view of
    the same bytes."""
    dt = np.dtype(dtype)
    p, data = random_file(tmp_path, math.prod(shape) * dt.itemsize, seed)
    return kvikpy.read(p, dtype=dt, shape=shape), np.frombuffer(data, dt).reshape(shape)


def device_values(device_array, schema) -> tuple[list[int], int, int]:
    """Walk a nanoarrow device array down its fixed-size lists: the length of each level,
    the innermost data pointer and the innermost item size in bytes."""
    array, lengths = device_array.array, []
    while schema.n_children:
        assert array.n_buffers == 1 and array.buffers[0] == 0 and array.n_children == 1
        lengths.append(array.length)
        array, schema = array.child(0), schema.child(0)
    lengths.append(array.length)
    return lengths, array.buffers[1], array.n_buffers


def gpu_bytes(ptr: int, n: int) -> bytes:
    if n == 0:
        return b""
    memory = cupy.cuda.UnownedMemory(ptr, n, None)
    view = cupy.ndarray(n, dtype=cupy.uint8, memptr=cupy.cuda.MemoryPointer(memory, 0))
    return cupy.asnumpy(view).tobytes()


@pytest.mark.parametrize("dtype", list(TYPES))
@pytest.mark.parametrize("shape", [(1000,), (10, 7), (3, 4, 5)])
def test_device_arrays_carry_the_typed_schema(tmp_path, dtype, shape):
    buf, view = gpu_typed_buffer(tmp_path, dtype, shape)
    d = nd.c_device_array(buf)
    assert d.device_type == nd.DeviceType.CUDA and d.device_id == 0
    assert schema_formats(d.schema) == expected_formats(dtype, shape)
    lengths, ptr, n_buffers = device_values(d, d.schema)
    assert lengths == [math.prod(shape[: i + 1]) for i in range(len(shape))]
    assert ptr == buf.ptr and n_buffers == 2  # the buffer's own memory, no copy
    _, capsule = buf.__arrow_c_device_array__()
    s = struct_of(capsule, b"arrow_device_array", ArrowDeviceArray)
    cupy.cuda.runtime.eventSynchronize(ctypes.c_void_p.from_address(s.sync_event).value)
    assert gpu_bytes(ptr, view.nbytes) == view.tobytes()
    schema = pa.DataType._import_from_c_capsule(buf.__arrow_c_schema__())
    assert schema == expected_type(dtype, shape)  # the type a host buffer exports


@pytest.mark.parametrize("dtype", ["complex64", "complex128"])
def test_device_export_of_dtypes_arrow_lacks_raises(tmp_path, dtype):
    buf, _ = device_buffer(tmp_path, 64, dtype=dtype)
    with pytest.raises(TypeError):
        buf.__arrow_c_device_array__()
    with pytest.raises(TypeError):
        nd.c_device_array(buf)


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    dtype=st.sampled_from(list(TYPES)),
    shape=st.lists(st.integers(0, 6), max_size=4).map(tuple),
    seed=st.integers(0, 1 << 16),
)
def test_any_dtype_and_shape_on_the_gpu_holds_numpys_view(tmp_path, dtype, shape, seed):
    buf, view = gpu_typed_buffer(tmp_path, dtype, shape, seed)
    d = nd.c_device_array(buf)
    assert schema_formats(d.schema) == expected_formats(dtype, shape)
    lengths, ptr, _ = device_values(d, d.schema)
    assert lengths[-1] == view.size
    if view.size:
        assert ptr == buf.ptr
    cupy.cuda.runtime.deviceSynchronize()
    assert gpu_bytes(ptr, view.nbytes) == view.tobytes()


@pytest.mark.parametrize("order", list(itertools.permutations(range(3))))
def test_nested_device_releases_run_once(tmp_path, order):
    gc.collect()  # buffers of earlier tests still in cycles go first
    base = _lib.live_buffers()
    buf, _ = gpu_typed_buffer(tmp_path, "float32", (16, 4, 2))
    _, device_array = buf.__arrow_c_device_array__()
    held = [buf, device_array, nd.c_device_array(buf)]
    del buf, device_array
    for i in order:
        held[i] = None
        gc.collect()
    assert _lib.live_buffers() == base


@pytest.mark.parametrize(("dtype", "type_id"), [("float32", "FLOAT32"), ("uint64", "UINT64")])
def test_cudf_reads_the_typed_device_array(tmp_path, dtype, type_id):
    plc = pytest.importorskip("pylibcudf")
    buf, view = gpu_typed_buffer(tmp_path, dtype, (4096,))
    col = plc.Column.from_arrow(buf)
    assert col.type().id() == getattr(plc.TypeId, type_id)
    assert col.size() == 4096
    back = plc.interop.to_arrow(col)
    assert back.type == TYPES[dtype][0]
    assert back.to_numpy().tobytes() == view.tobytes()
