"""Arrow C device data interface for GPU buffers: nanoarrow sees a CUDA uint8 array on the
right device, the sync event is a live CUDA event, and releases run exactly once."""

from __future__ import annotations

import ctypes
import gc
import itertools
import os
from pathlib import Path

import pytest

import kvikpy
from kvikpy import _lib

cupy = pytest.importorskip("cupy")
nd = pytest.importorskip("nanoarrow.device")
pa = pytest.importorskip("pyarrow")

from test_arrow import ArrowDeviceArray, struct_of  # noqa: E402


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
