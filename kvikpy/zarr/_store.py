"""``GDSStore``: zarr's ``LocalStore`` with its chunk reads and writes done by kvikpy."""

from __future__ import annotations

import asyncio
import os
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from zarr.abc.store import ByteRequest
from zarr.core.buffer import Buffer, BufferPrototype
from zarr.core.buffer.core import default_buffer_prototype
from zarr.storage import LocalStore

import kvikpy
from kvikpy.zarr import _reads


class GDSStore(LocalStore):
    """A zarr 3 store of a local directory whose reads and writes go through kvikpy.

    Keys, listing, metadata and deletion behave as in ``zarr.storage.LocalStore`` (this is
    a subclass); what changes is how bytes move:

    * ``get`` reads into the buffer type zarr asks for: GPU memory (CuPy) under
      ``zarr.config.enable_gpu()``, host memory otherwise, with no intermediate copy.
    * The gets zarr starts together (the chunks of one array read) and
      ``get_partial_values`` are gathered into one kvikpy batch read: one pass on
      kvikpy's thread pool, one allocation, and for GPU memory a few large DMAs instead
      of one read and one transfer per chunk.
    * Byte ranges (``RangeByteRequest``, ``OffsetByteRequest``, ``SuffixByteRequest``)
      behave as in ``LocalStore``: cut at the end of the file.
    * ``set`` writes host or GPU buffers with kvikpy (GPU data goes to the file without
      a copy through Python), to a temporary file that then replaces the key, as
      ``LocalStore`` does, so readers never see half a chunk.

    ``kvikio.zarr.GDSStore`` code runs unchanged with ``import kvikpy as kvikio``.

    Parameters
    ----------
    root
        The directory holding the store.
    read_only
        Whether writes and deletes are refused.

    Examples
    --------
    >>> import zarr, cupy, kvikpy.zarr
    >>> store = kvikpy.zarr.GDSStore("data.zarr", read_only=True)
    >>> with zarr.config.enable_gpu():
    ...     a = zarr.open_array(store, mode="r")[:]   # a CuPy array
    """

    def __repr__(self) -> str:
        return f"GDSStore('{self}')"

    async def get(
        self,
        key: str,
        prototype: BufferPrototype | None = None,
        byte_range: ByteRequest | None = None,
    ) -> Buffer | None:
        # docstring inherited
        if prototype is None:
            prototype = default_buffer_prototype()
        if not self._is_open:
            await self._open()
        r = _reads.request(self.root / key, prototype, byte_range)
        return await _reads.gatherer().submit(r)

    async def get_partial_values(
        self,
        prototype: BufferPrototype,
        key_ranges: Iterable[tuple[str, ByteRequest | None]],
    ) -> list[Buffer | None]:
        # docstring inherited
        if not self._is_open:
            await self._open()
        requests = [_reads.request(self.root / key, prototype, br) for key, br in key_ranges]
        if not requests:
            return []
        results = await asyncio.to_thread(_reads.read_requests, requests)
        return [_raise_error(r) for r in results]

    def get_sync(
        self,
        key: str,
        *,
        prototype: BufferPrototype | None = None,
        byte_range: ByteRequest | None = None,
    ) -> Buffer | None:
        # docstring inherited
        if prototype is None:
            prototype = default_buffer_prototype()
        self._ensure_open_sync()
        r = _reads.request(self.root / key, prototype, byte_range)
        return _raise_error(_reads.read_requests([r])[0])

    async def getsize(self, key: str) -> int:
        # docstring inherited: the file's size, without reading it
        return (await asyncio.to_thread(os.stat, self.root / key)).st_size

    async def _set(self, key: str, value: Buffer, exclusive: bool = False) -> None:
        if not self._is_open:
            await self._open()
        self._check_writable()
        _check_buffer(value)
        await asyncio.to_thread(_put, self.root / key, value, exclusive)

    def set_sync(self, key: str, value: Buffer) -> None:
        # docstring inherited
        self._ensure_open_sync()
        self._check_writable()
        _check_buffer(value)
        _put(self.root / key, value, False)


def _raise_error(result: Buffer | BaseException | None) -> Buffer | None:
    if isinstance(result, BaseException):
        raise result
    return result


def _check_buffer(value: Any) -> None:
    if not isinstance(value, Buffer):
        raise TypeError(
            f"GDSStore.set(): `value` must be a zarr Buffer instance (zarr.core.buffer.Buffer), "
            f"got an instance of {type(value).__name__}; wrap bytes with "
            "zarr.core.buffer.default_buffer_prototype().buffer.from_bytes(...)"
        )


def _put(path: Path, value: Buffer, exclusive: bool) -> None:
    """Write ``value`` (host or GPU memory) to a temporary file beside ``path``, then move
    it into place: replacing ``path``, or with ``exclusive`` only if ``path`` does not
    exist (``FileExistsError`` otherwise)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.name}.{uuid.uuid4().hex}.partial")
    data: Any = value.as_array_like()  # numpy or CuPy: both are buffers kvikpy writes
    try:
        if len(value) == 0:
            tmp.touch(exist_ok=False)  # nothing to write (an empty GPU array has no pointer)
        else:
            kvikpy.write(tmp, data)
        if exclusive:
            os.link(tmp, path)  # fails with FileExistsError where os.replace would not
            os.unlink(tmp)
        else:
            os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
