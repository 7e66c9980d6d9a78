"""Where kvikpy.arrow.read_ipc decodes compressed IPC buffers (``decode=``): the engine's
plan for decoding them on the GPU, run here with host stand-ins for nvCOMP (numcodecs'
zstd for a ZSTD frame, its LZ4 for a raw LZ4 block: nvCOMP's contract, exactly the
decoded bytes), gives the same allocation byte for byte as the host decoder, for files
pyarrow writes; lying lengths are refused naming the column; bad arguments are refused
before any I/O."""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np
import pytest

import kvikpy.arrow
from kvikpy import _lib, _nvcomp

pa = pytest.importorskip("pyarrow")
ipc = pytest.importorskip("pyarrow.ipc")
numcodecs = pytest.importorskip("numcodecs")

from test_arrow_ipc import every_type_table  # noqa: E402


def big_table(rows: int) -> pa.Table:
    """Columns whose buffers pass 64 KiB (LZ4 frames of several blocks) and small ones."""
    rng = np.random.default_rng(rows)
    ints = rng.integers(0, 1000, rows)
    return pa.table(
        {
            "ints": pa.array(ints),
            "runs": pa.array(np.repeat(np.arange(rows // 100 + 1), 100)[:rows]),
            "nulls": pa.array([None if i % 5 == 0 else float(i) for i in range(rows)]),
            "text": pa.array([f"row {i} " * (i % 4) for i in range(rows)]),
            "lists": pa.array([list(range(i % 5)) for i in range(rows)], pa.list_(pa.int32())),
        }
    )


def write(path: Path, table: pa.Table, codec: str, stream: bool, chunk: int) -> None:
    options = ipc.IpcWriteOptions(compression=codec)
    opener = ipc.new_stream if stream else ipc.new_file
    with opener(path, table.schema, options=options) as w:
        for batch in table.to_batches(max_chunksize=chunk):
            w.write_batch(batch)


def run_plan_on_host(
    path: Path, columns: list[str] | None, batches: list[int] | None
) -> tuple[bytes, set[int]]:
    """The table's allocation as the GPU path fills it, nvCOMP stood in for on the host;
    and the steps it took (0 copy, 1 ZSTD frame, 2 LZ4 block)."""
    pieces, host, total, labels = _lib.ipc_decode_plan(str(path), columns, batches)
    data = path.read_bytes()
    out = bytearray(total)
    steps = set()
    for step, src, src_len, dst, dst_len, r in pieces:
        raw = data[src : src + src_len]
        if step == 0:
            piece = raw
        elif step == 1:
            piece = bytes(numcodecs.Zstd().decode(raw))
        else:
            piece = bytes(numcodecs.LZ4().decode(struct.pack("<I", dst_len) + raw))
        assert len(piece) == dst_len, labels[r]
        out[dst : dst + dst_len] = piece
        steps.add(step)
    for at, decoded in host:
        out[at : at + len(decoded)] = decoded
    return bytes(out), steps


def host_bytes(path: Path, **kw: object) -> bytes:
    t = kvikpy.arrow.read_ipc(path, device="cpu", decode="host", **kw)  # type: ignore[arg-type]
    return t.buffer.to_numpy().tobytes() if t.buffer.nbytes else b""


@pytest.mark.parametrize("codec", ["zstd", "lz4"])
@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("rows", [300, 60_000])
def test_gpu_plan_gives_the_host_decoders_bytes(
    tmp_path: Path, codec: str, stream: bool, rows: int
) -> None:
    table = every_type_table(rows) if rows < 1000 else big_table(rows)
    path = tmp_path / "t.arrow"
    write(path, table, codec, stream, rows // 3 + 1)
    got, steps = run_plan_on_host(path, None, None)
    assert got == host_bytes(path)
    assert pa.table(kvikpy.arrow.read_ipc(path, device="cpu")).equals(table)
    # The GPU really gets work: ZSTD frames, or LZ4 blocks (small buffers are one block).
    assert (1 if codec == "zstd" else 2) in steps
    names = ["text", "ints"] if rows > 1000 else ["utf8", "list"]
    got, _ = run_plan_on_host(path, names, [1])
    assert got == host_bytes(path, columns=names, batches=[1])


def test_lying_length_names_the_column(tmp_path: Path) -> None:
    path = tmp_path / "t.arrow"
    write(path, pa.table({"a": pa.array(np.arange(5000))}), "zstd", False, 5000)
    data = bytearray(path.read_bytes())
    frame = data.index(bytes.fromhex("28b52ffd"))
    declared = struct.unpack_from("<q", data, frame - 8)[0]
    assert declared == 5000 * 8
    struct.pack_into("<q", data, frame - 8, 1 << 40)
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=r"column 'a'.*1099511627776 bytes uncompressed"):
        _lib.ipc_decode_plan(str(path), None, None)
    # The host decoder names it too.
    with pytest.raises(ValueError, match=r"record batch 0, column 'a', buffer 1.*1099511627776"):
        kvikpy.arrow.read_ipc(path, device="cpu")


def test_decode_argument_is_checked_first(tmp_path: Path) -> None:
    missing = tmp_path / "missing.arrow"
    with pytest.raises(TypeError, match="decode"):
        kvikpy.arrow.read_ipc(missing, device="cpu", decode=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="decode must be"):
        kvikpy.arrow.read_ipc(missing, device="cpu", decode="nvcomp")
    with pytest.raises(ValueError, match="GPU device"):
        kvikpy.arrow.read_ipc(missing, device="cpu", decode="gpu")


def test_decode_gpu_without_nvcomp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_nvcomp, "available", lambda: False)
    monkeypatch.setattr(kvikpy.arrow._devices, "resolve", lambda device: 0)
    with pytest.raises(ImportError, match="nvCOMP"):
        kvikpy.arrow.read_ipc(tmp_path / "missing.arrow", decode="gpu")


@pytest.mark.parametrize("decode", ["auto", "host"])
def test_host_tables_decode_on_the_host(tmp_path: Path, decode: str) -> None:
    path = tmp_path / "t.arrow"
    table = every_type_table(50)
    write(path, table, "lz4", False, 20)
    assert pa.table(kvikpy.arrow.read_ipc(path, device="cpu", decode=decode)).equals(table)


class _LeftWork:
    """An engine read that left work for nvCOMP, as `_decode_on_gpu` sees it."""

    def __init__(self, host_error: Exception | None = None) -> None:
        self.labels = ["record batch 0, column 'a', buffer 1"]
        self.on_host = 0
        self._host_error = host_error

    def decode_on_host(self) -> None:
        self.on_host += 1
        if self._host_error is not None:
            raise self._host_error


def test_nvcomp_failing_leaves_the_work_to_the_engine_on_the_host(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """One path where nvCOMP is missing or fails: the engine does the same work on the
    host from the bytes already read (no second read of the file); ``decode="gpu"`` still
    says nvCOMP failed, and a buffer the host cannot decode either is that error."""

    def failing(*args: object) -> None:
        raise RuntimeError("simulated nvCOMP failure")

    monkeypatch.setattr(kvikpy.arrow, "_run_pieces", failing)
    piece = [(1, 0, 8, 0, 8, 0)]
    read = _LeftWork()
    kvikpy.arrow._decode_on_gpu(read, piece, 0, False)  # type: ignore[arg-type]
    assert read.on_host == 1
    read = _LeftWork()
    with pytest.raises(RuntimeError, match=r"nvCOMP could not decode.*simulated"):
        kvikpy.arrow._decode_on_gpu(read, piece, 0, True)  # type: ignore[arg-type]
    assert read.on_host == 1
    read = _LeftWork(ValueError("buffer 1: malformed"))
    with pytest.raises(ValueError, match="malformed"):
        kvikpy.arrow._decode_on_gpu(read, piece, 0, True)  # type: ignore[arg-type]
    # nvCOMP installed but failing to load takes the same path.
    monkeypatch.undo()
    monkeypatch.setattr(_nvcomp, "available", lambda: False)
    read = _LeftWork()
    kvikpy.arrow._decode_on_gpu(read, piece, 0, False)  # type: ignore[arg-type]
    assert read.on_host == 1


def test_a_host_read_leaves_no_work_for_nvcomp(tmp_path: Path) -> None:
    path = tmp_path / "t.arrow"
    write(path, every_type_table(50), "zstd", False, 20)
    read = _lib.read_ipc_table(str(path), None, None, None, True)
    assert read.gpu_pieces == [] and read.labels == []
    table = read.table()
    assert table.ordinal is None
    with pytest.raises(RuntimeError, match="already taken"):
        read.table()
