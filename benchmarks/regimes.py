"""kvikpy against kvikio in every regime at once: per-call reads, a loop over files,
writes, the first read of a process, and a 4 GiB file cold, warm and half warm.

Every measurement runs in its own fresh process (its own pools, no shared state), the
libraries alternate (A/B, then B/A in the next round), the first pass of a process is a
verified warm-up, clocks are read after a device synchronisation, and the bytes of every
timed pass are verified outside the clock against checksums of random data (never all
zeros; reused buffers are zeroed before each pass, so a read that did nothing fails).
Each value is the median over the rounds, with the lowest and highest in brackets.
kvikio runs with ``KVIKIO_COMPAT_MODE=ON`` (POSIX) like kvikpy.

Rows (``--only`` takes names or the groups ``percall``, ``large``):

* ``percall-torch``, ``percall-cupy``, ``percall-host``: 4,000 blocking 4 KiB
  ``CuFile.read`` calls at consecutive offsets of one open file, each into its slice of
  one torch tensor, CuPy array or numpy array; calls/s (and microseconds per call);
* ``files``: 2,000 files of 4 KiB, one by one: open, ``CuFile.read`` into the file's slice
  of one CuPy array (numpy with ``--device cpu``), close; files/s;
* ``write``: ``CuFile.write`` of 2 GiB of a CuPy array to a new file, then ``os.sync()``,
  both inside the clock, 16 threads (kvikio with ``--kvikio-task-mib`` tasks, kvikpy at its
  default task size); ``--write-rounds`` rounds; the written file's checksum is verified;
* ``write-mem``: the same write to a file in ``/dev/shm`` (a tmpfs, where O_DIRECT is
  refused and both libraries write through memory): the write pipeline's own speed,
  which a disk at its ceiling hides;
* ``first-read``: a fresh process imports CuPy and starts CUDA (context, a 1 MiB
  destination array, a synchronisation) before the clock, so the CUDA context's start-up
  is outside it for both; the clock covers ``import kvikpy`` (or ``kvikio``), opening
  the file and reading its first 1 MiB into the array, and a synchronisation; ms;
* ``warm``, ``half``, ``cold``: a ``--size-mib`` (4 GiB) file read into one CuPy array at
  16 threads by kvikpy at its default, forced buffered (``KVIKIO_AUTO_DIRECT_IO_READ=0``)
  and forced direct (``=1``), and by kvikio buffered and direct (its tasks
  ``--kvikio-task-mib``). Warm: the file in the page cache (the median of 3 passes);
  cold: ``sync; echo 3 > /proc/sys/vm/drop_caches`` before the one timed pass; half warm:
  dropped, then the first half read through the page cache and what the kernel read
  ahead past it evicted again (``posix_fadvise(DONTNEED)`` on the second half), so the
  second half is cold; the resident share of each half is recorded before the clock.
  ``--disk-rounds`` rounds of the half, cold and disk rows. Each process first reads a
  separate 64 MiB file (pools and pinned buffers warm). Dropping the page cache needs
  root: without it the cold and half rows are skipped with the reason (``--evict
  fadvise`` evicts the file alone with ``posix_fadvise`` instead);
* ``disk``: the disk's own ceiling in the same run: the cold file read with ``pread`` on
  an ``O_DIRECT`` descriptor by 16 threads, 4 MiB requests, into page-aligned memory;
* ``write-sweep`` (only when named, to choose kvikpy's write defaults from one run):
  kvikpy's write at task sizes of 4, 8, 16 and 32 MiB (``KVIKIO_TASK_SIZE``) with its
  default chunking (with many threads, a whole task per ``pwrite``), with 4 MiB chunks
  (``KVIKPY_WRITE_CHUNK_SIZE``, its chunking before), with the range preallocated first
  (``KVIKPY_WRITE_PREALLOCATE=1``) and through the page cache
  (``KVIKIO_AUTO_DIRECT_IO_WRITE=0``); kvikio at 4 MiB and ``--kvikio-task-mib`` tasks;
  and the disk's own write ceiling (16 threads, 16 MiB ``pwrite`` calls on an
  ``O_DIRECT`` descriptor, with and without ``fallocate`` first), all incl. ``os.sync()``.

``--device cpu`` (kvikpy only, host memory, no CUDA) is a smoke mode for machines without
a GPU. On the GPU machine, ``make gpu-bench-regimes`` installs the carried wheels and
writes ``regimes.json`` and ``regimes.md`` into ``$(BENCH_OUT)`` (about 6 minutes on an
H100 at the defaults).

Usage: python -m benchmarks regimes [--device cuda|cpu] [--only write,percall]
    [--rounds 3] [--write-rounds 5] [--disk-rounds 5] [--size-mib 4096] [--write-mib 2048]
    [--out regimes.json] [--markdown regimes.md]
"""

from __future__ import annotations

import argparse
import atexit
import concurrent.futures
import datetime
import itertools
import json
import mmap
import os
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from benchmarks.common import (
    run_child,
    scratch_dir,
    versions,
    warm_page_cache,
    write_random_file,
    write_report,
)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE = 4096
THREADS = 16
CEILING_REQUEST = 4 << 20
WARMUP_BYTES = 64 << 20
DROP_CACHES = "/proc/sys/vm/drop_caches"
SHM = "/dev/shm"  # a tmpfs on Linux: writes there cost the pipeline, not a disk

# name -> (unit, higher is better); the order is the report's.
ROWS: dict[str, tuple[str, bool]] = {
    "percall-torch": ("calls/s", True),
    "percall-cupy": ("calls/s", True),
    "percall-host": ("calls/s", True),
    "files": ("files/s", True),
    "write": ("GB/s", True),
    "write-mem": ("GB/s", True),
    "first-read": ("ms", False),
    "warm": ("GB/s", True),
    "half": ("GB/s", True),
    "cold": ("GB/s", True),
    "disk": ("GB/s", True),
    "write-sweep": ("GB/s", True),
}
GPU_ONLY = {"percall-torch", "percall-cupy"}
OPT_IN = {"write-sweep"}
GROUPS = {"percall": ["percall-torch", "percall-cupy", "percall-host"]}
GROUPS["large"] = ["warm", "half", "cold", "disk"]
STATES = ("warm", "half", "cold")
# The configurations of the large rows: label -> (library, KVIKIO_AUTO_DIRECT_IO_READ).
LARGE = {
    "kvikpy default": ("kvikpy", None),
    "kvikpy buffered": ("kvikpy", "0"),
    "kvikpy direct": ("kvikpy", "1"),
    "kvikio buffered": ("kvikio", "0"),
    "kvikio direct": ("kvikio", "1"),
}
SWEEP_TASKS_MIB = (4, 8, 16, 32)
SWEEP_CHUNK = 4 << 20

# ---------------------------------------------------------------------------------------
# The child: one measurement, one JSON line.


class _Mem:
    """One consumer library's buffers: ``torch``, ``cupy`` or ``numpy``; sums on the
    buffer's own device, and a synchronisation before every clock reading."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        if kind == "torch":
            import torch

            self.mod: Any = torch
            torch.empty(1, device="cuda")  # the context starts here, not in a clock
        elif kind == "cupy":
            import cupy

            self.mod = cupy
            cupy.empty(1, dtype=cupy.uint8)
        else:
            self.mod = np
        self.sync()

    def name(self) -> str:
        if self.kind == "torch":
            return f"{self.mod.cuda.get_device_name()}, {os.cpu_count()} CPUs"
        if self.kind == "cupy":
            props = self.mod.cuda.runtime.getDeviceProperties(0)
            return f"{props['name'].decode()}, {os.cpu_count()} CPUs"
        return f"{os.cpu_count()} CPUs, host memory"

    def empty(self, n: int) -> Any:
        if self.kind == "torch":
            return self.mod.empty(n, dtype=self.mod.uint8, device="cuda")
        return self.mod.empty(n, dtype=self.mod.uint8)

    def random(self, n: int) -> Any:
        """``n`` random bytes (made on the GPU, 256 MiB at a time, for CuPy)."""
        if self.kind != "cupy":
            return np.random.default_rng(7).integers(0, 256, n, dtype=np.uint8)
        cupy = self.mod
        out = cupy.empty(n, dtype=cupy.uint8)
        step = 256 << 20
        for at in range(0, n, step):
            part = cupy.random.randint(0, 256, min(step, n - at))  # int64, then bytes
            out[at : at + part.size] = part.astype(cupy.uint8)
            del part
        return out

    def zero(self, buf: Any) -> None:
        if self.kind == "torch":
            buf.zero_()
        else:
            buf.fill(0)

    def sync(self) -> None:
        if self.kind == "torch":
            self.mod.cuda.synchronize()
        elif self.kind == "cupy":
            self.mod.cuda.runtime.deviceSynchronize()

    def total(self, buf: Any) -> int:
        if self.kind == "torch":
            return int(buf.sum(dtype=self.mod.int64))
        return int(buf.sum(dtype=self.mod.int64))


def _check(what: str, got: int, want: int) -> None:
    if got != want:
        raise RuntimeError(f"{what}: wrong bytes (checksum {got}, the data's is {want})")


def _passes(
    mem: _Mem, runs: int, run: Callable[[], Any], check: Callable[[], None], reset: Any
) -> float:
    """Median seconds of ``runs`` timed calls of ``run`` after a verified warm-up; every
    timed call is verified outside the clock, with ``reset`` before each."""
    reset()
    run()
    check()
    times = []
    for _ in range(runs):
        reset()
        mem.sync()
        t = time.perf_counter()
        run()
        mem.sync()
        times.append(time.perf_counter() - t)
        check()
    return statistics.median(times)


def _import(lib: str) -> Any:
    if lib == "kvikpy":
        import kvikpy

        return kvikpy
    import kvikio
    import kvikio.defaults

    return kvikio


def _evict(path: str, how: str) -> None:
    """Drop ``path`` from the page cache: every clean page of the machine
    (``drop_caches``) or the file's alone (``fadvise``)."""
    os.sync()
    if how == "drop_caches":
        with open(DROP_CACHES, "w") as fh:
            fh.write("3\n")
    else:
        _evict_range(path, 0, 0)  # a length of 0: to the end of the file


def _read_buffered(path: str, nbytes: int) -> None:
    with open(path, "rb", buffering=0) as fh:
        left = nbytes
        while left > 0:
            got = fh.read(min(64 << 20, left))
            if not got:
                break
            left -= len(got)


def _evict_range(path: str, offset: int, length: int) -> None:
    """Drop ``length`` bytes at ``offset`` of ``path`` from the page cache."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, offset, length, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def _resident(path: str, offset: int, length: int) -> float:
    """The share of the pages of ``length`` bytes at ``offset`` of ``path`` in the page
    cache (``mincore`` on a private mapping, which touches no page)."""
    import ctypes

    page = mmap.PAGESIZE
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
    with (
        open(path, "rb") as fh,
        mmap.mmap(fh.fileno(), length, access=mmap.ACCESS_COPY, offset=offset) as m,
    ):
        pages = (length + page - 1) // page
        vec = (ctypes.c_ubyte * pages)()
        anchor = ctypes.c_char.from_buffer(m)
        try:
            if libc.mincore(ctypes.addressof(anchor), length, vec) != 0:
                raise OSError(ctypes.get_errno(), "mincore")
        finally:
            del anchor
        return sum(v & 1 for v in vec) / pages


def _ceiling(spec: dict[str, Any]) -> float:
    """O_DIRECT ``pread`` of the cold file by 16 threads, 4 MiB requests: GB/s."""
    path, n = spec["path"], spec["bytes"]
    _evict(path, spec["evict"])
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    offsets = itertools.count(0, CEILING_REQUEST)
    moved = [0] * THREADS

    def worker(k: int) -> None:
        buf = mmap.mmap(-1, CEILING_REQUEST)  # page-aligned, as O_DIRECT needs
        try:
            while (at := next(offsets)) < n:
                moved[k] += os.preadv(fd, [buf], at)
        finally:
            buf.close()

    try:
        t = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(THREADS) as pool:
            list(pool.map(worker, range(THREADS)))
        dt = time.perf_counter() - t
    finally:
        os.close(fd)
    if sum(moved) != n:
        raise RuntimeError(f"disk: O_DIRECT pread moved {sum(moved)} of {n} bytes")
    return n / dt / 1e9


def _raw_write(spec: dict[str, Any]) -> float:
    """The disk's own write ceiling: ``spec["bytes"]`` of random data written to a new
    file with ``pwrite`` on an ``O_DIRECT`` descriptor by 16 threads, ``spec["request"]``
    bytes each (after ``fallocate`` of the whole file with ``spec["preallocate"]``), then
    ``os.sync()``, all inside the clock; GB/s. The file's checksum is verified."""
    n, request, out = spec["bytes"], spec["request"], spec["path"]
    block = mmap.mmap(-1, request)  # page-aligned, as O_DIRECT needs
    block.write(np.random.default_rng(9).integers(0, 256, request, dtype=np.uint8).tobytes())
    offsets = itertools.count(0, request)
    os.sync()
    t = time.perf_counter()
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_DIRECT, 0o644)
    try:
        if spec["preallocate"]:
            os.posix_fallocate(fd, 0, n)

        def worker(_: int) -> None:
            while (at := next(offsets)) < n:
                size = min(request, n - at)
                if size % PAGE:
                    raise RuntimeError("the raw write needs a size of whole 4 KiB pages")
                with memoryview(block) as whole, whole[:size] as view:
                    if os.pwrite(fd, view, at) != size:
                        raise RuntimeError(f"short O_DIRECT pwrite at {at}")

        with concurrent.futures.ThreadPoolExecutor(THREADS) as pool:
            list(pool.map(worker, range(THREADS)))
    finally:
        os.close(fd)
    os.sync()
    dt = time.perf_counter() - t
    whole, rest = divmod(n, request)
    one = np.frombuffer(block, dtype=np.uint8)
    want = whole * int(one.sum(dtype=np.int64)) + int(one[:rest].sum(dtype=np.int64))
    written = np.memmap(out, dtype=np.uint8, mode="r")
    _check("raw write", int(written.sum(dtype=np.int64)), want)
    del written, one
    os.unlink(out)
    return n / dt / 1e9


def child_main() -> None:
    """Entry point of a child process: its spec as JSON on the command line."""
    spec = json.loads(sys.argv[1])
    row, lib_name = spec["row"], spec["lib"]
    if row == "disk":
        print(json.dumps({"value": _ceiling(spec), "info": {}}))
        return
    if lib_name == "none":
        print(json.dumps({"value": _raw_write(spec), "info": {}}))
        return
    mem = _Mem(spec["mem"])
    if row == "first-read":
        dest = mem.empty(spec["size"])
        mem.sync()
        t = time.perf_counter()
        lib = _import(lib_name)
        with lib.CuFile(spec["path"], "r") as f:
            f.read(dest)
        mem.sync()
        dt = time.perf_counter() - t
        _check("first-read", mem.total(dest), spec["sum"])
        print(json.dumps({"value": dt * 1e3, "info": _info(lib, mem)}))
        return
    lib = _import(lib_name)
    if spec.get("settings"):
        lib.defaults.set(spec["settings"])
    value: float
    extra: dict[str, Any] = {}
    if row.startswith("percall"):
        count, size = spec["count"], spec["size"]
        buf = mem.empty(count * size)
        views = [buf[i * size : (i + 1) * size] for i in range(count)]
        with lib.CuFile(spec["path"], "r") as f:

            def calls() -> None:
                for i, view in enumerate(views):
                    f.read(view, size, i * size)

            t = _passes(
                mem,
                spec["runs"],
                calls,
                lambda: _check(row, mem.total(buf), spec["sum"]),
                lambda: mem.zero(buf),
            )
        value = count / t
    elif row == "files":
        paths, size = spec["paths"], spec["size"]
        buf = mem.empty(len(paths) * size)
        views = [buf[i * size : (i + 1) * size] for i in range(len(paths))]

        def loop() -> None:
            for p, view in zip(paths, views, strict=True):
                with lib.CuFile(p, "r") as f:
                    f.read(view)

        t = _passes(
            mem,
            spec["runs"],
            loop,
            lambda: _check(row, mem.total(buf), spec["sum"]),
            lambda: mem.zero(buf),
        )
        value = len(paths) / t
    elif row in ("write", "write-sweep", "write-mem"):
        value = _write(lib, mem, spec)
    else:
        value = _large(lib, mem, spec, extra)
    print(json.dumps({"value": value, "info": _info(lib, mem) | extra}))


def _info(lib: Any, mem: _Mem) -> dict[str, Any]:
    return {
        "machine": mem.name(),
        "version": getattr(lib, "__version__", "?"),
        "num_threads": lib.defaults.get("num_threads"),
        "task_size": lib.defaults.get("task_size"),
        "auto_direct_io_read": lib.defaults.get("auto_direct_io_read"),
        "auto_direct_io_write": lib.defaults.get("auto_direct_io_write"),
    }


def _write(lib: Any, mem: _Mem, spec: dict[str, Any]) -> float:
    """GB/s of one write of ``spec["bytes"]`` from ``mem`` to a new file, ``os.sync()``
    inside the clock, after a 64 MiB warm-up write; the file's checksum is verified."""
    n = spec["bytes"]
    src = mem.random(n)
    want = mem.total(src)
    out = spec["path"]
    with lib.CuFile(out, "w") as f:  # warm-up: pools, pinned buffers, O_DIRECT descriptor
        f.write(src[: min(n, WARMUP_BYTES)])
    os.unlink(out)
    os.sync()
    mem.sync()
    t = time.perf_counter()
    with lib.CuFile(out, "w") as f:
        got = f.write(src)
    os.sync()
    dt = time.perf_counter() - t
    if got != n:
        raise RuntimeError(f"write: wrote {got} of {n} bytes")
    written = np.memmap(out, dtype=np.uint8, mode="r")
    _check("write", int(written.sum(dtype=np.int64)), want)
    del written
    os.unlink(out)
    return n / dt / 1e9


def _large(lib: Any, mem: _Mem, spec: dict[str, Any], info: dict[str, Any]) -> float:
    """GB/s of reading the large file in state ``spec["row"]`` (see the module docs); the
    resident share of each half before the (last) timed pass goes into ``info``."""
    path, n, state = spec["path"], spec["bytes"], spec["row"]
    warm = mem.empty(spec["warmup_bytes"])
    with lib.CuFile(spec["warmup"], "r") as f:
        f.read(warm)
    mem.sync()
    _check("warm-up", mem.total(warm), spec["warmup_sum"])
    del warm
    buf = mem.empty(n)

    if state == "warm":
        warm_page_cache(path)  # and every timed read keeps it there

    def once() -> float:
        mem.zero(buf)
        if state != "warm":
            _evict(path, spec["evict"])
            if state == "half":
                _read_buffered(path, n // 2)
                _evict_range(path, n // 2, n - n // 2)
            info["resident_halves"] = [
                round(_resident(path, 0, n // 2), 4),
                round(_resident(path, n // 2, n - n // 2), 4),
            ]
        mem.sync()
        t = time.perf_counter()
        with lib.CuFile(path, "r") as f:
            got = f.read(buf)
        mem.sync()
        dt = time.perf_counter() - t
        if got != n:
            raise RuntimeError(f"{state}: read {got} of {n} bytes")
        _check(state, mem.total(buf), spec["sum"])
        return dt

    runs = 3 if state == "warm" else 1
    return n / statistics.median(once() for _ in range(runs)) / 1e9


CHILD = "from benchmarks.regimes import child_main; child_main()"


# ---------------------------------------------------------------------------------------
# The parent: the data, the rounds, the tables.


def select(only: str | None, device: str) -> list[str]:
    """The rows ``--only`` names (names or groups), in report order; without it every row
    the device has but the opt-in ones."""
    names = [r for r in ROWS if device == "cuda" or r not in GPU_ONLY]
    if not only:
        return [r for r in names if r not in OPT_IN]
    wanted = [g.strip() for g in only.split(",") if g.strip()]
    unknown = [g for g in wanted if g not in names and g not in GROUPS]
    if unknown:
        raise ValueError(
            f"--only names {', '.join(unknown)}, which is no row on device {device}; choose "
            f"from {', '.join(names)} or the groups {', '.join(GROUPS)}"
        )
    chosen = {r for g in wanted for r in GROUPS.get(g, [g])}
    return [r for r in names if r in chosen]


def evict_method(requested: str, drop_caches: str = DROP_CACHES) -> tuple[str | None, str]:
    """How cold rows evict the page cache, or ``None`` with the reason they are skipped
    (``drop_caches`` is tried once: writing to it drops the caches)."""
    if requested == "fadvise":
        return "fadvise", "the file alone evicted with posix_fadvise(DONTNEED)"
    try:
        os.sync()
        with open(drop_caches, "w") as fh:
            fh.write("3\n")
    except OSError as e:
        return None, f"dropping the page cache is not permitted here ({drop_caches}: {e})"
    return "drop_caches", f"sync; echo 3 > {drop_caches}"


def configs(row: str, device: str, args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The configurations one row compares: label -> library, settings, environment."""
    libs = ["kvikpy", "kvikio"] if device == "cuda" and not args.no_kvikio else ["kvikpy"]
    kvikio_task = args.kvikio_task_mib << 20
    if row in STATES:
        return {
            label: {
                "lib": lib,
                "settings": {"num_threads": THREADS}
                | ({"task_size": kvikio_task} if lib == "kvikio" else {}),
                "env": {"KVIKIO_AUTO_DIRECT_IO_READ": direct},
            }
            for label, (lib, direct) in LARGE.items()
            if lib in libs
        }
    if row == "disk":
        return {"O_DIRECT pread": {"lib": "none", "settings": {}, "env": {}}}
    if row in ("write", "write-mem"):
        return {
            lib: {
                "lib": lib,
                "settings": {"num_threads": THREADS}
                | ({"task_size": kvikio_task} if lib == "kvikio" else {}),
                "env": {},
            }
            for lib in libs
        }
    if row == "write-sweep":
        return sweep_configs(libs, args)
    return {lib: {"lib": lib, "settings": {}, "env": {}} for lib in libs}


def sweep_configs(libs: list[str], args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The write sweep: kvikpy's write at each task size with its default chunking (a
    whole task per pwrite with many threads), with 4 MiB chunks (its chunking before),
    with its range preallocated (``KVIKPY_WRITE_PREALLOCATE``), and through the page cache
    (``KVIKIO_AUTO_DIRECT_IO_WRITE=0``: the kernel's writeback under ``os.sync()``);
    kvikio at its default and at ``--kvikio-task-mib`` tasks; and the disk's O_DIRECT
    ceiling with and without ``fallocate``."""
    out: dict[str, dict[str, Any]] = {}

    def kvikpy(label: str, mib: int, **knobs: str) -> None:
        env: dict[str, str | None] = {
            "KVIKIO_TASK_SIZE": str(mib << 20),
            "KVIKIO_AUTO_DIRECT_IO_WRITE": "1",
            "KVIKPY_WRITE_CHUNK_SIZE": None,
            "KVIKPY_WRITE_PREALLOCATE": None,
        }
        out[f"kvikpy {mib} MiB tasks{label}"] = {
            "lib": "kvikpy",
            "settings": {"num_threads": THREADS},
            "env": env | knobs,
        }

    for mib in SWEEP_TASKS_MIB:
        kvikpy("", mib)
    for mib in SWEEP_TASKS_MIB[1:]:
        kvikpy(f", {SWEEP_CHUNK >> 20} MiB chunks", mib, KVIKPY_WRITE_CHUNK_SIZE=str(SWEEP_CHUNK))
    for mib in (4, 16):
        kvikpy(", preallocated", mib, KVIKPY_WRITE_PREALLOCATE="1")
    for mib in (4, 16):
        kvikpy(", buffered", mib, KVIKIO_AUTO_DIRECT_IO_WRITE="0")
    if "kvikio" in libs:
        for mib in sorted({4, args.kvikio_task_mib}):
            out[f"kvikio {mib} MiB tasks"] = {
                "lib": "kvikio",
                "settings": {"num_threads": THREADS, "task_size": mib << 20},
                "env": {},
            }
    for pre in (False, True):
        label = "O_DIRECT pwrite, 16 threads, 16 MiB requests" + (", fallocate" if pre else "")
        out[label] = {"lib": "none", "settings": {}, "env": {}, "raw": pre}
    return out


def make_data(folder: str, args: argparse.Namespace, todo: list[str]) -> dict[str, Any]:
    """Write every file the selected rows read; return what the children need."""
    data: dict[str, Any] = {}
    if any(r.startswith("percall") for r in todo):
        path = os.path.join(folder, "percall.bin")
        data["percall"] = {
            "path": path,
            "count": args.calls,
            "size": PAGE,
            "sum": write_random_file(path, args.calls * PAGE, seed=2),
        }
    if "files" in todo:
        sub = os.path.join(folder, "files")
        os.mkdir(sub)
        paths = [os.path.join(sub, f"{i:05d}.bin") for i in range(args.files)]
        total = sum(write_random_file(p, PAGE, seed=100 + i) for i, p in enumerate(paths))
        data["files"] = {"paths": paths, "size": PAGE, "sum": total}
    if "first-read" in todo:
        path = os.path.join(folder, "first.bin")
        write_random_file(path, 4 << 20, seed=3)
        size = 1 << 20
        head = np.fromfile(path, dtype=np.uint8, count=size)
        data["first-read"] = {"path": path, "size": size, "sum": int(head.sum(dtype=np.int64))}
    if any(r in todo for r in (*STATES, "disk")):
        path = os.path.join(folder, "big.bin")
        n = args.size_mib << 20
        data["large"] = {"path": path, "bytes": n, "sum": write_random_file(path, n, seed=1)}
        warm = os.path.join(folder, "warmup.bin")
        wn = min(WARMUP_BYTES, n)
        data["large"] |= {
            "warmup": warm,
            "warmup_bytes": wn,
            "warmup_sum": write_random_file(warm, wn, seed=4),
        }
        warm_page_cache(warm)
    if "write" in todo or "write-sweep" in todo:
        data["write"] = {"path": os.path.join(folder, "written.bin"), "bytes": args.write_mib << 20}
    if "write-mem" in todo:
        shm = tempfile.mkdtemp(prefix="kvikpy-regimes-", dir=SHM)
        atexit.register(shutil.rmtree, shm, ignore_errors=True)
        data["write-mem"] = {
            "path": os.path.join(shm, "written.bin"),
            "bytes": args.write_mib << 20,
        }
    return data


def child_spec(row: str, config: dict[str, Any], data: dict[str, Any], args: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"row": row, "lib": config["lib"], "settings": config["settings"]}
    spec["mem"] = "numpy" if args.device == "cpu" else "cupy"
    if row.startswith("percall"):
        spec |= data["percall"] | {"runs": args.runs}
        spec["mem"] = {"percall-torch": "torch", "percall-cupy": "cupy"}.get(row, "numpy")
    elif row == "files":
        spec |= data["files"] | {"runs": args.runs}
    elif row == "first-read":
        spec |= data["first-read"]
    elif row == "write-mem":
        spec |= data["write-mem"]
    elif row in ("write", "write-sweep"):
        spec |= data["write"]
        if "raw" in config:
            spec |= {"request": 16 << 20, "preallocate": config["raw"]}
    else:
        spec |= data["large"] | {"evict": args.evict_method}
    return spec


def run_one(row: str, config: dict[str, Any], data: dict[str, Any], args: Any) -> dict[str, Any]:
    """One measurement in a fresh process."""
    env = {"PYTHONPATH": os.pathsep.join(filter(None, [os.environ.get("PYTHONPATH"), REPO]))}
    env |= {k: v for k, v in config["env"].items()}
    spec = json.dumps(child_spec(row, config, data, args))
    return dict(run_child(CHILD, spec, what=f"{row} ({config['lib']})", timeout=600, env=env))


def summary_of(values: list[float]) -> dict[str, float]:
    return {"median": statistics.median(values), "min": min(values), "max": max(values)}


def fmt(value: float) -> str:
    if value >= 1000:
        return f"{value:,.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def cell(s: dict[str, float]) -> str:
    return f"{fmt(s['median'])} ({fmt(s['min'])}-{fmt(s['max'])})"


def ratio(a: dict[str, float], b: dict[str, float], higher: bool) -> float:
    """How much better ``a`` is than ``b``: above 1 when ``a`` wins."""
    return a["median"] / b["median"] if higher else b["median"] / a["median"]


def markdown(report: dict[str, Any]) -> str:
    """The report's tables, ready for docs/benchmarks.md."""
    rows, lines = report["rows"], [report["intro"], ""]
    pair = [r for r in rows if r not in (*STATES, "disk", "write-sweep")]
    if pair:
        lines += [
            "| row | what | unit | kvikpy | kvikio | kvikpy / kvikio |",
            "|---|---|---|---|---|---|",
        ]
        for r in pair:
            got = rows[r]["configs"]
            unit, higher = ROWS[r]
            kp, ko = got.get("kvikpy"), got.get("kvikio")
            extra = ""
            if unit == "calls/s" and kp:
                extra = f" ({1e6 / kp['median']:.1f} us/call"
                extra += f" vs {1e6 / ko['median']:.1f})" if ko else ")"
            lines.append(
                f"| `{r}` | {rows[r]['what']} | {unit} | {cell(kp) if kp else '-'}{extra} | "
                f"{cell(ko) if ko else '-'} | "
                f"{f'{ratio(kp, ko, higher):.2f}x' if kp and ko else '-'} |"
            )
        lines.append("")
    states = [r for r in STATES if r in rows]
    if states:
        labels = list(rows[states[0]]["configs"])
        head = ["state", *labels, "default / best forced kvikpy", "default / best kvikio"]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r in states:
            got = rows[r]["configs"]
            d = got["kvikpy default"]
            forced = [got[k] for k in ("kvikpy buffered", "kvikpy direct") if k in got]
            kvikio = [got[k] for k in ("kvikio buffered", "kvikio direct") if k in got]
            best_f = max(forced, key=lambda s: s["median"]) if forced else None
            best_k = max(kvikio, key=lambda s: s["median"]) if kvikio else None
            cells = [f"`{r}` ({rows[r]['what']})", *(cell(got[k]) for k in labels)]
            cells.append(f"{ratio(d, best_f, True):.2f}x" if best_f else "-")
            cells.append(f"{ratio(d, best_k, True):.2f}x" if best_k else "-")
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
        for r in states:
            halves = rows[r].get("resident_halves")
            if halves:
                first = [h[0] for h in halves]
                second = [h[1] for h in halves]
                lines += [
                    f"`{r}`: resident before the clock, first half "
                    f"{min(first):.1%}-{max(first):.1%}, second half "
                    f"{min(second):.1%}-{max(second):.1%}.",
                    "",
                ]
    if "disk" in rows:
        s = rows["disk"]["configs"]["O_DIRECT pread"]
        lines += [f"Disk ceiling ({rows['disk']['what']}): {cell(s)} GB/s.", ""]
    if "write-sweep" in rows:
        lines += ["| write configuration | GB/s |", "|---|---|"]
        for label, s in rows["write-sweep"]["configs"].items():
            lines.append(f"| {label} | {cell(s)} |")
        lines.append("")
    for r, why in report["skipped"].items():
        lines.append(f"`{r}` skipped: {why}.")
    return "\n".join(lines).rstrip() + "\n"


def describe(row: str, args: argparse.Namespace, data: dict[str, Any]) -> str:
    size = f"{args.size_mib >> 10} GiB" if args.size_mib % 1024 == 0 else f"{args.size_mib} MiB"
    mem = "host" if args.device == "cpu" else "CuPy"
    return {
        "percall-torch": f"{args.calls:,} `CuFile.read` calls of 4 KiB into one torch tensor",
        "percall-cupy": f"{args.calls:,} `CuFile.read` calls of 4 KiB into one CuPy array",
        "percall-host": f"{args.calls:,} `CuFile.read` calls of 4 KiB into one numpy array",
        "files": f"{args.files:,} files of 4 KiB: open, read into {mem} memory, close",
        "write": f"{args.write_mib} MiB from {mem} memory to a new file incl. `os.sync()`, "
        f"{THREADS} threads (kvikio {args.kvikio_task_mib} MiB tasks)",
        "write-mem": f"{args.write_mib} MiB from {mem} memory to a new file in {SHM} (tmpfs: "
        f"the write pipeline without the disk) incl. `os.sync()`, {THREADS} threads (kvikio "
        f"{args.kvikio_task_mib} MiB tasks)",
        "first-read": "import, open, first 1 MiB onto the GPU (CUDA started before the clock)"
        if args.device == "cuda"
        else "import, open, first 1 MiB into host memory",
        "warm": f"{size} in the page cache",
        "half": f"{size}, its first half in the page cache",
        "cold": f"{size}, page cache dropped",
        "disk": f"O_DIRECT pread of the cold {size} file, {THREADS} threads, 4 MiB requests",
        "write-sweep": f"kvikpy's {args.write_mib} MiB write at several task and chunk sizes",
    }[row]


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--only", default=None, help="rows or groups, comma-separated")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of most rows")
    parser.add_argument("--write-rounds", type=int, default=5, help="rounds of write rows")
    parser.add_argument(
        "--disk-rounds", type=int, default=5, help="rounds of the half, cold and disk rows"
    )
    parser.add_argument("--runs", type=int, default=5, help="timed passes per process")
    parser.add_argument("--size-mib", type=int, default=4096, help="the large file")
    parser.add_argument("--write-mib", type=int, default=2048)
    parser.add_argument("--calls", type=int, default=4000, help="per-call reads per pass")
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--kvikio-task-mib", type=int, default=16)
    parser.add_argument("--evict", choices=("drop_caches", "fadvise"), default="drop_caches")
    parser.add_argument("--drop-caches", default=DROP_CACHES, help=argparse.SUPPRESS)
    parser.add_argument("--no-kvikio", action="store_true", help="kvikpy's side only")
    parser.add_argument("--out", default=None, help="the JSON results")
    parser.add_argument("--markdown", default=None, help="the tables, also printed")
    args = parser.parse_args()
    try:
        todo = select(args.only, args.device)
    except ValueError as e:
        parser.error(str(e))
    counts = (
        args.rounds,
        args.write_rounds,
        args.disk_rounds,
        args.runs,
        args.size_mib,
        args.write_mib,
    )
    if min(*counts, args.calls, args.files, args.kvikio_task_mib) < 1:
        parser.error("every count and size must be at least 1")
    started = time.time()
    skipped: dict[str, str] = {}
    args.evict_method, how = evict_method(args.evict, args.drop_caches)
    if args.evict_method is None:
        for r in ("half", "cold", "disk"):
            if r in todo:
                todo.remove(r)
                skipped[r] = how
    folder = scratch_dir("kvikpy-regimes-")
    data = make_data(folder, args, todo)
    print(f"data written in {time.time() - started:.0f} s", file=sys.stderr, flush=True)
    results: dict[str, dict[str, list[float]]] = {r: {} for r in todo}
    infos: dict[str, dict[str, Any]] = {}
    resident: dict[str, list[list[float]]] = {}
    machine = ""

    def rounds_of(row: str) -> int:
        if row in ("write", "write-mem", "write-sweep", "first-read"):
            return int(args.write_rounds)
        if row in ("half", "cold", "disk"):
            return int(args.disk_rounds)
        return int(args.rounds)

    for k in range(max(rounds_of(r) for r in todo) if todo else 0):
        for row in todo:
            if k >= rounds_of(row):
                continue
            todo_configs = list(configs(row, args.device, args).items())
            for label, config in todo_configs if k % 2 == 0 else reversed(todo_configs):
                got = run_one(row, config, data, args)
                results[row].setdefault(label, []).append(got["value"])
                if got["info"]:
                    infos[f"{row}/{label}"] = got["info"]
                    machine = got["info"]["machine"]
                    if "resident_halves" in got["info"]:
                        resident.setdefault(row, []).append(got["info"]["resident_halves"])
        print(f"round {k + 1}: {time.time() - started:.0f} s", file=sys.stderr, flush=True)
    rows = {
        r: {
            "unit": ROWS[r][0],
            "what": describe(r, args, data),
            "configs": {label: summary_of(v) for label, v in results[r].items()},
            "values": results[r],
        }
        | ({"resident_halves": resident[r]} if r in resident else {})
        for r in todo
    }
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M")
    vers = versions()
    intro = (
        f"`python -m benchmarks regimes {shlex.join(sys.argv[1:])}` on {machine}, {when} UTC, "
        f"{time.time() - started:.0f} s in all; kvikpy {vers.get('kvikpy', '?')}, kvikio "
        f"{vers.get('kvikio-cu13', vers.get('libkvikio-cu13', 'not installed'))}; every "
        "measurement in its own fresh process, the libraries alternating, a verified warm-up "
        "first, the bytes of every timed pass verified; the median of "
        f"{args.rounds} rounds ({args.write_rounds} for writes and the first read, "
        f"{args.disk_rounds} for the half-warm, cold and disk rows), lowest "
        f"and highest in brackets; cold: {how}."
    )
    report = {"intro": intro, "rows": rows, "skipped": skipped}
    raw = {
        "versions": vers,
        "args": vars(args),
        "machine": machine,
        "measured_utc": when,
        "seconds": time.time() - started,
        "settings_seen": infos,
        **report,
    }
    write_report(markdown(report), raw, args.markdown, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
