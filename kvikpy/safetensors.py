"""Load a safetensors checkpoint into GPU memory in one pass.

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
from typing import Any

from kvikpy import _paths
from kvikpy._api import read

__all__ = ["load_file", "read_header"]

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


def load_file(
    path: _paths.StrPath, device: str | int = "cuda", *, framework: str = "torch"
) -> dict[str, Any]:
    """Load every tensor of a safetensors file, in one parallel read.

    Parameters
    ----------
    path
        The ``.safetensors`` file.
    device
        ``"cuda"``, ``"cuda:N"``, ``N`` or ``"cpu"`` (host memory), as for
        :func:`kvikpy.read`.
    framework
        ``"torch"`` (default) returns torch tensors; ``"numpy"`` returns numpy arrays
        (host memory only; no bfloat16 or float8).

    Returns
    -------
    dict
        Tensor name to tensor, each a view into one allocation holding the data section.
        A tensor whose offset is not a multiple of its item size (possible in files that
        mix dtypes without padding) is copied to an aligned allocation instead.

    Examples
    --------
    >>> from kvikpy.safetensors import load_file              # doctest: +SKIP
    >>> state = load_file("model.safetensors", device="cuda")  # doctest: +SKIP
    >>> model.load_state_dict(state)                          # doctest: +SKIP
    """
    data_start, header, _ = read_header(path)
    buf = read(path, offset=data_start, device=device)  # the data section, to the end
    if framework in ("torch", "pt"):
        import torch  # type: ignore[import-not-found, unused-ignore]

        whole = torch.from_dlpack(buf)
        out: dict[str, Any] = {}
        for tensor, info in header.items():
            torch_name, _, itemsize = _DTYPES[info["dtype"]]
            begin, end = info["data_offsets"]
            part = whole[begin:end]
            if begin % itemsize:
                part = part.clone()  # views need item-aligned offsets
            out[tensor] = part.view(getattr(torch, torch_name)).reshape(info["shape"])
        return out
    if framework in ("numpy", "np"):
        import numpy as np

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
    raise ValueError(f"framework must be 'torch' or 'numpy', got {framework!r}")
