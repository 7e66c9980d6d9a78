"""``kvikpy info``: versions, platform, CUDA devices, settings and library location."""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
from typing import Any

from kvikpy import _devices, _display, _gds, _lib, defaults
from kvikpy._api import cuda_available, device_count

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


def _setting_value(name: str) -> Any:
    """A setting as JSON can hold it (``compat_mode`` by its name)."""
    value = defaults.get(name)
    return value.name if isinstance(value, defaults.CompatMode) else value


def collect_info() -> dict[str, Any]:
    """Versions, platform, CUDA devices, settings and library location, as a dict.

    Returns
    -------
    dict
        ``kvikpy``, ``python``, ``python_implementation``, ``executable``, ``platform``,
        ``cuda_available``, ``cuda_unavailable_reason``, ``device_count``, ``devices``
        (``"cuda:N"`` labels: the engine does not report device names), ``compat_mode``
        (whether I/O resolves to POSIX rather than cuFile), ``gpu_io`` (which path GPU
        reads take), ``cufile`` (one line: whether cuFile is usable, why not, and what
        ``compat_mode`` then does), ``gds`` (see :func:`kvikpy._gds.gds_status`: usable,
        the first reason it is not, the libcufile loaded, stand-in or not, its version,
        nvidia-fs, the driver properties), ``settings`` and ``library`` (the path of the
        loaded extension module).
    """
    available = cuda_available()
    gds = _gds.gds_status()
    mode = str(_setting_value("compat_mode"))
    count = device_count() if available else 0
    return {
        "kvikpy": _lib.__version__,
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "executable": sys.executable,
        "platform": platform.platform(),
        "cuda_available": available,
        "cuda_unavailable_reason": None if available else _lib.cuda_unavailable_reason(),
        "device_count": count,
        "devices": [_devices.label(i) for i in range(count)],
        "compat_mode_preferred": defaults.is_compat_mode_preferred(),
        "gpu_io": _display.gpu_io(gds, mode, available),
        "cufile": _display.cufile_note(gds, mode),
        "gds": gds,
        "settings": {name: _setting_value(name) for name in _lib.setting_names()},
        "library": os.path.abspath(str(_lib.__file__)),
    }


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
        f"cuFile    {d['cufile']}",
        *(f"  {name:<22}  {value}" for name, value in (d["gds"]["properties"] or {}).items()),
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
