"""Batch reads: many files (:func:`read_many`) or many byte ranges of one file
(:func:`read_ranges`) into one allocation, in one parallel pass, as a :class:`Batch`."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeVar, overload

import kvikpy._lib as _lib
from kvikpy import _args, _devices, _paths
from kvikpy._cuda_streams import stream_handle
from kvikpy.spread import Spread, assign, element_index, file_sizes, is_spread

if TYPE_CHECKING:
    import numpy as np

_Result = TypeVar("_Result")


class BufferSequence:
    """Mixin: a batch's elements as a sequence of buffers. Indexing (negative counts from
    the end), slicing and iteration, written once; a subclass gives ``len`` and
    ``_element(i)`` for an index already checked."""

    def __len__(self) -> int:
        raise NotImplementedError

    def _element(self, i: int) -> _lib.Buffer:
        raise NotImplementedError

    @overload
    def __getitem__(self, i: int) -> _lib.Buffer: ...
    @overload
    def __getitem__(self, i: slice) -> list[_lib.Buffer]: ...
    def __getitem__(self, i: int | slice) -> _lib.Buffer | list[_lib.Buffer]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return self._element(element_index(i, len(self)))

    def __iter__(self) -> Iterator[_lib.Buffer]:
        for i in range(len(self)):
            yield self._element(i)


class Batch(BufferSequence, Sequence[_lib.Buffer]):
    """Many files or byte ranges laid end to end in one allocation.

    ``len(batch)`` is the number of elements (one per path or range, in the order given);
    ``batch[i]`` is a :class:`kvikpy.Buffer` view of element ``i`` (DLPack, CUDA Array
    Interface and Arrow work on it, and it keeps the whole allocation alive);
    ``batch.offsets`` holds the ``len + 1`` element boundaries in bytes; ``batch.buffer``
    is the whole allocation. The batch exports itself as an Arrow ``large_binary`` array
    with one element per file or range (``pyarrow.array(batch)`` for host batches,
    ``__arrow_c_device_array__`` for GPU ones), failed elements null.

    Made by :func:`read_many` and :func:`read_ranges`, not directly.

    Parameters
    ----------
    buffer
        The one allocation holding every element, end to end.
    offsets
        The ``len + 1`` element boundaries in bytes, starting at 0.
    failures
        Elements that could not be read, by index, with their errors.

    Examples
    --------
    >>> batch = kvikpy.read_many(["a.bin", "b.bin"])
    >>> len(batch), batch.sizes.tolist()
    (2, [4096, 100])
    >>> t = torch.from_dlpack(batch[1])  # element 1, on the GPU, no copy
    >>> whole = cupy.from_dlpack(batch.buffer)  # every byte, end to end
    """

    def __init__(
        self,
        buffer: _lib.Buffer,
        offsets: list[int],
        failures: dict[int, BaseException],
    ) -> None:
        self._buffer = buffer
        self._offsets = offsets
        self._failures = failures
        self._device_meta: _lib.BatchDeviceMeta | None = None  # made by the first GPU export

    @property
    def buffer(self) -> _lib.Buffer:
        """The one allocation holding every element."""
        return self._buffer

    @property
    def offsets(self) -> np.ndarray:
        """Element boundaries in bytes (``int64``, ``len(self) + 1`` entries)."""
        import numpy as np

        out = np.array(self._offsets, dtype=np.int64)
        out.flags.writeable = False
        return out

    @property
    def sizes(self) -> np.ndarray:
        """Each element's size in bytes."""
        import numpy as np

        return np.diff(self.offsets)

    @property
    def failures(self) -> dict[int, BaseException]:
        """Elements that could not be read (``errors="skip"`` only), by index."""
        return dict(self._failures)

    def __len__(self) -> int:
        return len(self._offsets) - 1

    def _element(self, i: int) -> _lib.Buffer:
        if i in self._failures:
            raise self._failures[i]
        start, end = self._offsets[i], self._offsets[i + 1]
        return self._buffer.view("|u1", 1, 8, [end - start], start, end - start)

    def __repr__(self) -> str:
        from kvikpy._display import batch_repr

        return batch_repr(self)

    def _repr_html_(self) -> str:
        from kvikpy._display import batch_rows, html_table

        return html_table("kvikpy.Batch", batch_rows(self))

    def __arrow_c_schema__(self) -> Any:
        return _lib.batch_schema()

    def __arrow_c_array__(self, requested_schema: Any = None) -> tuple[Any, Any]:
        """The batch as an Arrow ``large_binary`` array (host batches)."""
        return _lib.batch_arrow(self._buffer, self._offsets, sorted(self._failures), False)

    def __arrow_c_device_array__(
        self, requested_schema: Any = None, **kwargs: Any
    ) -> tuple[Any, Any]:
        """The batch as an Arrow ``large_binary`` device array (offsets on its device)."""
        _lib.check_device_kwargs("__arrow_c_device_array__", kwargs)
        failed = sorted(self._failures)
        if self._device_meta is None and self._buffer.device != "cpu":
            self._device_meta = _lib.batch_device_meta(self._buffer, self._offsets, failed)
        return _lib.batch_arrow(self._buffer, self._offsets, failed, True, self._device_meta)


@overload
def read_many(
    paths: Iterable[_paths.StrPath],
    *,
    device: str | int = "cuda",
    stream: Any = None,
    errors: Literal["raise", "skip"] = "raise",
    progress: bool = False,
) -> Batch: ...
@overload
def read_many(
    paths: Iterable[_paths.StrPath],
    *,
    device: Spread,
    stream: Any = None,
    errors: Literal["raise", "skip"] = "raise",
    progress: bool = False,
) -> SpreadBatch: ...
def read_many(
    paths: Iterable[_paths.StrPath],
    *,
    device: str | int | Spread = "cuda",
    stream: Any = None,
    errors: Literal["raise", "skip"] = "raise",
    progress: bool = False,
) -> Batch | SpreadBatch:
    """Read whole files into one allocation, in parallel, in one pass.

    Files are opened, read and closed on kvikpy's thread pool; for GPU memory, small files
    are gathered in pinned bounce buffers and moved in a few large DMAs rather than one
    per file.

    Parameters
    ----------
    paths
        The files, in the order their elements take in the batch: local paths or remote
        files' URLs (``http://``, ``https://``, ``s3://``, ``webhdfs://``; see
        :class:`kvikpy.RemoteFile`), sized with one request each.
    device
        ``"cuda"`` (the current GPU), ``"cuda:N"``, an int, or ``"cpu"``. Several
        devices (``["cuda:0", "cuda:1"]``) spread the files over them: runs of
        consecutive files with about the same bytes per device, read at the same time,
        returned as a :class:`kvikpy.SpreadBatch`; a mapping ``{index: device}`` places
        each file explicitly.
    stream
        Accepted for symmetry with :func:`kvikpy.read` (a CUDA stream, its handle, or
        anything with ``__cuda_stream__``; checked, and refused with ``device="cpu"``):
        the call returns once every byte has landed, so work queued on any stream
        afterwards sees them.
    errors
        ``"raise"`` (default): the first failing file (in ``paths`` order) raises its
        error (``FileNotFoundError``, ``PermissionError``, ``IsADirectoryError`` ...,
        naming the path) and the allocation is freed. ``"skip"``: failed files are left
        out and listed in :attr:`Batch.failures`; a file that failed before reading
        (missing, a directory) is an empty element, one that failed while reading keeps
        its place with unspecified bytes; either way ``batch[i]`` raises its error and the
        Arrow export marks it null.
    progress
        Show a progress bar of the bytes read (see :func:`kvikpy.read`).

    Returns
    -------
    Batch
        One element per path, in order.

    Raises
    ------
    OSError
        With ``errors="raise"``, the first failing file's error (a subclass such as
        ``FileNotFoundError``), its ``filename`` the path; nothing stays allocated.
    ValueError
        For a malformed ``device``, ``errors`` or ``stream``.
    CudaUnavailableError
        For a GPU device on a machine without CUDA (pass ``device="cpu"``).

    Examples
    --------
    >>> paths = sorted(glob.glob("shards/*.bin"))
    >>> batch = kvikpy.read_many(paths)  # one GPU allocation, one parallel pass
    >>> batch = kvikpy.read_many(paths, errors="skip")
    >>> batch.failures  # index -> exception, for the files that could not be read
    {3: FileNotFoundError(2, 'No such file or directory')}
    """
    if errors not in ("raise", "skip"):
        raise ValueError(f"errors must be 'raise' or 'skip', got {errors!r}")
    names = [_paths.fspath(p) for p in paths]
    if is_spread(device):
        if stream is not None:
            raise ValueError("stream= belongs to one GPU; it cannot be used with several devices")
        spread: Spread = device  # type: ignore[assignment]
        return read_spread(
            file_sizes(names),
            spread,
            lambda members, label: read_many(
                [names[i] for i in members], device=label, errors=errors, progress=progress
            ),
        )
    assert not isinstance(device, (list, tuple, Mapping))
    ordinal = _devices.resolve(device)
    if stream is not None:
        if ordinal is None:
            raise ValueError("stream= orders GPU reads; it cannot be used with device='cpu'")
        stream_handle(stream)  # a bad stream is an error even though the read completes first
    skip = errors == "skip"
    buffer, offsets, failed = _followed(
        progress,
        f"read_many ({len(names):,} files)",
        lambda p: _lib.read_files_batch(names, ordinal, skip, p),
    )
    return Batch(buffer, offsets, dict(failed))


@overload
def read_ranges(
    path: _paths.StrPath,
    ranges: Iterable[tuple[int, int]] | tuple[Any, Any],
    *,
    device: str | int = "cuda",
    progress: bool = False,
) -> Batch: ...
@overload
def read_ranges(
    path: _paths.StrPath,
    ranges: Iterable[tuple[int, int]] | tuple[Any, Any],
    *,
    device: Spread,
    progress: bool = False,
) -> SpreadBatch: ...
def read_ranges(
    path: _paths.StrPath,
    ranges: Iterable[tuple[int, int]] | tuple[Any, Any],
    *,
    device: str | int | Spread = "cuda",
    progress: bool = False,
) -> Batch | SpreadBatch:
    """Read many ``(offset, size)`` byte ranges of one file into one allocation.

    Ranges may overlap and come in any order; each becomes one element, in the order
    given. The file is opened once; the ranges are read on kvikpy's thread pool and, for
    GPU memory, gathered in pinned bounce buffers and moved in a few large DMAs.

    Parameters
    ----------
    path
        The file: a local path or a remote file's URL (read with one range request per
        piece).
    ranges
        A sequence of ``(offset, size)`` pairs, or two integer arrays
        ``(offsets, sizes)`` of the same length.
    device
        ``"cuda"`` (the current GPU), ``"cuda:N"``, an int, or ``"cpu"``; several
        devices (a list, or a mapping from range index to device) spread the ranges as
        in :func:`read_many`, into a :class:`kvikpy.SpreadBatch`.
    progress
        Show a progress bar of the bytes read (see :func:`kvikpy.read`).

    Returns
    -------
    Batch
        One element per range, in order (a :class:`kvikpy.SpreadBatch` for several
        devices).

    Raises
    ------
    TypeError
        For an offset or size that is not an integer (numpy integers are), before
        anything is read.
    ValueError
        For a negative offset or size, or a range reaching past the end of the file
        (the message names the range), before anything is read.
    OSError
        If the file cannot be opened or read (``FileNotFoundError`` ...).

    Examples
    --------
    >>> batch = kvikpy.read_ranges("big.bin", [(0, 4096), (1 << 30, 1 << 20)])
    >>> offsets = np.arange(0, 1 << 30, 1 << 24)
    >>> batch = kvikpy.read_ranges("big.bin", (offsets, np.full(len(offsets), 4096)))
    """
    pairs = _pairs(ranges)
    name = _paths.fspath(path)
    if is_spread(device):
        spread: Spread = device  # type: ignore[assignment]
        return read_spread(
            [size for _, size in pairs],
            spread,
            lambda members, label: read_ranges(
                name, [pairs[i] for i in members], device=label, progress=progress
            ),
        )
    assert not isinstance(device, (list, tuple, Mapping))
    ordinal = _devices.resolve(device)
    buffer, offsets, _ = _followed(
        progress,
        f"read_ranges ({len(pairs):,} ranges)",
        lambda p: _lib.read_ranges_batch(name, pairs, ordinal, p),
    )
    return Batch(buffer, offsets, {})


def _followed(
    progress: bool, desc: str, call: Callable[[_lib.Progress | None], _Result]
) -> _Result:
    """``call(None)``; with ``progress``, ``call(counter)`` drawn as a bar described as
    ``desc`` (:func:`kvikpy._progress.follow_call`, imported only when a bar is asked)."""
    if not progress:
        return call(None)
    from kvikpy._progress import follow_call

    return follow_call(call, desc)


def _pairs(ranges: Any) -> list[tuple[int, int]]:
    if (
        isinstance(ranges, tuple)
        and len(ranges) == 2
        and all(hasattr(r, "__len__") and not isinstance(r, tuple) for r in ranges)
    ):
        offsets, sizes = ranges
        if len(offsets) != len(sizes):
            raise ValueError(
                f"offsets and sizes differ in length ({len(offsets)} and {len(sizes)})"
            )
        ranges = zip(offsets, sizes, strict=True)
    out = []
    for i, r in enumerate(ranges):
        try:
            offset, size = r
        except (TypeError, ValueError):
            raise TypeError(
                f"range {i} must be an (offset, size) pair of integers, got {r!r}"
            ) from None
        offset = _args.non_negative(f"range {i}'s offset", offset)
        size = _args.non_negative(f"range {i}'s size", size)
        _args.end(f"range {i}", offset, size)
        out.append((offset, size))
    return out


class SpreadBatch(BufferSequence, Sequence[_lib.Buffer]):
    """A batch whose elements lie on several devices: one :class:`kvikpy.Batch` per device.

    ``batch[i]`` is element ``i`` (a :class:`kvikpy.Buffer` on its device, as in
    :class:`kvikpy.Batch`), ``batch.device_of(i)`` says where it is, ``batch.parts`` maps
    each device to its own ``Batch`` and ``batch.indices[device]`` lists which elements
    that part holds, in order. Made by :func:`kvikpy.read_many` and
    :func:`kvikpy.read_ranges` with several devices, not directly.

    Parameters
    ----------
    parts
        Each device's batch, by device label (``"cpu"``, ``"cuda:N"``).
    indices
        Each device's elements, by their index in the whole batch, in the order of that
        device's batch.
    n
        The number of elements in the whole batch.
    """

    def __init__(self, parts: dict[str, Batch], indices: dict[str, list[int]], n: int):
        self._parts = parts
        self._indices = indices
        self._where: list[tuple[str, int]] = [("", 0)] * n
        for device, members in indices.items():
            for k, i in enumerate(members):
                self._where[i] = (device, k)

    @property
    def parts(self) -> dict[str, Batch]:
        """Each device's own batch (``"cpu"`` or ``"cuda:N"`` to :class:`kvikpy.Batch`)."""
        return dict(self._parts)

    @property
    def indices(self) -> dict[str, list[int]]:
        """Each device's elements, by their index in this batch, in order."""
        return {d: list(v) for d, v in self._indices.items()}

    @property
    def failures(self) -> dict[int, BaseException]:
        """Elements that could not be read (``errors="skip"``), by index in this batch."""
        out: dict[int, BaseException] = {}
        for device, part in self._parts.items():
            for k, e in part.failures.items():
                out[self._indices[device][k]] = e
        return dict(sorted(out.items()))

    @property
    def sizes(self) -> list[int]:
        """Each element's size in bytes, in order."""
        return [int(self._parts[d].sizes[k]) for d, k in self._where]

    def device_of(self, i: int) -> str:
        """The device of element ``i``: ``"cpu"`` or ``"cuda:N"``.

        Parameters
        ----------
        i
            The element's index (negative counts from the end).
        """
        return self._where[element_index(i, len(self))][0]

    def __len__(self) -> int:
        return len(self._where)

    def _element(self, i: int) -> _lib.Buffer:
        device, k = self._where[i]
        return self._parts[device][k]

    def __repr__(self) -> str:
        shares = ", ".join(f"{d}: {len(v):,}" for d, v in self._indices.items())
        return (
            f"<kvikpy.SpreadBatch {len(self):,} elements on {len(self._parts)} devices ({shares})>"
        )


def read_spread(
    sizes: Sequence[int],
    device: Spread,
    read_part: Callable[[list[int], str], Batch],
) -> SpreadBatch:
    """Read each device's elements with ``read_part(indices, device)``, all parts at once
    (the engine releases the GIL, so the parts overlap); the first error is raised after
    every part has finished, and nothing stays allocated."""
    plan = assign(sizes, device)
    if len(plan) == 1:
        ((label, members),) = plan.items()
        return SpreadBatch({label: read_part(members, label)}, plan, len(sizes))
    # Imported here: concurrent.futures (and the logging it pulls in) is a fifth of
    # `import kvikpy`, and only reads spread over several GPUs need it.
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=len(plan), thread_name_prefix="kvikpy-spread") as pool:
        futures = {label: pool.submit(read_part, members, label) for label, members in plan.items()}
        parts: dict[str, Batch] = {}
        errors: list[BaseException] = []
        for label, future in futures.items():
            try:
                parts[label] = future.result()
            except BaseException as e:  # every part finishes before anything is raised
                errors.append(e)
    if errors:
        parts.clear()
        raise errors[0]
    return SpreadBatch(parts, plan, len(sizes))
