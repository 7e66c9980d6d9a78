"""zarr 3 on the GPU through kvikpy: :class:`GDSStore` and GPU decompression by nvCOMP.

``GDSStore`` is a zarr 3 store of a local directory (a ``zarr.storage.LocalStore``)
whose reads and writes go through kvikpy, batched: the chunks of one array read are read
in one kvikpy batch, into GPU memory under ``zarr.config.enable_gpu()``. Importing this
module also selects kvikpy's codecs for ``zstd``, ``numcodecs.zstd`` and
``numcodecs.lz4`` in zarr's configuration (:func:`register_codecs`): zarr's own codecs,
except that batches of chunks in GPU memory decode on the GPU through nvCOMP (the kvikpy
wheel's ``nvcomp`` extra). :func:`enable_gpu` turns on zarr's GPU mode with batch sizes
that suit them.

Needs zarr 3 (the kvikpy wheel's ``zarr`` extra, or ``pip install 'zarr>=3'``).
``import kvikpy as kvikio`` then runs ``kvikio.zarr.GDSStore`` code.
"""

from __future__ import annotations

import importlib.metadata

_MISSING = (
    "kvikpy.zarr needs zarr 3 (zarr-python >= 3.0.8), which is not installed; "
    "install it with `pip install 'zarr>=3'` (or the kvikpy wheel's zarr extra: "
    '`pip install "<kvikpy wheel>[zarr]"`)'
)

try:
    import zarr
    import zarr.storage
except ImportError as e:
    raise ImportError(_MISSING, name="zarr") from e


def _zarr_major() -> int:
    try:
        version = zarr.__version__
    except AttributeError:  # a broken install
        version = importlib.metadata.version("zarr")
    return int(str(version).split(".", 1)[0])


if _zarr_major() < 3:
    raise ImportError(
        f"kvikpy.zarr needs zarr 3, but zarr {zarr.__version__} is installed; upgrade "
        "with `pip install -U 'zarr>=3'`",
        name="zarr",
    )

from kvikpy.zarr._codecs import (  # noqa: E402
    NumcodecsLZ4,
    NumcodecsZstd,
    ZstdCodec,
    register_codecs,
)
from kvikpy.zarr._config import enable_gpu, nvcomp_available  # noqa: E402
from kvikpy.zarr._store import GDSStore  # noqa: E402

__all__ = [
    "GDSStore",
    "NumcodecsLZ4",
    "NumcodecsZstd",
    "ZstdCodec",
    "enable_gpu",
    "nvcomp_available",
    "register_codecs",
]

register_codecs()
