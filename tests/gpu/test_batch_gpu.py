"""Batch reads into GPU memory: read_many and read_ranges gathered through pinned bounce
buffers, and their Arrow large_binary device export (offsets on the GPU)."""

from __future__ import annotations

import ctypes

import numpy as np
import pytest

import kvikpy

cupy = pytest.importorskip("cupy")
nd = pytest.importorskip("nanoarrow.device")

from test_arrow import ArrowDeviceArray, struct_of  # noqa: E402
from test_batch import make_files  # noqa: E402


def device_bytes(buf) -> bytes:
    return cupy.asnumpy(cupy.from_dlpack(buf)).tobytes()


@pytest.mark.parametrize(
    "sizes", [[], [1], [1024] * 10_000, [4096] * 2000, [0, 5 << 20, 3, 0, (1 << 20) + 1]]
)
def test_read_many_into_gpu_memory(tmp_path, sizes):
    paths, blobs = make_files(tmp_path, sizes)
    with kvikpy.defaults.set({"bounce_buffer_size": 1 << 20}):
        batch = kvikpy.read_many(paths)
    assert len(batch) == len(sizes)
    assert batch.buffer.device.startswith("cuda")
    if sizes:
        assert device_bytes(batch.buffer) == b"".join(blobs)
        assert device_bytes(batch[len(sizes) // 2]) == blobs[len(sizes) // 2]


def test_read_ranges_into_gpu_memory(tmp_path):
    (path,), (data,) = make_files(tmp_path, [3 << 20])
    ranges = [(7, 100), (0, 4096), (2 << 20, 1 << 20), (5, 0), (12345, 65536)]
    batch = kvikpy.read_ranges(path, ranges)
    for i, (offset, size) in enumerate(ranges):
        assert device_bytes(batch[i]) == data[offset : offset + size]


def test_arrow_device_export_puts_offsets_on_the_gpu(tmp_path):
    paths, blobs = make_files(tmp_path, [10, 0, 300])
    names = [paths[0], tmp_path / "missing", paths[1], paths[2]]
    batch = kvikpy.read_many(names, errors="skip")
    dev = nd.c_device_array(batch)
    assert dev.device_type == nd.DeviceType.CUDA and dev.device_id == 0
    assert dev.array.length == 4 and dev.array.null_count == 1
    _, capsule = batch.__arrow_c_device_array__()
    s = struct_of(capsule, b"arrow_device_array", ArrowDeviceArray)
    validity, offsets, data = (s.array.buffers[i] for i in range(3))
    assert data == batch.buffer.ptr
    event = ctypes.c_void_p.from_address(s.sync_event).value
    cupy.cuda.runtime.eventSynchronize(event)
    got = cupy.ndarray(
        5,
        dtype=cupy.int64,
        memptr=cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(offsets, 40, batch), 0),
    )
    assert cupy.asnumpy(got).tolist() == batch.offsets.tolist()  # device memory
    bits = cupy.ndarray(
        1,
        dtype=cupy.uint8,
        memptr=cupy.cuda.MemoryPointer(cupy.cuda.UnownedMemory(validity, 1, batch), 0),
    )
    assert int(cupy.asnumpy(bits)[0]) & 0b1111 == 0b1101  # element 1 is null
    assert np.diff(batch.offsets).tolist() == [10, 0, 0, 300]
    assert device_bytes(batch[3]) == blobs[2]
    # The offsets and bitmap go to the GPU once: a second export shares them, and they
    # outlive the batch's first exports (the batch holds them).
    _, again = batch.__arrow_c_device_array__()
    s2 = struct_of(again, b"arrow_device_array", ArrowDeviceArray)
    assert (s2.array.buffers[0], s2.array.buffers[1]) == (validity, offsets)
    del capsule, again, dev
    assert cupy.asnumpy(got).tolist() == batch.offsets.tolist()
