"""Turning the stream objects of CuPy, PyTorch, Numba and CUDA Python into raw handles."""

from __future__ import annotations

from typing import Any


def stream_handle(stream: Any) -> int:
    """The ``CUstream`` value of ``stream`` (an int, or a framework's stream object).

    Accepted: ``None`` or an int (``None``, 0 or 1: the legacy default stream, 2: the
    per-thread default stream), objects with ``__cuda_stream__`` (CUDA Python protocol),
    ``torch.cuda.Stream`` (``.cuda_stream``), ``cupy.cuda.Stream`` (``.ptr``) and Numba
    streams (``.handle``).
    """
    if stream is None:
        return 0
    if isinstance(stream, bool):
        raise TypeError("a stream cannot be a bool")
    if isinstance(stream, int):
        if stream < 0:
            raise ValueError(f"a stream handle cannot be negative, got {stream}")
        return stream
    protocol = getattr(stream, "__cuda_stream__", None)
    if callable(protocol):
        _, handle = protocol()
        return int(handle)
    for attribute in ("cuda_stream", "ptr"):
        value = getattr(stream, attribute, None)
        if isinstance(value, int):
            return value
    handle = getattr(stream, "handle", None)
    if handle is not None:
        return int(getattr(handle, "value", handle) or 0)
    raise TypeError(
        f"expected a CUDA stream (an int handle, torch.cuda.Stream, cupy.cuda.Stream, ...), "
        f"got {type(stream).__name__}"
    )
