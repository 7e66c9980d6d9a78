"""A column of an Arrow IPC table over several record batches as one tensor: the reader
lays each column's values record batch after record batch in the table's memory, so a
fixed-width column without nulls (or a fixed-size list of such values) exports DLPack over
all its rows without a copy, whatever the number of record batches, the compression and
the columns and batches chosen; checked against pyarrow on the host (the same on a GPU is
tests/gpu/test_arrow_columns_gpu.py)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kvikpy.arrow

pa = pytest.importorskip("pyarrow")
ipc = pytest.importorskip("pyarrow.ipc")


def table(rows: int, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    ids = rng.integers(-(2**40), 2**40, rows)
    emb = rng.standard_normal((rows, 4)).astype(np.float32)
    return pa.table(
        {
            "input_ids": pa.array(ids, pa.int64()),
            "score": pa.array(rng.standard_normal(rows).astype(np.float32)),
            "small": pa.array(rng.integers(0, 100, rows).astype(np.int16)),
            "text": pa.array([f"row {i}" for i in range(rows)]),
            "maybe": pa.array([None if i % 3 == 0 else i for i in range(rows)], pa.int32()),
            "emb": pa.FixedSizeListArray.from_arrays(pa.array(emb.reshape(-1)), 4),
        }
    )


def write(path: Path, t: pa.Table, chunk: int, compression: str | None, stream: bool) -> None:
    opener = ipc.new_stream if stream else ipc.new_file
    options = ipc.IpcWriteOptions(compression=compression)
    with opener(path, t.schema, options=options) as w:
        for batch in t.to_batches(max_chunksize=chunk):
            w.write_batch(batch)


def expected(t: pa.Table, name: str) -> np.ndarray:
    column = t.column(name).combine_chunks()
    if pa.types.is_fixed_size_list(column.type):
        return column.flatten().to_numpy().reshape(len(column), column.type.list_size)
    return column.to_numpy()


@pytest.mark.parametrize("compression", [None, "zstd", "lz4"])
@pytest.mark.parametrize("stream", [False, True])
def test_a_column_of_many_record_batches_is_one_tensor(
    tmp_path: Path, compression: str | None, stream: bool
) -> None:
    t = table(1000)
    path = tmp_path / "t.arrow"
    write(path, t, 128, compression, stream)  # 8 record batches, the last short
    got = kvikpy.arrow.read_ipc(path, device="cpu")
    assert len(got.column("input_ids")) == 8
    for name in ("input_ids", "score", "small", "emb"):
        values = np.from_dlpack(got.column(name))
        want = expected(t, name)
        assert values.shape == want.shape and values.dtype == want.dtype, name
        np.testing.assert_array_equal(values, want, err_msg=name)
        # One view of the table's memory: the first chunk's values are its first rows.
        first = np.from_dlpack(got.column(name)[0])
        assert np.shares_memory(values, first) or values.size == 0
    # Chunks still export on their own, and through Arrow, as before.
    assert pa.table(got).equals(t)


def test_columns_with_nulls_or_variable_width_say_why(tmp_path: Path) -> None:
    t = table(300)
    path = tmp_path / "t.arrow"
    write(path, t, 100, None, False)
    got = kvikpy.arrow.read_ipc(path, device="cpu")
    for name in ("maybe", "text"):
        with pytest.raises(TypeError, match="has nulls or is not fixed-width"):
            np.from_dlpack(got.column(name))


def test_chosen_columns_and_batches_in_the_order_asked(tmp_path: Path) -> None:
    t = table(500, seed=3)
    path = tmp_path / "t.arrow"
    write(path, t, 100, None, False)
    got = kvikpy.arrow.read_ipc(path, device="cpu", columns=["emb", "input_ids"], batches=[3, 0, 4])
    ids = np.from_dlpack(got.column("input_ids"))
    want = np.concatenate([expected(t, "input_ids")[b * 100 : (b + 1) * 100] for b in (3, 0, 4)])
    np.testing.assert_array_equal(ids, want)
    emb = np.from_dlpack(got.column("emb"))
    assert emb.shape == (300, 4)


def test_empty_record_batches_do_not_break_the_run(tmp_path: Path) -> None:
    t = table(60, seed=5)
    batches = t.to_batches(max_chunksize=20)
    empty = t.slice(0, 0).to_batches()
    empty_batch = empty[0] if empty else pa.RecordBatch.from_pylist([], schema=t.schema)
    path = tmp_path / "t.arrow"
    with ipc.new_file(path, t.schema) as w:
        for b in [batches[0], empty_batch, batches[1], empty_batch, batches[2]]:
            w.write_batch(b)
    got = kvikpy.arrow.read_ipc(path, device="cpu")
    assert len(got.column("score")) == 5
    np.testing.assert_array_equal(np.from_dlpack(got.column("score")), expected(t, "score"))


@pytest.mark.parametrize("compression", [None, "zstd", "lz4"])
def test_a_column_of_many_record_batches_is_one_arrow_array(
    tmp_path: Path, compression: str | None
) -> None:
    """Over several record batches a column exports one Arrow array: over the table's
    memory where its values lie end to end, else (nulls, offsets, padding) joined on the
    host, validity bitmaps joined and offsets rebased."""
    rows = 1000
    t = table(rows).append_column(
        "flags", pa.array([None if i % 7 == 0 else i % 2 == 0 for i in range(rows)])
    )
    t = t.append_column(
        "blobs", pa.array([None if i % 5 == 0 else b"x" * (i % 9) for i in range(rows)])
    )
    t = t.append_column("big_text", pa.array([f"r{i}" for i in range(rows)], pa.large_string()))
    path = tmp_path / "t.arrow"
    write(path, t, 128, compression, False)  # 8 record batches, the last short
    got = kvikpy.arrow.read_ipc(path, device="cpu")
    for name in ("input_ids", "score", "small", "text", "maybe", "flags", "blobs", "big_text"):
        array = pa.array(got.column(name))
        assert array.equals(t.column(name).combine_chunks()), name
    # Without compression a fixed-width column without nulls is a view of the table.
    base, size = got.buffer.ptr, got.buffer.nbytes
    for name in ("input_ids", "emb") if compression is None else ():
        array = pa.array(got.column(name))
        assert array.equals(t.column(name).combine_chunks()), name
        values = array.buffers()[-1]
        assert base <= values.address < base + size, name
    # One record batch's chunk is the same export as before.
    assert pa.array(got.column("text")[1]).equals(t.column("text").combine_chunks()[128:256])


def test_a_column_that_cannot_be_one_array_says_what_to_do(tmp_path: Path) -> None:
    t = pa.table({"lists": pa.array([[i] * (i % 3) for i in range(300)], pa.list_(pa.int32()))})
    path = tmp_path / "t.arrow"
    write(path, t, 100, None, False)
    got = kvikpy.arrow.read_ipc(path, device="cpu")
    with pytest.raises(ValueError, match=r"'lists' .* spans 3 record batches.*column\[i\]"):
        pa.array(got.column("lists"))
    assert pa.array(got.column("lists")[2]).equals(t.column("lists").combine_chunks()[200:])


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    sizes=st.lists(st.integers(0, 70), min_size=1, max_size=8),
    compression=st.sampled_from([None, "zstd", "lz4"]),
)
def test_any_cut_into_record_batches_round_trips(
    tmp_path: Path, sizes: list[int], compression: str | None
) -> None:
    t = table(sum(sizes), seed=len(sizes))
    path = tmp_path / "h.arrow"
    with ipc.new_file(path, t.schema, options=ipc.IpcWriteOptions(compression=compression)) as w:
        at = 0
        for n in sizes:
            w.write_batch(
                t.slice(at, n).to_batches()[0]
                if n
                else pa.RecordBatch.from_pylist([], schema=t.schema)
            )
            at += n
    got = kvikpy.arrow.read_ipc(path, device="cpu")
    for name in ("input_ids", "small", "emb"):
        np.testing.assert_array_equal(np.from_dlpack(got.column(name)), expected(t, name))
    assert pa.table(got).equals(t)


@pytest.mark.parametrize("codec", ["zstd", "lz4"])
def test_the_gpu_decode_plan_lays_padded_buffers_out_as_the_host_does(
    tmp_path: Path, codec: str
) -> None:
    """Record batches sliced one row at a time make pyarrow declare padded buffers: both
    decode routes keep the bytes the rows need, so the column is one run on either."""
    pytest.importorskip("numcodecs")
    from test_arrow_ipc_decode import host_bytes, run_plan_on_host

    t = table(7, seed=11)
    path = tmp_path / "p.arrow"
    with ipc.new_file(path, t.schema, options=ipc.IpcWriteOptions(compression=codec)) as w:
        for i in range(len(t)):
            w.write_batch(t.slice(i, 1).to_batches()[0])
    got, _ = run_plan_on_host(path, None, None)
    assert got == host_bytes(path)
    column = kvikpy.arrow.read_ipc(path, device="cpu").column("input_ids")
    np.testing.assert_array_equal(np.from_dlpack(column), expected(t, "input_ids"))
