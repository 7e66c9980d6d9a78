"""A checkpoint's tensors as byte spans of its files, and reading them.

One job: given where each tensor's bytes lie (:class:`TensorSpan`), lay pieces of them
end to end at 64-byte boundaries (so every dtype views its piece without a copy), merge
reads that follow each other both in a file and in the destination (both planned by the
engine: ``_lib.safetensors_pack`` and ``_lib.safetensors_merge``), and run the reads at
once on kvikpy's pool (:class:`CuFile` ``pread``), every read waited for before the first
error is raised. The loaders of :mod:`kvikpy.safetensors` and the read-once exchange of
:mod:`kvikpy._read_once` read through it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import kvikpy._lib as _lib
from kvikpy.cufile import CuFile

__all__ = [
    "PACK_ALIGN",
    "FileRead",
    "Files",
    "TensorSpan",
    "file_indices",
    "merged",
    "pack",
    "read_into",
    "read_spans",
    "torch_device",
]

# Each shared tensor starts at a multiple of this in the packed buffer: every dtype's item
# size divides it, so every tensor is a view without a copy.
PACK_ALIGN = 64


@dataclass(frozen=True)
class TensorSpan:
    """One tensor's bytes in a file."""

    name: str
    path: str
    offset: int
    size: int


@dataclass(frozen=True)
class FileRead:
    """One read: ``length`` bytes of ``path`` at ``file_offset`` into a flat destination
    (this rank's share, or the buffer of the tensors it reads alone) at ``at``."""

    path: str
    file_offset: int
    at: int
    length: int


def read_into(dest: Any, reads: Sequence[FileRead], files: Files) -> None:
    """Run ``reads`` of ``files`` into ``dest`` (a flat uint8 buffer: this rank's share,
    or the buffer of the tensors it reads alone) at once on kvikpy's pool, each straight
    into its place (no staging buffer, no device copy); every read is waited for before
    the first error is raised."""
    files.wait(files.start(dest, reads))


@contextlib.contextmanager
def staging_budget(gpu: bool, host: bool) -> Iterator[tuple[int, int]]:
    """One staging budget (the ``checkpoint_staging`` setting) for the reads started on
    this thread inside the ``with`` block, for a load into GPU memory (``gpu``), host
    memory (``host``) or both; yields ``(bounce, device)`` as :meth:`Files.stage` returns
    it. Inside a load that entered a budget already, that one stays the load's."""
    split = _lib.staging_split(gpu, host)
    depth = _lib.staging_enter(split[0])
    try:
        yield split
    finally:
        _lib.staging_leave(depth)


class Files:
    """The files of a load, each opened once, and reads started on them; closed at the
    end (a ``with`` block), every read started being waited for first.

    A file's header and its tensors are read through the one handle opened here, so a
    load sees one file throughout: one version of a URL (every request carries the
    ``ETag`` it was opened at, and a replaced object is an error), one inode of a local
    path, however the name is reused meanwhile.
    """

    def __init__(self) -> None:
        self._open: dict[str, CuFile] = {}
        self._started: list[list[tuple[FileRead, Any]]] = []
        self._budget = contextlib.ExitStack()
        self._split: tuple[int, int] | None = None

    def __enter__(self) -> Files:
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            for started in self._started:  # no read may outlive its file (or buffer)
                for _, future in started:
                    try:
                        future.get()
                    except Exception:  # the first error is already on its way
                        continue
        finally:
            self._budget.close()
            for f in self._open.values():
                f.close()

    def stage(self, gpu: bool, host: bool) -> tuple[int, int]:
        """Bound the load's staging by the ``checkpoint_staging`` setting, for a load into
        GPU memory (``gpu``), host memory (``host``) or both: from here to the end of the
        ``with`` block, every read started on this thread takes its bounce buffers (pinned,
        and host ones for O_DIRECT) within one budget of the bytes the setting leaves
        them. Returns ``(bounce, device)``: that budget, and the bytes left for staging
        windows on each GPU. The first call fixes the budget; later ones return it."""
        if self._split is None:
            self._split = self._budget.enter_context(staging_budget(gpu, host))
        return self._split

    def open(self, path: str) -> CuFile:
        """File ``path``, opened on first use and kept open until the load ends."""
        f = self._open.get(path)
        if f is None:
            f = self._open[path] = CuFile(path, "r")
        return f

    def handle(self, path: str) -> _lib.FileHandle:
        """The engine's handle of file ``path`` (see :meth:`open`), for calls into the
        engine that read it."""
        return self.open(path)._handle

    def start(self, dest: Any, reads: Sequence[FileRead]) -> list[tuple[FileRead, Any]]:
        """Start ``reads`` into ``dest`` on kvikpy's pool; wait for them with :meth:`wait`."""
        started: list[tuple[FileRead, Any]] = []
        self._started.append(started)
        for r in reads:
            f = self.open(r.path)
            started.append((r, f.pread(dest[r.at : r.at + r.length], r.length, r.file_offset)))
        return started

    def wait(self, started: list[tuple[FileRead, Any]]) -> None:
        """Wait for every read of ``started``, then raise the first error, if any."""
        errors: list[BaseException] = []
        for r, future in started:
            try:
                got = future.get()
            except BaseException as e:  # wait for every read before raising
                errors.append(e)
                continue
            if got != r.length:
                errors.append(
                    EOFError(
                        f"{r.path}: {r.length} bytes at offset {r.file_offset} were asked "
                        f"for and only {got} read; the file is shorter than its header says"
                    )
                )
        self._started.remove(started)
        if errors:
            raise errors[0]


def file_indices(paths: Iterable[str]) -> tuple[list[str], dict[str, int]]:
    """The distinct ``paths`` in sorted order, and each one's index among them: the file
    indices the engine's plans take, numbered so that sorting by index sorts by path."""
    files = sorted(set(paths))
    return files, {p: i for i, p in enumerate(files)}


def merged(reads: Sequence[FileRead]) -> list[FileRead]:
    """``reads`` with each run of reads that follow each other both in one file and in
    the destination made one read (in the order given; the engine's merge).

    Raises ``ValueError`` for an offset or place plus length past 2**64.
    """
    files, index = file_indices(r.path for r in reads)
    runs = _lib.safetensors_merge(
        [(index[r.path], r.file_offset, r.length, 0, r.at) for r in reads], False
    )
    return [FileRead(files[f], offset, at, length) for f, offset, length, _, at, _ in runs]


def pack(pieces: Sequence[tuple[TensorSpan, int, int]]) -> tuple[list[int], list[FileRead], int]:
    """Lay ``(tensor, offset in it, length)`` pieces end to end, each at a 64-byte
    boundary: each piece's place, the merged reads that fill them, and the bytes in all
    (the engine's plan).

    Raises ``ValueError`` for an offset or total past 2**64.
    """
    files, index = file_indices(t.path for t, _, _ in pieces)
    places, runs, total = _lib.safetensors_pack(
        [(index[t.path], t.offset + within, length) for t, within, length in pieces], PACK_ALIGN
    )
    reads = [FileRead(files[f], offset, at, length) for f, offset, length, _, at, _ in runs]
    return places, reads, total


def read_spans(
    spans: Sequence[tuple[TensorSpan, int, int]], device: str | int, files: Files
) -> list[tuple[Any, int]]:
    """Read ``(tensor, offset in it, length)`` pieces into one new buffer on ``device``,
    with the merged reads of :func:`pack` all at once on the pool (a checkpoint's
    adjacent tensors cost one read per file, as a whole-file read would).

    Returns, per piece in order, ``(torch uint8 tensor of all pieces, start in it)``.
    """
    import torch  # type: ignore[import-not-found, unused-ignore]

    places, reads, total = pack(spans)
    where = torch_device(device)
    whole = torch.empty(total, dtype=torch.uint8, device=where)
    if where != "cpu":  # kvikpy writes from its own streams: the memory must be idle
        torch.cuda.current_stream(where).synchronize()
    read_into(whole, reads, files)
    return [(whole, at) for at in places]


def torch_device(device: str | int) -> Any:
    from kvikpy import _devices

    ordinal = _devices.resolve(device)
    return "cpu" if ordinal is None else f"cuda:{ordinal}"
