"""kvikpy: fast file I/O into GPU and host memory, with kvikio's API and a Rust engine.

``import kvikpy as kvikio`` runs kvikio-style code::

    import numpy as np
    import kvikpy as kvikio

    a = np.arange(1_000_000, dtype="float32")
    with kvikio.CuFile("/tmp/data.bin", "w") as f:
        f.write(a)
    b = np.empty_like(a)
    with kvikio.CuFile("/tmp/data.bin", "r") as f:
        fut = f.pread(b)           # non-blocking, split over the thread pool
        assert fut.get() == b.nbytes
"""

from __future__ import annotations

import atexit
import importlib
from typing import TYPE_CHECKING, Any

from kvikpy import _lib, defaults
from kvikpy._api import cuda_available, device_count, read, write
from kvikpy._lib import Buffer, __version__
from kvikpy._lib import bounce_buffer_free as _bounce_buffer_free
from kvikpy.batch import Batch, read_many, read_ranges
from kvikpy.chunks import ChunkIterator, iter_chunks
from kvikpy.cufile import CuFile, IOFuture, IOFutureStream, wait_all
from kvikpy.defaults import CompatMode
from kvikpy.errors import (
    ConfigError,
    CudaError,
    CudaUnavailableError,
    InternalError,
    KvikpyError,
)

__all__ = [
    "Batch",
    "Buffer",
    "ChunkIterator",
    "CompatMode",
    "ConfigError",
    "CuFile",
    "CudaError",
    "CudaUnavailableError",
    "IOFuture",
    "IOFutureStream",
    "InternalError",
    "KvikpyError",
    "__version__",
    "bounce_buffer_free",
    "cuda_available",
    "defaults",
    "device_count",
    "iter_chunks",
    "numpy",
    "read",
    "read_many",
    "read_ranges",
    "safetensors",
    "wait_all",
    "write",
]


def bounce_buffer_free() -> int:
    """Free the idle bounce buffers kvikpy keeps (pinned ones for GPU transfers, aligned
    ones for O_DIRECT).

    Returns the number of bytes released. Buffers in use by running operations are kept
    and return to the (now smaller) pool when those finish.
    """
    return int(_bounce_buffer_free())


if TYPE_CHECKING:
    from kvikpy import numpy, safetensors

# Submodules that import numpy load on first use, so `import kvikpy` costs a few
# milliseconds instead of numpy's import time.
_LAZY_SUBMODULES = ("numpy", "safetensors")


def __getattr__(name: str) -> Any:
    if name in _LAZY_SUBMODULES:
        return importlib.import_module(f"kvikpy.{name}")
    raise AttributeError(f"module 'kvikpy' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The public API (``__all__``) and the module's dunders: what tab completion and
    ``dir(kvikpy)`` offer, without the helpers this module imports for itself."""
    return sorted({*__all__, *(n for n in globals() if n.startswith("__") and n.endswith("__"))})


# I/O threads still finishing an operation at exit may call back into Python (callbacks,
# buffer releases); let them finish before the interpreter is torn down.
atexit.register(_lib.wait_for_io, 30.0)
