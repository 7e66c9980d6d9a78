"""kvikpy.arrow.read_ipc against pyarrow: IPC files and streams (as pyarrow and Hugging Face
``datasets`` write them) read into host memory equal pyarrow's own reading, for every type
kvikpy places, column and batch subsets read only their bytes, and malformed files give a
clear error."""

from __future__ import annotations

import datetime
import decimal
import json
import random
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from remote_servers import Counter, CountingRangeHandler, serve

import kvikpy
import kvikpy.arrow

pa = pytest.importorskip("pyarrow")
ipc = pytest.importorskip("pyarrow.ipc")
feather = pytest.importorskip("pyarrow.feather")


def every_type_table(rows: int = 50) -> pa.Table:
    r = random.Random(rows)

    def maybe(v: object, i: int) -> object:
        return None if i % 7 == 3 else v

    cols = {
        "i8": pa.array([maybe(r.randint(-128, 127), i) for i in range(rows)], pa.int8()),
        "i16": pa.array([r.randint(-(2**15), 2**15 - 1) for _ in range(rows)], pa.int16()),
        "i32": pa.array([maybe(i * 3, i) for i in range(rows)], pa.int32()),
        "i64": pa.array(range(rows), pa.int64()),
        "u8": pa.array([i % 256 for i in range(rows)], pa.uint8()),
        "u16": pa.array([i for i in range(rows)], pa.uint16()),
        "u32": pa.array([maybe(i, i) for i in range(rows)], pa.uint32()),
        "u64": pa.array([2**63 + i for i in range(rows)], pa.uint64()),
        "f16": pa.array([float(i) / 4 for i in range(rows)], pa.float16()),
        "f32": pa.array([maybe(i / 3, i) for i in range(rows)], pa.float32()),
        "f64": pa.array([i / 7 for i in range(rows)], pa.float64()),
        "bool": pa.array([maybe(i % 3 == 0, i) for i in range(rows)], pa.bool_()),
        "date32": pa.array([datetime.date(2020, 1, 1 + i % 28) for i in range(rows)]),
        "date64": pa.array([maybe(i * 86_400_000, i) for i in range(rows)], pa.date64()),
        "time32": pa.array([i for i in range(rows)], pa.time32("ms")),
        "time64": pa.array([maybe(i, i) for i in range(rows)], pa.time64("ns")),
        "ts": pa.array([i for i in range(rows)], pa.timestamp("us", tz="Europe/Paris")),
        "ts_naive": pa.array([maybe(i, i) for i in range(rows)], pa.timestamp("s")),
        "dur": pa.array([i for i in range(rows)], pa.duration("ms")),
        "dec128": pa.array(
            [maybe(decimal.Decimal(f"{i}.{i % 100:02d}"), i) for i in range(rows)],
            pa.decimal128(10, 2),
        ),
        "dec256": pa.array([decimal.Decimal(i) for i in range(rows)], pa.decimal256(50, 0)),
        "fsb": pa.array([bytes([i % 256] * 3) for i in range(rows)], pa.binary(3)),
        "utf8": pa.array([maybe(f"s{'x' * (i % 5)}", i) for i in range(rows)]),
        "large_utf8": pa.array([f"L{i}" for i in range(rows)], pa.large_string()),
        "binary": pa.array([maybe(bytes(i % 4), i) for i in range(rows)], pa.binary()),
        "large_binary": pa.array([bytes(i % 3) for i in range(rows)], pa.large_binary()),
        "list": pa.array([maybe(list(range(i % 4)), i) for i in range(rows)], pa.list_(pa.int64())),
        "large_list": pa.array(
            [[f"{i}"] * (i % 3) for i in range(rows)], pa.large_list(pa.string())
        ),
        "embedding": pa.array(
            [[float(i), float(-i), 0.5, 1.0] for i in range(rows)],
            pa.list_(pa.float32(), 4),
        ),
        "struct": pa.array(
            [maybe({"a": i, "b": f"{i}"}, i) for i in range(rows)],
            pa.struct([("a", pa.int32()), ("b", pa.string())]),
        ),
        "map": pa.array(
            [[(f"k{j}", j) for j in range(i % 3)] for i in range(rows)],
            pa.map_(pa.string(), pa.int32()),
        ),
        "dict": pa.array(
            [maybe(["red", "green", "blue"][i % 3], i) for i in range(rows)]
        ).dictionary_encode(),
        "nulls": pa.nulls(rows),
    }
    return pa.table(cols, metadata={"origin": "kvikpy tests"})


def read_back(path: Path, **kwargs: object) -> pa.Table:
    t = kvikpy.arrow.read_ipc(path, device="cpu", **kwargs)
    return pa.table(t)


@pytest.mark.parametrize("chunks", [1, 3])
def test_file_format_every_type(tmp_path: Path, chunks: int) -> None:
    table = every_type_table()
    path = tmp_path / "t.arrow"
    with ipc.new_file(path, table.schema) as w:
        for batch in table.to_batches(max_chunksize=(len(table) + chunks - 1) // chunks):
            w.write_batch(batch)
    got = read_back(path)
    assert got.schema.equals(table.schema, check_metadata=True), got.schema
    assert got.equals(table)
    for name in table.column_names:
        assert got.column(name).equals(table.column(name)), name


def test_stream_format_every_type(tmp_path: Path) -> None:
    table = every_type_table(33)
    path = tmp_path / "t.stream"
    with ipc.new_stream(path, table.schema) as w:
        for batch in table.to_batches(max_chunksize=10):
            w.write_batch(batch)
    assert read_back(path).equals(table)


def test_feather_v2_uncompressed(tmp_path: Path) -> None:
    table = every_type_table(20)
    path = tmp_path / "t.feather"
    feather.write_feather(table, path, compression="uncompressed")
    assert read_back(path).equals(table)


def test_shards_written_by_datasets(tmp_path: Path) -> None:
    """Shards written by Hugging Face ``datasets`` itself: ``save_to_disk`` and the cache
    file a ``map`` writes read back equal to the dataset's own table, metadata too."""
    datasets = pytest.importorskip("datasets")
    datasets.disable_progress_bars()
    rows = 3000
    ds = datasets.Dataset.from_dict(
        {
            "input_ids": [list(range(i % 11)) for i in range(rows)],
            "label": [i % 3 for i in range(rows)],
            "text": [f"row {i}" for i in range(rows)],
        }
    )
    ds.save_to_disk(str(tmp_path / "saved"))
    cached = ds.map(
        lambda r: {"n": len(r["input_ids"])}, cache_file_name=str(tmp_path / "cache.arrow")
    )
    shards = sorted((tmp_path / "saved").glob("*.arrow"))
    assert len(shards) == 1
    for path, want in ((shards[0], ds.data.table), (tmp_path / "cache.arrow", cached.data.table)):
        t = kvikpy.arrow.read_ipc(path, device="cpu")
        got = pa.table(t)
        assert got.equals(want.combine_chunks()), path.name
        assert got.schema.metadata == want.schema.metadata
        assert t.num_rows == rows


def test_datasets_style_shard(tmp_path: Path) -> None:
    """A shard as Hugging Face ``datasets`` writes its cache: the IPC stream format, batches
    of 1000 rows, its features in the schema metadata under ``huggingface``."""
    rows = 2500
    table = pa.table(
        {
            "input_ids": pa.array([list(range(i % 9)) for i in range(rows)], pa.list_(pa.int32())),
            "label": pa.array([i % 2 for i in range(rows)], pa.int64()),
            "text": pa.array([f"row {i}" for i in range(rows)]),
        },
        metadata={"huggingface": json.dumps({"info": {"features": {}}})},
    )
    path = tmp_path / "data-00000-of-00001.arrow"
    with ipc.new_stream(path, table.schema) as w:
        for batch in table.to_batches(max_chunksize=1000):
            w.write_batch(batch)
    t = kvikpy.arrow.read_ipc(path, device="cpu")
    assert (t.num_rows, t.num_batches, t.column_names) == (
        rows,
        3,
        ["input_ids", "label", "text"],
    )
    got = pa.table(t)
    assert got.equals(table)
    assert got.schema.metadata[b"huggingface"] == table.schema.metadata[b"huggingface"]
    # One batch of a fixed-width column is a DLPack tensor.
    np = pytest.importorskip("numpy")
    one = kvikpy.arrow.read_ipc(path, columns=["label"], batches=[-1], device="cpu")
    values = np.from_dlpack(one.column("label"))
    assert values.tolist() == table.column("label").to_pylist()[2000:]


def test_subsets_read_only_their_bytes(tmp_path: Path) -> None:
    table = every_type_table(200)
    path = tmp_path / "t.arrow"
    with ipc.new_file(path, table.schema) as w:
        for batch in table.to_batches(max_chunksize=50):
            w.write_batch(batch)
    whole = kvikpy.arrow.read_ipc(path, device="cpu")
    sub = kvikpy.arrow.read_ipc(path, columns=["utf8", "i32"], batches=[1, 3], device="cpu")
    assert sub.nbytes < whole.nbytes / 5
    assert whole.nbytes <= path.stat().st_size
    got = pa.table(sub)
    assert got.column_names == ["utf8", "i32"]
    want = pa.Table.from_batches([table.to_batches(max_chunksize=50)[i] for i in (1, 3)]).select(
        ["utf8", "i32"]
    )
    assert got.equals(want)


def test_table_surface(tmp_path: Path) -> None:
    table = every_type_table(10)
    path = tmp_path / "t.arrow"
    feather.write_feather(table, path, compression="uncompressed")
    t = kvikpy.arrow.read_ipc(path, device="cpu")
    assert t.num_rows == len(t) == 10
    assert t.schema.equals(table.schema)
    assert "10 rows" in repr(t) and "cpu" in repr(t)
    assert "<table>" in t._repr_html_() and "dict" in t._repr_html_()
    assert pa.array(t.column("utf8")).equals(table.column("utf8").chunk(0))
    assert pa.array(t.column(0)).equals(table.column(0).chunk(0))
    with pytest.raises(KeyError, match="nope"):
        t.column("nope")
    with pytest.raises(IndexError):
        t.column(99)
    with pytest.raises(TypeError, match="DLPack"):
        t.column("utf8").__dlpack__()


def test_bad_arguments(tmp_path: Path) -> None:
    path = tmp_path / "t.arrow"
    feather.write_feather(every_type_table(5), path, compression="uncompressed")
    with pytest.raises(ValueError, match=r"no column .zz."):
        kvikpy.arrow.read_ipc(path, columns=["zz"], device="cpu")
    with pytest.raises(TypeError):
        kvikpy.arrow.read_ipc(path, columns="i8", device="cpu")
    with pytest.raises(TypeError):
        kvikpy.arrow.read_ipc(path, batches=[1.0], device="cpu")  # type: ignore[list-item]
    with pytest.raises(IndexError):
        kvikpy.arrow.read_ipc(path, batches=[5], device="cpu")
    with pytest.raises(IndexError, match="record batch -2 is out of range: the file has 1"):
        kvikpy.arrow.read_ipc(path, batches=[-2], device="cpu")
    with pytest.raises(OverflowError):
        kvikpy.arrow.read_ipc(path, batches=[-(2**70)], device="cpu")
    with pytest.raises(FileNotFoundError):
        kvikpy.arrow.read_ipc(tmp_path / "missing.arrow", device="cpu")


def test_unsupported_types_name_the_column(tmp_path: Path) -> None:
    ree = pa.RunEndEncodedArray.from_arrays(pa.array([2, 3], pa.int32()), pa.array([7, 8]))
    table = pa.table({"ok": [1, 2, 3], "r": ree})
    path = tmp_path / "t.arrow"
    feather.write_feather(table, path, compression="uncompressed")
    with pytest.raises(kvikpy.errors.UnsupportedOperationError, match=r"'r'.*RunEndEncoded"):
        kvikpy.arrow.read_ipc(path, device="cpu")


def view_union_table(rows: int = 40) -> pa.Table:
    """The view types (string_view and binary_view, with data buffers when values are longer
    than 12 bytes; list_view and large_list_view) and unions (sparse and dense, nested)."""

    def text(i: int) -> str | None:
        return None if i % 6 == 5 else f"v{i}" * (1 + i % 9)  # some inline, some not

    strings = [text(i) for i in range(rows)]
    ids = pa.array([i % 3 for i in range(rows)], pa.int8())
    sparse = pa.UnionArray.from_sparse(
        ids,
        [
            pa.array([None if i % 4 == 0 else i for i in range(rows)], pa.int64()),
            pa.array([f"u{i}" for i in range(rows)]),
            pa.array([[i] * (i % 3) for i in range(rows)], pa.list_(pa.int16())),
        ],
        ["n", "s", "l"],
    )
    counts = [sum(1 for j in range(rows) if j % 3 == k) for k in range(3)]
    offsets = pa.array([i // 3 for i in range(rows)], pa.int32())
    codes = pa.array([(3, 7, 11)[i % 3] for i in range(rows)], pa.int8())
    dense = pa.UnionArray.from_dense(
        codes,
        offsets,
        [
            pa.array([float(i) if i % 5 else None for i in range(counts[0])]),
            pa.array([f"d{i}" * (i % 4) for i in range(counts[1])], pa.string_view()),
            pa.array([i % 2 == 0 for i in range(counts[2])]),
        ],
        ["f", "sv", "b"],
        [3, 7, 11],
    )
    lists = [None if i % 7 == 2 else list(range(i % 5)) for i in range(rows)]
    cols = {
        "sv": pa.array(strings, pa.string_view()),
        "bv": pa.array([None if s is None else s.encode() * 2 for s in strings], pa.binary_view()),
        "sv_short": pa.array([f"{i}" for i in range(rows)], pa.string_view()),
        "lv": pa.array(lists, pa.list_view(pa.int32())),
        "llv": pa.array(
            [None if v is None else [f"x{j}" for j in v] for v in lists],
            pa.large_list_view(pa.string_view()),
        ),
        "sparse": sparse,
        "dense": dense,
        "nested": pa.StructArray.from_arrays(
            [pa.array(lists, pa.list_view(pa.int64())), pa.array(strings, pa.string_view())],
            ["lv", "sv"],
        ),
        "i": pa.array(range(rows), pa.int32()),
    }
    return pa.table(cols, metadata={"kind": "views and unions"})


def write_batches(
    path: Path, table: pa.Table, stream: bool, chunk: int, compression: str | None = None
) -> None:
    opener = ipc.new_stream if stream else ipc.new_file
    options = ipc.IpcWriteOptions(compression=compression)
    with opener(path, table.schema, options=options) as w:
        for batch in table.to_batches(max_chunksize=chunk):
            w.write_batch(batch)


@pytest.mark.parametrize("compression", [None, "zstd", "lz4"])
@pytest.mark.parametrize("stream", [False, True])
def test_view_and_union_types(tmp_path: Path, stream: bool, compression: str | None) -> None:
    # Long strings: the string_view columns get more than one data buffer per batch.
    table = view_union_table(3000)
    path = tmp_path / "t.arrow"
    write_batches(path, table, stream, 1200, compression)
    got = read_back(path)
    assert got.schema.equals(table.schema, check_metadata=True), got.schema
    assert got.equals(table)
    for name in table.column_names:
        assert got.column(name).equals(table.column(name)), name
    # The data buffers keep their sizes (the C interface's last buffer of a view array).
    written = [b.column("sv") for b in table.to_batches(max_chunksize=1200)]
    for want, have in zip(written, got.column("sv").chunks, strict=True):
        assert len(want.buffers()) == len(have.buffers()) > 3
        assert [b.size for b in want.buffers()[2:]] == [b.size for b in have.buffers()[2:]]
    # Subsets past view-typed and union columns read their own bytes.
    sub = read_back(path, columns=["i", "dense"], batches=[1, 2])
    want = pa.Table.from_batches(table.to_batches(max_chunksize=1200)[1:]).select(["i", "dense"])
    assert sub.equals(want)


@pytest.mark.parametrize("stream", [False, True])
def test_unions_of_metadata_version_4(tmp_path: Path, stream: bool) -> None:
    """Before metadata version 5, a union had a validity buffer, which is skipped."""
    table = view_union_table(30).select(["sparse", "dense", "i", "lv"])
    path = tmp_path / "v4.arrow"
    options = ipc.IpcWriteOptions(metadata_version=ipc.MetadataVersion.V4)
    opener = ipc.new_stream if stream else ipc.new_file
    with opener(path, table.schema, options=options) as w:
        w.write_table(table)
    assert read_back(path).equals(table)
    assert read_back(path, columns=["i"]).equals(table.select(["i"]))


def test_view_and_union_columns_one_by_one(tmp_path: Path) -> None:
    table = view_union_table(50)
    path = tmp_path / "t.arrow"
    write_batches(path, table, False, 20)
    t = kvikpy.arrow.read_ipc(path, device="cpu")
    chunks = table.to_batches(max_chunksize=20)
    for name in table.column_names:
        for i, chunk in enumerate(t.column(name)):
            assert pa.array(chunk).equals(chunks[i].column(name)), (name, i)
    na = pytest.importorskip("nanoarrow")
    # The C layouts: a view array's buffers are validity, views, its data buffers, then
    # the data buffers' sizes; a union has no validity buffer.
    for name in ("sv", "sv_short", "bv"):
        written = chunks[0].column(name).buffers()
        assert na.c_array(t.column(name)[0]).n_buffers == 2 + len(written[2:]) + 1
    assert na.c_array(t.column("sparse")[0]).n_buffers == 1
    assert na.c_array(t.column("dense")[0]).n_buffers == 2
    assert na.c_array(t.column("lv")[0]).n_buffers == 3
    import ctypes

    sv = na.c_array(t.column("sv")[0])
    data = chunks[0].column("sv").buffers()[2:]
    sizes = (ctypes.c_int64 * len(data)).from_address(sv.buffers[-1])
    assert list(sizes) == [b.size for b in data]


def test_view_and_union_device_stream_on_the_host(tmp_path: Path) -> None:
    table = view_union_table(30)
    path = tmp_path / "t.arrow"
    write_batches(path, table, True, 10)
    t = kvikpy.arrow.read_ipc(path, device="cpu")
    # pyarrow's own import of the C stream and of each column's C array.
    assert pa.RecordBatchReader.from_stream(t).read_all().equals(table)
    assert pa.table(t.to_host()).equals(table)
    assert kvikpy.arrow.write_ipc(tmp_path / "out.arrow", t) > 0
    assert feather.read_table(tmp_path / "out.arrow").equals(table)


def delta_batches() -> list[pa.RecordBatch]:
    """Record batches whose dictionaries grow (strings with nulls, floats, booleans), so
    that pyarrow writes delta dictionary batches with ``emit_dictionary_deltas``."""
    schema = pa.schema(
        [
            ("s", pa.dictionary(pa.int32(), pa.string())),
            ("f", pa.dictionary(pa.int8(), pa.float64())),
            ("b", pa.dictionary(pa.int16(), pa.large_binary())),
            ("i", pa.int64()),
        ]
    )
    words = ["red", None, "green", "a much longer value", "blue", "", "cyan"]
    out = []
    for n in (2, 3, 3, 5, 7):
        keys = pa.array([(j * 5) % n for j in range(9)], pa.int32())
        out.append(
            pa.record_batch(
                [
                    pa.DictionaryArray.from_arrays(keys, pa.array(words[:n])),
                    pa.DictionaryArray.from_arrays(
                        pa.array([j % n for j in range(9)], pa.int8()),
                        pa.array([None if j == 1 else j / 4 for j in range(n)]),
                    ),
                    pa.DictionaryArray.from_arrays(
                        pa.array([n - 1 - j % n for j in range(9)], pa.int16()),
                        pa.array([b"x" * j for j in range(n)], pa.large_binary()),
                    ),
                    pa.array(range(9)),
                ],
                schema=schema,
            )
        )
    return out


@pytest.mark.parametrize("compression", [None, "zstd"])
@pytest.mark.parametrize("stream", [False, True])
def test_delta_dictionaries(tmp_path: Path, stream: bool, compression: str | None) -> None:
    batches = delta_batches()
    path = tmp_path / "t.arrow"
    opener = ipc.new_stream if stream else ipc.new_file
    options = ipc.IpcWriteOptions(emit_dictionary_deltas=True, compression=compression)
    with opener(path, batches[0].schema, options=options) as w:
        for batch in batches:
            w.write_batch(batch)
        assert w.stats.num_dictionary_deltas > 0
    want = (ipc.open_stream if stream else ipc.open_file)(path).read_all()
    got = read_back(path)
    assert got.equals(want)
    for name in want.column_names:
        for g, w in zip(got.column(name).chunks, want.column(name).chunks, strict=True):
            assert g.equals(w), name
            if name != "i":
                assert g.dictionary.equals(w.dictionary), name
    # A subset of batches, and a table copied back from its allocation.
    sub = read_back(path, columns=["s", "i"], batches=[1, 4])
    assert sub.equals(
        pa.Table.from_batches([want.to_batches()[i] for i in (1, 4)]).select(["s", "i"])
    )
    t = kvikpy.arrow.read_ipc(path, device="cpu")
    assert pa.table(t.to_host()).equals(want)


def test_delta_dictionaries_of_other_types_name_their_column(tmp_path: Path) -> None:
    kind = pa.dictionary(pa.int32(), pa.list_(pa.int8()))
    schema = pa.schema([("d", kind), ("i", pa.int64())])
    batches = [
        pa.record_batch(
            [
                pa.DictionaryArray.from_arrays(
                    pa.array([0, 1, 0], pa.int32()), pa.array(values, pa.list_(pa.int8()))
                ),
                pa.array([1, 2, 3]),
            ],
            schema=schema,
        )
        for values in ([[1], [2, 3]], [[1], [2, 3], []])
    ]
    path = tmp_path / "t.arrow"
    with ipc.new_stream(
        path, schema, options=ipc.IpcWriteOptions(emit_dictionary_deltas=True)
    ) as w:
        for batch in batches:
            w.write_batch(batch)
    with pytest.raises(kvikpy.errors.UnsupportedOperationError, match=r"'d'.*delta"):
        kvikpy.arrow.read_ipc(path, device="cpu")
    assert read_back(path, columns=["i"]).column("i").to_pylist() == [1, 2, 3] * 2
    # Before the delta, the dictionary is whole.
    assert read_back(path, batches=[0]).equals(pa.Table.from_batches(batches[:1]))


@pytest.mark.parametrize("codec", ["zstd", "lz4"])
@pytest.mark.parametrize("stream", [False, True])
def test_compressed_bodies(tmp_path: Path, codec: str, stream: bool) -> None:
    table = every_type_table(300)
    path = tmp_path / "t.arrow"
    options = ipc.IpcWriteOptions(compression=codec)
    opener = ipc.new_stream if stream else ipc.new_file
    with opener(path, table.schema, options=options) as w:
        for batch in table.to_batches(max_chunksize=100):
            w.write_batch(batch)
    assert read_back(path).equals(table)
    sub = read_back(path, columns=["utf8", "list"], batches=[2])
    assert sub.equals(
        pa.Table.from_batches([table.to_batches(max_chunksize=100)[2]]).select(["utf8", "list"])
    )


def mutated_reads(
    path: Path, seed: int, cases: int, errors: tuple[type[BaseException], ...]
) -> set[str]:
    """Read ``cases`` damaged copies of ``path`` (cut short, or 1-4 bytes changed): the
    names of the errors raised (only ``errors`` may be) and "read" for copies that read;
    a copy that reads has no more bytes than the file."""
    data = path.read_bytes()
    r = random.Random(seed)
    bad = path.with_name("bad.arrow")
    outcomes = set()
    for case in range(cases):
        mutated = bytearray(data)
        if case % 3 == 0:
            mutated = mutated[: r.randrange(len(mutated))]
        else:
            for _ in range(r.randint(1, 4)):
                mutated[r.randrange(len(mutated))] = r.randrange(256)
        bad.write_bytes(bytes(mutated))
        try:
            t = kvikpy.arrow.read_ipc(bad, device="cpu")
        except errors as e:
            outcomes.add(type(e).__name__)
            continue
        assert t.nbytes <= len(mutated)
        outcomes.add("read")
    return outcomes


@pytest.mark.parametrize("codec", [None, "zstd", "lz4"])
def test_malformed_files_give_clear_errors(tmp_path: Path, codec: str | None) -> None:
    path = tmp_path / "t.arrow"
    options = ipc.IpcWriteOptions(compression=codec)
    with ipc.new_file(path, every_type_table(30).schema, options=options) as w:
        for batch in every_type_table(30).to_batches(max_chunksize=10):
            w.write_batch(batch)
    outcomes = mutated_reads(path, 7, 150, (ValueError, OSError, IndexError))
    assert "ValueError" in outcomes


@pytest.mark.parametrize("kind", ["views", "deltas"])
def test_malformed_views_unions_and_deltas_give_clear_errors(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "t.arrow"
    if kind == "views":
        write_batches(path, view_union_table(60), True, 25)
    else:
        batches = delta_batches()
        options = ipc.IpcWriteOptions(emit_dictionary_deltas=True)
        with ipc.new_stream(path, batches[0].schema, options=options) as w:
            for batch in batches:
                w.write_batch(batch)
    errors = (ValueError, OSError, IndexError, kvikpy.errors.UnsupportedOperationError)
    outcomes = mutated_reads(path, 11, 200, errors)
    assert "ValueError" in outcomes and "read" in outcomes


def test_remote_http(tmp_path: Path) -> None:
    table = every_type_table(40)
    path = tmp_path / "t.arrow"
    with ipc.new_file(path, table.schema) as w:
        for batch in table.to_batches(max_chunksize=16):
            w.write_batch(batch)
    stream = tmp_path / "s.arrow"
    with ipc.new_stream(stream, table.schema) as w:
        for batch in table.to_batches(max_chunksize=16):
            w.write_batch(batch)
    with kvikpy.utils.LocalHttpServer(tmp_path, max_lifetime=60) as server:
        for name in ("t.arrow", "s.arrow"):
            got = pa.table(kvikpy.arrow.read_ipc(f"{server.url}/{name}", device="cpu"))
            assert got.equals(table)


@pytest.mark.parametrize("codec", ["zstd", "lz4"])
def test_remote_compressed_tables_read_each_body_whole(tmp_path: Path, codec: str) -> None:
    """A compressed table over HTTP: the bytes pyarrow reads, with the buffers of each
    record batch body asked for together, not one request per buffer."""
    table = every_type_table(40)
    path = tmp_path / "t.arrow"
    options = ipc.IpcWriteOptions(compression=codec)
    with ipc.new_file(path, table.schema, options=options) as w:
        for batch in table.to_batches(max_chunksize=10):
            w.write_batch(batch)
    buffers = sum(
        len(b.buffers()) for batch in table.to_batches(max_chunksize=10) for b in batch.columns
    )
    counter = Counter()
    with serve(CountingRangeHandler, directory=str(tmp_path), counter=counter) as url:
        got = kvikpy.arrow.read_ipc(f"{url}/t.arrow", device="cpu")
    assert pa.table(got).equals(table)
    # The metadata (size, footer, message headers), then one request per body of 4 batches.
    assert len(counter.ranges) < 20 < buffers, (len(counter.ranges), buffers)


@pytest.mark.parametrize("compression", [None, "zstd", "lz4"])
def test_write_ipc_roundtrip(tmp_path: Path, compression: str | None) -> None:
    table = every_type_table(40)
    path = tmp_path / "out.arrow"
    path.write_bytes(b"x" * 10_000_000)  # an older, longer file is replaced whole
    n = kvikpy.arrow.write_ipc(path, table, compression=compression)
    assert n == path.stat().st_size
    assert feather.read_table(path).equals(table)
    # A kvikpy table goes back out as it came in.
    again = tmp_path / "again.arrow"
    kvikpy.arrow.write_ipc(again, kvikpy.arrow.read_ipc(path, device="cpu"))
    assert feather.read_table(again).equals(table)


def test_write_ipc_bad_input_writes_nothing(tmp_path: Path) -> None:
    path = tmp_path / "out.arrow"
    with pytest.raises(ValueError, match="compression"):
        kvikpy.arrow.write_ipc(path, every_type_table(3), compression="gzip")
    with pytest.raises(TypeError, match="exports no Arrow"):
        kvikpy.arrow.write_ipc(path, [1, 2, 3])
    assert not path.exists()


def test_device_stream_on_the_host_and_lifetimes(tmp_path: Path) -> None:
    import gc

    from test_chunks import consume_device_stream

    from kvikpy import _lib

    table = every_type_table(30)
    path = tmp_path / "t.arrow"
    with ipc.new_file(path, table.schema) as w:
        for batch in table.to_batches(max_chunksize=10):
            w.write_batch(batch)
    gc.collect()
    base = _lib.live_buffers()
    t = kvikpy.arrow.read_ipc(path, device="cpu")
    device_type, _, fmt, devices = consume_device_stream(
        t.__arrow_c_device_stream__(), read=lambda p, n: b""
    )
    assert (device_type, fmt) == (1, "+s")  # ARROW_DEVICE_CPU, a struct per batch
    assert devices == [(1, -1, 1)] * 3
    # An exported column keeps the allocation after the table is gone.
    column = pa.array(t.column("utf8")[2])
    reader = pa.RecordBatchReader.from_stream(t)
    del t
    gc.collect()
    assert _lib.live_buffers() > base
    assert column.equals(table.column("utf8").chunk(0).slice(20, 10))
    assert pa.Table.from_batches(list(reader)).equals(table)
    del column, reader
    gc.collect()
    assert _lib.live_buffers() == base


def test_embedding_columns_are_2d_dlpack(tmp_path: Path) -> None:
    np = pytest.importorskip("numpy")
    values = np.arange(40, dtype=np.float32).reshape(10, 4)
    table = pa.table({"emb": pa.FixedSizeListArray.from_arrays(pa.array(values.ravel()), 4)})
    path = tmp_path / "e.arrow"
    feather.write_feather(table, path, compression="uncompressed")
    t = kvikpy.arrow.read_ipc(path, device="cpu")
    got = np.from_dlpack(t.column("emb"))
    assert got.shape == (10, 4) and (got == values).all()


def own_writer_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make a fall back to pyarrow's writer fail the test."""

    def refuse(*args: object) -> int:
        raise AssertionError("write_ipc fell back to pyarrow")

    monkeypatch.setattr(kvikpy.arrow, "_write_pyarrow", refuse)


class OnlyArray:
    """Exports one record batch through ``__arrow_c_array__`` only."""

    def __init__(self, inner: object) -> None:
        self.inner = inner

    def __arrow_c_array__(self, requested_schema: object = None) -> object:
        return self.inner.__arrow_c_array__()  # type: ignore[attr-defined]


class OnlyDeviceStream:
    """Exports a table through ``__arrow_c_device_stream__`` only."""

    def __init__(self, inner: object) -> None:
        self.inner = inner

    def __arrow_c_device_stream__(self, requested_schema: object = None, **kw: object) -> object:
        return self.inner.__arrow_c_device_stream__()  # type: ignore[attr-defined]


@pytest.mark.parametrize("source", ["pyarrow", "batch", "kvikpy", "device_stream"])
def test_write_ipc_own_writer_every_type(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, source: str
) -> None:
    """Uncompressed tables of every type kvikpy's writer handles are written by kvikpy
    (metadata encoded by the engine, buffers written from memory) and read back equal in
    pyarrow and kvikpy, schema metadata included."""
    table = every_type_table(60).drop_columns(["dict"])
    own_writer_only(monkeypatch)
    path = tmp_path / "out.arrow"
    path.write_bytes(b"x" * 1_000_000)  # replaced whole
    if source == "pyarrow":
        data: object = table.combine_chunks()
        expect = table
    elif source == "batch":
        data = OnlyArray(table.to_batches()[0])
        expect = table
    else:
        src = tmp_path / "in.arrow"
        with ipc.new_file(src, table.schema) as w:
            for batch in table.to_batches(max_chunksize=25):
                w.write_batch(batch)
        data = kvikpy.arrow.read_ipc(src, device="cpu")
        if source == "device_stream":
            data = OnlyDeviceStream(data)
        expect = table
    n = kvikpy.arrow.write_ipc(path, data)
    assert n == path.stat().st_size
    got = feather.read_table(path)
    assert got.schema.equals(expect.schema, check_metadata=True)
    assert got.equals(expect)
    assert read_back(path).equals(expect)
    if source == "kvikpy":
        assert ipc.open_file(path).num_record_batches == 3


def test_write_ipc_own_writer_aligns_buffers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every buffer starts at a multiple of 64 bytes of the file, so kvikpy reads a file
    it wrote with its buffers where they lie."""
    own_writer_only(monkeypatch)
    table = every_type_table(33).drop_columns(["dict"])
    path = tmp_path / "a.arrow"
    kvikpy.arrow.write_ipc(path, table)
    reader = ipc.open_file(path)
    assert reader.num_record_batches == 1
    blob = path.read_bytes()
    batch = reader.get_batch(0)
    addresses = []
    base = pa.py_buffer(blob).address
    mapped = pa.ipc.open_file(pa.BufferReader(pa.py_buffer(blob))).get_batch(0)
    for column in mapped.columns:
        for buf in column.buffers():
            if buf is not None and buf.size:
                addresses.append(buf.address - base)
    assert addresses and all(a % 64 == 0 for a in addresses), addresses
    assert batch.equals(table.to_batches()[0])


def test_write_ipc_empty_tables(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    own_writer_only(monkeypatch)
    schema = pa.schema([("a", pa.int32()), ("s", pa.string()), ("l", pa.list_(pa.int8()))])
    for i, table in enumerate([schema.empty_table(), pa.Table.from_batches([], schema)]):
        path = tmp_path / f"e{i}.arrow"
        kvikpy.arrow.write_ipc(path, table)
        got = feather.read_table(path)
        assert got.schema.equals(schema) and got.num_rows == 0


def test_write_ipc_falls_back_for_slices_and_dictionaries(tmp_path: Path) -> None:
    """Columns kvikpy's writer does not handle go through pyarrow from host memory."""
    table = every_type_table(40)
    for name, data in (("sliced", table.slice(3, 20)), ("dict", table.select(["dict", "i32"]))):
        path = tmp_path / f"{name}.arrow"
        kvikpy.arrow.write_ipc(path, data)
        assert feather.read_table(path).equals(data), name


def test_write_ipc_refuses_non_tables_without_writing(tmp_path: Path) -> None:
    path = tmp_path / "out.arrow"
    with pytest.raises(TypeError, match="struct arrays"):
        kvikpy.arrow.write_ipc(path, pa.array([1, 2, 3]))
    with pytest.raises(TypeError, match="struct arrays"):
        kvikpy.arrow.write_ipc(path, pa.chunked_array([[1, 2], [3]]))
    assert not path.exists()


WRITABLE = [c for c in every_type_table(1).column_names if c != "dict"]


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    columns=st.lists(st.sampled_from(WRITABLE), min_size=1, max_size=6, unique=True),
    rows=st.integers(0, 45),
    chunk=st.integers(1, 50),
)
def test_write_ipc_any_columns_rows_and_batches_round_trip(
    tmp_path: Path, columns: list[str], rows: int, chunk: int
) -> None:
    """Any mix of columns, row counts (0 included) and record batch sizes written by
    kvikpy's writer reads back equal in pyarrow, and in kvikpy."""
    table = every_type_table(max(rows, 1)).select(columns).slice(0, rows)
    batches = [b for b in table.to_batches(max_chunksize=chunk)]
    # Each batch its own buffers (pyarrow's slices have offsets, which this writer
    # leaves to pyarrow): a table rebuilt from unsliced copies.
    data = pa.Table.from_batches(
        [
            pa.record_batch([pa.concat_arrays([c]) for c in b.columns], schema=b.schema)
            for b in batches
        ],
        table.schema,
    )
    path = tmp_path / f"h{rows}-{chunk}-{len(columns)}.arrow"
    kvikpy.arrow._write_own(str(path), data)
    got = feather.read_table(path)
    assert got.equals(table)
    assert read_back(path).equals(table)


def test_columns_and_chunks_have_a_readable_repr(tmp_path: Path) -> None:
    path = tmp_path / "r.arrow"
    table = pa.table({"ids": pa.array(list(range(10)), pa.int64())})
    with ipc.new_file(path, table.schema) as w:
        for batch in table.to_batches(max_chunksize=4):
            w.write_batch(batch)
    t = kvikpy.arrow.read_ipc(path, device="cpu")
    column = t.column("ids")
    assert repr(column) == "<kvikpy.arrow.Column 'ids' (Int64): 10 rows in 3 chunks on cpu>"
    assert repr(column[2]) == (
        "<kvikpy.arrow.ColumnChunk 'ids' (Int64) of record batch 2: 2 rows on cpu>"
    )
