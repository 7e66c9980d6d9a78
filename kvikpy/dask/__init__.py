"""Dask arrays whose chunks kvikpy reads on the workers, into host memory (numpy chunks)
or onto each worker's GPU (CuPy chunks).

* :func:`from_raw`: an array stored raw in one file (a local path or a URL kvikpy reads),
  in C or Fortran order, from an offset. The chunks of a group of neighbouring chunks are
  read by one task with one :func:`kvikpy.read_ranges` call (one allocation, one parallel
  pass); cheap tasks then hand out each chunk, a view of that allocation, on the same
  worker.
* :func:`from_files`: many files each holding one array of the same shape, stacked along
  a new leading axis; a group of files is read by one task with :func:`kvikpy.read_many`.
* :func:`from_zarr`: ``dask.array.from_zarr`` over :class:`kvikpy.zarr.GDSStore`, with
  CuPy chunks for ``device="cuda"``.

Every input is checked when the array is made (the file's size against dtype, shape and
offset; the chunks; the device's spelling), so a mistake raises ``ValueError`` at once,
not from a worker. The graphs hold paths, never open files, and pickle; any dask
scheduler runs them, dask.distributed included (``dask_cuda.LocalCUDACluster`` for one
worker per GPU, where ``device="cuda"`` is each worker's own GPU).

Needs dask and distributed: the kvikpy wheel's ``dask`` extra, or ``pip install
'dask[array]' distributed``.
"""

from __future__ import annotations

_MISSING = (
    "kvikpy.dask needs dask (with dask.array) and distributed, which are not installed; "
    "install them with `pip install 'dask[array]' distributed` "
    '(or the kvikpy wheel\'s dask extra: `pip install "<kvikpy wheel>[dask]"`)'
)

try:
    import dask
    import dask.array
except ImportError as e:
    raise ImportError(_MISSING, name="dask") from e

from kvikpy.dask._files import from_files  # noqa: E402
from kvikpy.dask._raw import from_raw  # noqa: E402
from kvikpy.dask._zarr import from_zarr  # noqa: E402

__all__ = ["from_files", "from_raw", "from_zarr"]

del dask
