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

import kvikpy._lib as _lib
from kvikpy import cufile_driver, defaults, utils
from kvikpy._api import cuda_available, device_count, read, write
from kvikpy._lib import Buffer, __git_commit__, __version__
from kvikpy._page_cache import (
    clear_page_cache,
    drop_file_page_cache,
    drop_system_page_cache,
    get_page_cache_info,
)
from kvikpy.batch import Batch, SpreadBatch, read_many, read_ranges
from kvikpy.buffer import bounce_buffer_free, memory_deregister, memory_register
from kvikpy.chunks import ChunkIterator, iter_chunks
from kvikpy.cufile import CuFile, IOFuture, IOFutureStream, wait_all
from kvikpy.defaults import CompatMode
from kvikpy.errors import (
    ConfigError,
    CudaError,
    CudaUnavailableError,
    CuFileError,
    InternalError,
    KvikpyError,
    MmapClosedError,
)
from kvikpy.mmap import Mmap
from kvikpy.remote_file import (
    RemoteEndpointType,
    RemoteFile,
    infer_remote_endpoint_type,
    is_remote_file_available,
)
from kvikpy.stream import stream_deregister, stream_register
from kvikpy.utils import kvikio_deprecation_notice

__all__ = [
    "Batch",
    "Buffer",
    "ChunkIterator",
    "CompatMode",
    "ConfigError",
    "CuFile",
    "CuFileError",
    "CudaError",
    "CudaUnavailableError",
    "IOFuture",
    "IOFutureStream",
    "InternalError",
    "KvikpyError",
    "Mmap",
    "MmapClosedError",
    "RemoteEndpointType",
    "RemoteFile",
    "SpreadBatch",
    "__git_commit__",
    "__version__",
    "arrow",
    "bounce_buffer_free",
    "clear_page_cache",
    "cuda_available",
    "cufile_driver",
    "defaults",
    "device_count",
    "drop_file_page_cache",
    "drop_system_page_cache",
    "get_page_cache_info",
    "infer_remote_endpoint_type",
    "info",
    "is_remote_file_available",
    "iter_chunks",
    "kvikio_deprecation_notice",
    "memory_deregister",
    "memory_register",
    "numpy",
    "read",
    "read_many",
    "read_ranges",
    "safetensors",
    "stream_deregister",
    "stream_register",
    "utils",
    "wait_all",
    "write",
]


def info() -> dict[str, Any]:
    """What ``python -m kvikpy info`` prints, as a dict: versions, CUDA and its devices,
    whether GPUDirect Storage (cuFile) is usable and why not, the settings and the
    library's location.

    Returns
    -------
    dict
        See :func:`kvikpy._info.collect_info` for the keys; ``gds`` says which path
        GPU reads take (``gds["usable"]``, ``gds["reason"]``, the libcufile loaded and
        its version, the driver properties).
    """
    from kvikpy._info import collect_info

    return collect_info()


if TYPE_CHECKING:
    from kvikpy import arrow, numpy, safetensors

# Submodules that import numpy load on first use, so `import kvikpy` costs a few
# milliseconds instead of numpy's import time.
_LAZY_SUBMODULES = ("arrow", "numpy", "safetensors")


def __getattr__(name: str) -> Any:
    if name in _LAZY_SUBMODULES:
        return importlib.import_module(f"kvikpy.{name}")
    raise AttributeError(f"module 'kvikpy' has no attribute {name!r}")


def __dir__() -> list[str]:
    """The public API (``__all__``) and the module's dunders: what tab completion and
    ``dir(kvikpy)`` offer, without the helpers this module imports for itself."""
    return sorted({*__all__, *(n for n in globals() if n.startswith("__") and n.endswith("__"))})


# At exit, after the I/O below has finished (atexit runs last-registered first): close
# what kvikpy opened in cuFile (handles of files still open, streams, the driver). A
# no-op where cuFile was never used.
atexit.register(_lib.cufile_shutdown, 30.0)
# I/O threads still finishing an operation at exit may call back into Python (callbacks,
# buffer releases); let them finish before the interpreter is torn down.
atexit.register(_lib.wait_for_io, 30.0)
# Before that wait (registered last, it runs first): cancel remote requests in flight, so
# that a pending read of a server that stalls ends within tens of milliseconds instead of
# holding up exit for its http_timeout.
atexit.register(_lib.cancel_remote_io)
