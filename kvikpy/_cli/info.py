"""``kvikpy info``: versions, platform, CUDA devices, settings and library location."""

from __future__ import annotations

import argparse
import json
from typing import Any

from kvikpy import _display
from kvikpy._info import collect_info

__all__ = ["add_parser", "collect_info", "command", "format_info"]


def add_parser(sub: Any) -> None:
    """Add the ``info`` subcommand to ``sub`` (what ``add_subparsers`` returned)."""
    info = sub.add_parser(
        "info",
        help="versions, CUDA devices, settings and library location",
        description="Print kvikpy's version, Python's, the platform, CUDA and its devices, "
        "the current settings and where the library was loaded from.",
    )
    info.add_argument("--json", action="store_true", help="print one JSON object")
    info.set_defaults(run=command)


def format_info(d: dict[str, Any]) -> str:
    """The human-readable lines of a :func:`collect_info` result."""
    if d["cuda_available"]:
        cuda = f"available, {d['device_count']} device(s): {', '.join(d['devices'])}"
    else:
        cuda = f"not available ({d['cuda_unavailable_reason']})"
    io = d["gpu_io"]
    lines = [
        f"kvikpy    {d['kvikpy']}",
        f"python    {d['python']} ({d['python_implementation']}, {d['executable']})",
        f"platform  {d['platform']}",
        f"cuda      {cuda}",
        f"gpu I/O   {io}",
        f"threads   {d['io_threads']}",
        f"cuFile    {d['cufile']}",
        *(f"  {name:<22}  {value}" for name, value in (d["gds"]["properties"] or {}).items()),
        f"staging   {_display.staging_line(d['staging'])}",
        f"library   {d['library']}",
        "settings",
    ]
    width = max(map(len, d["settings"]), default=0)
    lines += [f"  {name:<{width}}  {value}" for name, value in d["settings"].items()]
    return "\n".join(lines)


def command(args: argparse.Namespace) -> int:
    """Run ``kvikpy info`` with parsed arguments; the exit status."""
    d = collect_info()
    print(json.dumps(d) if args.json else format_info(d))
    return 0
