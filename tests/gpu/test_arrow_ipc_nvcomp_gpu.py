"""kvikpy.arrow.read_ipc with compressed bodies decoded on the GPU by nvCOMP: ZSTD and LZ4
files written by pyarrow read with ``decode="gpu"`` equal pyarrow's reading and, byte
for byte, ``decode="host"``; one nvCOMP call per codec per read; a failing nvCOMP call
falls back to the host (``"auto"``) or is a clear error (``"gpu"``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import kvikpy.arrow
from kvikpy import _nvcomp

cupy = pytest.importorskip("cupy")
pa = pytest.importorskip("pyarrow")
ipc = pytest.importorskip("pyarrow.ipc")
if not _nvcomp.available():
    pytest.skip("nvCOMP (nvidia.nvcomp) is not importable", allow_module_level=True)

from test_arrow_ipc import every_type_table  # noqa: E402
from test_arrow_ipc_decode import big_table, write  # noqa: E402

pytestmark = pytest.mark.gpu


def device_bytes(t: kvikpy.arrow.Table) -> bytes:
    buf = t.buffer
    return cupy.asnumpy(cupy.from_dlpack(buf)).tobytes() if buf.nbytes else b""


def count_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = _nvcomp._Decoder.decode

    def counting(self: Any, sources: list[Any], header: int) -> list[Any]:
        calls.append(len(sources))
        return real(self, sources, header)

    monkeypatch.setattr(_nvcomp._Decoder, "decode", counting)
    return calls


@pytest.mark.parametrize("codec", ["zstd", "lz4"])
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("rows", [300, 200_000])
def test_gpu_decode_equals_pyarrow_and_host(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, codec: str, stream: bool, rows: int
) -> None:
    table = every_type_table(rows) if rows < 1000 else big_table(rows)
    path = tmp_path / "t.arrow"
    write(path, table, codec, stream, rows // 3 + 1)
    calls = count_calls(monkeypatch)
    gpu = kvikpy.arrow.read_ipc(path, decode="gpu")
    assert gpu.device.startswith("cuda")
    # One nvCOMP call for the whole read (small LZ4 buffers are single blocks).
    assert len(calls) == 1 and calls[0] > 1
    host = kvikpy.arrow.read_ipc(path, decode="host")
    assert device_bytes(gpu) == device_bytes(host)
    assert pa.table(gpu.to_host()).equals(table)
    cpu = kvikpy.arrow.read_ipc(path, device="cpu")
    assert device_bytes(gpu) == cpu.buffer.to_numpy().tobytes()


@pytest.mark.parametrize("codec", ["zstd", "lz4"])
def test_column_subset_decoded_on_the_gpu(tmp_path: Path, codec: str) -> None:
    table = big_table(100_000)
    path = tmp_path / "t.arrow"
    write(path, table, codec, False, 40_000)
    t = kvikpy.arrow.read_ipc(path, columns=["text", "ints"], batches=[1, 2], decode="gpu")
    want = pa.Table.from_batches(table.to_batches(max_chunksize=40_000)[1:]).select(
        ["text", "ints"]
    )
    assert pa.table(t.to_host()).equals(want)
    ints = cupy.from_dlpack(t.column("ints")[0])
    assert np.array_equal(cupy.asnumpy(ints), want.column("ints").chunk(0).to_numpy())


def test_auto_uses_nvcomp_on_the_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    table = every_type_table(100)
    path = tmp_path / "t.arrow"
    write(path, table, "zstd", False, 50)
    calls = count_calls(monkeypatch)
    assert pa.table(kvikpy.arrow.read_ipc(path).to_host()).equals(table)
    assert calls
    calls.clear()
    assert pa.table(kvikpy.arrow.read_ipc(path, decode="host").to_host()).equals(table)
    assert not calls


def test_nvcomp_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    table = every_type_table(100)
    path = tmp_path / "t.arrow"
    write(path, table, "zstd", False, 50)

    def failing(self: Any, sources: list[Any], header: int) -> list[Any]:
        raise RuntimeError("simulated nvCOMP failure")

    monkeypatch.setattr(_nvcomp._Decoder, "decode", failing)
    # "auto" decodes on the host instead, to the same table.
    assert pa.table(kvikpy.arrow.read_ipc(path).to_host()).equals(table)
    with pytest.raises(RuntimeError, match=r"nvCOMP could not decode.*simulated"):
        kvikpy.arrow.read_ipc(path, decode="gpu")


def test_wrong_output_size_names_the_buffer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    table = pa.table({"a": pa.array(np.arange(1000))})
    path = tmp_path / "t.arrow"
    write(path, table, "zstd", False, 1000)
    real = _nvcomp._Decoder.decode

    def short(self: Any, sources: list[Any], header: int) -> list[Any]:
        return [out[:-1] for out in real(self, sources, header)]

    monkeypatch.setattr(_nvcomp._Decoder, "decode", short)
    with pytest.raises(RuntimeError, match=r"column 'a', buffer 1: nvCOMP decoded 7999 bytes"):
        kvikpy.arrow.read_ipc(path, decode="gpu")


@pytest.mark.parametrize("compression", ["lz4", "zstd"])
def test_feather_files_decoded_on_the_gpu(tmp_path: Path, compression: str) -> None:
    feather = pytest.importorskip("pyarrow.feather")
    table = every_type_table(5000)
    path = tmp_path / "t.feather"
    feather.write_feather(table, path, compression=compression, chunksize=1000)
    gpu = kvikpy.arrow.read_ipc(path, decode="gpu")
    assert pa.table(gpu.to_host()).equals(feather.read_table(path))
    assert device_bytes(gpu) == device_bytes(kvikpy.arrow.read_ipc(path, decode="host"))


def test_zstd_decoded_in_place(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """nvCOMP writing ZSTD frames straight into the table (the route the arrow-zstd
    benchmark compares with decoding into nvCOMP's outputs and copying)."""
    table = big_table(100_000)
    path = tmp_path / "t.arrow"
    write(path, table, "zstd", False, 30_000)
    monkeypatch.setattr(kvikpy.arrow, "_ZSTD_IN_PLACE", True)
    gpu = kvikpy.arrow.read_ipc(path, decode="gpu")
    assert pa.table(gpu.to_host()).equals(table)
    assert device_bytes(gpu) == device_bytes(kvikpy.arrow.read_ipc(path, decode="host"))
