"""What the commands of :mod:`kvikpy._cli` share: argument types, the ``PATH`` and
``--device`` arguments, file checks, checksums and throughput."""

from __future__ import annotations

import argparse
import os
import stat
import zlib
from typing import Any

import kvikpy._lib as _lib
from kvikpy import _devices

__all__ = [
    "GB",
    "PROG",
    "VERIFY_CHUNK",
    "CliError",
    "add_path_and_device",
    "crc32_of_buffer",
    "crc32_of_file",
    "file_size",
    "gbps",
    "parse_size",
    "positive_int",
]

PROG = "kvikpy"
GB = 1e9  # throughputs are in decimal GB/s, as in docs/benchmarks.md
VERIFY_CHUNK = 64 << 20  # bytes hashed (and copied back from the GPU) at a time
_SUFFIXES = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


class CliError(Exception):
    """A failure to report as one line on stderr (exit status 1), without a traceback."""


# ---------------------------------------------------------------------------------------
# Arguments


def positive_int(text: str) -> int:
    """Parse a whole number of at least 1 (argparse ``type=``)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def parse_size(text: str) -> int:
    """Parse a positive byte count: ``4194304``, or with a binary suffix (``4M``, ``4MiB``).

    Parameters
    ----------
    text
        Digits, optionally followed by ``k``, ``M``, ``G`` or ``T`` (any case), optionally
        followed by ``iB`` or ``B``; the suffixes are powers of 1024.

    Returns
    -------
    int
        The number of bytes.

    Raises
    ------
    argparse.ArgumentTypeError
        For anything else, or a size of 0.
    """
    s = text.strip().lower().removesuffix("ib").removesuffix("b")
    scale = _SUFFIXES.get(s[-1:], 1)
    digits = s[:-1] if scale > 1 else s
    if not digits.isdigit():
        raise argparse.ArgumentTypeError(
            f"expected a size in bytes such as 4194304 or 4MiB, got {text!r}"
        )
    value = int(digits) * scale
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1 byte, got {text!r}")
    return value


def _device_choice(text: str) -> str:
    """Check a ``--device`` value (argparse ``type=``): see :func:`kvikpy._devices.check_option`."""
    try:
        return _devices.check_option(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_path_and_device(parser: argparse.ArgumentParser) -> None:
    """The ``PATH`` and ``--device`` arguments ``bench`` and ``read`` share."""
    parser.add_argument("path", metavar="PATH", help="the file to read")
    parser.add_argument(
        "--device",
        type=_device_choice,
        default="auto",
        metavar="{auto,cpu,cuda,cuda:N}",
        help="where the bytes go: host memory (cpu), a GPU, or auto (a GPU if CUDA is "
        "available, else cpu); default auto",
    )


# ---------------------------------------------------------------------------------------
# Files, checksums, rates


def file_size(path: str, command: str = "bench") -> int:
    """The size of ``path``, which must be a regular file (non-empty for ``bench``).

    Raises
    ------
    CliError
        If ``path`` is missing, a directory, not a regular file, or (for ``bench``) empty.
    """
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise CliError(f"{path}: no such file") from None
    except OSError as exc:
        raise CliError(f"{path}: {exc.strerror or exc}") from None
    if stat.S_ISDIR(st.st_mode):
        raise CliError(f"{path} is a directory; {command} reads one file")
    if not stat.S_ISREG(st.st_mode):
        raise CliError(f"{path} is not a regular file")
    if st.st_size == 0 and command == "bench":
        raise CliError(f"{path} is empty; there is nothing to time")
    return st.st_size


def crc32_of_buffer(buf: Any, size: int) -> int:
    """CRC-32 of the first ``size`` bytes of ``buf`` (GPU data copied back in chunks)."""
    crc = 0
    if isinstance(buf, _lib.Buffer):
        for start in range(0, size, VERIFY_CHUNK):
            n = min(VERIFY_CHUNK, size - start)
            chunk = buf.view("|u1", 1, 8, [n], start, n).to_numpy()
            crc = zlib.crc32(chunk.data, crc)
        return crc
    view = memoryview(buf).cast("B")
    for start in range(0, size, VERIFY_CHUNK):
        crc = zlib.crc32(view[start : start + VERIFY_CHUNK], crc)
    return crc


def crc32_of_file(path: str) -> tuple[int, int]:
    """CRC-32 and size of ``path`` read with plain Python, in chunks."""
    crc, total = 0, 0
    chunk = bytearray(VERIFY_CHUNK)
    view = memoryview(chunk)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(chunk):
            crc = zlib.crc32(view[:n], crc)
            total += n
    return crc, total


def gbps(size: int, seconds: float) -> float:
    """Throughput in GB/s (10^9 bytes/s)."""
    return size / max(seconds, 1e-9) / GB
