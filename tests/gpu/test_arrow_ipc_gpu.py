"""kvikpy.arrow.read_ipc onto the GPU: the table's record batches are CUDA device arrays
(read as a C consumer does, and by nanoarrow.device when it is installed), their bytes
equal pyarrow's reading of the same file (copied back with CuPy), fixed-width columns are
DLPack tensors for CuPy and torch, and the memory outlives the table while an export
holds it. pylibcudf is not tested: it is not installable on the GPU machine."""

from __future__ import annotations

import gc
from pathlib import Path

import numpy as np
import pytest

import kvikpy
import kvikpy.arrow

cupy = pytest.importorskip("cupy")
pa = pytest.importorskip("pyarrow")
ipc = pytest.importorskip("pyarrow.ipc")

from test_arrow_ipc import delta_batches, every_type_table, view_union_table  # noqa: E402

pytestmark = pytest.mark.gpu


def write_file(path: Path, table: pa.Table, stream: bool, chunk: int) -> None:
    opener = ipc.new_stream if stream else ipc.new_file
    with opener(path, table.schema) as w:
        for batch in table.to_batches(max_chunksize=chunk):
            w.write_batch(batch)


def host_copy(table: kvikpy.arrow.Table) -> np.ndarray:
    buf = table.buffer
    return cupy.asnumpy(cupy.from_dlpack(buf)) if buf.nbytes else np.zeros(0, np.uint8)


@pytest.mark.parametrize("stream", [False, True])
def test_gpu_table_equals_host_table(tmp_path: Path, stream: bool) -> None:
    table = every_type_table(64)
    path = tmp_path / "t.arrow"
    write_file(path, table, stream, 20)
    gpu = kvikpy.arrow.read_ipc(path)
    cpu = kvikpy.arrow.read_ipc(path, device="cpu")
    assert gpu.device.startswith("cuda") and gpu.num_rows == 64
    assert gpu.nbytes == cpu.nbytes
    assert pa.table(cpu).equals(table)
    # The GPU table's bytes, copied back, are the same table.
    assert pa.table(gpu.to_host()).equals(table)
    assert len(host_copy(gpu)) == gpu.buffer.nbytes


def test_device_stream_is_cuda(tmp_path: Path) -> None:
    from test_chunks import consume_device_stream

    table = every_type_table(30)
    path = tmp_path / "t.arrow"
    write_file(path, table, False, 10)
    t = kvikpy.arrow.read_ipc(path)
    device_type, _, fmt, devices = consume_device_stream(
        t.__arrow_c_device_stream__(), read=lambda p, n: b""
    )
    assert (device_type, fmt) == (2, "+s")  # ARROW_DEVICE_CUDA, a struct per batch
    assert devices == [(2, cupy.cuda.runtime.getDevice(), 1)] * t.num_batches
    with pytest.raises(BufferError, match="__arrow_c_device_stream__"):
        t.__arrow_c_stream__()
    nd = pytest.importorskip("nanoarrow.device")
    for i in range(t.num_batches):
        arr = nd.c_device_array(t.column("i64")[i])
        assert arr.device_type == nd.DeviceType.CUDA
        assert arr.device_id == cupy.cuda.runtime.getDevice()


def test_dlpack_columns_for_cupy_and_torch(tmp_path: Path) -> None:
    table = pa.table({"ids": pa.array(np.arange(1000, dtype=np.int32)), "x": np.ones(1000)})
    path = tmp_path / "t.arrow"
    write_file(path, table, True, 1000)
    t = kvikpy.arrow.read_ipc(path)
    ids = cupy.from_dlpack(t.column("ids"))
    assert ids.dtype == np.int32 and cupy.asnumpy(ids).tolist() == list(range(1000))
    del t
    gc.collect()
    # The export keeps the memory alive after the table is gone.
    assert int(ids.sum()) == sum(range(1000))
    torch = pytest.importorskip("torch")
    t = kvikpy.arrow.read_ipc(path, columns=["x"])
    x = torch.from_dlpack(t.column("x"))
    assert x.is_cuda and float(x.sum()) == 1000.0


def test_write_ipc_from_the_gpu(tmp_path: Path) -> None:
    table = every_type_table(50)
    src = tmp_path / "in.arrow"
    write_file(src, table, False, 20)
    gpu = kvikpy.arrow.read_ipc(src)
    out = tmp_path / "out.arrow"
    kvikpy.arrow.write_ipc(out, gpu, compression="zstd")
    assert pa.ipc.open_file(out).read_all().equals(table)


def test_compressed_file_onto_the_gpu(tmp_path: Path) -> None:
    table = every_type_table(80)
    path = tmp_path / "z.arrow"
    with ipc.new_file(path, table.schema, options=ipc.IpcWriteOptions(compression="zstd")) as w:
        for batch in table.to_batches(max_chunksize=30):
            w.write_batch(batch)
    gpu = kvikpy.arrow.read_ipc(path)
    assert pa.table(gpu.to_host()).equals(table)


def test_embeddings_to_torch(tmp_path: Path) -> None:
    torch = pytest.importorskip("torch")
    values = np.random.default_rng(0).random((256, 8), dtype=np.float32)
    table = pa.table({"emb": pa.FixedSizeListArray.from_arrays(pa.array(values.ravel()), 8)})
    path = tmp_path / "e.arrow"
    write_file(path, table, False, 256)
    emb = torch.from_dlpack(kvikpy.arrow.read_ipc(path).column("emb"))
    assert emb.is_cuda and tuple(emb.shape) == (256, 8)
    assert np.array_equal(emb.cpu().numpy(), values)


def test_write_ipc_straight_from_gpu_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Uncompressed, a GPU table is written by kvikpy's own writer from device memory:
    no host copy of the table, no pyarrow; pyarrow reads the file back equal."""
    table = every_type_table(70).drop_columns(["dict"])
    src = tmp_path / "in.arrow"
    write_file(src, table, False, 30)
    gpu = kvikpy.arrow.read_ipc(src)
    assert gpu.device.startswith("cuda")

    def refuse(*args: object) -> object:
        raise AssertionError("the GPU table went through the host")

    monkeypatch.setattr(kvikpy.arrow, "_write_pyarrow", refuse)
    monkeypatch.setattr(kvikpy.arrow.Table, "to_host", refuse)
    out = tmp_path / "out.arrow"
    n = kvikpy.arrow.write_ipc(out, gpu)
    assert n == out.stat().st_size
    got = pa.ipc.open_file(out).read_all()
    assert got.schema.equals(table.schema, check_metadata=True)
    assert got.equals(table)
    assert pa.ipc.open_file(out).num_record_batches == 3
    # One record batch handed over as a device array (__arrow_c_device_array__).

    class OneBatch:
        def __init__(self, inner: object) -> None:
            self.inner = inner

        def __arrow_c_device_array__(self, requested_schema: object = None, **kw: object) -> object:
            return self.inner.__arrow_c_device_array__()  # type: ignore[attr-defined]

    one = tmp_path / "one.arrow"
    kvikpy.arrow.write_ipc(one, OneBatch(next(gpu._batches())))
    assert pa.ipc.open_file(one).read_all().equals(table.slice(0, 30))
    # And back onto the GPU by kvikpy.
    monkeypatch.undo()
    again = kvikpy.arrow.read_ipc(out)
    assert pa.table(again.to_host()).equals(table)


def test_write_ipc_gpu_table_with_dictionaries_falls_back(tmp_path: Path) -> None:
    """A column kvikpy's writer does not handle (dictionary) sends a GPU kvikpy table
    through the host and pyarrow, as before."""
    table = every_type_table(40).select(["dict", "i32", "utf8"])
    src = tmp_path / "in.arrow"
    write_file(src, table, False, 20)
    out = tmp_path / "out.arrow"
    kvikpy.arrow.write_ipc(out, kvikpy.arrow.read_ipc(src))
    assert pa.ipc.open_file(out).read_all().equals(table)


@pytest.mark.parametrize("compression", [None, "zstd"])
@pytest.mark.parametrize("stream", [False, True])
def test_views_and_unions_onto_the_gpu(
    tmp_path: Path, stream: bool, compression: str | None
) -> None:
    import ctypes

    table = view_union_table(2000)
    path = tmp_path / "v.arrow"
    opener = ipc.new_stream if stream else ipc.new_file
    with opener(path, table.schema, options=ipc.IpcWriteOptions(compression=compression)) as w:
        for batch in table.to_batches(max_chunksize=800):
            w.write_batch(batch)
    gpu = kvikpy.arrow.read_ipc(path)
    assert gpu.device.startswith("cuda")
    # The GPU table's bytes, copied back, are the same table.
    assert pa.table(gpu.to_host()).equals(table)
    nd = pytest.importorskip("nanoarrow.device")
    written = table.to_batches(max_chunksize=800)
    for i in range(gpu.num_batches):
        for name in ("sv", "bv", "sparse", "dense", "lv", "llv", "nested"):
            arr = nd.c_device_array(gpu.column(name)[i])
            assert arr.device_type == nd.DeviceType.CUDA, name
            assert arr.device_id == cupy.cuda.runtime.getDevice()
        # A view array: validity, views and data buffers on the GPU, then the data
        # buffers' sizes in host memory.
        data = written[i].column("sv").buffers()[2:]
        sv = nd.c_device_array(gpu.column("sv")[i]).array
        assert sv.n_buffers == 2 + len(data) + 1
        sizes = (ctypes.c_int64 * len(data)).from_address(sv.buffers[-1])
        assert list(sizes) == [b.size for b in data]
        for j, b in enumerate(data):
            if b.size:
                attrs = cupy.cuda.runtime.pointerGetAttributes(sv.buffers[2 + j])
                assert attrs.type == cupy.cuda.runtime.memoryTypeDevice
                got = cupy.asnumpy(
                    cupy.ndarray(
                        (b.size,),
                        cupy.uint8,
                        cupy.cuda.MemoryPointer(
                            cupy.cuda.UnownedMemory(sv.buffers[2 + j], b.size, gpu), 0
                        ),
                    )
                )
                assert got.tobytes() == b.to_pybytes()
        # Unions export no validity buffer.
        assert nd.c_device_array(gpu.column("sparse")[i]).array.n_buffers == 1
        assert nd.c_device_array(gpu.column("dense")[i]).array.n_buffers == 2


@pytest.mark.parametrize("stream", [False, True])
def test_delta_dictionaries_onto_the_gpu(tmp_path: Path, stream: bool) -> None:
    batches = delta_batches()
    path = tmp_path / "d.arrow"
    opener = ipc.new_stream if stream else ipc.new_file
    options = ipc.IpcWriteOptions(emit_dictionary_deltas=True)
    with opener(path, batches[0].schema, options=options) as w:
        for batch in batches:
            w.write_batch(batch)
    want = (ipc.open_stream if stream else ipc.open_file)(path).read_all()
    gpu = kvikpy.arrow.read_ipc(path)
    assert pa.table(gpu.to_host()).equals(want)
    nd = pytest.importorskip("nanoarrow.device")
    for i in range(gpu.num_batches):
        arr = nd.c_device_array(gpu.column("s")[i])
        assert arr.device_type == nd.DeviceType.CUDA
        # The extended dictionary's buffers are GPU memory too.
        dictionary = arr.array.dictionary
        for address in dictionary.buffers:
            if address:
                attrs = cupy.cuda.runtime.pointerGetAttributes(address)
                assert attrs.type == cupy.cuda.runtime.memoryTypeDevice
