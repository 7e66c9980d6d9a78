"""``GDSStore``: zarr's ``LocalStore`` with its chunk reads and writes done by kvikpy."""

from __future__ import annotations

import asyncio
import builtins
import os
import stat
import uuid
from collections.abc import AsyncIterator, Iterable, Iterator
from pathlib import Path
from typing import Any, Self

from zarr.abc.store import ByteRequest
from zarr.core.buffer import Buffer, BufferPrototype
from zarr.core.buffer.core import default_buffer_prototype
from zarr.core.common import AccessModeLiteral
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

    Unlike ``LocalStore``, the store never reaches outside its root, whatever the keys
    (they may come from metadata written elsewhere). Every operation that takes a key or
    prefix (``get``, ``get_partial_values``, ``set``, ``set_if_not_exists``, ``delete``,
    ``delete_dir``, ``exists``, ``getsize``, ``list_prefix``, ``list_dir``) raises
    ``ValueError``, naming the key, the root and the reason, for:

    * a key with a ``..`` segment (``../x``, ``a/../../x``; even one that would come
      back inside, as zarr never writes one);
    * an absolute key (``/etc/passwd``);
    * a key with a NUL byte;
    * unless ``follow_symlinks=True``, a key whose path passes through a symbolic link
      inside the root (a link to a file or to a directory, wherever it points).

    Empty segments (``a//b``) and ``.`` stay inside the root and are allowed, as is a
    backslash (an ordinary character in a Linux file name). Listing (``list``,
    ``list_prefix``, ``list_dir``) skips symbolic links unless ``follow_symlinks=True``.
    The checks see the directory as it is when the call is made: they protect against
    hostile keys and links in the data, not against another process swapping a
    directory for a link while a call runs.

    Parameters
    ----------
    root
        The directory holding the store. It may itself be, or lie below, a symbolic link:
        only links inside it are refused.
    read_only
        Whether writes and deletes are refused.
    follow_symlinks
        Whether keys may pass through symbolic links inside the root (to wherever they
        point, as ``LocalStore`` does); default ``False``, which refuses them.

    Examples
    --------
    >>> import zarr, cupy, kvikpy.zarr
    >>> store = kvikpy.zarr.GDSStore("data.zarr", read_only=True)
    >>> with zarr.config.enable_gpu():
    ...     a = zarr.open_array(store, mode="r")[:]   # a CuPy array
    """

    follow_symlinks: bool

    def __init__(
        self, root: Path | str, *, read_only: bool = False, follow_symlinks: bool = False
    ) -> None:
        if not isinstance(follow_symlinks, bool):
            raise TypeError(
                f"follow_symlinks must be True or False, not {type(follow_symlinks).__name__}"
            )
        super().__init__(root, read_only=read_only)
        self.follow_symlinks = follow_symlinks

    @classmethod
    async def open(
        cls,
        root: Path | str,
        *,
        read_only: bool = False,
        mode: AccessModeLiteral | None = None,
        follow_symlinks: bool = False,
    ) -> Self:
        """Create and open the store (as ``LocalStore.open``; ``follow_symlinks`` as for
        the constructor)."""
        store = await super().open(root, read_only=read_only, mode=mode)
        store.follow_symlinks = follow_symlinks
        return store

    def with_read_only(self, read_only: bool = False) -> Self:
        # docstring inherited
        return type(self)(root=self.root, read_only=read_only, follow_symlinks=self.follow_symlinks)

    def __eq__(self, other: object) -> bool:
        return super().__eq__(other) and self.follow_symlinks == getattr(
            other, "follow_symlinks", None
        )

    def __repr__(self) -> str:
        if self.follow_symlinks:
            return f"GDSStore('{self}', follow_symlinks=True)"
        return f"GDSStore('{self}')"

    def _path(self, key: str) -> Path:
        """The file of ``key`` under the root, refusing keys that would leave it (see the
        class docstring): a few string tests, and without ``follow_symlinks`` one
        ``lstat`` per existing path segment."""
        if not isinstance(key, str):
            raise TypeError(f"a zarr key is a str, not {type(key).__name__}")
        if "\x00" in key:
            self._refuse(key, "it holds a NUL byte")
        if key.startswith("/"):
            self._refuse(key, "it is absolute; keys are relative to the root")
        if ".." in key and ".." in key.split("/"):
            self._refuse(key, "a '..' segment would leave the root")
        if not self.follow_symlinks and key:
            at = str(self.root)
            for part in key.split("/"):
                if not part or part == ".":
                    continue
                at = f"{at}/{part}"
                try:
                    mode = os.lstat(at).st_mode
                except (FileNotFoundError, NotADirectoryError):
                    break  # nothing further exists, so no link either
                if stat.S_ISLNK(mode):
                    self._refuse(
                        key,
                        f"{at!r} is a symbolic link, and the store was made without "
                        "follow_symlinks=True",
                    )
        return self.root / key

    def _refuse(self, key: str, why: str) -> None:
        raise ValueError(
            f"GDSStore refuses key {key!r}: {why} (the store's root is {str(self.root)!r}; "
            "a store never reads or writes outside it)"
        )

    def _walk(self, base: Path) -> Iterator[str]:
        """The keys of the regular files below ``base``, symbolic links skipped (neither
        listed nor descended into)."""
        strip = len(str(self.root)) + 1
        stack = [str(base)]
        while stack:
            try:
                entries = os.scandir(stack.pop())
            except (FileNotFoundError, NotADirectoryError):
                continue
            with entries:
                for e in entries:
                    if e.is_symlink():
                        continue
                    if e.is_dir(follow_symlinks=False):
                        stack.append(e.path)
                    elif e.is_file(follow_symlinks=False):
                        yield e.path[strip:]

    async def list(self) -> AsyncIterator[str]:
        # docstring inherited; without follow_symlinks, links are skipped
        if self.follow_symlinks:
            async for key in super().list():
                yield key
            return
        for key in self._walk(self.root):
            yield key

    async def list_prefix(self, prefix: str) -> AsyncIterator[str]:
        # docstring inherited
        base = self._path(prefix.rstrip("/"))
        if self.follow_symlinks:
            async for key in super().list_prefix(prefix):
                yield key
            return
        for key in self._walk(base):
            yield key

    async def list_dir(self, prefix: str) -> AsyncIterator[str]:
        # docstring inherited
        base = self._path(prefix.rstrip("/"))
        try:
            entries = os.scandir(base)
        except (FileNotFoundError, NotADirectoryError):
            return
        with entries:
            names = [e.name for e in entries if self.follow_symlinks or not e.is_symlink()]
        for name in names:
            yield name

    async def delete(self, key: str) -> None:
        # docstring inherited
        self._path(key)
        await super().delete(key)

    def delete_sync(self, key: str) -> None:
        # docstring inherited
        self._path(key)
        super().delete_sync(key)

    async def delete_dir(self, prefix: str) -> None:
        # docstring inherited
        self._path(prefix.rstrip("/"))
        await super().delete_dir(prefix)

    async def exists(self, key: str) -> bool:
        # docstring inherited
        return await asyncio.to_thread(self._path(key).is_file)

    async def get(
        self,
        key: str,
        prototype: BufferPrototype | None = None,
        byte_range: ByteRequest | None = None,
    ) -> Buffer | None:
        # docstring inherited
        if not self._is_open:
            await self._open()
        return await _reads.gatherer().submit(self._request(key, prototype, byte_range))

    async def get_partial_values(
        self,
        prototype: BufferPrototype,
        key_ranges: Iterable[tuple[str, ByteRequest | None]],
    ) -> builtins.list[Buffer | None]:
        # docstring inherited
        if not self._is_open:
            await self._open()
        requests = [_reads.request(self._path(key), prototype, br) for key, br in key_ranges]
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
        self._ensure_open_sync()
        r = self._request(key, prototype, byte_range)
        return _raise_error(_reads.read_requests([r])[0])

    def _request(
        self, key: str, prototype: BufferPrototype | None, byte_range: ByteRequest | None
    ) -> _reads.Request:
        """The read of ``key`` (or of its ``byte_range``) into ``prototype``'s buffers,
        zarr's default prototype when ``None``; the key checked (:meth:`_path`)."""
        if prototype is None:
            prototype = default_buffer_prototype()
        return _reads.request(self._path(key), prototype, byte_range)

    async def getsize(self, key: str) -> int:
        # docstring inherited: the file's size, without reading it
        return (await asyncio.to_thread(os.stat, self._path(key))).st_size

    async def _set(self, key: str, value: Buffer, exclusive: bool = False) -> None:
        if not self._is_open:
            await self._open()
        self._check_writable()
        _check_buffer(value)
        await asyncio.to_thread(_put, self._path(key), value, exclusive)

    def set_sync(self, key: str, value: Buffer) -> None:
        # docstring inherited
        self._ensure_open_sync()
        self._check_writable()
        _check_buffer(value)
        _put(self._path(key), value, False)


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
