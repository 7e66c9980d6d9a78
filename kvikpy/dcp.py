"""PyTorch distributed checkpoints through kvikpy: storage for ``torch.distributed.checkpoint``.

``dcp.save(state_dict, storage_writer=kvikpy.dcp.FileSystemWriter(path))`` writes each
rank's tensors, from the GPU or the host, straight from their memory into its data files
(one per rank, or ``thread_count``), all started at once on kvikpy's pool; ``dcp.load(state_dict,
storage_reader=kvikpy.dcp.FileSystemReader(path))`` reads each tensor straight into the
tensor it loads into. Both are the classes of ``torch.distributed.checkpoint`` of the same
names, with the data files written and read by kvikpy; planning, metadata, deduplication
and resharding are PyTorch's own.

What differs from PyTorch's own files: PyTorch writes each tensor of a data file as
``torch.save`` writes a tensor (a small zip archive), which takes a host copy of GPU
tensors to make; kvikpy writes the tensor's bytes alone, so that they go from GPU memory
to the file and back with no copy. kvikpy's data files are named ``__{rank}_{i}.kvikpy``;
``kvikpy.dcp.FileSystemReader`` reads checkpoints written by either writer, while
PyTorch's ``FileSystemReader`` reads only those PyTorch wrote (it fails on kvikpy's data
files, unpickling raw bytes).

Needs torch (``import kvikpy.dcp`` raises ``ModuleNotFoundError`` saying so without it).
"""

from __future__ import annotations

import heapq
import io
import os
from collections.abc import Sequence
from typing import Any

try:
    import torch  # type: ignore[import-not-found, unused-ignore]
    import torch.distributed.checkpoint as _dcp  # type: ignore[import-not-found, unused-ignore]
    from torch.distributed.checkpoint.filesystem import (  # type: ignore[import-not-found, unused-ignore]
        _StorageInfo,
    )
    from torch.distributed.checkpoint.metadata import (  # type: ignore[import-not-found, unused-ignore]
        TensorStorageMetadata,
    )
    from torch.distributed.checkpoint.planner import (  # type: ignore[import-not-found, unused-ignore]
        LoadItemType,
        LoadPlan,
        WriteItemType,
    )
    from torch.distributed.checkpoint.storage import (  # type: ignore[import-not-found, unused-ignore]
        WriteResult,
    )
except ModuleNotFoundError as e:
    raise ModuleNotFoundError(
        f"kvikpy.dcp is storage for torch.distributed.checkpoint and needs torch ({e}); "
        "install torch"
    ) from None

from kvikpy._save import write_files
from kvikpy._spans import staging_budget
from kvikpy.cufile import CuFile, wait_all

__all__ = ["SUFFIX", "FileSystemReader", "FileSystemWriter"]

#: The ending of the data files kvikpy writes: a rank's files are ``__{rank}_{i}.kvikpy``.
SUFFIX = ".kvikpy"

#: Tensors of at least this many bytes start at a multiple of 4 KiB in a data file (their
#: aligned middle can move by direct I/O); smaller ones at a multiple of 64 bytes.
_PAGE_FROM = 1 << 20


def _bytes_of(t: Any) -> Any:
    """Tensor ``t`` (contiguous) as a flat ``uint8`` tensor over the same memory."""
    return t.detach().reshape(-1).view(torch.uint8)


def _inside(name: str, req: Any) -> None:
    """``ValueError`` unless ``name`` (a data file the metadata names) is a plain file name
    in the checkpoint's directory: a reader never opens anything outside it."""
    if not name or name in (".", "..") or os.path.basename(name) != name or "\0" in name:
        raise ValueError(
            f"the checkpoint's metadata puts {req.storage_index.fqn!r} in {name!r}, which is "
            "not a file of the checkpoint's directory; the metadata is damaged or hostile"
        )


#: The most data files one rank writes (``thread_count``).
_MOST_FILES = 1024


def _spread(items: list[Any], files: int) -> list[list[Any]]:
    """``items`` (``(item, buffer, nbytes)``) over at most ``files`` lists of about equal
    bytes, largest first onto the lightest list, each list in the items' own order; no
    empty list (fewer items than files make fewer files)."""
    count = max(1, min(files, len(items)))
    # A heap of (bytes, items, list): of lists equally light, the one with fewest items,
    # so that empty items (last, being smallest) still leave no list empty.
    lightest = [(0, 0, f) for f in range(count)]
    into = [0] * len(items)
    for k in sorted(range(len(items)), key=lambda k: -items[k][2]):
        load, held, into[k] = heapq.heappop(lightest)
        heapq.heappush(lightest, (load + items[k][2], held + 1, into[k]))
    spread: list[list[Any]] = [[] for _ in range(count)]
    for item, f in zip(items, into, strict=True):
        spread[f].append(item)
    return spread


class FileSystemWriter(_dcp.FileSystemWriter):  # type: ignore[misc]
    """``torch.distributed.checkpoint.FileSystemWriter`` whose data files kvikpy writes.

    Each rank writes ``thread_count`` data files (one by default), ``__{rank}_{i}.kvikpy``:
    its tensors' bytes, each from the memory it lies in (any GPU of the host, or the
    host), and its other items (the bytes PyTorch serialises for non-tensor values), all
    started at once on kvikpy's pool, however many files they go to. Each file is written
    under a temporary name and takes its name once every byte of every file is written
    (synced to the disk first with ``sync_files``); a rank whose write fails (a full disk,
    Ctrl-C) leaves no data file, and the checkpoint's ``.metadata`` is only written once
    every rank has written its data. The metadata is PyTorch's own.

    Parameters
    ----------
    path
        The checkpoint's directory (created if missing).
    sync_files
        Whether each data file reaches the disk before it takes its name (PyTorch's
        meaning; on by default).
    thread_count
        The data files each rank writes (PyTorch's parameter: there, one writing thread
        per file), its items spread over them by size. kvikpy writes a file from many
        threads either way, so one is enough on filesystems that take parallel direct
        writes (ext4, XFS); on one that writes a file one call at a time (tmpfs:
        ``/dev/shm``) several files are written at once. At least 1.
    overwrite
        Whether a checkpoint already in ``path`` may be overwritten (PyTorch's meaning).
    cache_staged_state_dict
        For ``dcp.async_save``: keep the host copy PyTorch stages between saves
        (PyTorch's meaning).
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        sync_files: bool = True,
        thread_count: int = 1,
        overwrite: bool = True,
        cache_staged_state_dict: bool = False,
    ) -> None:
        if isinstance(thread_count, bool) or not isinstance(thread_count, int):
            raise TypeError(
                f"thread_count must be an int (data files per rank), not "
                f"{type(thread_count).__name__} {thread_count!r:.40}"
            )
        if not 1 <= thread_count <= _MOST_FILES:
            raise ValueError(
                f"thread_count must be 1 to {_MOST_FILES} (data files per rank), got {thread_count}"
            )
        super().__init__(
            path,
            single_file_per_rank=True,
            sync_files=sync_files,
            thread_count=thread_count,
            overwrite=overwrite,
            cache_staged_state_dict=cache_staged_state_dict,
        )
        self._files = thread_count

    def write_data(self, plan: Any, planner: Any) -> Any:
        """Write this rank's items (``plan``, their data from ``planner``) into its data
        file; the returned ``torch.futures.Future`` is already done: its results say where
        each item lies.

        Parameters
        ----------
        plan
            This rank's ``SavePlan``, its ``storage_data`` the rank's file prefix.
        planner
            The ``SavePlanner`` that resolves each item's data.
        """
        items = []
        for item in plan.items:
            data = planner.resolve_data(item)
            if item.type == WriteItemType.BYTE_IO:
                buf: Any = data.getbuffer() if isinstance(data, io.BytesIO) else data
                nbytes = len(buf)
            else:
                t = data.detach()
                if not t.is_contiguous():
                    t = t.contiguous()
                buf = _bytes_of(t)
                nbytes = t.numel() * t.element_size()
            items.append((item, buf, nbytes))
        files: list[tuple[str, list[tuple[Any, int, int]]]] = []
        results = []
        for i, bucket in enumerate(_spread(items, self._files)):
            name = f"{plan.storage_data.prefix}{i}{SUFFIX}"
            pieces: list[tuple[Any, int, int]] = []
            at = 0
            for item, buf, nbytes in bucket:
                align = 4096 if nbytes >= _PAGE_FROM else 64
                at = -(-at // align) * align
                pieces.append((buf, nbytes, at))
                results.append(
                    WriteResult(
                        index=item.index,
                        size_in_bytes=nbytes,
                        storage_data=_StorageInfo(relative_path=name, offset=at, length=nbytes),
                    )
                )
                at += nbytes
            files.append((os.path.join(os.fspath(self.path), name), pieces))
        write_files(files, bool(self.sync_files))
        done = torch.futures.Future()
        done.set_result(results)
        return done


class FileSystemReader(_dcp.FileSystemReader):  # type: ignore[misc]
    """``torch.distributed.checkpoint.FileSystemReader`` that reads kvikpy's data files.

    Items in files that :class:`FileSystemWriter` wrote are read by kvikpy, each tensor
    straight into the tensor it loads into (on any GPU of the host, or the host) where it
    is the stored tensor whole, contiguous and of its dtype, else into a buffer on the
    target's device that is then narrowed and copied (a checkpoint resharded on loading);
    all of a rank's reads are started at once on kvikpy's pool. Items in files PyTorch's
    own writer wrote are read by PyTorch, so checkpoints from either writer load.

    Parameters
    ----------
    path
        The checkpoint's directory.
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        super().__init__(path)
        self._metadata: Any = None

    def set_up_storage_reader(
        self, metadata: Any, is_coordinator: bool, *args: Any, **kwargs: Any
    ) -> None:
        """PyTorch's, keeping the checkpoint's metadata (each stored tensor's dtype and
        chunks) for the reads.

        Parameters
        ----------
        metadata
            The checkpoint's metadata.
        is_coordinator
            Whether this rank coordinates the load.
        *args
            Further positional arguments of PyTorch's method, passed on.
        **kwargs
            Its keyword arguments (``rank``, ``use_collectives``), passed on.
        """
        super().set_up_storage_reader(metadata, is_coordinator, *args, **kwargs)
        self._metadata = metadata

    def read_data(self, plan: Any, planner: Any) -> Any:
        """Read the items of ``plan`` into what ``planner`` resolves them to.

        Parameters
        ----------
        plan
            This rank's ``LoadPlan``.
        planner
            The ``LoadPlanner`` that gives each item's destination.
        """
        ours = [r for r in plan.items if self._info(r).relative_path.endswith(SUFFIX)]
        theirs = [r for r in plan.items if not self._info(r).relative_path.endswith(SUFFIX)]
        if theirs:
            super().read_data(LoadPlan(theirs, plan.storage_data, plan.planner_data), planner)
        if ours:
            self._read_ours(ours, planner)
        done = torch.futures.Future()
        done.set_result(None)
        return done

    def _info(self, req: Any) -> Any:
        return self.storage_data[req.storage_index]

    def _stored(self, req: Any) -> tuple[Any, Sequence[int]]:
        """The dtype and shape of the stored chunk that ``req`` reads from."""
        md = self._metadata.state_dict_metadata[req.storage_index.fqn]
        if not isinstance(md, TensorStorageMetadata):
            raise ValueError(f"{req.storage_index.fqn!r} is not a tensor in this checkpoint")
        offsets = list(req.storage_index.offset)
        for chunk in md.chunks:
            if list(chunk.offsets) == offsets:
                return md.properties.dtype, list(chunk.sizes)
        raise ValueError(
            f"the checkpoint has no chunk of {req.storage_index.fqn!r} at offsets {offsets}"
        )

    def _read_ours(self, reqs: list[Any], planner: Any) -> None:
        """Start every read of ``reqs`` at once, wait for all, then hand each item over."""
        files: dict[str, CuFile] = {}
        started: list[tuple[Any, Any, Any, int]] = []  # (req, what was read into, target, n)
        try:
            for req in reqs:
                info = self._info(req)
                f = files.get(info.relative_path)
                if f is None:
                    _inside(info.relative_path, req)
                    path = os.path.join(os.fspath(self.path), info.relative_path)
                    f = files[info.relative_path] = CuFile(path, "r")
                if req.type == LoadItemType.BYTE_IO:
                    started.append((req, bytearray(info.length), None, info.length))
                    continue
                target = planner.resolve_tensor(req).detach()
                dtype, shape = self._stored(req)
                whole = (
                    all(o == 0 for o in req.storage_offsets)
                    and list(req.lengths) == list(shape)
                    and target.dtype == dtype
                    and target.is_contiguous()
                )
                into = target if whole else torch.empty(shape, dtype=dtype, device=target.device)
                nbytes = into.numel() * into.element_size()
                if nbytes != info.length:
                    raise ValueError(
                        f"{info.relative_path}: {req.storage_index.fqn!r} holds {info.length} "
                        f"bytes, but its stored chunk of {list(shape)} {dtype} is {nbytes}; "
                        "the checkpoint's metadata and data do not match"
                    )
                started.append((req, into, target, nbytes))
            on_gpu = [t is not None and t.is_cuda for _, _, t, _ in started]
            # One staging budget for the load's reads (their bounce buffers).
            with staging_budget(gpu=any(on_gpu), host=not all(on_gpu)):
                futures = [
                    files[self._info(req).relative_path].pread(
                        into if target is None else _bytes_of(into), n, self._info(req).offset
                    )
                    for req, into, target, n in started
                    if n
                ]
                got = wait_all(futures)
        finally:
            for f in files.values():
                f.close()
        counts = iter(got)
        for req, into, target, n in started:
            if n and (k := next(counts)) != n:
                info = self._info(req)
                raise OSError(
                    f"{info.relative_path} ended after {k} of the {n} bytes of "
                    f"{req.storage_index.fqn!r} at offset {info.offset} (cut short?)"
                )
            if target is None:
                planner.load_bytes(req, io.BytesIO(into))
                continue
            if into is not target:
                part = into
                for dim, (offset, length) in enumerate(
                    zip(req.storage_offsets, req.lengths, strict=True)
                ):
                    part = part.narrow(dim, offset, length)
                target.copy_(part)
            planner.commit_tensor(req, target)
