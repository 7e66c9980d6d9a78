"""iter_chunks into GPU memory: the chunks tile the file and kept chunks stay intact."""

from __future__ import annotations

import pytest

import kvikpy

cupy = pytest.importorskip("cupy")

from conftest import random_file  # noqa: E402


def test_gpu_chunks_tile_the_file_and_kept_ones_stay(tmp_path):
    p, data = random_file(tmp_path, (9 << 20) + 5)
    it = kvikpy.iter_chunks(p, 1 << 20, depth=2)
    kept = []
    out = b""
    for i, c in enumerate(it):
        out += cupy.asnumpy(cupy.from_dlpack(c)).tobytes()
        if i % 4 == 0:
            kept.append((i, cupy.from_dlpack(c)))
    assert out == data
    for i, a in kept:
        assert cupy.asnumpy(a).tobytes() == data[i << 20 : (i + 1) << 20]


def test_gpu_chunks_as_an_arrow_device_stream(tmp_path):
    from test_chunks import consume_device_stream

    p, data = random_file(tmp_path, (3 << 20) + 11)

    def read(ptr: int, n: int) -> bytes:
        memory = cupy.cuda.UnownedMemory(ptr, n, None)
        view = cupy.ndarray(n, dtype=cupy.uint8, memptr=cupy.cuda.MemoryPointer(memory, 0))
        return cupy.asnumpy(view).tobytes()

    it = kvikpy.iter_chunks(p, 1 << 20)
    device_type, chunks, fmt, devices = consume_device_stream(it.__arrow_c_device_stream__(), read)
    assert device_type == 2 and fmt == "C"  # ARROW_DEVICE_CUDA
    assert b"".join(chunks) == data
    assert devices == [(2, 0, 2)] * 4


def test_gpu_chunks_refuse_the_host_stream_interface(tmp_path):
    p, data = random_file(tmp_path, 1000)
    it = kvikpy.iter_chunks(p, 100)
    with pytest.raises(BufferError, match="__arrow_c_device_stream__"):
        it.__arrow_c_stream__()
    pa = pytest.importorskip("pyarrow")
    with pytest.raises(BufferError, match="GPU 0"):
        pa.RecordBatchReader.from_stream(it)
    assert b"".join(cupy.asnumpy(cupy.from_dlpack(c)).tobytes() for c in it) == data  # intact
