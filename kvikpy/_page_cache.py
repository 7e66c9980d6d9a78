"""kvikio's page-cache utilities: how much of a file the page cache holds, dropping one
file's pages (no privileges needed), dropping the whole system's cache (where permitted).

Benchmarks of cold reads call :func:`drop_file_page_cache` before each run."""

from __future__ import annotations

import os
from typing import TypeAlias

import kvikpy._lib as _lib
from kvikpy import _paths
from kvikpy.errors import FileTypeError
from kvikpy.utils import kvikio_deprecation_notice

__all__ = [
    "FileArgument",
    "clear_page_cache",
    "drop_file_page_cache",
    "drop_system_page_cache",
    "get_page_cache_info",
]


#: What the page-cache functions take as ``file``: a path, a file descriptor, or an open
#: file object (anything with ``fileno()``).
FileArgument: TypeAlias = "_paths.StrPath | int | _paths.HasFileno"


def _file(file: FileArgument) -> str | int:
    """``file`` as the engine takes it: a path string or a descriptor."""
    if isinstance(file, str | bytes | os.PathLike):
        return _paths.fspath(file)
    if isinstance(file, int):
        return file
    if _paths.has_fileno(file):
        return file.fileno()
    raise FileTypeError(
        f"file must be a path (str, bytes or os.PathLike), a file descriptor (int) or an "
        f"open file object, not {type(file).__name__}"
    )


def get_page_cache_info(file: FileArgument, offset: int = 0, length: int = 0) -> tuple[int, int]:
    """How many pages of a file the page cache holds: ``(cached_pages, total_pages)``.

    Parameters
    ----------
    file
        A path, a file descriptor, or an open file object (its ``fileno()``; its position
        is not used). A path is opened read-only for the call.
    offset
        Where the range starts, in bytes.
    length
        How many bytes; 0 (the default) means to the end of the file.

    Returns
    -------
    tuple[int, int]
        The pages of the range in the page cache, and all its pages. A range is counted in
        whole pages (the pages it touches); one that starts at or past the end of the file
        is ``(0, 0)``, and one that runs past the end stops there.

    Raises
    ------
    FileNotFoundError
        If the path does not exist (also a ``RuntimeError``, with kvikio's
        ``Unable to open file``); other failures are ``OSError``, also ``RuntimeError``.
    FileTypeError
        If ``file`` is none of the above (a ``TypeError`` and a ``ValueError``).
    NegativeValueError
        If ``offset`` or ``length`` is negative.

    Examples
    --------
    >>> import kvikpy
    >>> cached, total = kvikpy.get_page_cache_info("/etc/hostname")
    >>> 0 <= cached <= total
    True
    """
    cached, total = _lib.page_cache_info(_file(file), offset, length)
    return int(cached), int(total)


def drop_file_page_cache(
    file: FileArgument, offset: int = 0, length: int = 0, sync_first: bool = True
) -> None:
    """Ask the kernel to evict a file's pages from the page cache
    (``posix_fadvise(POSIX_FADV_DONTNEED)``); needs no privileges and touches no other file.

    Parameters
    ----------
    file
        A path, a file descriptor, or an open file object.
    offset
        Where the range starts, in bytes.
    length
        How many bytes; 0 (the default) means to the end of the file.
    sync_first
        Write the file's dirty pages to disk first (``fdatasync``), so that they can be
        evicted; dirty pages stay cached otherwise.

    Notes
    -----
    Only pages wholly inside the range are evicted. Filesystems that keep files in memory
    (tmpfs, ``/dev/shm``) ignore the advice: their pages stay. The kernel may also keep
    pages that are mapped or locked by a process.

    Raises
    ------
    FileNotFoundError
        If the path does not exist (also a ``RuntimeError``); other failures are
        ``OSError``, also ``RuntimeError``.
    FileTypeError
        If ``file`` is none of the above.
    NegativeValueError
        If ``offset`` or ``length`` is negative.
    """
    _lib.drop_file_page_cache(_file(file), offset, length, sync_first)


def drop_system_page_cache(
    reclaim_dentries_and_inodes: bool = True, sync_first: bool = True
) -> bool:
    """Drop the page cache of the whole system (every file of every process), where this
    process is permitted to.

    Parameters
    ----------
    reclaim_dentries_and_inodes
        Also free the kernel's cached directory entries and inodes (``vm.drop_caches=3``
        rather than ``1``).
    sync_first
        Write every dirty page to disk first (``sync``), so that they can be dropped.

    Returns
    -------
    bool
        Whether the cache was dropped; ``False`` where no way was permitted (it never
        raises for that).

    Notes
    -----
    Tried in kvikio's order, each where the previous was refused: writing
    ``/proc/sys/vm/drop_caches`` (root, or ``CAP_SYS_ADMIN``), then ``sysctl
    vm.drop_caches=N``, then ``sudo -n sysctl vm.drop_caches=N``. kvikio runs ``sudo``
    without ``-n``, which may stop to ask for a password; kvikpy never does, so a sudoers
    rule for it needs ``NOPASSWD``. To drop one file's pages without privileges, use
    :func:`drop_file_page_cache`.
    """
    return bool(_lib.drop_system_page_cache(reclaim_dentries_and_inodes, sync_first))


@kvikio_deprecation_notice(
    "clear_page_cache is deprecated; use drop_system_page_cache instead.", since="kvikio 26.04"
)
def clear_page_cache(
    reclaim_dentries_and_inodes: bool = True, clear_dirty_pages: bool = True
) -> bool:
    """Drop the system's page cache: :func:`drop_system_page_cache` under kvikio's older
    name, with ``clear_dirty_pages`` for its ``sync_first``.

    Parameters
    ----------
    reclaim_dentries_and_inodes
        As for :func:`drop_system_page_cache`.
    clear_dirty_pages
        ``sync_first`` of :func:`drop_system_page_cache`.

    Returns
    -------
    bool
        Whether the cache was dropped.
    """
    return drop_system_page_cache(reclaim_dentries_and_inodes, clear_dirty_pages)
