"""Load a safetensors checkpoint into GPU memory in one pass, alone or read once for a
whole ``torch.distributed`` process group.

``kvikpy.safetensors.load_file(path, device="cuda")`` returns the same dict of torch
tensors as ``safetensors.torch.load_file(path, device="cuda")``, but reads every tensor's
bytes with a single parallel kvikpy read into one GPU allocation; each tensor is a view into
it (the allocation lives as long as any of the tensors).
"""

from __future__ import annotations

import itertools
import json
import math
import os
import struct
from collections.abc import Sequence
from typing import Any

from kvikpy import _paths
from kvikpy._api import read
from kvikpy._shared_load import Needs, TensorSpan, read_spans

__all__ = ["load_file", "load_files", "read_header"]

# safetensors dtype -> (torch dtype name, numpy dtype name or None, item size in bytes)
_DTYPES: dict[str, tuple[str, str | None, int]] = {
    "F64": ("float64", "float64", 8),
    "F32": ("float32", "float32", 4),
    "F16": ("float16", "float16", 2),
    "BF16": ("bfloat16", None, 2),
    "I64": ("int64", "int64", 8),
    "I32": ("int32", "int32", 4),
    "I16": ("int16", "int16", 2),
    "I8": ("int8", "int8", 1),
    "U64": ("uint64", "uint64", 8),
    "U32": ("uint32", "uint32", 4),
    "U16": ("uint16", "uint16", 2),
    "U8": ("uint8", "uint8", 1),
    "BOOL": ("bool", "bool", 1),
    "F8_E4M3": ("float8_e4m3fn", None, 1),
    "F8_E5M2": ("float8_e5m2", None, 1),
}

# The format caps the header at 100 MB; anything larger is a corrupt or hostile file.
_MAX_HEADER = 100_000_000


def read_header(path: _paths.StrPath) -> tuple[int, dict[str, Any], dict[str, str]]:
    """Parse and validate a safetensors header.

    Parameters
    ----------
    path
        The ``.safetensors`` file.

    Returns
    -------
    tuple[int, dict, dict]
        ``(data_start, tensors, metadata)``: the byte offset where tensor data begins,
        ``{name: {"dtype", "shape", "data_offsets"}}`` and the ``__metadata__`` strings.

    Raises
    ------
    ValueError
        Naming the file, for anything malformed: a header that is too large or not JSON,
        an unknown dtype, offsets that do not match the shape, overlap, or reach past the
        end of the file.
    """
    name = _paths.fspath(path)
    file_size = os.path.getsize(name)
    with open(name, "rb") as fh:
        prefix = fh.read(8)
        if len(prefix) < 8:
            raise ValueError(f"{name!r} is not a safetensors file: it has only {file_size} bytes")
        (header_size,) = struct.unpack("<Q", prefix)
        if header_size > min(_MAX_HEADER, file_size - 8):
            raise ValueError(
                f"{name!r} is not a valid safetensors file: its header claims {header_size} "
                f"bytes, but the file has {file_size}"
            )
        raw = fh.read(header_size)
    try:
        header = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{name!r}: the safetensors header is not valid JSON ({e})") from None
    if not isinstance(header, dict):
        raise ValueError(f"{name!r}: the safetensors header is not a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    data_start = 8 + header_size
    data_size = file_size - data_start
    spans = []
    for tensor, info in header.items():
        try:
            dtype, shape, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise ValueError(
                f"{name!r}: tensor {tensor!r} lacks dtype, shape or data_offsets"
            ) from None
        if dtype not in _DTYPES:
            raise ValueError(f"{name!r}: tensor {tensor!r} has unknown dtype {dtype!r}")
        if not all(isinstance(d, int) and d >= 0 for d in shape):
            raise ValueError(f"{name!r}: tensor {tensor!r} has invalid shape {shape!r}")
        expected = math.prod(shape) * _DTYPES[dtype][2]
        if not (0 <= begin <= end <= data_size) or end - begin != expected:
            raise ValueError(
                f"{name!r}: tensor {tensor!r} ({dtype}{shape}) claims bytes [{begin}, {end}) "
                f"of a {data_size}-byte data section; it needs {expected} bytes"
            )
        spans.append((begin, end, tensor))
    spans.sort()
    for (_, end_a, a), (begin_b, _, b) in itertools.pairwise(spans):
        if begin_b < end_a:
            raise ValueError(f"{name!r}: tensors {a!r} and {b!r} overlap")
    return data_start, header, metadata


def _spans(
    paths: Sequence[str],
) -> tuple[list[TensorSpan], dict[str, dict[str, Any]], dict[str, int]]:
    """Every tensor of the files, in file order, with its absolute byte span, its header
    entry, and where each file's data section starts; names must be unique across the
    files (as in a sharded checkpoint). Each header is read once, here."""
    spans: list[TensorSpan] = []
    infos: dict[str, dict[str, Any]] = {}
    starts: dict[str, int] = {}
    where: dict[str, str] = {}
    for path in paths:
        data_start, header, _ = read_header(path)
        starts[path] = data_start
        ordered = sorted(header.items(), key=lambda item: item[1]["data_offsets"][0])
        for tensor, info in ordered:
            if tensor in where:
                raise ValueError(
                    f"tensor {tensor!r} is in both {where[tensor]!r} and {path!r}; the "
                    "shards of one checkpoint hold each tensor once"
                )
            where[tensor] = path
            begin, end = info["data_offsets"]
            spans.append(TensorSpan(tensor, path, data_start + begin, end - begin))
            infos[tensor] = info
    return spans, infos, starts


def _typed(flat: Any, info: dict[str, Any]) -> Any:
    """A flat ``torch.uint8`` tensor as the tensor its header describes (a view where the
    bytes are item-aligned, else a copy)."""
    import torch  # type: ignore[import-not-found, unused-ignore]

    torch_name, _, itemsize = _DTYPES[info["dtype"]]
    if flat.storage_offset() % itemsize:
        flat = flat.clone()  # views need item-aligned offsets
    return flat.view(getattr(torch, torch_name)).reshape(info["shape"])


def _wanted(names: Sequence[str], tensor_filter: Needs) -> list[str]:
    """The names a single process returns for ``tensor_filter`` (no process group)."""
    if tensor_filter is None:
        return list(names)
    if callable(tensor_filter):
        return [n for n in names if tensor_filter(n)]
    raise TypeError(
        "without a process_group, tensor_filter must be a callable taking a tensor name "
        f"(a rank-to-names mapping needs process_group=), not {type(tensor_filter).__name__}"
    )


def load_file(
    path: _paths.StrPath | Sequence[_paths.StrPath],
    device: str | int = "cuda",
    *,
    framework: str = "torch",
    process_group: Any = None,
    tensor_filter: Needs = None,
) -> dict[str, Any]:
    """Load the tensors of a safetensors file (or of a checkpoint's shards), in one
    parallel read, or read once for a whole ``torch.distributed`` process group.

    Parameters
    ----------
    path
        The ``.safetensors`` file, or a list of the files of a sharded checkpoint (each
        tensor name in one file only).
    device
        ``"cuda"``, ``"cuda:N"``, ``N`` or ``"cpu"`` (host memory), as for
        :func:`kvikpy.read`. With an NCCL ``process_group``, this rank's GPU (``"cuda"``
        is the current device, which torchrun scripts set with
        ``torch.cuda.set_device(local_rank)``).
    framework
        ``"torch"`` (default) returns torch tensors; ``"numpy"`` returns numpy arrays
        (host memory, one file, no process group; no bfloat16 or float8).
    process_group
        A ``torch.distributed`` process group (``torch.distributed.group.WORLD`` for
        the default one), or ``None`` to read alone. With a group, every rank calls this
        function with the same files; each byte is read from storage by one rank only, and
        the group's all-gather (NCCL over NVLink between GPUs, gloo for ``device="cpu"``)
        gives every rank the tensors it needs. Each rank gets a dict of its own tensors.
    tensor_filter
        Which tensors to return. ``None``: all of them. A callable taking a tensor name
        (on each rank, for that rank: ``lambda name: name.startswith(f"layers.{rank}.")``).
        With a process group, also a mapping from rank to the tensor names that rank needs
        (the same mapping on every rank). A tensor needed by one rank only is read by that
        rank alone; one needed by several is read once and shared.

    Returns
    -------
    dict
        Tensor name to tensor. Read alone, tensors are views into one allocation per
        file; a tensor whose offset is not a multiple of its item size (possible in files
        that mix dtypes without padding) is copied to an aligned allocation instead.

    Raises
    ------
    ValueError
        For a malformed file (see :func:`read_header`), a tensor name in two shards, a
        ``framework`` that cannot do what is asked, or a ``process_group`` without an
        initialised ``torch.distributed``.
    KeyError
        For a ``tensor_filter`` mapping that names a tensor no file holds.

    Examples
    --------
    >>> from kvikpy.safetensors import load_file              # doctest: +SKIP
    >>> state = load_file("model.safetensors", device="cuda")  # doctest: +SKIP
    >>> model.load_state_dict(state)                          # doctest: +SKIP

    Under ``torchrun --nproc-per-node 8``, each GPU gets the whole checkpoint while storage
    is read once:

    >>> dist.init_process_group("nccl")                       # doctest: +SKIP
    >>> torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))  # doctest: +SKIP
    >>> state = load_file(shards, process_group=dist.group.WORLD)  # doctest: +SKIP
    """
    many = not isinstance(path, (str, bytes, os.PathLike))
    if isinstance(path, (str, bytes, os.PathLike)):
        paths = [_paths.fspath(path)]
    else:
        paths = [_paths.fspath(p) for p in path]
        if not paths:
            raise ValueError("load_file needs at least one file; got an empty list")
    if framework in ("numpy", "np"):
        if many or process_group is not None or tensor_filter is not None:
            raise ValueError(
                "framework='numpy' loads one file alone; use framework='torch' for shards, "
                "process_group= or tensor_filter="
            )
        return _load_numpy(paths[0], device)
    if framework not in ("torch", "pt"):
        raise ValueError(f"framework must be 'torch' or 'numpy', got {framework!r}")
    import torch  # type: ignore[import-not-found, unused-ignore]

    spans, infos, starts = _spans(paths)
    if process_group is not None:
        from kvikpy._shared_load import load_shared

        flat = load_shared(spans, tensor_filter, device, process_group)
        return {name: _typed(t, infos[name]) for name, t in flat.items()}
    wanted = _wanted([s.name for s in spans], tensor_filter)
    if len(wanted) < len(spans):
        keep = set(wanted)
        pieces = [(s, 0, s.size) for s in spans if s.name in keep]
        got = read_spans(pieces, device)
        return {
            s.name: _typed(whole[start : start + s.size], infos[s.name])
            for (s, _, _), (whole, start) in zip(pieces, got, strict=True)
        }
    # Every tensor: each file's data section in one parallel read, tensors as views.
    sections = {
        name: torch.from_dlpack(read(name, offset=start, device=device))
        for name, start in starts.items()
    }
    return {
        s.name: _typed(
            sections[s.path][s.offset - starts[s.path] : s.offset - starts[s.path] + s.size],
            infos[s.name],
        )
        for s in spans
    }


def load_files(
    paths: Sequence[_paths.StrPath],
    device: str | int = "cuda",
    *,
    process_group: Any = None,
    tensor_filter: Needs = None,
) -> dict[str, Any]:
    """Load the shards of one checkpoint as one dict of torch tensors.

    The same as :func:`load_file` with a list of paths.

    Parameters
    ----------
    paths
        The shard files (each tensor name in one file only).
    device
        Where the tensors go, as for :func:`load_file`.
    process_group
        A ``torch.distributed`` process group to read the checkpoint once for, or
        ``None`` to read alone (see :func:`load_file`).
    tensor_filter
        Which tensors to return (see :func:`load_file`).

    Examples
    --------
    >>> shards = sorted(glob.glob("model-*-of-*.safetensors"))  # doctest: +SKIP
    >>> state = kvikpy.safetensors.load_files(shards)          # doctest: +SKIP
    """
    if isinstance(paths, (str, bytes, os.PathLike)):
        raise TypeError("load_files takes a list of paths; use load_file for one file")
    return load_file(list(paths), device, process_group=process_group, tensor_filter=tensor_filter)


def _load_numpy(path: str, device: str | int) -> dict[str, Any]:
    import numpy as np

    data_start, header, _ = read_header(path)
    buf = read(path, offset=data_start, device=device)  # the data section, to the end
    if buf.device != "cpu":
        raise ValueError("framework='numpy' loads into host memory; pass device='cpu'")
    whole_np = np.from_dlpack(buf)
    result: dict[str, Any] = {}
    for tensor, info in header.items():
        _, np_name, _ = _DTYPES[info["dtype"]]
        if np_name is None:
            raise ValueError(
                f"tensor {tensor!r} has dtype {info['dtype']}, which numpy lacks; "
                "use framework='torch'"
            )
        begin, end = info["data_offsets"]
        result[tensor] = whole_np[begin:end].view(np_name).reshape(info["shape"])
    return result
