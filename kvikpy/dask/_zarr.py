"""``from_zarr``: ``dask.array.from_zarr`` over :class:`kvikpy.zarr.GDSStore`."""

from __future__ import annotations

import os
from typing import Any

import dask.array as da
from dask.base import tokenize

from kvikpy.dask import _common


def from_zarr(
    url_or_store: Any,
    component: str | None = None,
    *,
    device: str = "cpu",
    chunks: Any = None,
    name: str | None = None,
    **kwargs: Any,
) -> da.Array:
    """A dask array over a zarr array whose chunks kvikpy reads (:class:`kvikpy.zarr.GDSStore`).

    A thin layer over ``dask.array.from_zarr``: a local directory is opened as a
    read-only ``GDSStore``, so every task's chunk reads go through kvikpy (the chunks one
    task reads, one batch read); ``device="cuda"`` reads them into GPU memory and makes
    CuPy chunks. Plain ``dask.array.from_zarr(zarr.open_array(store=GDSStore(root)))``
    works too, for numpy chunks.

    Parameters
    ----------
    url_or_store
        A local directory holding the zarr store (a path), a zarr store (a ``GDSStore``
        for kvikpy's reads; other stores are used as they are), or an open
        ``zarr.Array``. Remote stores (URLs) are not ``GDSStore``\\ s: use
        ``dask.array.from_zarr`` for those.
    component
        The array's path inside the store (a group's member), if not at its root.
    device
        ``"cpu"`` (numpy chunks) or ``"cuda"`` (CuPy chunks on each worker's current
        GPU, read under zarr's GPU mode; under ``dask_cuda`` each worker's own GPU).
        ``"cuda:N"`` is refused: zarr reads on threads of its own, whose current GPU is
        not the one the task asked for.
    chunks
        Dask's chunks; ``None`` (the default) takes the zarr array's. Dask chunks that
        hold several zarr chunks make tasks that read those chunks in one batch.
    name
        The dask name of the array's chunks (default: derived from the array).
    **kwargs
        Passed to ``zarr.open_array`` (``zarr_format=`` ...).

    Returns
    -------
    dask.array.Array
        numpy chunks for ``device="cpu"``, CuPy chunks otherwise.

    Raises
    ------
    ValueError
        For a URL, an unknown ``device`` or ``"cuda:N"``, or ``component`` with an open
        array.
    ImportError
        Without zarr 3 (the kvikpy wheel's ``zarr`` extra), or CuPy for a GPU ``device``.

    Examples
    --------
    >>> x = kvikpy.dask.from_zarr("data.zarr")                 # numpy chunks
    >>> g = kvikpy.dask.from_zarr("data.zarr", device="cuda")  # CuPy chunks
    """
    import zarr

    from kvikpy import _paths
    from kvikpy.zarr import GDSStore

    device = _common.check_device(device)
    if device.startswith("cuda:"):
        raise ValueError(
            f"from_zarr reads with device='cuda' (each worker's current GPU), not "
            f"device={device!r}: zarr runs its reads on threads of its own, whose current "
            "GPU is the worker's, so a fixed GPU cannot be honoured. Give each worker its "
            "GPU instead (dask_cuda.LocalCUDACluster, or CUDA_VISIBLE_DEVICES per worker)"
        )
    if isinstance(url_or_store, zarr.Array):
        if component is not None or kwargs:
            raise ValueError(
                "component= and zarr.open_array's arguments apply to a store, not to an "
                "array already open; pass the store (or its directory) instead"
            )
        z = url_or_store
    else:
        store = url_or_store
        if isinstance(store, str | bytes | os.PathLike):
            root = _paths.fspath(store)
            if "://" in root:
                raise ValueError(
                    f"{root} is a URL; kvikpy.zarr.GDSStore reads zarr stores in local "
                    "directories. Use dask.array.from_zarr for remote stores"
                )
            store = GDSStore(root, read_only=True)
        kwargs.setdefault("mode", "r")
        z = zarr.open_array(store=store, path=component or "", **kwargs)
    if device == "cpu":
        result: da.Array = da.from_zarr(z, chunks=chunks, name=name)  # type: ignore[no-untyped-call]
        return result
    if name is None:
        name = "from-zarr-" + tokenize(z, chunks, device)
    _common.check_dtype(z.dtype, device)
    meta = _common.meta(device, z.dtype, z.ndim)
    source = GPUZarrArray(z, device)
    result = da.from_array(  # type: ignore[no-untyped-call]
        source,
        chunks=z.chunks if chunks is None else chunks,
        name=name,
        meta=meta,
        asarray=False,
        fancy=False,
    )
    return result


class GPUZarrArray:
    """A zarr array whose ``[...]`` reads under zarr's GPU buffers (CuPy results), on
    ``device``: what ``dask.array.from_array`` slices for :func:`from_zarr`'s GPU chunks.

    Parameters
    ----------
    array
        The zarr array.
    device
        ``"cuda"`` or ``"cuda:N"``.
    """

    def __init__(self, array: Any, device: str) -> None:
        self.array = array
        self.device = device
        self.shape: tuple[int, ...] = tuple(array.shape)
        self.dtype = array.dtype
        self.ndim = len(self.shape)

    def __getitem__(self, selection: Any) -> Any:
        from zarr.core.buffer import gpu

        with _common.cuda_context(self.device):
            return self.array.get_basic_selection(selection, prototype=gpu.buffer_prototype)

    def __dask_tokenize__(self) -> Any:
        return (type(self).__name__, tokenize(self.array), self.device)
