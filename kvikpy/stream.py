"""kvikio's ``kvikio.stream``: cuFile's registration of CUDA streams."""

from __future__ import annotations

from kvikpy._gds import stream_deregister, stream_register

__all__ = ["stream_deregister", "stream_register"]
