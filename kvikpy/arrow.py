"""Arrow tables from IPC files and streams (Feather v2, ``.arrow``, Hugging Face
``datasets`` cache shards) read straight into GPU or host memory: :func:`read_ipc` gives a
:class:`Table` whose record batches are Arrow (device) arrays over one allocation."""

from __future__ import annotations

import html
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import kvikpy._lib as _lib
from kvikpy import _devices, _nvcomp, _paths
from kvikpy.errors import UnsupportedOperationError

__all__ = ["Column", "ColumnChunk", "Table", "read_ipc", "write_ipc"]


class _ColumnExports:
    """What a column and its chunks export alike: the column's Arrow type, and DLPack
    over the values :meth:`_values` finds."""

    _table: _lib.IpcTable
    _column: int

    def _values(self) -> _lib.Buffer:
        raise NotImplementedError

    def __arrow_c_schema__(self) -> Any:
        return self._table.column_schema_capsule(self._column)

    def __dlpack__(self, **kwargs: Any) -> Any:
        return self._values().__dlpack__(**kwargs)

    def __dlpack_device__(self) -> tuple[int, int]:
        return self._values().__dlpack_device__()


class ColumnChunk(_ColumnExports):
    """One column of one record batch: an Arrow array on the table's device.

    Exports ``__arrow_c_device_array__`` (and ``__arrow_c_array__`` in host memory); a
    fixed-width column without nulls also exports DLPack, so ``torch.from_dlpack`` and
    ``cupy.from_dlpack`` take it without a copy (a fixed-size list of such values, an
    embedding column, as a 2-D tensor). It keeps the table's memory alive.

    Made by :meth:`Table.column` (``table.column(name)[i]``), not directly.

    Parameters
    ----------
    table
        The table's engine object.
    batch
        The record batch.
    column
        The column's position.
    """

    def __init__(self, table: _lib.IpcTable, batch: int, column: int) -> None:
        self._table = table
        self._batch = batch
        self._column = column

    def __arrow_c_array__(self, requested_schema: Any = None) -> tuple[Any, Any]:
        return self._table.column_capsules(self._batch, self._column, False)

    def __arrow_c_device_array__(
        self, requested_schema: Any = None, **kwargs: Any
    ) -> tuple[Any, Any]:
        _lib.check_device_kwargs("__arrow_c_device_array__", kwargs)
        return self._table.column_capsules(self._batch, self._column, True)

    def _values(self) -> _lib.Buffer:
        return _values_view(self._table, self._batch, self._column)

    def __repr__(self) -> str:
        t = self._table
        return (
            f"<kvikpy.arrow.ColumnChunk {t.column_names[self._column]!r} "
            f"({t.column_types[self._column]}) of record batch {self._batch}: "
            f"{t.batch_rows[self._batch]:,} rows on {_device_label(t)}>"
        )


def _values_view(table: _lib.IpcTable, batch: int | None, column: int) -> _lib.Buffer:
    """The values of ``column`` of record batch ``batch`` (``None``: of every record
    batch, laid end to end by the reader) as one buffer DLPack exports."""
    found = table.column_values(batch, column)
    if found is None:
        name = table.column_names[column]
        kind = table.column_types[column]
        if batch is None and table.column_values(0, column) is not None:
            raise ValueError(
                f"column {name!r} ({kind}): the values of its {len(table.batch_rows)} record "
                "batches do not lie end to end (a compressed buffer decoded with padding), "
                "so they make no one tensor; export each chunk (column[i]) or join them "
                "(torch.cat)"
            )
        raise TypeError(
            f"column {name!r} ({kind}) has nulls or is not fixed-width, so it has no "
            "DLPack form; use its Arrow export (__arrow_c_device_array__)"
        )
    offset, shape, typestr, code, bits = found
    count = 1
    for d in shape:
        count *= d
    return table.buffer.view(typestr, code, bits, shape, offset, count * (bits // 8))


def _device_label(table: _lib.IpcTable) -> str:
    """Where a table's memory is: ``"cuda:N"`` or ``"cpu"``."""
    ordinal = table.ordinal
    return "cpu" if ordinal is None else f"cuda:{ordinal}"


class Column(_ColumnExports, Sequence[ColumnChunk]):
    """A column of a :class:`Table`: one :class:`ColumnChunk` per record batch.

    A fixed-width column without nulls (or a fixed-size list of such values) exports
    DLPack over all its record batches at once: the reader lays each such column's
    values end to end in the table's memory, so ``torch.from_dlpack(table.column(name))``
    is one tensor of every row, without a copy; its Arrow (device) array is one array over
    the same memory. Over several record batches, a host table's other fixed-width, string
    and binary columns export one Arrow array too, joined into new host memory (validity
    bitmaps joined, offsets rebased: a copy); other columns, and those of a GPU table
    whose batches do not lie end to end, say so: export each chunk (``column[i]``).

    Made by :meth:`Table.column`, not directly.

    Parameters
    ----------
    table
        The table's engine object.
    column
        The column's position.
    """

    def __init__(self, table: _lib.IpcTable, column: int) -> None:
        self._table = table
        self._column = column
        self._chunks = [ColumnChunk(table, b, column) for b in range(len(table.batch_rows))]

    def __len__(self) -> int:
        return len(self._chunks)

    def __getitem__(self, i: Any) -> Any:
        return self._chunks[i]

    def __arrow_c_array__(self, requested_schema: Any = None) -> tuple[Any, Any]:
        if len(self._chunks) == 1:
            return self._chunks[0].__arrow_c_array__(requested_schema)
        return self._table.joined_column_capsules(self._column, False)

    def __arrow_c_device_array__(
        self, requested_schema: Any = None, **kwargs: Any
    ) -> tuple[Any, Any]:
        if len(self._chunks) == 1:
            return self._chunks[0].__arrow_c_device_array__(requested_schema, **kwargs)
        _lib.check_device_kwargs("__arrow_c_device_array__", kwargs)
        return self._table.joined_column_capsules(self._column, True)

    def _values(self) -> _lib.Buffer:
        if len(self._chunks) == 1:
            return self._chunks[0]._values()
        return _values_view(self._table, None, self._column)

    def __repr__(self) -> str:
        t = self._table
        return (
            f"<kvikpy.arrow.Column {t.column_names[self._column]!r} "
            f"({t.column_types[self._column]}): {sum(t.batch_rows):,} rows in "
            f"{len(self._chunks)} chunks on {_device_label(t)}>"
        )


class _Batch:
    """A record batch of a table as a struct array (for the stream exports)."""

    def __init__(self, table: _lib.IpcTable, index: int) -> None:
        self._table = table
        self._index = index

    def __arrow_c_array__(self, requested_schema: Any = None) -> tuple[Any, Any]:
        return self._table.batch_capsules(self._index, False)

    def __arrow_c_device_array__(
        self, requested_schema: Any = None, **kwargs: Any
    ) -> tuple[Any, Any]:
        return self._table.batch_capsules(self._index, True)


class Table:
    """An Arrow table read by :func:`read_ipc`: record batches in one allocation.

    ``__arrow_c_device_stream__`` hands out one ``ArrowDeviceArray`` per record batch (a
    struct of the columns, on the table's device); host tables (``device="cpu"``) also
    export ``__arrow_c_stream__``, so ``pyarrow.table(t)`` works. The memory lives as
    long as the table or any array exported from it.

    Made by :func:`read_ipc`, not directly.

    Parameters
    ----------
    inner
        The engine's table: the plan and the allocation.
    """

    def __init__(self, inner: _lib.IpcTable) -> None:
        self._inner = inner

    @property
    def column_names(self) -> list[str]:
        """The column names, in order."""
        return self._inner.column_names

    @property
    def num_rows(self) -> int:
        """Rows in the table (all record batches read)."""
        return sum(self._inner.batch_rows)

    @property
    def num_columns(self) -> int:
        """Columns in the table."""
        return len(self._inner.column_names)

    @property
    def num_batches(self) -> int:
        """Record batches read."""
        return len(self._inner.batch_rows)

    @property
    def nbytes(self) -> int:
        """Bytes read from the file (only the chosen columns' and batches' buffers)."""
        return self._inner.bytes_read

    @property
    def device(self) -> str:
        """``"cuda:N"`` or ``"cpu"``."""
        return _device_label(self._inner)

    @property
    def buffer(self) -> _lib.Buffer:
        """The one allocation holding every buffer of the table."""
        return self._inner.buffer

    @property
    def schema(self) -> Any:
        """The schema: a ``pyarrow.Schema`` when pyarrow is installed, else an object
        exporting ``__arrow_c_schema__``."""
        holder = _Schema(self._inner)
        try:
            import pyarrow  # type: ignore[import-untyped]
        except ImportError:
            return holder
        return pyarrow.schema(holder)

    def column(self, name: str | int) -> Column:
        """A column by name or position.

        Parameters
        ----------
        name
            The column's name, or its position.

        Returns
        -------
        Column
            One chunk per record batch.

        Raises
        ------
        KeyError
            For a name the table does not have.
        IndexError
            For a position out of range.
        """
        names = self._inner.column_names
        if isinstance(name, bool) or not isinstance(name, (str, int)):
            raise TypeError(f"a column is named by a str or int, not {name!r}")
        if isinstance(name, str):
            if name not in names:
                raise KeyError(f"the table has no column {name!r}; its columns: {names}")
            index = names.index(name)
        else:
            if not -len(names) <= name < len(names):
                raise IndexError(
                    f"column {name} is out of range for a table of {len(names)} columns"
                )
            index = name % len(names)
        return Column(self._inner, index)

    def _batches(self) -> Iterator[_Batch]:
        return iter([_Batch(self._inner, i) for i in range(self.num_batches)])

    def __arrow_c_schema__(self) -> Any:
        return self._inner.schema_capsule()

    def __arrow_c_device_stream__(self, requested_schema: Any = None, **kwargs: Any) -> Any:
        _lib.check_device_kwargs("__arrow_c_device_stream__", kwargs)
        return self._inner.stream_capsule(self._batches(), True)

    def __arrow_c_stream__(self, requested_schema: Any = None) -> Any:
        return self._inner.stream_capsule(self._batches(), False)

    def __len__(self) -> int:
        return self.num_rows

    def to_host(self) -> Table:
        """The table in host memory: the same layout over a copy of its allocation (itself
        when it already is on the host).

        Returns
        -------
        Table
            A host table (``device == "cpu"``).
        """
        if self._inner.ordinal is None:
            return self
        host = _lib.Buffer.allocate(self.buffer.nbytes, None, False)
        if self.buffer.nbytes:
            import numpy as np

            np.copyto(np.from_dlpack(host), self.buffer.to_numpy())
        return Table(self._inner.over_copy(host))

    def __repr__(self) -> str:
        return (
            f"<kvikpy.arrow.Table {self.num_rows:,} rows x {self.num_columns} columns "
            f"in {self.num_batches} batches on {self.device}, {self.nbytes:,} bytes>"
        )

    def _repr_html_(self) -> str:
        rows = "".join(
            f"<tr><td>{html.escape(n)}</td><td><code>{html.escape(t)}</code></td></tr>"
            for n, t in zip(self._inner.column_names, self._inner.column_types, strict=True)
        )
        return (
            f"<div><b>kvikpy.arrow.Table</b> {self.num_rows:,} rows &times; "
            f"{self.num_columns} columns in {self.num_batches} record batches on "
            f"<b>{html.escape(self.device)}</b> ({self.nbytes:,} bytes read)"
            f"<table><tr><th>column</th><th>type</th></tr>{rows}</table></div>"
        )


class _Schema:
    def __init__(self, inner: _lib.IpcTable) -> None:
        self._inner = inner

    def __arrow_c_schema__(self) -> Any:
        return self._inner.schema_capsule()


def read_ipc(
    source: _paths.StrPath,
    *,
    columns: Iterable[str] | None = None,
    batches: Iterable[int] | None = None,
    device: str | int = "cuda",
    decode: str = "auto",
) -> Table:
    """Read an Arrow IPC file or stream into GPU (or host) memory as a :class:`Table`.

    Both IPC formats are read: the file format (Feather v2, ``.arrow``, ``.feather``)
    and the stream format (Hugging Face ``datasets`` cache shards). The footer or the
    message headers are read and checked first; then only the buffers of the chosen
    columns and record batches are read, in one parallel batch read, into one
    allocation (each buffer 64-byte aligned), with no decoding on the host.

    Compressed record batches (IPC's per-buffer ZSTD and LZ4 frames) are decoded on the
    GPU by nvCOMP when the table goes to a GPU and nvCOMP is installed (the kvikpy
    wheel's ``nvcomp`` extra, with CuPy): the compressed buffers are read onto the GPU in
    the one batch read and decoded in one nvCOMP call per codec into their places in the
    table.
    LZ4 frames whose blocks depend on each other (pyarrow writes them so for buffers over
    64 KiB) cannot be decoded block by block and are decoded on the host; so is
    everything when the table goes to the host or nvCOMP is missing. The bytes are the
    same either way.

    Parameters
    ----------
    source
        A local path, or a URL kvikpy reads (HTTP(S), S3, WebHDFS).
    columns
        Names of the columns to read, in the order wanted; all when None.
    batches
        Indices of the record batches to read (negative counts from the end); all when
        None.
    device
        ``"cuda"`` (the current GPU), ``"cuda:N"``, an int, or ``"cpu"``.
    decode
        Where compressed buffers are decoded: ``"auto"`` (on the GPU with nvCOMP where it
        can, else on the host; should nvCOMP fail, the host decodes those buffers instead,
        from the bytes already read),
        ``"gpu"`` (nvCOMP, an error where it cannot) or ``"host"``.

    Returns
    -------
    Table
        The chosen columns of the chosen record batches.

    Raises
    ------
    TypeError
        For a column name that is not a str, a batch index that is not an int, or a
        ``decode`` that is not a str.
    ValueError
        For a file that is not valid Arrow IPC data (the message says what is wrong and
        names the buffer), a column the file does not have, a ``decode`` other than those
        above, or ``decode="gpu"`` with ``device="cpu"``.
    ImportError
        For ``decode="gpu"`` where nvCOMP or CuPy is not installed.
    RuntimeError
        For ``decode="gpu"`` where nvCOMP fails on buffers the host decodes.
    IndexError
        For a record batch index out of range.
    kvikpy.errors.UnsupportedOperationError
        For a column of a type kvikpy cannot read (the message names the column and
        its type), or delta dictionary batches.
    OSError
        If the file cannot be opened or read.

    Examples
    --------
    >>> t = kvikpy.arrow.read_ipc("train/data-00000-of-00004.arrow")
    >>> ids = torch.from_dlpack(t.column("label"))
    >>> host = pyarrow.table(kvikpy.arrow.read_ipc("x.feather", device="cpu"))
    """
    names: list[str] | None = None
    if columns is not None:
        if isinstance(columns, str):
            raise TypeError(f"columns is a list of names, not one str; write columns=[{columns!r}]")
        names = []
        for c in columns:
            if not isinstance(c, str):
                raise TypeError(f"a column is named by a str, not {c!r}")
            names.append(c)
    picked: list[int] | None = None
    if batches is not None:
        picked = []
        for b in batches:
            if isinstance(b, bool) or not hasattr(b, "__index__"):
                raise TypeError(f"a record batch is chosen by an int index, not {b!r}")
            picked.append(b.__index__())
    if not isinstance(decode, str):
        raise TypeError(f'decode is "auto", "gpu" or "host", not {decode!r}')
    if decode not in ("auto", "gpu", "host"):
        raise ValueError(f'decode must be "auto", "gpu" or "host", not {decode!r}')
    ordinal = _devices.resolve(device)
    if decode == "gpu" and ordinal is None:
        raise ValueError('decode="gpu" decodes into GPU memory; read with a GPU device, not "cpu"')
    if decode == "gpu" and not _nvcomp.available():
        raise ImportError(
            'decode="gpu" needs nvCOMP and CuPy: pip install "<kvikpy wheel>[nvcomp]" cupy-cuda13x'
        )
    name = _paths.fspath(source)
    # Found, not loaded: nvCOMP and CuPy load only for a read that leaves it work.
    gpu_decoder = ordinal is not None and decode != "host" and _nvcomp.installed()
    read = _lib.read_ipc_table(name, names, picked, ordinal, gpu_decoder)
    pieces = read.gpu_pieces  # work left for nvCOMP (only ever on a GPU table)
    if pieces and ordinal is not None:
        _decode_on_gpu(read, pieces, ordinal, decode == "gpu")
    return Table(read.table())


_STEPS = {1: "zstd", 2: "lz4"}

# Whether nvCOMP writes ZSTD frames straight into their places in the table (True) or
# into its own outputs, each then checked and copied into place (False). LZ4 blocks always
# take the second route: a block's decoded size is known only once it is decoded. The
# arrow-zstd benchmark times both (and a GPU test runs the first).
_ZSTD_IN_PLACE = False


def _decode_on_gpu(
    read: _lib.IpcRead,
    pieces: list[tuple[int, int, int, int, int, int]],
    ordinal: int,
    strict: bool,
) -> None:
    """Do the work the engine left for nvCOMP on GPU ``ordinal``. Should nvCOMP be missing
    or fail, the engine does the same work on the host, from the bytes already read (a
    malformed buffer is then the error, naming it); with ``strict`` nvCOMP's failure is
    the error even so."""
    try:
        _run_pieces(read, pieces, read.labels, ordinal)
    except Exception as e:
        read.decode_on_host()
        if strict:
            raise RuntimeError(
                f"nvCOMP could not decode this read's compressed buffers, which the host "
                f'decodes ({e}); read with decode="auto" or decode="host"'
            ) from e


class _GpuDecodeError(ValueError):
    """nvCOMP's output for a buffer differs from what the plan expects."""


def _run_pieces(
    owner: object,
    pieces: list[tuple[int, int, int, int, int, int]],
    labels: list[str],
    ordinal: int,
) -> None:
    """Do the GPU work of a read (copies; ZSTD frames and LZ4 blocks in one nvCOMP call
    per codec) and wait for it, even when it fails (``owner`` keeps the memory alive)."""
    if not _nvcomp.available():
        raise RuntimeError("nvCOMP or CuPy is installed but cannot load")
    cp: Any = _nvcomp.cupy()

    def view(address: int, size: int) -> Any:
        memory = cp.cuda.UnownedMemory(address, size, owner, ordinal)
        return cp.ndarray((size,), cp.uint8, cp.cuda.MemoryPointer(memory, 0))

    with cp.cuda.Device(ordinal):
        try:
            by_codec: dict[int, list[tuple[int, int, int, int, int, int]]] = {}
            for piece in pieces:
                step, src, src_len, dst, dst_len, _ = piece
                if step == 0:
                    if src_len:
                        view(dst, dst_len)[...] = view(src, src_len)
                else:
                    by_codec.setdefault(step, []).append(piece)
            for step, group in by_codec.items():
                sources = [view(p[1], p[2]) for p in group]
                decoder = _nvcomp._decoder(_STEPS[step], ordinal)
                if step == 1 and _ZSTD_IN_PLACE:
                    # ZSTD frames state their size (checked against the buffer's on the host).
                    decoder.decode_into(sources, [view(p[3], p[4]) for p in group])
                    continue
                decoded = decoder.decode(sources, 0)
                for (_, _, _, dst, dst_len, r), out in zip(group, decoded, strict=True):
                    if out.nbytes != dst_len:
                        raise _GpuDecodeError(
                            f"{labels[r]}: nvCOMP decoded {out.nbytes} bytes where "
                            f"{dst_len} were expected"
                        )
                    view(dst, dst_len)[...] = out
        finally:
            # Nothing queued may still write the table (the host fallback rewrites it).
            cp.cuda.get_current_stream().synchronize()


def write_ipc(
    path: _paths.StrPath,
    data: Any,
    *,
    compression: str | None = None,
) -> int:
    """Write a table as an Arrow IPC file (Feather v2) that pyarrow and kvikpy read.

    Uncompressed, the file is written by kvikpy itself: the IPC metadata (schema,
    record batch headers, footer) is encoded on the host from the data's Arrow C
    description, and each buffer's bytes are written from the memory they lie in, GPU
    or host, through kvikpy's parallel write path (device buffers through the pinned
    staging buffers; no host copy of the table is made). Each buffer starts at a
    multiple of 64 bytes in the file. Compressed files, and columns kvikpy's writer does
    not handle (dictionary-encoded, union, view and run-end encoded types, sliced
    arrays), are written through pyarrow from host memory (a GPU :class:`Table` is
    copied to the host first).

    Parameters
    ----------
    path
        The file to write (replaced if it exists).
    data
        A :class:`Table` (on the GPU or the host), or anything exporting an Arrow
        table or record batch: ``__arrow_c_device_stream__`` or
        ``__arrow_c_device_array__`` (GPU or host memory), ``__arrow_c_stream__`` or
        ``__arrow_c_array__`` (host memory), such as a ``pyarrow.Table``, a
        ``pyarrow.RecordBatch`` or a cuDF table's device export.
    compression
        ``None`` (uncompressed), ``"zstd"`` or ``"lz4"``: IPC's per-buffer compression.

    Returns
    -------
    int
        The bytes written.

    Raises
    ------
    ImportError
        If pyarrow is not installed where it is needed (compression, or a column type
        kvikpy's writer does not handle).
    TypeError
        For data that exports no Arrow table or record batch.
    ValueError
        For a compression other than those above, or Arrow data that contradicts its
        own schema. Nothing is written on bad input.
    kvikpy.errors.UnsupportedOperationError
        For GPU data (other than a :class:`Table`) with a column kvikpy's writer does
        not handle.
    OSError
        If the file cannot be written.

    Examples
    --------
    >>> t = kvikpy.arrow.read_ipc("train.arrow", columns=["input_ids", "label"])
    >>> kvikpy.arrow.write_ipc("subset.arrow", t)  # from GPU memory
    """
    if compression not in (None, "zstd", "lz4"):
        raise ValueError(f"compression must be None, 'zstd' or 'lz4', not {compression!r}")
    name = _paths.fspath(path)
    exports = (
        "__arrow_c_device_stream__",
        "__arrow_c_device_array__",
        "__arrow_c_stream__",
        "__arrow_c_array__",
    )
    if not any(hasattr(data, e) for e in exports):
        raise TypeError(
            f"{type(data).__name__} exports no Arrow table or record batch "
            "(__arrow_c_device_stream__, __arrow_c_device_array__, __arrow_c_stream__, "
            "__arrow_c_array__); pass a table"
        )
    if compression is None:
        try:
            return _write_own(name, data)
        except UnsupportedOperationError:
            # Columns kvikpy's writer does not handle: pyarrow writes what the host holds.
            on_host = isinstance(data, Table) or not (
                hasattr(data, "__arrow_c_device_stream__")
                or hasattr(data, "__arrow_c_device_array__")
            )
            if not on_host and not _host_exports(data):
                raise
    return _write_pyarrow(name, data, compression)


def _host_exports(data: Any) -> bool:
    """Whether ``data`` also exports host memory (pyarrow's objects do, a GPU table not)."""
    return hasattr(data, "__arrow_c_stream__") or hasattr(data, "__arrow_c_array__")


def _write_own(name: str, data: Any) -> int:
    """Write ``data`` with kvikpy's IPC writer, from the memory it lies in."""
    if hasattr(data, "__arrow_c_device_stream__"):
        return _lib.write_ipc_stream(name, data.__arrow_c_device_stream__())
    if hasattr(data, "__arrow_c_stream__"):
        return _lib.write_ipc_stream(name, data.__arrow_c_stream__())
    if hasattr(data, "__arrow_c_device_array__"):
        schema, array = data.__arrow_c_device_array__()
        return _lib.write_ipc_array(name, schema, array)
    schema, array = data.__arrow_c_array__()
    return _lib.write_ipc_array(name, schema, array)


def _write_pyarrow(name: str, data: Any, compression: str | None) -> int:
    """Write ``data`` (host memory, or a kvikpy :class:`Table`) through pyarrow."""
    try:
        import pyarrow as pa
        import pyarrow.ipc as ipc  # type: ignore[import-untyped]
    except ImportError:
        raise ImportError(
            "kvikpy.arrow.write_ipc needs pyarrow to write compressed files or columns of "
            "this type: pip install pyarrow"
        ) from None
    if isinstance(data, Table):
        data = data.to_host()
    if hasattr(data, "__arrow_c_stream__"):
        reader = pa.RecordBatchReader.from_stream(data)
    elif hasattr(data, "__arrow_c_array__"):
        batch = pa.record_batch(data)
        reader = pa.RecordBatchReader.from_batches(batch.schema, [batch])
    else:
        raise TypeError(
            f"{type(data).__name__} is in GPU memory; write_ipc compresses GPU data only "
            "from a kvikpy.arrow.Table (copy other GPU tables to the host, or write them "
            "uncompressed)"
        )
    sink = pa.BufferOutputStream()
    options = ipc.IpcWriteOptions(compression=compression)
    with ipc.new_file(sink, reader.schema, options=options) as writer:
        for batch in reader:
            writer.write_batch(batch)
    body = sink.getvalue()
    import numpy as np

    from kvikpy.cufile import CuFile

    # A new file replaces any at `name` only once complete (see CuFile._one_shot).
    with CuFile._one_shot(name) as f:
        return int(f.write(np.frombuffer(body, dtype=np.uint8)))
