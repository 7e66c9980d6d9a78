"""Checkpoint bytes straight into tensors that already exist: the checks, the read plan
and the reads behind :func:`kvikpy.safetensors.load_into`.

The core knows two kinds of target: numpy arrays (host memory) and torch tensors (host
or any GPU of the host); everything torch-specific (modules, the meta device, dtype
conversion on the GPU, process groups) is imported only when a torch object is passed.

The plan: every target is described once (where its bytes are, how many, of what dtype
and shape); targets that share their memory (tied weights) are read once; each
checkpoint tensor becomes one ``(file, offset, destination address, length)`` read, and
reads that follow each other both in a file and in memory are merged into one. Reads
into host memory (and a process group's own reads) then run as one scattered read on
kvikpy's pool (``_lib.read_scattered``, the engine's batch request), each straight into
its destination. Reads into GPU tensors run in windows: contiguous stretches of a file of
at most :func:`window_bytes` (half of what the ``checkpoint_staging`` setting leaves the
GPU, see :func:`staging_split`), each read in one parallel read (the path
:func:`kvikpy.safetensors.load_file` takes) into a staging buffer on the device and copied
into the tensors on the GPU, the next window read meanwhile; the GPU holds the model and
at most two staging buffers, and the reads' pinned bounce buffers stay within the rest of
the setting. Nothing the size of the checkpoint is allocated.
"""

from __future__ import annotations

import contextlib
import itertools
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import kvikpy._lib as _lib
from kvikpy._spans import Files, TensorSpan, file_indices

__all__ = ["LoadIntoError", "LoadResult", "Source", "load"]

#: The most bytes of the staging buffer a dtype conversion reads through, per device (and
#: at most the ``checkpoint_staging`` setting): a tensor whose file dtype differs from its
#: target's is read this many bytes at a time and converted into place.
CONVERT_STAGING = 64 << 20

#: Bytes of file between two tensors that a window reads through rather than split at.
STAGING_GAP = 1 << 20

#: The most bytes of each exchange of a process-group load (and at most half the
#: ``checkpoint_staging`` setting): the packed buffers every rank gathers at once hold at
#: most this much (or one tensor, if larger).
SHARED_ROUND = 256 << 20


def staging_bytes() -> int:
    """The ``checkpoint_staging`` setting: the staging memory a load may hold, its bounce
    buffers (pinned and host) and its staging windows on each GPU together."""
    value = _lib.get_setting("checkpoint_staging")
    assert isinstance(value, int)
    return value


def staging_split(gpu: bool = True, host: bool = False) -> tuple[int, int]:
    """How the ``checkpoint_staging`` setting splits for a load into GPU memory (``gpu``),
    host memory (``host``) or both: ``(bounce, device)``. ``bounce`` bounds the bounce
    buffers its reads hold at once (pinned host memory for GPU targets, and the host
    buffers of O_DIRECT reads): half the setting, or less when the reads at the current
    settings (threads, ``task_size``, ``bounce_buffer_size``) would never hold that
    much. ``device`` is the rest, the GPU memory of its staging windows per device."""
    return _lib.staging_split(gpu, host)


def window_bytes(device_part: int | None = None) -> int:
    """Bytes of each window of a load into GPU tensors: the checkpoint is read in
    contiguous windows of at most this many bytes into a staging buffer on the target's
    device, then copied into the tensors on the GPU. Two such buffers per device (one
    filled while the other is emptied) bound the extra GPU memory to ``device_part``,
    the part of the ``checkpoint_staging`` setting its bounce buffers leave (by default
    that of a load into GPU memory, :func:`staging_split`); a tensor larger than a
    window is read straight into its target instead."""
    if device_part is None:
        device_part = staging_split()[1]
    return device_part // 2


# numpy dtype names and torch dtype names, by safetensors dtype code.
_NUMPY = {
    "float64": "F64",
    "float32": "F32",
    "float16": "F16",
    "int64": "I64",
    "int32": "I32",
    "int16": "I16",
    "int8": "I8",
    "uint64": "U64",
    "uint32": "U32",
    "uint16": "U16",
    "uint8": "U8",
    "bool": "BOOL",
}
_TORCH = {
    **_NUMPY,
    "bfloat16": "BF16",
    "float8_e4m3fn": "F8_E4M3",
    "float8_e5m2": "F8_E5M2",
}


class LoadIntoError(ValueError, RuntimeError):
    """A checkpoint that does not fit its target (missing or unexpected names, a shape or
    dtype that differs, a target that is not contiguous), or a load that failed part way.

    A ``ValueError`` (bad input) and a ``RuntimeError`` (what
    ``torch.nn.Module.load_state_dict`` raises for the same mismatches), with the same
    message layout as torch's.

    Parameters
    ----------
    message
        What was asked, what was found, what to do.
    missing_keys
        Target names the checkpoint lacks (as in torch's report).
    unexpected_keys
        Checkpoint names the target lacks (as in torch's report).
    written
        The target names whose bytes were all written before a failure; empty when the
        checkpoint was refused before any byte was read (the target is untouched).
    """

    def __init__(
        self,
        message: str,
        missing_keys: Sequence[str] = (),
        unexpected_keys: Sequence[str] = (),
        written: Sequence[str] = (),
    ) -> None:
        super().__init__(message)
        self.missing_keys = list(missing_keys)
        self.unexpected_keys = list(unexpected_keys)
        self.written = list(written)


class LoadResult(NamedTuple):
    """What :func:`kvikpy.safetensors.load_into` did not match, as torch's
    ``load_state_dict`` reports it: target names the checkpoint lacks, and checkpoint
    names the target lacks."""

    missing_keys: list[str]
    unexpected_keys: list[str]


@dataclass(frozen=True)
class Source:
    """One checkpoint tensor: where its bytes are, and what they are."""

    span: TensorSpan
    dtype: str  # safetensors code
    shape: tuple[int, ...]
    itemsize: int


@dataclass
class _Target:
    """One target tensor, described once."""

    name: str
    obj: Any  # the numpy array or torch tensor
    torch: bool
    device: int | None  # CUDA ordinal, None for host memory, -1 for the meta device
    ptr: int
    nbytes: int
    dtype: str | None  # safetensors code; None for a dtype the format lacks
    dtype_shown: str
    shape: tuple[int, ...]
    contiguous: bool
    writable: bool
    block: int = 0  # GPU: the allocation the memory belongs to (reads never span two)
    aliases: list[str] = field(default_factory=list)  # other names of the same memory


def _describe(name: str, obj: Any) -> _Target:
    """``obj`` as a :class:`_Target`; ``TypeError`` for what is neither a numpy array
    nor a torch tensor."""
    module = type(obj).__module__ or ""
    if module.startswith("torch"):
        kind = obj.device.type
        if kind == "meta":
            device: int | None = -1
        elif kind == "cuda":
            device = obj.device.index if obj.device.index is not None else 0
        elif kind == "cpu":
            device = None
        else:
            raise TypeError(
                f"target {name!r} is a torch tensor on {obj.device}; load_into writes into "
                "CPU or CUDA tensors (or meta tensors of a module it materialises)"
            )
        dtype_shown = str(obj.dtype).removeprefix("torch.")
        return _Target(
            name,
            obj,
            True,
            device,
            0 if device == -1 else obj.data_ptr(),
            obj.numel() * obj.element_size(),
            _TORCH.get(dtype_shown),
            dtype_shown,
            tuple(obj.shape),
            obj.is_contiguous(),
            True,
            obj.untyped_storage().data_ptr() if device not in (None, -1) else 0,
        )
    import numpy as np

    if not isinstance(obj, np.ndarray):
        raise TypeError(
            f"target {name!r} is a {type(obj).__name__}; load_into writes into torch "
            "tensors or numpy arrays"
        )
    return _Target(
        name,
        obj,
        False,
        None,
        obj.__array_interface__["data"][0],
        obj.nbytes,
        _NUMPY.get(obj.dtype.name),
        obj.dtype.name,
        tuple(obj.shape),
        obj.flags.c_contiguous,
        obj.flags.writeable,
    )


def _shape_shown(t: _Target | Source) -> str:
    shape = list(t.shape)
    if isinstance(t, _Target) and t.torch:
        return f"torch.Size({shape})"
    return f"({', '.join(map(str, shape))}{',' if len(shape) == 1 else ''})"


def _targets(target: Any) -> tuple[dict[str, Any], Any]:
    """The name -> tensor mapping of ``target`` and the module it came from (or None)."""
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(target, torch.nn.Module):
        return dict(target.state_dict(keep_vars=True)), target
    if isinstance(target, Mapping):
        for key in target:
            if not isinstance(key, str):
                raise TypeError(f"target names must be strings, got {type(key).__name__} {key!r}")
        return dict(target), None
    raise TypeError(
        "load_into's target must be a torch.nn.Module or a mapping of names to torch "
        f"tensors or numpy arrays, not {type(target).__name__}"
    )


def _check(
    sources: dict[str, Source],
    targets: dict[str, _Target],
    strict: bool,
    convert: bool,
    what: str,
) -> tuple[list[str], list[str], list[str]]:
    """Match checkpoint names to target names; raise :class:`LoadIntoError` for what
    torch's ``load_state_dict`` refuses. Returns (names to read, missing, unexpected)."""
    # Tied weights: one name per distinct memory reads, the others are aliases; an alias
    # the checkpoint lacks is filled through the name it has.
    by_memory: dict[tuple[int | None, int, int], str] = {}
    for name, t in targets.items():
        key: tuple[int | None, int, int]
        if t.device == -1:  # meta: tied means the same tensor object
            key = (t.device, id(t.obj), t.nbytes)
        elif t.nbytes == 0:  # no memory to share
            key = (t.device, 0, -1 - len(by_memory))
        else:
            key = (t.device, t.ptr, t.nbytes)
        first = by_memory.setdefault(key, name)
        if first != name:
            targets[first].aliases.append(name)
            t.aliases.append(first)
    unexpected = [n for n in sources if n not in targets]
    missing = [
        n
        for n, t in targets.items()
        if n not in sources and not any(a in sources for a in t.aliases)
    ]
    problems: list[str] = []
    if strict:  # torch's order: missing, then unexpected, then the rest
        if missing:
            problems.append(
                "Missing key(s) in state_dict: " + ", ".join(f'"{n}"' for n in missing) + ". "
            )
        if unexpected:
            problems.append(
                "Unexpected key(s) in state_dict: " + ", ".join(f'"{n}"' for n in unexpected) + ". "
            )
    read: list[str] = []
    done: set[str] = set()
    for name, s in sources.items():
        if name not in targets:
            continue
        t = targets[name]
        if t.shape != s.shape:
            problems.append(
                f"size mismatch for {name}: copying a param with shape {_shape_shown(s)} "
                f"from checkpoint, the shape in current model is {_shape_shown(t)}."
            )
            continue
        if t.dtype != s.dtype and not convert:
            problems.append(
                f"dtype mismatch for {name}: the checkpoint holds {s.dtype}, the target "
                f"is {t.dtype_shown}; pass convert_dtype=True to convert while loading."
            )
            continue
        if t.dtype is None:
            problems.append(f"dtype of {name}: {t.dtype_shown} is not a safetensors dtype.")
            continue
        if not t.contiguous:
            problems.append(
                f"{name} is not contiguous: load_into writes a tensor's bytes in place "
                "(make it contiguous first)."
            )
            continue
        if not t.writable:
            problems.append(f"{name} is read-only.")
            continue
        if any(a in done for a in t.aliases):
            continue  # tied: the same memory is already read through another name
        done.add(name)
        read.append(name)
    # Distinct targets whose memory overlaps (views that are not the same tensor) would
    # be written twice, in an order no one chose.
    spans = sorted(
        (-2 if t.device is None else t.device, t.ptr, t.nbytes, n)
        for n in read
        for t in [targets[n]]
        if t.nbytes and t.device != -1
    )
    for a, b in itertools.pairwise(spans):
        if a[0] == b[0] and b[1] < a[1] + a[2]:
            problems.append(
                f"{a[3]} and {b[3]} overlap in memory without being the same tensor: "
                "loading both would write the same bytes twice."
            )
    if problems:
        raise LoadIntoError(
            f"Error(s) in loading state_dict for {what}:\n\t" + "\n\t".join(problems),
            missing,
            unexpected,
        )
    return read, missing, unexpected


@dataclass(frozen=True)
class _Read:
    """One read: ``length`` bytes of ``path`` at ``offset`` to address ``ptr`` on
    ``device``; ``names`` are the targets it fills, ``owners`` the objects whose memory
    it writes (held until the read has stopped)."""

    path: str
    offset: int
    device: int | None
    ptr: int
    length: int
    names: tuple[str, ...]
    block: int = 0  # reads into GPU memory merge only within one allocation
    owners: tuple[Any, ...] = field(default=(), compare=False, repr=False)


def _merged(reads: Sequence[_Read]) -> list[_Read]:
    """``reads`` with each run of reads that follow each other both in one file and in
    one device's memory made one read (sorted by file and offset first); in GPU memory
    only within one allocation (two tensors that merely sit side by side stay two
    reads). The engine's merge plans it; a read that merges with none is returned as is.

    Raises ``ValueError`` for an offset or address plus length past 2**64.
    """
    _, index = file_indices(r.path for r in reads)
    memories: dict[tuple[int | None, int], int] = {}  # (device, allocation) -> its key
    runs = _lib.safetensors_merge(
        [
            (
                index[r.path],
                r.offset,
                r.length,
                memories.setdefault((r.device, r.block), len(memories)),
                r.ptr,
            )
            for r in reads
        ],
        True,
    )
    out: list[_Read] = []
    for _, offset, length, _, ptr, members in runs:
        first = reads[members[0]]
        if len(members) == 1:
            out.append(first)
            continue
        group = [reads[i] for i in members]
        out.append(
            _Read(
                first.path,
                offset,
                first.device,
                ptr,
                length,
                tuple(n for r in group for n in r.names),
                first.block,
                tuple(o for r in group for o in r.owners),
            )
        )
    return out


@dataclass(frozen=True)
class _Window:
    """One read of a load into GPU tensors: ``length`` bytes of ``path`` at ``offset``,
    holding ``reads`` (in file order); read into a staging buffer and copied out, or,
    when ``alone``, straight into the memory of its one read (larger than the bound)."""

    path: str
    offset: int
    length: int
    reads: tuple[_Read, ...]
    alone: bool = False


def _windows(reads: Sequence[_Read], bound: int, gap: int) -> list[_Window]:
    """The windows that read ``reads``, in file order (by file, then offset): each covers
    consecutive reads of one file, reading through gaps of fewer than ``gap`` bytes
    between them, and spans at most ``bound`` bytes; a read longer than ``bound`` is a
    window of its own (``alone``). Every read is in exactly one window. The engine plans
    them.

    Raises ``ValueError`` for an offset plus length past 2**64.
    """
    files, index = file_indices(r.path for r in reads)
    planned = _lib.safetensors_windows(
        [(index[r.path], r.offset, r.length) for r in reads], bound, gap
    )
    return [
        _Window(files[f], offset, length, tuple(reads[i] for i in members), alone)
        for f, offset, length, alone, members in planned
    ]


def _bytes_of(t: _Target) -> Any:
    """The memory of the torch tensor ``t`` as a flat ``uint8`` tensor (a view)."""
    import torch  # type: ignore[import-not-found, unused-ignore]

    return t.obj.detach().reshape(-1).view(torch.uint8)


def _read_staged(
    reads: Sequence[_Read], targets: Mapping[str, _Target], files: Files, device_part: int
) -> list[str]:
    """Read ``reads`` (into torch tensors on GPUs, one name each) in windows (see
    :func:`window_bytes`; ``device_part`` is the GPU staging the load's bounce buffers
    leave): each window in one read into a staging buffer on its device, then
    copied into its tensors on the device's current stream, the next window read into
    the other buffer meanwhile (a read into a torch tensor waits for the work queued
    before it on that stream, so a buffer is refilled only once the copies out of it
    have run). Waits for the copies, then returns the names written; raises
    :class:`LoadIntoError` naming what was written if a read fails (a window's tensors
    are all written or none)."""
    if not reads:
        return []
    import torch

    from kvikpy.cufile import IOFuture

    by_device: dict[int, list[_Read]] = {}
    for r in reads:
        by_device.setdefault(r.device or 0, []).append(r)
    everything = [n for r in reads for n in r.names]
    written: list[str] = []
    for device, group in sorted(by_device.items()):
        windows = _windows(group, window_bytes(device_part), STAGING_GAP)
        staged = [w.length for w in windows if not w.alone]
        buffers = [
            torch.empty(max(staged), dtype=torch.uint8, device=f"cuda:{device}")
            for _ in range(min(2, len(staged)))
        ]
        running: list[tuple[_Window, Any, IOFuture]] = []
        turn = 0
        for k in range(len(windows) + 1):
            # Start window k (queued after the copies out of its buffer), then copy
            # window k - 1 out once its read is done: two reads in flight.
            if k < len(windows):
                w = windows[k]
                if w.alone:
                    dest = _bytes_of(targets[w.reads[0].names[0]])
                else:
                    dest = buffers[turn % len(buffers)][: w.length]
                    turn += 1
                running.append((w, dest, files.open(w.path).pread(dest, w.length, w.offset)))
            if not running or (len(running) < 2 and k < len(windows)):
                continue
            w, dest, future = running.pop(0)
            try:
                got = future.get()
                if got != w.length:
                    raise OSError(
                        f"{w.path} ended after {got} of the {w.length} bytes at offset "
                        f"{w.offset} (cut since its header was read?)"
                    )
            except Exception as e:
                for _, _, other in running:  # let the other read stop first
                    with contextlib.suppress(Exception):
                        other.get()
                _staged_failed(device, e, written, everything)
            if not w.alone:
                with torch.no_grad():
                    for r in w.reads:
                        at = r.offset - w.offset
                        _bytes_of(targets[r.names[0]]).copy_(dest[at : at + r.length])
            written.extend(n for r in w.reads for n in r.names)
        torch.cuda.current_stream(device).synchronize()
        del buffers
    return written


def _staged_failed(
    device: int, error: Exception, written: list[str], everything: list[str]
) -> None:
    """Raise :class:`LoadIntoError` for a window read that failed with ``error``."""
    import torch

    torch.cuda.current_stream(device).synchronize()  # the copies already queued land
    done = set(written)
    raise _read_failed(error, written, sorted(n for n in everything if n not in done)) from error


def _read_failed(error: BaseException, written: list[str], failed: list[str]) -> LoadIntoError:
    """The :class:`LoadIntoError` of a load whose reads failed with ``error`` (the first
    failure): which tensors were written and which were not, or only in part."""
    return LoadIntoError(
        f"reading the checkpoint into its target failed ({error}); "
        f"{len(written)} tensor(s) were written, {len(failed)} were not or only in "
        f"part: {', '.join(failed[:20])}{' ...' if len(failed) > 20 else ''}",
        written=written,
    )


def _address(buf: Any) -> tuple[int, int | None]:
    """The address of ``buf`` (a torch tensor or numpy array) and its CUDA device (None
    for host memory)."""
    module = type(buf).__module__ or ""
    if module.startswith("torch"):
        return buf.data_ptr(), (buf.device.index or 0) if buf.device.type == "cuda" else None
    return buf.__array_interface__["data"][0], None


def _run(
    reads: Sequence[_Read], files: Files, dest: Callable[[_Read], Any] | None = None
) -> list[str]:
    """Run ``reads`` as one scattered read on kvikpy's pool, each straight into its memory
    (or into ``dest(read)``; GPU memory through kvikpy's bounded pinned staging); wait for
    all, then raise :class:`LoadIntoError` naming what was written if any failed. Returns
    the names written."""
    paths: dict[str, int] = {}
    items: list[tuple[int, int, int, int, int | None]] = []
    owners: list[Any] = []
    for r in reads:
        f = paths.setdefault(r.path, len(paths))
        if dest is not None:
            buf = dest(r)
            owners.append(buf)
            ptr, device = _address(buf)
        else:
            owners.append(r.owners)
            ptr, device = r.ptr, r.device
        items.append((f, r.offset, r.length, ptr, device))
    handles = [files.handle(p) for p in paths]
    failures = _lib.read_scattered(handles, items, owners) if items else []
    if failures:
        failed_at = {i for i, _ in failures}
        written = [n for i, r in enumerate(reads) if i not in failed_at for n in r.names]
        failed = sorted({n for i, _ in failures for n in reads[i].names})
        first = failures[0][1]
        raise _read_failed(first, written, failed) from first
    return [n for r in reads for n in r.names]


def _chunks(total: int, step: int) -> Iterator[tuple[int, int]]:
    at = 0
    while at < total:
        yield at, min(step, total - at)
        at += step


def _fixed(buf: Any) -> Callable[[_Read], Any]:
    """A destination function that always answers ``buf``."""
    return lambda _r: buf


def _convert(
    jobs: Sequence[tuple[Source, _Target]],
    dtypes: Mapping[str, tuple[str, str | None, int]],
    files: Files,
    device_part: int,
) -> list[str]:
    """Read each ``(source, target)`` of differing dtypes through a bounded staging buffer
    per device (on a GPU within ``device_part``, the GPU staging the load's bounce buffers
    leave; in host memory within the ``checkpoint_staging`` setting) and convert into the
    target in place."""
    staging: dict[int | None, Any] = {}
    written: list[str] = []
    largest = max((s.span.size for s, _ in jobs), default=0)
    host_part = staging_bytes()
    for s, t in jobs:
        torch_name, np_name, itemsize = dtypes[s.dtype]
        buf = staging.get(t.device)
        bound = host_part if t.device is None else device_part
        size = max(min(CONVERT_STAGING, bound, largest), itemsize)
        if buf is None:
            if t.torch:
                import torch  # type: ignore[import-not-found, unused-ignore]

                where = "cpu" if t.device is None else f"cuda:{t.device}"
                buf = torch.empty(size, dtype=torch.uint8, device=where)
            else:
                import numpy as np

                buf = np.empty(size, dtype=np.uint8)
            staging[t.device] = buf
        step = len(buf) // itemsize * itemsize
        if t.torch:
            import torch

            flat = t.obj.detach().view(-1)
            dtype = getattr(torch, torch_name)
        else:
            if np_name is None:
                raise LoadIntoError(f"{t.name}: numpy has no {s.dtype} to convert from")
            flat = t.obj.reshape(-1)
            dtype = np_name
        for at, n in _chunks(s.span.size, step):
            part = buf[:n]
            _run(
                [_Read(s.span.path, s.span.offset + at, t.device, 0, n, (t.name,))],
                files,
                _fixed(part),
            )
            first = at // itemsize
            if t.torch:
                import torch

                with torch.no_grad():
                    flat[first : first + n // itemsize].copy_(part.view(dtype))
                if t.device is not None:  # the staging is refilled next: copy first
                    torch.cuda.synchronize(t.device)
            else:
                flat[first : first + n // itemsize] = part.view(dtype)
        written.append(t.name)
    return written


def _materialise(module: Any, device: Any) -> None:
    """Every meta parameter and buffer of ``module`` as uninitialised memory on
    ``device`` (and every other one moved there), keeping tied tensors tied."""
    import torch

    done: dict[int, tuple[Any, Any]] = {}  # id(old) -> (old, new); old kept alive
    for sub in module.modules():
        for table in (sub._parameters, sub._buffers):
            for key, value in table.items():
                if value is None:
                    continue
                seen = done.get(id(value))
                new = seen[1] if seen is not None else None
                if new is None:
                    if value.device.type == "meta":
                        data = torch.empty_like(value, device=device)
                    else:
                        data = value.detach().to(device)
                    if isinstance(value, torch.nn.Parameter):
                        new = torch.nn.Parameter(data, requires_grad=value.requires_grad)
                    else:
                        new = data
                    done[id(value)] = (value, new)
                table[key] = new


def _meta_buffers_left(module: Any, names: set[str]) -> list[str]:
    """Buffers on the meta device that are not in the state dict (non-persistent), or
    meta tensors the checkpoint does not fill: their values cannot come from it."""
    out = []
    for prefix, sub in module.named_modules():
        for key, value in sub._buffers.items():
            full = f"{prefix}.{key}" if prefix else key
            if value is not None and value.device.type == "meta" and full not in names:
                out.append(full)
    return out


def _unfilled_error(unfilled: list[str], why: str = "") -> LoadIntoError:
    return LoadIntoError(
        "these buffers are on the meta device and the checkpoint has no values for them "
        f"(non-persistent buffers): {', '.join(unfilled)}{why}; build the model under "
        "accelerate.init_empty_weights(), which keeps buffers real, or create them on a "
        "real device"
    )


def _owner(module: Any, name: str) -> tuple[Any, str]:
    """The submodule of ``module`` that holds buffer ``name``, and the buffer's own name."""
    path, _, key = name.rpartition(".")
    return (module.get_submodule(path) if path else module), key


def _recomputable(module: Any, unfilled: list[str]) -> bool:
    """Whether ``module`` can compute the buffers ``unfilled`` itself, as transformers
    does after building a model on the meta device: a transformers model (it has
    ``_init_weights``, which recomputes non-persistent buffers such as a rotary
    embedding's from the config) and buffers of floating dtypes (whose every value
    :func:`_recompute` can check was written)."""
    if not callable(getattr(module, "_init_weights", None)):
        return False
    for name in unfilled:
        sub, key = _owner(module, name)
        if not sub._buffers[key].dtype.is_floating_point:
            return False
    return True


def _recompute(module: Any, unfilled: list[str]) -> None:
    """Fill the materialised buffers ``unfilled`` with NaN, let the model's own
    ``_init_weights`` compute them (before the checkpoint is read, so the checkpoint's
    values win for anything else it initialises), and check that every value was
    written; ``LoadIntoError`` if not, the model then back on the meta device."""
    import torch

    owners: dict[int, Any] = {}
    with torch.no_grad():
        for name in unfilled:
            sub, key = _owner(module, name)
            sub._buffers[key].fill_(float("nan"))
            owners[id(sub)] = sub
        for sub in owners.values():
            module._init_weights(sub)
    left = [n for n in unfilled if bool(torch.isnan(_buffer(module, n)).any())]
    if left:
        module.to_empty(device="meta")
        raise _unfilled_error(left, ", which its _init_weights does not compute")


def _buffer(module: Any, name: str) -> Any:
    sub, key = _owner(module, name)
    return sub._buffers[key]


def load(
    target: Any,
    sources: Sequence[Source],
    dtypes: Mapping[str, tuple[str, str | None, int]],
    files: Files,
    *,
    strict: bool,
    convert: bool,
    device: Any,
    process_group: Any,
    rename: Callable[[str], str] | None = None,
) -> LoadResult:
    """The body of :func:`kvikpy.safetensors.load_into` (see there), on validated
    checkpoint tensors ``sources`` of ``files`` (read through the handles their headers
    were read through); ``rename`` maps checkpoint names to target names."""
    if not isinstance(strict, bool):
        raise TypeError(f"strict must be True or False, not {type(strict).__name__}")
    if not isinstance(convert, bool):
        raise TypeError(f"convert_dtype must be True or False, not {type(convert).__name__}")
    tensors, module = _targets(target)
    what = type(module).__name__ if module is not None else "the target mapping"
    by_name: dict[str, Source] = {}
    for s in sources:
        name = rename(s.span.name) if rename is not None else s.span.name
        if name in by_name:
            raise LoadIntoError(
                f"checkpoint tensors {by_name[name].span.name!r} and {s.span.name!r} both "
                f"load into {name!r}"
            )
        by_name[name] = s
    try:
        described = {name: _describe(name, obj) for name, obj in tensors.items()}
        read, missing, unexpected = _check(by_name, described, strict, convert, what)
        metas = [n for n, t in described.items() if t.device == -1]
        unfilled: list[str] = []
        if metas:
            if module is None:
                raise LoadIntoError(
                    f"target {metas[0]!r} is on the meta device; pass the module itself so "
                    "load_into can materialise it"
                )
            unfilled = _meta_buffers_left(module, set(by_name))
            if unfilled and not _recomputable(module, unfilled):
                raise _unfilled_error(unfilled)
    except (LoadIntoError, TypeError, ValueError):
        if process_group is not None:  # the other ranks must not wait for this one
            from kvikpy._read_once import exchange_status

            exchange_status(process_group, None)
        raise
    if metas:
        _materialise(module, _torch_device(device))
        if unfilled:
            _recompute(module, unfilled)
        tensors, _ = _targets(module)
        described = {name: _describe(name, obj) for name, obj in tensors.items()}
        read, missing, unexpected = _check(by_name, described, strict, convert, what)
    direct = [n for n in read if described[n].dtype == by_name[n].dtype]
    converted = [n for n in read if described[n].dtype != by_name[n].dtype]
    _synchronize(described[n] for n in read)
    # One staging budget for the load's bounce buffers; GPU staging gets the rest.
    _, device_part = files.stage(
        gpu=any(described[n].device is not None for n in read),
        host=any(described[n].device is None for n in read),
    )

    def read_alone(names: Sequence[str]) -> None:
        reads = [
            _Read(s.span.path, s.span.offset, t.device, t.ptr, s.span.size, (n,), t.block, (t.obj,))
            for n in names
            for s, t in [(by_name[n], described[n])]
            if s.span.size
        ]
        _run(_merged(reads), files)

    if process_group is not None:
        from kvikpy._read_once import exchange_status, load_shared_into

        needs = exchange_status(process_group, [by_name[n].span.name for n in direct])
        if any(n is None for n in needs):
            bad = [r for r, n in enumerate(needs) if n is None]
            raise LoadIntoError(
                f"rank(s) {bad} of the process group refused the checkpoint (see their "
                "errors); no rank read it"
            )
        spans = {s.span.name: name for name, s in by_name.items()}
        load_shared_into(
            [s.span for s in sources],
            {by_name[n].span.name: described[n].obj for n in direct},
            needs,
            process_group,
            None if device is None else _torch_device(device),
            lambda alone: read_alone([spans[t.name] for t in alone]),
            min(SHARED_ROUND, device_part // 2),
            files,
        )
    else:
        staged = {n for n in direct if described[n].torch and described[n].device is not None}
        read_alone([n for n in direct if n not in staged])
        _read_staged(
            [
                _Read(s.span.path, s.span.offset, t.device, t.ptr, s.span.size, (n,), t.block)
                for n in direct
                if n in staged
                for s, t in [(by_name[n], described[n])]
                if s.span.size
            ],
            described,
            files,
            device_part,
        )
    if converted:
        _convert([(by_name[n], described[n]) for n in converted], dtypes, files, device_part)
    return LoadResult(missing, unexpected)


def _synchronize(targets: Iterator[_Target]) -> None:
    """Wait for each GPU's pending work on the targets (their allocation, a
    materialisation) before kvikpy writes into them."""
    devices = {t.device for t in targets if t.torch and t.device is not None}
    if devices:
        import torch

        for d in devices:
            torch.cuda.synchronize(d)


def _torch_device(device: Any) -> Any:
    """Where a meta module goes: ``device`` as torch names it (default the current
    CUDA device)."""
    import torch

    if device is None:
        return torch.device("cuda", torch.cuda.current_device())
    if isinstance(device, int) and not isinstance(device, bool):
        return torch.device("cuda", device)
    return torch.device(device)
