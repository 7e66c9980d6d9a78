"""Paths as Python's ``open`` takes them, and files whose size is unknown until read.

* ``fspath`` accepts ``str``, ``bytes`` and ``os.PathLike`` of either and returns a ``str``
  that names the same file (``bytes`` are decoded with the filesystem encoding and
  ``surrogateescape``, which the extension encodes back to the same bytes).
* Pseudo-files (``/proc/self/maps``, most of ``/sys``) report a size of 0 but have
  content; a read sized by ``fstat`` would silently return nothing. ``is_unsized`` spots
  them (one 1-byte ``pread``, asked only of files that report 0 bytes), and devices and
  pipes, whose size says nothing of their end (``/dev/zero`` never ends). The engine
  reads them: reads that name a size read that many bytes; reads to the end read a
  pseudo-file to its end (``FileHandle.read_to_end``, kept to ``UNSIZED_LIMIT`` bytes by
  ``bounded``) and refuse devices and pipes (``refuse_endless``); sized reads get the
  engine's error (``FileHandle.size_for``).
"""

from __future__ import annotations

import os
import re
import stat
import urllib.parse
from typing import Protocol, TypeAlias, TypeGuard

import kvikpy._lib as _lib

#: Every spelling of a path that Python's ``open`` accepts.
StrPath: TypeAlias = "str | bytes | os.PathLike[str] | os.PathLike[bytes]"


class HasFileno(Protocol):
    """An open file object backed by an operating-system file: anything with
    ``fileno()`` (``open(...)``, ``tempfile.TemporaryFile()``...)."""

    def fileno(self) -> int: ...


def has_fileno(obj: object) -> TypeGuard[HasFileno]:
    """Whether ``obj`` is an open file object (it has a callable ``fileno``).

    Looked up as an attribute rather than with ``isinstance`` against a runtime-checkable
    protocol: from Python 3.12 that ``isinstance`` sees only attributes defined on the
    class, so wrappers that forward ``fileno`` through ``__getattr__`` (the object of
    ``tempfile.NamedTemporaryFile``) would not count as files."""
    return callable(getattr(obj, "fileno", None))


# URL schemes read as remote files: the engine's list (`source::URL_SCHEMES`), asked once.
_URL_SCHEMES = tuple(f"{scheme}://" for scheme in _lib.url_schemes())


def is_url(name: str) -> bool:
    """Whether ``name`` (from :func:`fspath`) is a remote file's URL, not a local path."""
    return name[:10].lower().startswith(_URL_SCHEMES)


_QUERY_SECRETS = re.compile(r"(?i)([?&]x-amz-(?:signature|security-token)=)[^&#\s]+")


def redact_url(url: str) -> str:
    """``url`` with its credentials redacted, for display: user info as ``user:***@host``
    (``***@host`` for a user info without password, which may be a token), and the
    values of a presigned URL's ``X-Amz-Signature`` and ``X-Amz-Security-Token`` as
    ``***``; other URLs unchanged."""
    url = _QUERY_SECRETS.sub(r"\1***", url)
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return "<a malformed URL>" if "@" in url else url
    if "@" not in parts.netloc:
        return url
    info, _, host = parts.netloc.rpartition("@")
    shown = f"{info.partition(':')[0]}:***" if ":" in info else "***"
    return urllib.parse.urlunsplit(parts._replace(netloc=f"{shown}@{host}"))


def fspath(path: StrPath) -> str:
    """``path`` as a ``str`` naming the same file; ``TypeError`` for anything else."""
    if type(path) is str:  # the common case, on every path of a many-file batch
        return path
    try:
        name = os.fspath(path)
    except TypeError:
        raise TypeError(
            f"a path must be str, bytes or os.PathLike, not {type(path).__name__}"
        ) from None
    return os.fsdecode(name)


def has_content(fd: int) -> bool:
    """Whether the open file yields a byte when read; asked only of files that report a
    size of 0, to tell pseudo-files from empty files."""
    return len(os.pread(fd, 1, 0)) > 0


#: The most bytes a read to the end takes of a file that reports a size of 0 (a /proc or
#: /sys pseudo-file) before it refuses: such files are small, and one that goes on is no
#: file to read whole (``/proc/self/pagemap``). Pass a size to read more.
UNSIZED_LIMIT = 64 << 20

_KINDS = (
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISFIFO, "a pipe (FIFO)"),
    (stat.S_ISSOCK, "a socket"),
)


def special_kind(fd: int) -> str | None:
    """What the open file is when it is no regular file (``"a character device"``...);
    None for a regular file."""
    mode = os.fstat(fd).st_mode
    return next((name for test, name in _KINDS if test(mode)), None)


def is_unsized(fd: int) -> bool:
    """Whether the open file's size (0) says nothing of its content: a device, a pipe or
    a socket, or a pseudo-file that reports 0 bytes but yields some. Asked only of files
    that report 0 bytes."""
    return special_kind(fd) is not None or has_content(fd)


def refuse_endless(fd: int, name: str) -> None:
    """``ValueError`` for a device, pipe or socket, which may never end and so cannot be
    read to its end; it says to pass ``size=`` (``count=`` for numpy.fromfile)."""
    kind = special_kind(fd)
    if kind is not None:
        raise ValueError(
            f"{name!r} is {kind}: it has no size and may never end, so it cannot be read "
            "to its end; pass size= (count= for numpy.fromfile) to read that many bytes"
        )


def bounded(content: bytes, name: str) -> bytes:
    """``content``, a file that reports a size of 0 read to its end (the engine reads at
    most :data:`UNSIZED_LIMIT` + 1 bytes of it); ``ValueError`` where it went on past
    :data:`UNSIZED_LIMIT` bytes, saying to pass ``size=``."""
    if len(content) > UNSIZED_LIMIT:
        raise ValueError(
            f"{name!r} reports a size of 0 bytes and did not end within {UNSIZED_LIMIT} "
            f"bytes ({UNSIZED_LIMIT >> 20} MiB, kvikpy's bound for reading such a file to "
            "its end); pass size= (count= for numpy.fromfile) to read that many bytes"
        )
    return content
