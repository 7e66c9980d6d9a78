"""Paths as Python's ``open`` takes them, and files whose size is unknown until read.

* ``fspath`` accepts ``str``, ``bytes`` and ``os.PathLike`` of either and returns a ``str``
  that names the same file (``bytes`` are decoded with the filesystem encoding and
  ``surrogateescape``, which the extension encodes back to the same bytes).
* Pseudo-files (``/proc/self/maps``, most of ``/sys``) report a size of 0 but have
  content; a read sized by ``fstat`` would silently return nothing. ``has_content``
  spots them (one 1-byte ``pread``, asked only of files that report 0 bytes); host reads
  read them to their end, and sized reads get the engine's error
  (``FileHandle.size_for``).
"""

from __future__ import annotations

import os
import re
import urllib.parse
from typing import Protocol, TypeAlias, TypeGuard

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


_PIECE = 1 << 20

# URL schemes read as remote files (the engine's `source::remote::as_url` rule).
_URL_SCHEMES = ("http://", "https://", "s3://", "webhdfs://")


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


def read_to_end(fd: int) -> bytes:
    """Every byte of an open file, read until end of file (for unsized pseudo-files)."""
    pieces = []
    position = 0
    while piece := os.pread(fd, _PIECE, position):
        pieces.append(piece)
        position += len(piece)
    return b"".join(pieces)
