"""iter_chunks into host memory (runs without a GPU): the chunks tile the file, a plain
loop cycles through depth + 2 buffers, chunks the caller keeps are never overwritten, and
the iterator is an Arrow C stream (record batches or plain uint8 arrays) and C device
stream."""

from __future__ import annotations

import ctypes
import gc

import numpy as np
import pytest
from conftest import random_file
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_arrow import ArrowDeviceArray, struct_of

import kvikpy
from kvikpy import _lib

pa = pytest.importorskip("pyarrow")


def host_bytes(chunk) -> bytes:
    return np.from_dlpack(chunk).tobytes()


@pytest.mark.parametrize(
    ("n", "chunk"), [(0, 10), (5, 10), (10, 10), (1_000_003, 100_000), (300_000, 1 << 20)]
)
def test_chunks_tile_the_file(tmp_path, n, chunk):
    p, data = random_file(tmp_path, n)
    sizes, out = [], b""
    for c in kvikpy.iter_chunks(p, chunk, device="cpu"):
        sizes.append(c.nbytes)
        out += host_bytes(c)
    assert out == data
    assert sizes == [min(chunk, n - o) for o in range(0, n, chunk)]


@pytest.mark.parametrize("depth", [1, 2, 4])
def test_a_plain_loop_cycles_through_depth_plus_two_buffers(tmp_path, depth):
    p, data = random_file(tmp_path, 50 * 4096)
    it = kvikpy.iter_chunks(p, 4096, device="cpu", depth=depth)
    total = 0
    for c in it:
        total += int(np.from_dlpack(c).sum(dtype=np.int64))
    assert total == int(np.frombuffer(data, dtype=np.uint8).sum(dtype=np.int64))
    assert it.allocations == depth + 2


def test_kept_chunks_are_never_overwritten(tmp_path):
    p, data = random_file(tmp_path, 64 * 1000 + 7)
    it = kvikpy.iter_chunks(p, 1000, device="cpu", depth=2)
    kept = list(it)  # every chunk held at once
    assert b"".join(host_bytes(c) for c in kept) == data
    assert it.allocations == len(kept)


def test_chunks_kept_through_dlpack_are_never_overwritten(tmp_path):
    p, data = random_file(tmp_path, 40 * 512)
    arrays = []
    for i, c in enumerate(kvikpy.iter_chunks(p, 512, device="cpu")):
        if i % 3 == 0:
            arrays.append((i, np.from_dlpack(c)))  # the export holds the memory
        del c
        gc.collect()
    for i, a in arrays:
        assert a.tobytes() == data[i * 512 : (i + 1) * 512]


def test_bad_arguments_and_closing(tmp_path):
    p, _ = random_file(tmp_path, 100)
    with pytest.raises(ValueError, match="chunk_size"):
        kvikpy.iter_chunks(p, 0, device="cpu")
    with pytest.raises(ValueError, match="depth"):
        kvikpy.iter_chunks(p, 10, device="cpu", depth=0)
    with pytest.raises(FileNotFoundError):
        kvikpy.iter_chunks(tmp_path / "missing", 10, device="cpu")
    with kvikpy.iter_chunks(p, 10, device="cpu") as it:
        assert next(it).nbytes == 10
    assert list(it) == []  # closed: nothing more
    assert "10-byte chunks" in repr(it)


class _Stream(ctypes.Structure):
    pass


_GET_SCHEMA = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(_Stream), ctypes.c_void_p)
_GET_NEXT = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(_Stream), ctypes.c_void_p)
_LAST_ERROR = ctypes.CFUNCTYPE(ctypes.c_char_p, ctypes.POINTER(_Stream))
_RELEASE = ctypes.CFUNCTYPE(None, ctypes.POINTER(_Stream))
_Stream._fields_ = [
    ("device_type", ctypes.c_int32),
    ("get_schema", _GET_SCHEMA),
    ("get_next", _GET_NEXT),
    ("get_last_error", _LAST_ERROR),
    ("release", _RELEASE),
    ("private_data", ctypes.c_void_p),
]
_RELEASE_ARRAY = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


def consume_device_stream(capsule, read=ctypes.string_at) -> tuple[int, list[bytes], str, list]:
    """Drive an arrow_device_array_stream the way a C consumer would; ``read(ptr, n)``
    copies a chunk's bytes out (from host memory by default)."""
    stream = struct_of(capsule, b"arrow_device_array_stream", _Stream)
    schema = (ctypes.c_byte * 72)()  # struct ArrowSchema
    assert stream.get_schema(ctypes.byref(stream), ctypes.addressof(schema)) == 0
    fmt = ctypes.c_char_p.from_address(ctypes.addressof(schema)).value
    ctypes.CFUNCTYPE(None, ctypes.c_void_p)(
        ctypes.c_void_p.from_address(ctypes.addressof(schema) + 56).value
    )(ctypes.addressof(schema))  # release the schema
    chunks, devices = [], []
    while True:
        out = ArrowDeviceArray()
        assert stream.get_next(ctypes.byref(stream), ctypes.addressof(out)) == 0
        if not out.array.release:
            break  # end of stream
        devices.append((out.device_type, out.device_id, out.array.n_buffers))
        chunks.append(read(out.array.buffers[1], out.array.length))
        _RELEASE_ARRAY(out.array.release)(ctypes.addressof(out.array))
    return stream.device_type, chunks, fmt.decode(), devices


def test_arrow_device_stream_yields_the_chunks(tmp_path):
    p, data = random_file(tmp_path, 10 * 1000 + 3)
    gc.collect()  # buffers of earlier tests still in cycles go first
    base = _lib.live_buffers()
    it = kvikpy.iter_chunks(p, 1000, device="cpu")
    first = next(it)  # the stream continues where the iterator is
    device_type, chunks, fmt, devices = consume_device_stream(it.__arrow_c_device_stream__())
    assert device_type == 1 and fmt == "C"  # ARROW_DEVICE_CPU, uint8
    assert host_bytes(first) + b"".join(chunks) == data
    assert devices == [(1, -1, 2)] * len(chunks)
    del first, it
    gc.collect()
    assert _lib.live_buffers() == base
    with pytest.raises(NotImplementedError, match="future_option"):
        kvikpy.iter_chunks(p, 1000, device="cpu").__arrow_c_device_stream__(future_option=1)


def test_an_unconsumed_device_stream_releases_its_iterator(tmp_path):
    p, _ = random_file(tmp_path, 5000)
    gc.collect()  # buffers of earlier tests still in cycles go first
    base = _lib.live_buffers()
    it = kvikpy.iter_chunks(p, 1000, device="cpu")
    capsule = it.__arrow_c_device_stream__()
    del it, capsule
    gc.collect()
    assert _lib.live_buffers() == base


CHUNK_SCHEMA = pa.schema([pa.field("bytes", pa.uint8(), nullable=False)])


@pytest.mark.parametrize(("n", "chunk"), [(10 * 1000 + 3, 1000), (0, 100), (100, 100)])
def test_record_batch_reader_from_stream_reads_the_chunks(tmp_path, n, chunk):
    p, data = random_file(tmp_path, n)
    gc.collect()  # buffers of earlier tests still in cycles go first
    base = _lib.live_buffers()
    it = kvikpy.iter_chunks(p, chunk, device="cpu")
    reader = pa.RecordBatchReader.from_stream(it)
    assert reader.schema == CHUNK_SCHEMA
    batches = list(reader)
    assert [b.num_rows for b in batches] == [min(chunk, n - o) for o in range(0, n, chunk)]
    assert b"".join(b.column(0).to_numpy().tobytes() for b in batches) == data
    assert it.allocations == len(batches)  # every batch still holds its chunk: no copy
    del reader, it, batches
    gc.collect()
    assert _lib.live_buffers() == base


def test_pyarrow_table_and_chunked_array_take_the_stream(tmp_path):
    p, data = random_file(tmp_path, 5 * 4096 + 1)
    table = pa.table(kvikpy.iter_chunks(p, 4096, device="cpu"))
    assert table.schema == CHUNK_SCHEMA and table.column("bytes").num_chunks == 6
    assert table.column("bytes").to_numpy().tobytes() == data
    structs = pa.chunked_array(kvikpy.iter_chunks(p, 4096, device="cpu"))
    assert structs.type == pa.struct(CHUNK_SCHEMA) and structs.num_chunks == 6
    assert b"".join(c.field(0).to_numpy().tobytes() for c in structs.chunks) == data


def test_a_requested_uint8_schema_gives_plain_uint8_chunks(tmp_path):
    p, data = random_file(tmp_path, 7 * 1000 + 9)
    it = kvikpy.iter_chunks(p, 1000, device="cpu")
    first = next(it)  # the stream continues where the iterator is
    column = pa.chunked_array(it, type=pa.uint8())
    assert column.type == pa.uint8() and column.num_chunks == 7
    assert [len(c) for c in column.chunks] == [1000] * 6 + [9]
    assert host_bytes(first) + column.to_numpy().tobytes() == data
    # Any other request keeps the record batches (a producer may keep its own schema).
    capsule = kvikpy.iter_chunks(p, 1000, device="cpu").__arrow_c_stream__(
        pa.int64().__arrow_c_schema__()
    )
    assert pa.RecordBatchReader._import_from_c_capsule(capsule).schema == CHUNK_SCHEMA
    with pytest.raises(TypeError, match="arrow_schema capsule"):
        kvikpy.iter_chunks(p, 1000, device="cpu").__arrow_c_stream__("uint8")


def test_stream_errors_reach_the_consumer(tmp_path):
    p, _ = random_file(tmp_path, 64)
    typed = kvikpy.read(p, dtype="float32", device="cpu")
    for items, match in [
        ([object()], "Buffer"),
        ([typed], "chunk of Arrow type Float32 in a stream of UInt8"),
    ]:
        reader = pa.RecordBatchReader._import_from_c_capsule(_lib.host_stream_capsule(iter(items)))
        with pytest.raises(OSError, match=match):  # pyarrow turns EIO into OSError
            reader.read_next_batch()


def test_an_unconsumed_stream_releases_its_iterator(tmp_path):
    p, _ = random_file(tmp_path, 5000)
    gc.collect()  # buffers of earlier tests still in cycles go first
    base = _lib.live_buffers()
    it = kvikpy.iter_chunks(p, 1000, device="cpu")
    next(it)
    capsule = it.__arrow_c_stream__()
    del it, capsule
    gc.collect()
    assert _lib.live_buffers() == base


@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    chunk=st.integers(1, 9_000),
    whole=st.integers(0, 30),
    part=st.floats(0, 1, exclude_max=True),
    seed=st.integers(0, 1 << 16),
)
def test_stream_chunks_hold_the_files_bytes(tmp_path, chunk, whole, part, seed):
    n = chunk * whole + int(part * chunk)  # up to 30 whole chunks and a shorter last one
    p, data = random_file(tmp_path, n, seed)
    batches = list(pa.RecordBatchReader.from_stream(kvikpy.iter_chunks(p, chunk, device="cpu")))
    assert [b.num_rows for b in batches] == [min(chunk, n - o) for o in range(0, n, chunk)]
    assert b"".join(b.column(0).to_numpy().tobytes() for b in batches) == data
    column = pa.chunked_array(kvikpy.iter_chunks(p, chunk, device="cpu"), type=pa.uint8())
    assert column.to_numpy().tobytes() == data
