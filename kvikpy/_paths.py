"""Paths as Python's ``open`` takes them, and which of them name remote files.

* ``fspath`` accepts ``str``, ``bytes`` and ``os.PathLike`` of either and returns a ``str``
  that names the same file (``bytes`` are decoded with the filesystem encoding and
  ``surrogateescape``, which the extension encodes back to the same bytes).
* ``is_url`` tells remote files' URLs from local paths, and ``redact_url`` hides a URL's
  credentials for display.

Files whose size says nothing of their end (devices, pipes, ``/proc`` and ``/sys``
pseudo-files that report 0 bytes) are the engine's to size and read.
"""

from __future__ import annotations

import os
import re
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
