"""The checks and writes behind :func:`kvikpy.safetensors.save_file`.

Every tensor is described once (its safetensors dtype, its shape, and where its bytes
lie: the host or a GPU, at which address), and everything that could not be written as
it is (a dtype the format lacks, a tensor that is not contiguous, on the meta device, or
sharing memory with another) is refused before the file is created. The engine then
checks the names and sizes and lays out the header
(``kvikpy_core::safetensors::write``); the header and every tensor are written at once
on kvikpy's pool, each straight from the memory it lies in, into a new file that takes
the target's place only once every byte is written (:meth:`CuFile._one_shot`). A save
in the background copies the tensors first (:mod:`kvikpy._save_async`).

torch tensors are recognised by their type, so torch is never imported here.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, cast

import kvikpy._lib as _lib
from kvikpy import _paths
from kvikpy._dtypes import BFLOAT16_TYPESTR
from kvikpy._save_async import SaveFuture, snapshot, start
from kvikpy.cufile import CuFile, IOFuture, wait_all

__all__ = ["copies_of", "save", "write_checked", "write_files", "write_pieces"]


@dataclass(frozen=True)
class _Tensor:
    """One tensor to save, described once."""

    name: str
    buf: Any  # what the write reads: the array, or a torch tensor detached from autograd
    dtype: str  # safetensors code
    shape: tuple[int, ...]
    nbytes: int
    device: int | None  # the GPU its memory is on; None for host memory
    address: int
    storage: int | None  # a torch tensor's storage address (to say so in messages)


def save(
    tensors: Any,
    filename: _paths.StrPath,
    metadata: Any,
    dtypes: Mapping[str, str],
    sync: bool = True,
    blocking: bool = True,
) -> SaveFuture | None:
    """Write ``tensors`` with ``metadata`` to ``filename`` as a safetensors file (see
    :func:`kvikpy.safetensors.save_file`); ``dtypes`` maps dtype names as torch, numpy
    and ml_dtypes spell them (``"float32"``, ``"bfloat16"``) to safetensors codes; with
    ``sync``, the file and its rename reach the disk before the save ends. Without
    ``blocking``, the tensors are copied and the copies written in the background
    (:mod:`kvikpy._save_async`): returns the save's future."""
    name = _paths.fspath(filename)
    if _paths.is_url(name):
        raise ValueError(
            f"save_file writes local files, not {_paths.redact_url(name)!r}; write the file "
            "locally, then upload it"
        )
    pairs = _metadata(metadata)
    if not isinstance(tensors, Mapping):
        raise TypeError(
            "save_file's tensors must be a mapping (a dict) of names to tensors, not "
            f"{type(tensors).__name__}"
        )
    described = [_describe(key, obj, dtypes) for key, obj in tensors.items()]
    _refuse_overlaps(described)
    rows = [(t.name, t.dtype, list(t.shape), t.nbytes) for t in described]
    header, offsets, size = _lib.safetensors_new_header(rows, pairs)
    at = [len(header) + offset for offset in offsets]
    if blocking:
        pieces = [(t.buf, t.nbytes, o) for t, o in zip(described, at, strict=True)]
        write_pieces(name, [(header, len(header), 0), *pieces], bool(sync))
        return None
    # Everything is checked: copy the tensors, then write the copies in the background.
    copied, ready = copies_of(described)

    def job() -> int:
        ready()
        pieces = [(t.buf, t.nbytes, o) for t, o in zip(copied, at, strict=True)]
        write_pieces(name, [(header, len(header), 0), *pieces], bool(sync))
        return int(size)

    return start(name, job)


def copies_of(described: list[_Tensor]) -> tuple[list[_Tensor], Callable[[], None]]:
    """``described`` with each buffer replaced by a copy, for a save in the background
    (GPU copies within the ``checkpoint_staging`` setting per device, see
    :func:`kvikpy._save_async.snapshot`), and the function that waits for the copies."""
    staging = int(cast(int, _lib.get_setting("checkpoint_staging")))
    copies, ready = snapshot([(t.buf, t.nbytes, t.device, t.address) for t in described], staging)
    copied = [dataclasses.replace(t, buf=c) for t, c in zip(described, copies, strict=True)]
    return copied, ready


def write_pieces(name: str, pieces: list[tuple[Any, int, int]], sync: bool) -> None:
    """Write each ``(buffer, nbytes, file_offset)`` of ``pieces`` (those of no bytes
    write nothing) into a new file that takes ``name``'s place once every byte is written
    (synced first with ``sync``), all started at once on kvikpy's pool; a failure (a full
    disk, Ctrl-C) removes it, leaving ``name`` as it was."""
    write_files([(name, pieces)], sync)


def write_files(files: list[tuple[str, list[tuple[Any, int, int]]]], sync: bool) -> None:
    """:func:`write_pieces` for several files, ``(name, pieces)`` each, every piece of
    every file started at once; the files take their names only once every byte of all
    of them is written, and a failure removes all of them."""
    with contextlib.ExitStack() as stack:
        jobs: list[tuple[CuFile, Any, int, int]] = []
        shown: list[str] = []
        for name, pieces in files:
            f = stack.enter_context(CuFile._one_shot(name, sync=sync))
            jobs += [(f, buf, nbytes, offset) for buf, nbytes, offset in pieces if nbytes]
            shown += [name] * (len(jobs) - len(shown))
        write_checked(jobs, shown, "the file")


def _task_size(jobs: list[tuple[CuFile, Any, int, int]]) -> int | None:
    """The task size to name for ``jobs`` started at once: the setting's, named (so that
    no piece is cut finer to spread it over the pool: 4 MiB tensors stay 4 MiB writes)
    when the pieces hold at least one task per thread; ``None`` (the engine may spread
    them) for fewer bytes."""
    task = int(cast(int, _lib.get_setting("task_size")))
    threads = int(cast(int, _lib.get_setting("num_threads")))
    return task if sum(job[2] for job in jobs) >= task * threads else None


def write_checked(jobs: list[tuple[CuFile, Any, int, int]], shown: list[str], what: str) -> None:
    """Run ``jobs`` (:func:`_write_all`) into new files, each first allocated up to the end
    of its last piece (one ``fallocate``, not one per piece); ``OSError`` naming the file
    (``shown``, one name per job) and ``what`` was not replaced for a write that wrote
    fewer bytes than asked."""
    ends: dict[CuFile, int] = {}
    for f, _, size, offset in jobs:
        ends[f] = max(ends.get(f, 0), offset + size)
    for f, end in ends.items():
        f._handle.reserve(end)
    written = _write_all(jobs)
    for (_, _, size, offset), name, n in zip(jobs, shown, written, strict=True):
        if n != size:
            raise OSError(
                f"{name}: {n} of {size} bytes were written at offset {offset}; {what} was "
                "not replaced"
            )


def _write_all(jobs: list[tuple[CuFile, Any, int, int]]) -> list[int]:
    """Start every ``(file, buffer, size, file_offset)`` write at once, then wait for them
    all (the first error raised once all have finished); the bytes each wrote."""
    futures: list[IOFuture] = []
    task = _task_size(jobs)
    try:
        for f, buf, size, offset in jobs:
            futures.append(f.pwrite(buf, size, offset, task))
    except BaseException:
        for started in futures:  # leave none running behind the error
            with contextlib.suppress(Exception):  # the error raised is the first one
                started.get()
        raise
    return wait_all(futures)


def _text(value: Any, what: str) -> str:
    """``value`` as a plain ``str`` that UTF-8 encodes; ``TypeError`` for a non-string,
    ``ValueError`` for a string with a lone surrogate (no UTF-8 holds it)."""
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, not {type(value).__name__} {value!r:.80}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise ValueError(
            f"{what} {value!r:.80} has a lone surrogate ({e.reason} at position {e.start}), "
            "which UTF-8, and so a safetensors header, cannot hold"
        ) from None
    return str.__str__(value)  # a str subclass as the plain text it holds


def _metadata(metadata: Any) -> list[tuple[str, str]] | None:
    """``metadata`` as the engine takes it: ``None``, or its ``(key, value)`` strings."""
    if metadata is None:
        return None
    if not isinstance(metadata, Mapping):
        raise TypeError(
            "metadata must be None or a dict of str to str, not "
            f"{type(metadata).__name__}; pass {{'key': 'value'}}"
        )
    pairs = []
    for key, value in metadata.items():
        key = _text(key, "a metadata key")
        if not isinstance(value, str):
            raise TypeError(
                f"metadata[{key!r}] is {type(value).__name__} {value!r:.80}; metadata values "
                "are strings (pass str(value), or json.dumps(value) for structured values)"
            )
        pairs.append((key, _text(value, f"metadata[{key!r}]")))
    return pairs


def _dtype_name(dtype: Any) -> str:
    """A dtype's name as torch and numpy spell it: ``"float32"``, ``"bfloat16"``."""
    text = str(dtype)
    if text.startswith("torch."):
        return text.removeprefix("torch.")
    name = getattr(dtype, "name", None)
    return name if isinstance(name, str) else text


def _unsupported(name: str, shown: str, dtypes: Mapping[str, str]) -> ValueError:
    return ValueError(
        f"tensor {name!r} has dtype {shown}, which safetensors cannot hold; supported: "
        f"{', '.join(dtypes)} (convert it, e.g. with .astype() or .to())"
    )


def _not_contiguous(name: str, torch: bool) -> ValueError:
    fix = "call .contiguous()" if torch else "pass numpy.ascontiguousarray(a) (cupy's for CuPy)"
    return ValueError(
        f"tensor {name!r} is not contiguous: save_file writes each tensor's bytes from the "
        f"memory where they lie, in order; {fix} to save a contiguous copy"
    )


def _describe(key: Any, obj: Any, dtypes: Mapping[str, str]) -> _Tensor:
    """Tensor ``obj`` named ``key`` as a :class:`_Tensor`; ``TypeError`` or
    ``ValueError`` for what cannot be written as it is."""
    name = _text(key, "a tensor name")
    module = type(obj).__module__ or ""
    if module.startswith("torch") and hasattr(obj, "untyped_storage"):
        return _describe_torch(name, obj, dtypes)
    dtype = getattr(obj, "dtype", None)
    shape = getattr(obj, "shape", None)
    if dtype is None or shape is None:
        raise TypeError(
            f"tensor {name!r} is a {type(obj).__name__}; save_file writes arrays: torch "
            "tensors, numpy or CuPy arrays, anything with __dlpack__ or "
            "__cuda_array_interface__ and a dtype and shape"
        )
    dtype_name = _dtype_name(dtype)
    if isinstance(obj, _lib.Buffer) and obj.typestr == BFLOAT16_TYPESTR:
        dtype_name = "bfloat16"  # kvikpy's 2-byte items without ml_dtypes
    code = dtypes.get(dtype_name)
    if code is None or getattr(dtype, "fields", None):
        raise _unsupported(name, dtype_name, dtypes)
    if getattr(dtype, "byteorder", "=") == ">":
        raise ValueError(
            f"tensor {name!r} is big-endian ({dtype.str}); safetensors holds little-endian "
            f"bytes: pass a.astype('{dtype.str.replace('>', '<')}')"
        )
    flags = getattr(obj, "flags", None)
    if flags is not None and not getattr(flags, "c_contiguous", True):
        raise _not_contiguous(name, False)
    address, nbytes, device = _lib.buffer_extent(obj)
    return _Tensor(name, obj, code, tuple(int(d) for d in shape), nbytes, device, address, None)


def _describe_torch(name: str, t: Any, dtypes: Mapping[str, str]) -> _Tensor:
    """torch tensor ``t`` as a :class:`_Tensor`."""
    kind = t.device.type
    if kind == "meta":
        raise ValueError(
            f"tensor {name!r} is on the meta device: it has a shape but no values to save; "
            "materialise the model first (model.to_empty(device=...), then load or "
            "initialise its weights)"
        )
    if kind not in ("cpu", "cuda"):
        raise ValueError(
            f"tensor {name!r} is on {t.device}; save_file writes CPU and CUDA tensors: "
            "move it with .to('cpu') or .to('cuda')"
        )
    if str(t.layout) != "torch.strided":
        raise ValueError(
            f"tensor {name!r} is a {t.layout} tensor; safetensors holds dense tensors: "
            "pass .to_dense()"
        )
    dtype_name = _dtype_name(t.dtype)
    code = dtypes.get(dtype_name)
    if code is None:
        raise _unsupported(name, f"torch.{dtype_name}", dtypes)
    if not t.is_contiguous():
        raise _not_contiguous(name, True)
    for lazy, fix in (("is_conj", "resolve_conj"), ("is_neg", "resolve_neg")):
        if getattr(t, lazy, lambda: False)():
            raise ValueError(
                f"tensor {name!r} is a lazy view ({lazy}() is true): its memory does not "
                f"hold its values; pass .{fix}()"
            )
    # Its bytes, as a flat uint8 view of the same memory, detached from autograd: every
    # dtype then goes through DLPack (torch's export lacks some, float8 among them).
    buf = t.detach().reshape(-1).view(sys.modules["torch"].uint8)
    address, nbytes, device = _lib.buffer_extent(buf)
    return _Tensor(
        name,
        buf,
        code,
        tuple(t.shape),
        nbytes,
        device,
        address,
        t.untyped_storage().data_ptr(),
    )


def _refuse_overlaps(described: list[_Tensor]) -> None:
    """``ValueError`` naming two tensors whose bytes overlap in the memory of one device
    (tied weights, views of one array): a file holds each tensor's own bytes."""
    spans = sorted(
        (-1 if t.device is None else t.device, t.address, t.address + t.nbytes, k)
        for k, t in enumerate(described)
        if t.nbytes
    )
    for a, b in itertools.pairwise(spans):
        if a[0] == b[0] and b[1] < a[2]:
            first, second = described[a[3]], described[b[3]]
            how = (
                "the same torch storage, overlapping bytes"
                if first.storage is not None and first.storage == second.storage
                else "their bytes overlap"
            )
            raise ValueError(
                f"tensors {first.name!r} and {second.name!r} share memory ({how}); a "
                "safetensors file holds each tensor's bytes once: keep one of them (tie "
                "the other to it again after loading), or save a copy (.clone(), .copy())"
            )
