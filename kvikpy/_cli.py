"""The command line: ``python -m kvikpy`` and the ``kvikpy`` script.

``kvikpy bench PATH``
    Read one file whole with kvikpy, 1 warm-up and ``--repeat`` timed runs, into host or
    GPU memory (kvikpy's one-time setup paid beforehand on a sparse file); print the first
    read's throughput and the median (min, max) of the timed ones, then check the bytes
    against a plain-Python read of the file.
``kvikpy info``
    The kvikpy and Python versions, the platform, CUDA and its devices, every setting and
    where the library was loaded from.

Both print one line per fact, or one JSON object with ``--json``. Failures (a missing
file, CUDA asked for but absent...) print one line on stderr and exit with status 1;
malformed arguments exit with status 2, as with any argparse program.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import stat
import statistics
import sys
import tempfile
import time
import zlib
from collections.abc import Sequence
from typing import Any

import kvikpy
from kvikpy import _display, _lib, defaults
from kvikpy._api import _device
from kvikpy._display import human_bytes
from kvikpy.errors import KvikpyError

__all__ = ["main"]

PROG = "kvikpy"
GB = 1e9  # throughputs are in decimal GB/s, as in docs/benchmarks.md
VERIFY_CHUNK = 64 << 20  # bytes hashed (and copied back from the GPU) at a time
SETUP_DIR = "/dev/shm"  # tmpfs: the setup read's sparse file costs neither disk nor memory
_SUFFIXES = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}


class CliError(Exception):
    """A failure to report as one line on stderr (exit status 1), without a traceback."""


# ---------------------------------------------------------------------------------------
# Arguments


def _positive_int(text: str) -> int:
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
    """Check a ``--device`` value: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``."""
    if text in ("auto", "cpu", "cuda") or (text.startswith("cuda:") and text[5:].isdigit()):
        return text
    raise argparse.ArgumentTypeError(f"expected auto, cpu, cuda or cuda:N, got {text!r}")


def _add_path_and_device(parser: argparse.ArgumentParser) -> None:
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


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``kvikpy`` and its ``bench`` and ``info`` subcommands."""
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="kvikpy: fast file reads into GPU and host memory.",
    )
    parser.add_argument("--version", action="version", version=f"kvikpy {kvikpy.__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="{bench,info,read}")

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
    _add_path_and_device(bench)
    bench.add_argument(
        "--threads",
        type=_positive_int,
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
        "--repeat", type=_positive_int, default=5, metavar="N", help="timed reads; default 5"
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

    read = sub.add_parser(
        "read",
        help="read PATH (or a byte range of it) once and report what arrived",
        description=(
            "Read PATH, or --size bytes of it at --offset, once with kvikpy.read into new "
            "host or GPU memory; print the size, the time and throughput (GB/s, 10^9 "
            "bytes/s), a CRC-32 of the bytes and the first --head of them in hex."
        ),
    )
    _add_path_and_device(read)
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

    info = sub.add_parser(
        "info",
        help="versions, CUDA devices, settings and library location",
        description="Print kvikpy's version, Python's, the platform, CUDA and its devices, "
        "the current settings and where the library was loaded from.",
    )
    info.add_argument("--json", action="store_true", help="print one JSON object")
    return parser


# ---------------------------------------------------------------------------------------
# bench


def _file_size(path: str, command: str = "bench") -> int:
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


def resolve_device(choice: str) -> tuple[str, int]:
    """Turn a ``--device`` value into a label and a CUDA ordinal (-1 for host memory).

    Parameters
    ----------
    choice
        ``auto``, ``cpu``, ``cuda`` or ``cuda:N``.

    Returns
    -------
    tuple[str, int]
        ``("cpu", -1)`` or ``("cuda:N", N)``.

    Raises
    ------
    CudaUnavailableError
        If a GPU is asked for and CUDA is unavailable.
    ValueError
        If the device does not exist.
    """
    if choice == "auto":
        choice = "cuda" if kvikpy.cuda_available() else "cpu"
    if choice == "cpu":
        return "cpu", -1
    ordinal = _device(choice, option="--device")
    return f"cuda:{ordinal}", ordinal


def _allocate(size: int, ordinal: int) -> Any:
    """A buffer of ``size`` bytes to read into, allocated and touched before any timing.

    A numpy array in host memory for ``ordinal == -1``, else a ``kvikpy.Buffer`` in the
    GPU's memory (allocated the way ``kvikpy.read`` allocates it).
    """
    if ordinal >= 0:
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
        for _ in range(runs):
            start = time.perf_counter()
            # With a bar, a future, so that the bar can follow its byte counter.
            got = f.read(buf, size) if meter is None else track(f.pread(buf, size)._handle, meter)
            seconds.append(time.perf_counter() - start)
            if got != size:
                raise CliError(f"{path} changed while being read: got {got} of {size} bytes")
    return seconds


def _crc32_of_buffer(buf: Any, size: int) -> int:
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


def _crc32_of_file(path: str) -> tuple[int, int]:
    """CRC-32 and size of ``path`` read with plain Python, in chunks."""
    crc, total = 0, 0
    chunk = bytearray(VERIFY_CHUNK)
    view = memoryview(chunk)
    with open(path, "rb", buffering=0) as f:
        while n := f.readinto(chunk):
            crc = zlib.crc32(view[:n], crc)
            total += n
    return crc, total


def _gbps(size: int, seconds: float) -> float:
    return size / max(seconds, 1e-9) / GB


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
    size = _file_size(path)
    label, ordinal = resolve_device(device)
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
    rates = [_gbps(size, s) for s in timed]
    result: dict[str, Any] = {
        "path": path,
        "size": size,
        "device": label,
        "threads": used_threads,
        "task_size": used_task_size,
        "repeat": repeat,
        "first_gbps": _gbps(size, first),
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
        got = _crc32_of_buffer(buf, size)
        expected, file_size = _crc32_of_file(path)
        result["crc32"], result["file_crc32"] = f"{got:08x}", f"{expected:08x}"
        result["verified"] = got == expected and file_size == size
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


def _bench_command(args: argparse.Namespace) -> int:
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


# ---------------------------------------------------------------------------------------
# read


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
    _file_size(path, "read")
    label, _ = resolve_device(device)
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
        "gbps": _gbps(n, seconds) if seconds > 0 else None,
        "crc32": f"{_crc32_of_buffer(buf, n):08x}",
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


def _read_command(args: argparse.Namespace) -> int:
    result = run_read(
        args.path, device=args.device, offset=args.offset, size=args.size, head=args.head
    )
    print(json.dumps(result) if args.json else format_read(result))
    return 0


# ---------------------------------------------------------------------------------------
# info


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
        (whether I/O resolves to POSIX rather than cuFile), ``settings`` and ``library``
        (the path of the loaded extension module).
    """
    available = kvikpy.cuda_available()
    count = kvikpy.device_count() if available else 0
    return {
        "kvikpy": kvikpy.__version__,
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "executable": sys.executable,
        "platform": platform.platform(),
        "cuda_available": available,
        "cuda_unavailable_reason": None if available else _lib.cuda_unavailable_reason(),
        "device_count": count,
        "devices": [f"cuda:{i}" for i in range(count)],
        "compat_mode_preferred": defaults.is_compat_mode_preferred(),
        "gpu_io": _display.backend(),
        "cufile": _display.cufile_note(str(_setting_value("compat_mode"))),
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
        f"library   {d['library']}",
        "settings",
    ]
    width = max(map(len, d["settings"]), default=0)
    lines += [f"  {name:<{width}}  {value}" for name, value in d["settings"].items()]
    return "\n".join(lines)


def _info_command(args: argparse.Namespace) -> int:
    d = collect_info()
    print(json.dumps(d) if args.json else format_info(d))
    return 0


# ---------------------------------------------------------------------------------------
# Entry point


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
    commands = {"bench": _bench_command, "info": _info_command, "read": _read_command}
    command = commands[args.command]
    try:
        return command(args)
    except (CliError, OSError, ValueError, KvikpyError) as exc:
        print(f"{PROG} {args.command}: error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"{PROG} {args.command}: interrupted", file=sys.stderr)
        return 130
