"""The command line: ``python -m kvikpy`` and the ``kvikpy`` script.

``kvikpy bench PATH``
    Read one file whole with kvikpy, 1 warm-up and ``--repeat`` timed runs, into host or
    GPU memory (kvikpy's one-time setup paid beforehand on a sparse file); print the first
    read's throughput and the median (min, max) of the timed ones, then check the bytes
    against a plain-Python read of the file.
``kvikpy read PATH``
    Read a file, or a byte range of it, once with ``kvikpy.read``; print the size, time,
    throughput, a CRC-32 and the first bytes.
``kvikpy info``
    The kvikpy and Python versions, the platform, CUDA and its devices, every setting and
    where the library was loaded from.

Each prints one line per fact, or one JSON object with ``--json``. Failures (a missing
file, CUDA asked for but absent...) print one line on stderr and exit with status 1;
malformed arguments exit with status 2, as with any argparse program.

This package holds :func:`main` and the parser; each command is a module (``bench``,
``read``, ``info``) that adds its subparser and runs it, and ``common`` holds what they
share. Devices are parsed and resolved by :mod:`kvikpy._devices`.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import kvikpy
from kvikpy._cli import bench, info, read
from kvikpy._cli.bench import format_bench, run_bench
from kvikpy._cli.common import PROG, CliError, parse_size
from kvikpy._cli.info import collect_info, format_info
from kvikpy._cli.read import format_read, run_read
from kvikpy.errors import KvikpyError

__all__ = [
    "CliError",
    "build_parser",
    "collect_info",
    "format_bench",
    "format_info",
    "format_read",
    "main",
    "parse_size",
    "run_bench",
    "run_read",
]

_COMMANDS = (bench, info, read)  # each adds its subparser, which names its `run`


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``kvikpy`` and its ``bench``, ``info`` and ``read`` commands."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="kvikpy: fast file reads into GPU and host memory.",
    )
    parser.add_argument("--version", action="version", version=f"kvikpy {kvikpy.__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{bench,info,read}")
    for module in _COMMANDS:
        module.add_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with ``argv`` (default ``sys.argv[1:]``); the exit status.

    Parameters
    ----------
    argv
        The arguments after the program name, e.g. ``["bench", "data.bin", "--json"]``.

    Returns
    -------
    int
        0 on success, 1 for a failure reported on stderr (missing file, no CUDA, bytes
        that differ...), 2 for malformed arguments, 130 when interrupted with Ctrl-C.
    """
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # --help, --version, or a usage error already printed
        return 0 if exc.code is None else exc.code if isinstance(exc.code, int) else 1
    try:
        status: int = args.run(args)
    except (CliError, OSError, ValueError, KvikpyError) as exc:
        print(f"{PROG} {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{PROG} {args.command}: interrupted", file=sys.stderr)
        return 130
    return status
