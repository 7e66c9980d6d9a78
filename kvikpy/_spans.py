"""A checkpoint's tensors as byte spans of its files, and reading them.

One job: given where each tensor's bytes lie (:class:`TensorSpan`), lay pieces of them
end to end at 64-byte boundaries (so every dtype views its piece without a copy), merge
reads that follow each other both in a file and in the destination, and run the reads at
once on kvikpy's pool (:class:`CuFile` ``pread``), every read waited for before the first
error is raised. The loaders of :mod:`kvikpy.safetensors` and the read-once exchange of
:mod:`kvikpy._read_once` read through it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import kvikpy._lib as _lib
from kvikpy.cufile import CuFile

__all__ = [
    "PACK_ALIGN",
    "FileRead",
    "Files",
    "TensorSpan",
    "coalesced",
    "merged",
    "pack",
    "read_into",
    "read_spans",
    "torch_device",
]

# Each shared tensor starts at a multiple of this in the packed buffer: every dtype's item
# size divides it, so every tensor is a view without a copy.
PACK_ALIGN = 64

_R = TypeVar("_R")


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
            for f in self._open.values():
                f.close()

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


def coalesced(reads: Iterable[_R], joined: Callable[[_R, _R], _R | None]) -> list[_R]:
    """``reads`` in order, each that ``joined(last, read)`` merges into the one before it
    (the merged read, or ``None`` where the two stay apart) made one read with it."""
    out: list[_R] = []
    for r in reads:
        one = joined(out[-1], r) if out else None
        if one is None:
            out.append(r)
        else:
            out[-1] = one
    return out


def merged(reads: Sequence[FileRead]) -> list[FileRead]:
    """``reads`` with each run of reads that follow each other both in one file and in
    the destination made one read."""
    return coalesced(reads, _joined)


def _joined(last: FileRead, r: FileRead) -> FileRead | None:
    if (
        last.path == r.path
        and last.file_offset + last.length == r.file_offset
        and last.at + last.length == r.at
    ):
        return FileRead(r.path, last.file_offset, last.at, last.length + r.length)
    return None


def pack(pieces: Sequence[tuple[TensorSpan, int, int]]) -> tuple[list[int], list[FileRead], int]:
    """Lay ``(tensor, offset in it, length)`` pieces end to end, each at a 64-byte
    boundary: each piece's place, the merged reads that fill them, and the bytes in all."""
    places: list[int] = []
    reads: list[FileRead] = []
    end = 0
    for t, within, length in pieces:
        end = -(-end // PACK_ALIGN) * PACK_ALIGN
        places.append(end)
        if length:
            reads.append(FileRead(t.path, t.offset + within, end, length))
        end += length
    return places, merged(reads), end


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
