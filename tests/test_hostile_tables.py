"""Arrow IPC tables a hostile writer made: a compressed buffer whose length prefix lies
(a decompression bomb) is refused before it is decoded; a stream cut inside a message
marker is an error, not a shorter table; a table of 100,000 columns is read, and its
columns chosen by name, in one pass over the names."""

from __future__ import annotations

import struct
import textwrap
from pathlib import Path

import numpy as np
import pytest
from conftest import run_python

import kvikpy.arrow

pa = pytest.importorskip("pyarrow")
ipc = pytest.importorskip("pyarrow.ipc")

MiB = 1 << 20


def zstd_file(path: Path, table: pa.Table) -> bytes:
    with ipc.new_file(path, table.schema, options=ipc.IpcWriteOptions(compression="zstd")) as w:
        w.write_table(table)
    return path.read_bytes()


def test_a_bomb_is_refused_before_it_is_decoded(tmp_path: Path) -> None:
    # 256 MiB of zeros: a ZSTD frame of a few KiB. Its prefix then claims 2**62 bytes.
    path = tmp_path / "bomb.arrow"
    data = bytearray(zstd_file(path, pa.table({"a": np.zeros(32 * MiB, dtype=np.int64)})))
    assert len(data) < 256 << 10
    frame = data.index(bytes.fromhex("28b52ffd"))
    assert struct.unpack_from("<q", data, frame - 8)[0] == 256 * MiB
    struct.pack_into("<q", data, frame - 8, 1 << 62)
    path.write_bytes(bytes(data))
    code = """
        import resource, sys
        import kvikpy.arrow
        before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        try:
            kvikpy.arrow.read_ipc(sys.argv[1], device="cpu")
        except ValueError as e:
            message = str(e)
        else:
            message = "read"
        grew = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
        print(grew // 1024)
        print(message)
    """
    r = run_python(textwrap.dedent(code), str(path), timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    grew_mib, message = r.stdout.strip().split("\n", 1)
    assert "column 'a'" in message and "refused before decoding" in message, message
    assert int(grew_mib) < 64, f"reading the bomb took {grew_mib} MiB more"


@pytest.mark.parametrize("codec", ["zstd", "lz4"])
def test_lengths_the_frame_or_the_column_contradict_are_refused(tmp_path: Path, codec: str) -> None:
    path = tmp_path / "t.arrow"
    table = pa.table({"a": np.arange(5000, dtype=np.int64)})
    with ipc.new_file(path, table.schema, options=ipc.IpcWriteOptions(compression=codec)) as w:
        w.write_table(table)
    data = bytearray(path.read_bytes())
    magic = bytes.fromhex("28b52ffd") if codec == "zstd" else bytes.fromhex("04224d18")
    frame = data.index(magic)
    assert struct.unpack_from("<q", data, frame - 8)[0] == 5000 * 8
    for lie in (5000 * 8 - 8, 5000 * 8 * 3):
        struct.pack_into("<q", data, frame - 8, lie)
        path.write_bytes(bytes(data))
        with pytest.raises(ValueError, match=rf"column 'a', buffer 1: .*{lie}"):
            kvikpy.arrow.read_ipc(path, device="cpu")


def stream_of_two_batches(path: Path) -> tuple[bytes, int, pa.Table]:
    """A stream of two record batches with no end-of-stream marker; the offset where the
    second batch's message starts."""
    table = pa.table({"x": np.arange(10, dtype=np.int64), "s": [str(i) for i in range(10)]})
    sink = pa.BufferOutputStream()
    with ipc.new_stream(sink, table.schema) as w:
        w.write_batch(table.slice(0, 5).to_batches()[0])
        w.write_batch(table.slice(5).to_batches()[0])
    whole = sink.getvalue().to_pybytes()
    assert whole.endswith(b"\xff\xff\xff\xff\x00\x00\x00\x00")
    body = whole[:-8]  # without the end-of-stream marker
    # Message starts: each a continuation marker; the second batch's is the last one.
    second = body.rindex(b"\xff\xff\xff\xff")
    return body, second, table


def test_a_stream_cut_inside_a_message_marker_is_an_error(tmp_path: Path) -> None:
    body, second, table = stream_of_two_batches(tmp_path)
    path = tmp_path / "cut.arrows"
    for cut in (1, 2, 3):
        path.write_bytes(body[: second + cut])
        with pytest.raises(ValueError, match=rf"cut short: it ends {cut} byte\(s\) into"):
            kvikpy.arrow.read_ipc(path, device="cpu")
        with pytest.raises(pa.ArrowInvalid):  # pyarrow refuses it too
            ipc.open_stream(path.read_bytes()).read_all()
    # Cut between messages, or ended by the marker: accepted, as pyarrow accepts them.
    path.write_bytes(body[:second])
    assert kvikpy.arrow.read_ipc(path, device="cpu").num_rows == 5
    path.write_bytes(body + b"\xff\xff\xff\xff\x00\x00\x00\x00")
    assert pa.table(kvikpy.arrow.read_ipc(path, device="cpu")).equals(table)
    path.write_bytes(body)
    assert kvikpy.arrow.read_ipc(path, device="cpu").num_rows == 10


def test_a_table_of_100000_columns_is_chosen_from_by_name(tmp_path: Path) -> None:
    n = 100_000
    names = [f"c{i}" for i in range(n)]
    table = pa.table([pa.array([i], pa.int32()) for i in range(n)], names=names)
    path = tmp_path / "wide.arrow"
    with ipc.new_file(path, table.schema) as w:
        w.write_table(table)
    got = kvikpy.arrow.read_ipc(path, device="cpu", columns=names[::-1])
    assert got.num_columns == n
    assert pa.table(got).column(0).to_pylist() == [n - 1]
    some = kvikpy.arrow.read_ipc(path, device="cpu", columns=names[::1000])
    assert some.num_columns == 100
    # A missing name is reported with the first names and a count, not all 100,000.
    with pytest.raises(ValueError) as e:
        kvikpy.arrow.read_ipc(path, device="cpu", columns=["c1", "nope"])
    message = str(e.value)
    assert '"nope"' in message and "and 99980 more" in message and len(message) < 2000
