"""zarr's GPU mode with batch sizes that suit kvikpy's batched reads and decodes."""

from __future__ import annotations

from typing import Any

import zarr

from kvikpy._nvcomp import nvcomp

# zarr reads an array in mini-batches of `codec_pipeline.batch_size` chunks, up to
# `async.concurrency` mini-batches (and gets within one) at a time. Its defaults (1 and
# 10) hand kvikpy ten chunks per batch read and nvCOMP one chunk per decode. nvCOMP
# decodes each zstd or lz4 chunk (one frame) on its own, so its throughput grows with the
# chunks per call; these give nvCOMP batches of 128 and batch reads of up to a few
# hundred chunks.
BATCH_SIZE = 128
CONCURRENCY = 64


def enable_gpu(*, batch_size: int = BATCH_SIZE, concurrency: int = CONCURRENCY) -> Any:
    """``zarr.config.enable_gpu()`` plus larger batches: reads land in GPU memory (CuPy),
    many chunks are read in one kvikpy batch and decoded in one nvCOMP call.

    Like zarr's, it sets the configuration at once and, used as a context manager,
    restores the previous one on exit.

    Parameters
    ----------
    batch_size
        zarr's ``codec_pipeline.batch_size``: the chunks decoded together (one nvCOMP
        call for zstd and lz4). zarr's default is 1.
    concurrency
        zarr's ``async.concurrency``: how many mini-batches, and how many gets within
        one, run at a time; their product bounds the chunks one kvikpy batch read takes.
        zarr's default is 10.

    Returns
    -------
    donfig.ConfigSet
        zarr's configuration change (a context manager).

    Examples
    --------
    >>> with kvikpy.zarr.enable_gpu():
    ...     a = zarr.open_array(kvikpy.zarr.GDSStore("data.zarr"), mode="r")[:]
    """
    for name, value in (("batch_size", batch_size), ("concurrency", concurrency)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name} must be a positive int, got {value!r}")
    return zarr.config.set(
        {
            "buffer": "zarr.buffer.gpu.Buffer",
            "ndbuffer": "zarr.buffer.gpu.NDBuffer",
            "codec_pipeline.batch_size": batch_size,
            "async.concurrency": concurrency,
        }
    )


def nvcomp_available() -> bool:
    """Whether nvCOMP's Python package (``nvidia-nvcomp-cu13``, the kvikpy
    wheel's ``nvcomp`` extra) can be imported, so zstd and lz4 chunks in GPU memory decode on
    the GPU (without it they decode on the CPU, as zarr's codecs do)."""
    return nvcomp() is not None
