"""``kvikpy bench PATH``: time whole-file reads with kvikpy and check the bytes."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

import kvikpy
import kvikpy._lib as _lib
from kvikpy import _devices, defaults
from kvikpy._cli.common import (
    PROG,
    CliError,
    add_path_and_device,
    crc32_of_buffer,
    crc32_of_file,
    file_size,
    gbps,
    parse_size,
    positive_int,
)
from kvikpy._display import human_bytes
from kvikpy.cufile import engine_handle

__all__ = ["SETUP_DIR", "add_parser", "command", "format_bench", "run_bench"]

SETUP_DIR = "/dev/shm"  # tmpfs: the setup read's sparse file costs neither disk nor memory


def add_parser(sub: Any) -> None:
    """Add the ``bench`` subcommand to ``sub`` (what ``add_subparsers`` returned)."""
    bench = sub.add_parser(
        "bench",
        help="time whole-file reads of PATH and check the bytes",
        description=(
            "Read PATH whole with kvikpy: 1 warm-up read, then --repeat timed reads into the "
            "same buffer. Prints the first read's throughput (lower if the file was not in "
            "the page cache) and the median, min and max of the timed reads, in GB/s "
            "(10^9 bytes/s), then checks a CRC-32 of the bytes read against a plain-Python "
            "read of the file. kvikpy's one-time setup (I/O threads, pinned buffers) is paid "
            "beforehand by a read of a sparse file in /dev/shm, so it does not slow the first "
            "read."
        ),
    )
    add_path_and_device(bench)
    bench.add_argument(
        "--threads",
        type=positive_int,
        metavar="N",
        help="I/O threads (setting num_threads); default: the current setting",
    )
    bench.add_argument(
        "--task-size",
        type=parse_size,
        metavar="BYTES",
        help="bytes per parallel task, e.g. 4194304 or 4MiB (setting task_size); "
        "default: the current setting",
    )
    bench.add_argument(
        "--repeat", type=positive_int, default=5, metavar="N", help="timed reads; default 5"
    )
    bench.add_argument(
        "--no-verify",
        dest="verify",
        action="store_false",
        help="skip the check of the bytes read against the file",
    )
    bench.add_argument(
        "--progress",
        action="store_true",
        help="draw a progress bar of the bytes read (on stderr)",
    )
    bench.add_argument("--json", action="store_true", help="print one JSON object")
    bench.set_defaults(run=command)


def _allocate(size: int, ordinal: int | None) -> Any:
    """A buffer of ``size`` bytes to read into, allocated and touched before any timing.

    A numpy array in host memory for ``ordinal is None``, else a ``kvikpy.Buffer`` in the
    GPU's memory (allocated the way ``kvikpy.read`` allocates it).
    """
    if ordinal is not None:
        return _lib.Buffer.allocate(size, ordinal, False)
    import numpy as np  # deferred: `import kvikpy` does not load numpy

    try:
        buf = np.empty(size, dtype=np.uint8)
        buf.fill(0)  # fault the pages in now, so the first timed read does not pay for it
    except MemoryError:
        raise CliError(f"not enough host memory for a {human_bytes(size)} buffer") from None
    return buf


def _setup_read(buf: Any, size: int) -> bool:
    """Run one read shaped like the benchmark's from a sparse file in ``/dev/shm``.

    The first read of a process pays one-time costs (starting the I/O threads, allocating
    the pinned staging buffers of GPU reads: ~0.1 s on an H100-class machine) that would
    make a file already in the page cache look cold. Reading as many bytes, with the same
    settings, from a hole in tmpfs pays them without touching the benchmarked file's
    cache, and takes no memory (holes read as the shared zero page).

    Returns
    -------
    bool
        Whether the read ran (False where ``/dev/shm`` cannot hold the file).
    """
    try:
        with tempfile.NamedTemporaryFile(dir=SETUP_DIR, prefix="kvikpy-bench-") as hole:
            hole.truncate(size)
            with kvikpy.CuFile(hole.name, "r") as f:
                f.read(buf, size)
    except OSError:
        return False
    return True


def _timed_reads(path: str, buf: Any, size: int, runs: int, progress: bool = False) -> list[float]:
    """Read ``size`` bytes of ``path`` into ``buf`` ``runs`` times; the seconds of each.

    ``CuFile.read`` blocks until the bytes have landed, in GPU memory too (the copies
    from its pinned staging buffers are synchronized before it returns), so the clock
    is read after the data is in place. With ``progress``, each read is a ``pread``
    whose engine byte counter feeds one bar over all the reads; its wait returns
    the moment the read completes, so the clock still times the read.
    """
    seconds = []
    with contextlib.ExitStack() as stack:
        f = stack.enter_context(kvikpy.CuFile(path, "r"))
        meter = None
        if progress:
            from kvikpy._progress import bar, track

            meter = stack.enter_context(bar(size * runs, f"bench {os.path.basename(path)}"))
        handle = engine_handle(f)
        for _ in range(runs):
            start = time.perf_counter()
            # With a bar, a future, so that the bar can follow its byte counter.
            # Exact reads: the engine fails one that finds the file shorter than sized.
            if meter is None:
                handle.read_exact(buf, size)
            else:
                track(handle.pread_exact(buf, size), meter)
            seconds.append(time.perf_counter() - start)
    return seconds


def run_bench(
    path: str,
    device: str = "auto",
    threads: int | None = None,
    task_size: int | None = None,
    repeat: int = 5,
    verify: bool = True,
    progress: bool = False,
) -> dict[str, Any]:
    """Time whole-file reads of ``path`` and check the bytes; the results as a dict.

    Parameters
    ----------
    path
        The file.
    device
        ``auto``, ``cpu``, ``cuda`` or ``cuda:N``.
    threads, task_size
        Settings ``num_threads`` and ``task_size`` for the reads (None: keep the current).
    repeat
        Timed reads after the warm-up read.
    verify
        Compare a CRC-32 of the bytes read with one of a plain-Python read of the file.
    progress
        Draw a bar of the bytes read over all the reads.

    Returns
    -------
    dict
        ``path``, ``size``, ``device``, ``threads``, ``task_size``, ``repeat``,
        ``first_gbps``, ``median_gbps``, ``min_gbps``, ``max_gbps``, ``first_s``,
        ``times_s``, ``setup_read`` (whether one-time setup was paid before the first
        read: see :func:`_setup_read`), ``verified`` (None when not checked), ``crc32``
        and ``file_crc32`` (hex strings, None when not checked) and ``kvikpy``, the
        version.

    Raises
    ------
    CliError
        For a missing, empty or special file, or an unavailable device.
    """
    size = file_size(path)
    label, ordinal = _devices.resolve_option(device)
    overrides: dict[str, int] = {}
    if threads is not None:
        overrides["num_threads"] = threads
    if task_size is not None:
        overrides["task_size"] = task_size
    buf = _allocate(size, ordinal)
    with defaults.set(overrides):
        used_threads = int(defaults.get("num_threads"))
        used_task_size = int(defaults.get("task_size"))
        setup = _setup_read(buf, size)
        first, *timed = _timed_reads(path, buf, size, 1 + repeat, progress)
    rates = [gbps(size, s) for s in timed]
    result: dict[str, Any] = {
        "path": path,
        "size": size,
        "device": label,
        "threads": used_threads,
        "task_size": used_task_size,
        "repeat": repeat,
        "first_gbps": gbps(size, first),
        "median_gbps": statistics.median(rates),
        "min_gbps": min(rates),
        "max_gbps": max(rates),
        "first_s": first,
        "times_s": timed,
        "setup_read": setup,
        "verified": None,
        "crc32": None,
        "file_crc32": None,
        "kvikpy": kvikpy.__version__,
    }
    if verify:
        got = crc32_of_buffer(buf, size)
        expected, on_disk = crc32_of_file(path)
        result["crc32"], result["file_crc32"] = f"{got:08x}", f"{expected:08x}"
        result["verified"] = got == expected and on_disk == size
    return result


def format_bench(r: dict[str, Any]) -> str:
    """The one-line summary of a :func:`run_bench` result."""
    if r["verified"] is None:
        check = "bytes not checked"
    elif r["verified"]:
        check = f"bytes verified (crc32 {r['crc32']})"
    else:
        check = f"BYTES DIFFER from the file (crc32 {r['crc32']} read, {r['file_crc32']} on disk)"
    reads = "read" if r["repeat"] == 1 else "reads"
    return (
        f"{r['path']}: {human_bytes(r['size'])} into {r['device']}, {r['threads']} threads, "
        f"{human_bytes(r['task_size'])} tasks: first read {r['first_gbps']:.2f} GB/s, "
        f"then median {r['median_gbps']:.2f} GB/s (min {r['min_gbps']:.2f}, "
        f"max {r['max_gbps']:.2f}) over {r['repeat']} {reads}; {check}"
    )


def command(args: argparse.Namespace) -> int:
    """Run ``kvikpy bench`` with parsed arguments; the exit status."""
    result = run_bench(
        args.path,
        device=args.device,
        threads=args.threads,
        task_size=args.task_size,
        repeat=args.repeat,
        verify=args.verify,
        progress=args.progress,
    )
    print(json.dumps(result) if args.json else format_bench(result))
    if result["verified"] is False:
        print(f"{PROG} bench: error: the bytes read differ from the file", file=sys.stderr)
        return 1
    return 0
