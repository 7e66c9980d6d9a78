"""``kvikpy read PATH``: read a file, or a byte range of it, once and report what arrived."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

import kvikpy
from kvikpy import _devices
from kvikpy._cli.common import (
    add_path_and_device,
    crc32_of_buffer,
    file_size,
    gbps,
    parse_size,
)
from kvikpy._display import human_bytes

__all__ = ["add_parser", "command", "format_read", "run_read"]


def add_parser(sub: Any) -> None:
    """Add the ``read`` subcommand to ``sub`` (what ``add_subparsers`` returned)."""
    read = sub.add_parser(
        "read",
        help="read PATH (or a byte range of it) once and report what arrived",
        description=(
            "Read PATH, or --size bytes of it at --offset, once with kvikpy.read into new "
            "host or GPU memory; print the size, the time and throughput (GB/s, 10^9 "
            "bytes/s), a CRC-32 of the bytes and the first --head of them in hex."
        ),
    )
    add_path_and_device(read)
    read.add_argument(
        "--offset", type=parse_size, default=0, metavar="BYTES", help="where to start"
    )
    read.add_argument(
        "--size", type=parse_size, metavar="BYTES", help="how much; default: to the end"
    )
    read.add_argument(
        "--head", type=int, default=16, metavar="N", help="bytes to show in hex; default 16"
    )
    read.add_argument("--json", action="store_true", help="print one JSON object")
    read.set_defaults(run=command)


def run_read(
    path: str, *, device: str = "auto", offset: int = 0, size: int | None = None, head: int = 16
) -> dict[str, Any]:
    """Read ``size`` bytes of ``path`` at ``offset`` once; what arrived and how fast.

    Returns
    -------
    dict
        ``path``, ``device``, ``offset``, ``size``, ``seconds``, ``gbps``, ``crc32`` and
        ``head`` (the first bytes, hex).
    """
    file_size(path, "read")
    label, _ = _devices.resolve_option(device)
    import numpy  # noqa: F401  (kvikpy.read imports it on first use: not part of the read)

    t0 = time.perf_counter()
    buf = kvikpy.read(path, offset=offset, size=size, device=label)
    seconds = time.perf_counter() - t0  # kvikpy.read returns once the bytes have landed
    n = buf.nbytes
    shown = min(max(head, 0), n)
    first = buf.view("|u1", 1, 8, [shown], 0, shown).to_numpy().tobytes() if shown else b""
    return {
        "path": path,
        "device": label,
        "offset": offset,
        "size": n,
        "seconds": seconds,
        "gbps": gbps(n, seconds) if seconds > 0 else None,
        "crc32": f"{crc32_of_buffer(buf, n):08x}",
        "head": first.hex(" "),
    }


def format_read(r: dict[str, Any]) -> str:
    """The human summary of a :func:`run_read` result."""
    where = f" at offset {human_bytes(r['offset'])}" if r["offset"] else ""
    speed = f" ({r['gbps']:.2f} GB/s)" if r["gbps"] else ""
    head = f"\nfirst bytes: {r['head']}" if r["head"] else ""
    return (
        f"read {human_bytes(r['size'])} ({r['size']:,} bytes) of {r['path']}{where} into "
        f"{r['device']} in {r['seconds'] * 1e3:.1f} ms{speed}, kvikpy's one-time setup "
        f"included (use 'bench' for steady-state speed); crc32 {r['crc32']}{head}"
    )


def command(args: argparse.Namespace) -> int:
    """Run ``kvikpy read`` with parsed arguments; the exit status."""
    result = run_read(
        args.path, device=args.device, offset=args.offset, size=args.size, head=args.head
    )
    print(json.dumps(result) if args.json else format_read(result))
    return 0
