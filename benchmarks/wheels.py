"""Two builds of kvikpy side by side: the same workloads in alternating fresh processes,
one build per process, to show what an engine change costs or gains.

Each build is a folder a wheel was installed into (``pip install --target DIR``), or any
folder holding a ``kvikpy`` package, named on the command line as LABEL=DIR; the child
processes import kvikpy from it alone (and stop if it comes from anywhere else). The
workloads mirror the other benchmarks of this folder, kvikpy's side only:

* ``large``, ``large-1t``: ``kvikpy.read`` of a warm file (default 4 GiB) at default
  settings and on one I/O thread, GB/s (``large``);
* ``small-4k``, ``small-64k``, ``small-1m``: 2,000 files, one by one: open, ``CuFile.read``
  into the file's slice of one buffer, close; files/s (``small``);
* ``tiny-torch``, ``tiny-cupy``, ``tiny-host`` (the group ``tiny``): 2,000 ``CuFile.read``
  calls of 4 KiB at consecutive offsets of one open file, each into its slice of one torch
  tensor, CuPy array or numpy array (the per-call cost: context binding, intake, the
  inline path), reads/s (``percall-*`` of ``regimes``);
* ``write``: ``CuFile.write`` of ``--write-mib`` (1 GiB) from GPU memory (host memory
  with ``--device cpu``) to a new file at default settings, then ``os.sync()``, both
  inside the clock; the written file's checksum is verified; GB/s;
* ``batch-4k``, ``batch-64k``, ``batch-ranges``: ``read_many`` of the 4 KiB and 64 KiB
  files, ``read_ranges`` of 2,000 random 1 MiB ranges of the large file; files or ranges/s
  (``batch``);
* ``ranges-4k`` ... ``ranges-16m+1``: random 4 KiB, 64 KiB, 1 MiB and 16 MiB ranges of the
  large file at 4 KiB-aligned offsets (and offset + 1), one ``CuFile.read`` each through
  one open file; ranges/s (``ranges``; at most ``--range-budget-mib`` per run and size);
* ``checkpoint``: ``kvikpy.safetensors.load_file`` of a 2 GiB checkpoint of 256 tensors,
  GB/s (``checkpoint``), written with the ``safetensors`` package where installed;
* ``stream``: ``CuFile.raw_read_async`` of 1 GiB into a torch tensor on a torch stream,
  GB/s (GPU only).

Every timed run stops its clock after a device synchronisation; the first run is a
verified warm-up, and the last timed run's bytes are verified too, outside the clock,
against checksums of the data made when it was written (buffers that are read into again
are zeroed first, so a read that did nothing fails). Each workload's value is the median
of ``--runs`` runs in one process; over ``--rounds`` rounds (each runs every build once,
in alternating order) the table shows the median round and, in brackets, the lowest and
highest. ``--device cpu`` reads into host memory with no CUDA at all (for a smoke test).

Usage: python -m benchmarks wheels --build before=/tmp/a --build after=/tmp/b
    [--device cuda|cpu] [--only large,ranges] [--rounds 6] [--runs 5]
    [--out wheels.json] [--markdown wheels.md]
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import shlex
import statistics
import struct
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from benchmarks.common import scratch_dir, versions, write_random_file, write_report

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE = 4096
TINY = 2000
SMALL_SIZES = {"4k": 4 << 10, "64k": 64 << 10, "1m": 1 << 20}
BATCH_SIZES = ("4k", "64k")
RANGE_SIZES = {"4k": 4 << 10, "64k": 64 << 10, "1m": 1 << 20, "16m": 16 << 20}
BATCH_RANGE = 1 << 20

# name -> unit; the order is the table's. Names select by group with --only: "ranges"
# is every ranges-* row, "large" both large rows.
UNITS: dict[str, str] = {
    "large": "GB/s",
    "large-1t": "GB/s",
    **{f"small-{k}": "files/s" for k in SMALL_SIZES},
    "tiny-torch": "reads/s",
    "tiny-cupy": "reads/s",
    "tiny-host": "reads/s",
    "write": "GB/s",
    **{f"batch-{k}": "files/s" for k in BATCH_SIZES},
    "batch-ranges": "ranges/s",
    **{f"ranges-{k}{s}": "ranges/s" for k in RANGE_SIZES for s in ("", "+1")},
    "checkpoint": "GB/s",
    "checkpoint-into": "GB/s",
    "stream": "GB/s",
}
GPU_ONLY = {"stream", "tiny-torch", "tiny-cupy", "checkpoint-into"}
# Keys of a summary row besides the builds' labels.
RESERVED = {"unit", "what", "ratios", "spread", "beyond_spread"}


# ---------------------------------------------------------------------------------------
# The child: one build, every selected workload, one JSON line.


class _Host:
    """Host memory and numpy sums: no CUDA call at all."""

    kvikpy_device = "cpu"

    def name(self) -> str:
        return f"{os.cpu_count()} CPUs"

    def empty(self, n: int) -> Any:
        return np.empty(n, dtype=np.uint8)

    def zero(self, buf: Any) -> None:
        buf.fill(0)

    def sync(self) -> None:
        pass

    def total(self, data: Any) -> int:
        arr = data if isinstance(data, np.ndarray) else np.from_dlpack(data)
        return int(arr.view(np.uint8).sum(dtype=np.int64))

    def load_checkpoint(self, load_file: Callable[..., Any], path: str) -> dict[str, Any]:
        return dict(load_file(path, device="cpu", framework="numpy"))

    def state_total(self, state: dict[str, Any]) -> int:
        return sum(int(t.reshape(-1).view(np.uint8).sum(dtype=np.int64)) for t in state.values())


class _Cupy:
    """GPU memory through CuPy (the ``tiny-cupy`` workload); sums on the GPU."""

    def __init__(self) -> None:
        import cupy

        self.cupy = cupy

    def empty(self, n: int) -> Any:
        return self.cupy.empty(n, dtype=self.cupy.uint8)

    def zero(self, buf: Any) -> None:
        buf.fill(0)

    def sync(self) -> None:
        self.cupy.cuda.runtime.deviceSynchronize()

    def total(self, data: Any) -> int:
        return int(data.sum(dtype=self.cupy.int64))


class _Cuda:
    """GPU memory through torch; sums on the GPU."""

    kvikpy_device = "cuda"

    def __init__(self) -> None:
        import torch

        self.torch = torch

    def name(self) -> str:
        return f"{self.torch.cuda.get_device_name()}, {os.cpu_count()} CPUs"

    def empty(self, n: int) -> Any:
        return self.torch.empty(n, dtype=self.torch.uint8, device="cuda")

    def zero(self, buf: Any) -> None:
        buf.zero_()

    def sync(self) -> None:
        self.torch.cuda.synchronize()

    def total(self, data: Any) -> int:
        t = data if isinstance(data, self.torch.Tensor) else self.torch.from_dlpack(data)
        return int(t.view(self.torch.uint8).sum(dtype=self.torch.int64))

    def load_checkpoint(self, load_file: Callable[..., Any], path: str) -> dict[str, Any]:
        return dict(load_file(path, device="cuda"))

    def state_total(self, state: dict[str, Any]) -> int:
        torch = self.torch
        sums = [t.reshape(-1).view(torch.uint8).sum(dtype=torch.int64) for t in state.values()]
        return int(torch.stack(sums).sum()) if sums else 0


def _expect(work: str, got: int, want: int) -> None:
    if got != want:
        raise RuntimeError(f"{work}: wrong bytes (checksum {got}, the data's is {want})")


def _timed(
    mem: _Host | _Cuda | _Cupy,
    runs: int,
    run: Callable[[], Any],
    check: Callable[[Any], None],
    reset: Callable[[], None] | None = None,
) -> float:
    """Median seconds of ``runs`` timed calls of ``run`` after a verified warm-up; the
    last timed call's result is verified too. ``reset`` (zeroing a reused buffer) and the
    checks run outside the clock; the clock is read after a device synchronisation."""
    if reset:
        reset()
    check(run())  # warm up (contexts, pools, page cache) and verify the bytes
    times = []
    result = None
    for _ in range(runs):
        result = None  # free the previous result outside the clock
        if reset:
            reset()
        mem.sync()
        t = time.perf_counter()
        result = run()
        mem.sync()
        times.append(time.perf_counter() - t)
    check(result)
    return statistics.median(times)


def _fill(buf: Any, path: str) -> None:
    """Fill ``buf`` with the first bytes of ``path`` (random data, never all zeros)."""
    data = np.fromfile(path, dtype=np.uint8, count=len(buf))
    if isinstance(buf, np.ndarray):
        buf[:] = data
    else:  # a torch tensor on the GPU
        import torch

        buf.copy_(torch.from_numpy(data))


def _slices(buf: Any, count: int, size: int) -> list[Any]:
    return [buf[i * size : (i + 1) * size] for i in range(count)]


def run_workloads(
    kvikpy: Any, spec: dict[str, Any], mem: _Host | _Cuda, runs: int
) -> dict[str, float]:
    """Every workload in ``spec["workloads"]``, in order: name -> rate (see ``UNITS``)."""
    out: dict[str, float] = {}
    todo = spec["workloads"]
    dev = mem.kvikpy_device
    big, big_bytes = spec.get("big"), spec.get("big_bytes", 0)

    def timed(work: str, run: Callable[[], Any], want: int, reset: Any = None) -> float:
        return _timed(mem, runs, run, lambda r: _expect(work, mem.total(r), want), reset)

    if "large" in todo:
        out["large"] = (
            big_bytes / timed("large", lambda: kvikpy.read(big, device=dev), spec["big_sum"]) / 1e9
        )
    if "large-1t" in todo:
        with kvikpy.defaults.set(num_threads=1):
            t = timed("large-1t", lambda: kvikpy.read(big, device=dev), spec["big_sum"])
        out["large-1t"] = big_bytes / t / 1e9
    for key, files in spec.get("small", {}).items():
        paths, size = files["paths"], files["size"]
        if f"small-{key}" in todo:
            buf = mem.empty(len(paths) * size)
            views = _slices(buf, len(paths), size)

            def loop(paths: list[str] = paths, views: list[Any] = views, buf: Any = buf) -> Any:
                for p, view in zip(paths, views, strict=True):
                    with kvikpy.CuFile(p, "r") as f:
                        f.read(view)
                return buf

            t = timed(f"small-{key}", loop, files["sum"], lambda buf=buf: mem.zero(buf))
            out[f"small-{key}"] = len(paths) / t
            del buf, views
    for kind in ("torch", "cupy", "host"):
        work = f"tiny-{kind}"
        if work not in todo:
            continue
        into: Any = {"torch": mem, "cupy": _Cupy, "host": _Host}[kind]
        into = into() if isinstance(into, type) else into
        buf = into.empty(spec["tiny_count"] * PAGE)
        views = _slices(buf, spec["tiny_count"], PAGE)
        with kvikpy.CuFile(big, "r") as f:

            def tiny(f: Any = f, views: list[Any] = views, buf: Any = buf) -> Any:
                for i, view in enumerate(views):
                    f.read(view, file_offset=i * PAGE)
                return buf

            t = _timed(
                into,
                runs,
                tiny,
                lambda r, into=into, work=work: _expect(work, into.total(r), spec["tiny_sum"]),
                lambda buf=buf, into=into: into.zero(buf),
            )
        out[work] = len(views) / t
        del buf, views
    if "write" in todo:
        nbytes = spec["write_bytes"]
        src = mem.empty(nbytes)
        _fill(src, big)
        want = mem.total(src)
        target = spec["write_path"]

        def write() -> str:
            with kvikpy.CuFile(target, "w") as f:
                f.write(src)
            os.sync()
            return str(target)

        def written(path: str) -> None:
            data = np.memmap(path, dtype=np.uint8, mode="r")
            _expect("write", int(data.sum(dtype=np.int64)), want)
            del data

        def remove() -> None:
            if os.path.exists(target):
                os.unlink(target)
            os.sync()

        out["write"] = nbytes / _timed(mem, runs, write, written, remove) / 1e9
        remove()
        del src
    for key in BATCH_SIZES:
        if f"batch-{key}" in todo:
            files = spec["small"][key]

            def many(paths: list[str] = files["paths"]) -> Any:
                return kvikpy.read_many(paths, device=dev).buffer

            t = timed(f"batch-{key}", many, files["sum"])
            out[f"batch-{key}"] = len(files["paths"]) / t
    if "batch-ranges" in todo:
        pairs = [(o, BATCH_RANGE) for o in spec["batch_ranges"]["offsets"]]
        t = timed(
            "batch-ranges",
            lambda: kvikpy.read_ranges(big, pairs, device=dev).buffer,
            spec["batch_ranges"]["sum"],
        )
        out["batch-ranges"] = len(pairs) / t
    for name, ranges in spec.get("ranges", {}).items():
        size, offsets = ranges["size"], ranges["offsets"]
        buf = mem.empty(len(offsets) * size)
        views = _slices(buf, len(offsets), size)
        with kvikpy.CuFile(big, "r") as f:

            def reads(
                f: Any = f,
                views: list[Any] = views,
                offsets: Any = offsets,
                size: int = size,
                buf: Any = buf,
            ) -> Any:
                for view, off in zip(views, offsets, strict=True):
                    f.read(view, size, off)
                return buf

            t = timed(name, reads, ranges["sum"], lambda buf=buf: mem.zero(buf))
        out[name] = len(offsets) / t
        del buf, views
    if "checkpoint" in spec:
        from kvikpy.safetensors import load_file

        ckpt = spec["checkpoint"]

        def check_state(state: dict[str, Any]) -> None:
            if sorted(state) != sorted(ckpt["names"]):
                raise RuntimeError(f"checkpoint: loaded {len(state)} tensors, not the file's")
            _expect("checkpoint", mem.state_total(state), ckpt["sum"])

    if "checkpoint" in todo:
        t = _timed(mem, runs, lambda: mem.load_checkpoint(load_file, ckpt["path"]), check_state)
        out["checkpoint"] = ckpt["bytes"] / t / 1e9
    if "checkpoint-into" in todo:
        assert isinstance(mem, _Cuda)
        from kvikpy.safetensors import load_into

        # The targets: the checkpoint's own tensors on the GPU, zeroed before each load.
        targets = mem.load_checkpoint(load_file, ckpt["path"])

        def into() -> dict[str, Any]:
            load_into(targets, ckpt["path"])
            return targets

        def zero_targets() -> None:
            for tensor in targets.values():
                tensor.zero_()

        t = _timed(mem, runs, into, check_state, zero_targets)
        out["checkpoint-into"] = ckpt["bytes"] / t / 1e9
        del targets
    if "stream" in todo:
        assert isinstance(mem, _Cuda)
        nbytes = spec["stream_bytes"]
        buf = mem.empty(nbytes)
        stream = mem.torch.cuda.Stream()
        with kvikpy.CuFile(big, "r") as f:

            def ordered(f: Any = f) -> Any:
                future = f.raw_read_async(buf, stream, nbytes, 0)
                done = future.check_bytes_done()  # waits for the stream to reach it
                if done != nbytes:
                    raise RuntimeError(f"stream: read {done} bytes of {nbytes}")
                return buf

            t = timed("stream", ordered, spec["stream_sum"], lambda: mem.zero(buf))
        out["stream"] = nbytes / t / 1e9
        del buf
    return out


def child_main() -> None:
    """Entry point of a child process: ``SPEC BUILD DEVICE RUNS`` on the command line."""
    spec_path, build, device, runs = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    # Checked before importing: a folder without kvikpy would otherwise import whatever
    # copy is next on the path (a source tree without its compiled module fails oddly).
    package = os.path.join(build, "kvikpy", "__init__.py")
    if not os.path.exists(package):
        raise SystemExit(
            f"there is no kvikpy in {build}, so it would be imported from elsewhere, not from "
            f"the build folder: install a wheel there with pip install --target {build}"
        )
    import kvikpy

    where = os.path.abspath(kvikpy.__file__)
    if not where.startswith(os.path.join(os.path.abspath(build), "")):
        raise SystemExit(
            f"kvikpy was imported from {where}, not from the build folder {build}: install "
            f"the build there (pip install --no-deps --target {build} WHEEL)"
        )
    with open(spec_path) as fh:
        spec = json.load(fh)
    mem = _Cuda() if device == "cuda" else _Host()
    results = run_workloads(kvikpy, spec, mem, runs)
    info = {"file": where, "version": getattr(kvikpy, "__version__", "?")}
    print(json.dumps({"results": results, "kvikpy": info, "machine": mem.name()}))


CHILD = "from benchmarks.wheels import child_main; child_main()"


# ---------------------------------------------------------------------------------------
# The parent: the data, the rounds, the table.


def select(only: str | None, device: str) -> list[str]:
    """The workloads ``--only`` names (a name, or a group: ``ranges`` for every
    ``ranges-*``), in table order; every one the device supports without it."""
    names = [w for w in UNITS if device == "cuda" or w not in GPU_ONLY]
    if not only:
        return names
    wanted = [g.strip() for g in only.split(",") if g.strip()]
    chosen = [w for w in names if any(w == g or w.startswith(g + "-") for g in wanted)]
    unknown = [g for g in wanted if not any(w == g or w.startswith(g + "-") for w in names)]
    if unknown:
        raise ValueError(
            f"--only names {', '.join(unknown)}, which is no workload on device {device}; "
            f"choose from {', '.join(names)}"
        )
    return chosen


class _RangeSums:
    """Byte sums of any 4 KiB-multiple range of a file, from per-page prefix sums (one
    pass over the file) and the bytes of the unaligned edges."""

    def __init__(self, path: str) -> None:
        self.data = np.memmap(path, dtype=np.uint8, mode="r")
        pages = [
            self.data[at : at + (256 << 20)].reshape(-1, PAGE).sum(axis=1, dtype=np.int64)
            for at in range(0, len(self.data), 256 << 20)
        ]
        self.prefix = np.concatenate([[0], np.cumsum(np.concatenate(pages))])

    def __call__(self, offset: int, size: int) -> int:
        page, shift = divmod(offset, PAGE)
        assert size % PAGE == 0
        total = int(self.prefix[page + size // PAGE] - self.prefix[page])
        if shift:
            start = page * PAGE
            total -= int(self.data[start : start + shift].sum(dtype=np.int64))
            total += int(self.data[start + size : start + size + shift].sum(dtype=np.int64))
        return total


def write_safetensors(path: str, tensors: dict[str, np.ndarray], dtype: str, item: int) -> None:
    """Write ``tensors`` (raw bytes, each a 1-D tensor of ``dtype`` with ``item``-byte
    elements) in the safetensors format: an 8-byte header length, the JSON header padded
    with spaces to 8 bytes, the data. For machines without the ``safetensors`` package."""
    header, at = {}, 0
    for name, raw in tensors.items():
        header[name] = {
            "dtype": dtype,
            "shape": [raw.size // item],
            "data_offsets": [at, at + raw.size],
        }
        at += raw.size
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(text)) + text)
        for raw in tensors.values():
            raw.tofile(fh)


def write_checkpoint(path: str, nbytes: int, count: int, device: str) -> dict[str, Any]:
    """A checkpoint of ``count`` 2-byte-element tensors, ``nbytes`` in all (BF16 as
    benchmarks/checkpoint.py writes for the GPU; F16 on the host, where numpy must read
    it), written with the ``safetensors`` package where installed; what the child checks."""
    per = max(2, nbytes // count // 2 * 2)
    rng = np.random.default_rng(3)
    raw = {f"layer.{i}.weight": rng.integers(0, 256, per, dtype=np.uint8) for i in range(count)}
    total = sum(int(r.sum(dtype=np.int64)) for r in raw.values())
    dtype = "BF16" if device == "cuda" else "F16"
    try:
        import safetensors  # noqa: F401
    except ImportError:
        write_safetensors(path, raw, dtype, 2)
        writer = f"benchmarks.wheels.write_safetensors ({dtype})"
    else:
        if device == "cuda":
            import torch
            from safetensors.torch import save_file as save_torch

            save_torch({k: torch.from_numpy(r).view(torch.bfloat16) for k, r in raw.items()}, path)
            writer = "safetensors.torch.save_file (BF16)"
        else:
            from safetensors.numpy import save_file as save_numpy

            save_numpy({k: r.view(np.float16) for k, r in raw.items()}, path)
            writer = "safetensors.numpy.save_file (F16)"
    return {
        "path": path,
        "bytes": os.path.getsize(path),
        "names": sorted(raw),
        "sum": total,
        "writer": writer,
    }


def make_data(folder: str, args: argparse.Namespace, todo: list[str]) -> dict[str, Any]:
    """Write every file the selected workloads read; return the children's spec: paths,
    offsets and the checksums to verify against."""
    spec: dict[str, Any] = {"workloads": todo}
    groups = {w.split("-")[0] for w in todo}
    if groups & {"large", "tiny", "ranges", "stream", "write"} or "batch-ranges" in todo:
        big = os.path.join(folder, "big.bin")
        spec |= {"big": big, "big_bytes": args.size_mib << 20}
        spec["big_sum"] = write_random_file(big, args.size_mib << 20, seed=1)
        sums = _RangeSums(big)
        n = args.size_mib << 20
        spec["tiny_count"] = min(TINY, n // PAGE)
        spec["tiny_sum"] = sums(0, spec["tiny_count"] * PAGE)
        spec["write_bytes"] = min(args.write_mib << 20, n)
        spec["write_path"] = os.path.join(folder, "written.bin")
        spec["stream_bytes"] = min(args.stream_mib << 20, n)
        spec["stream_sum"] = sums(0, spec["stream_bytes"])
        rng = np.random.default_rng(2)

        def offsets(size: int, count: int, shift: int) -> list[int]:
            if n < size + PAGE:
                raise ValueError(
                    f"{size >> 10} KiB ranges need a larger file than {args.size_mib} MiB: "
                    "raise --size-mib"
                )
            pages = rng.integers(0, (n - size - 1) // PAGE, count)
            return [int(p) * PAGE + shift for p in pages]

        if "batch-ranges" in todo:
            at = offsets(BATCH_RANGE, args.ranges, 0)
            spec["batch_ranges"] = {"offsets": at, "sum": sum(sums(o, BATCH_RANGE) for o in at)}
        spec["ranges"] = {}
        for key, size in RANGE_SIZES.items():
            count = max(1, min(args.ranges, (args.range_budget_mib << 20) // size))
            for shift, suffix in ((0, ""), (1, "+1")):
                name = f"ranges-{key}{suffix}"
                if name in todo:
                    at = offsets(size, count, shift)
                    spec["ranges"][name] = {
                        "size": size,
                        "offsets": at,
                        "sum": sum(sums(o, size) for o in at),
                    }
        del sums
    if groups & {"small", "batch"}:
        spec["small"] = {}
        for key, size in SMALL_SIZES.items():
            if f"small-{key}" not in todo and f"batch-{key}" not in todo:
                continue
            sub = os.path.join(folder, f"small-{key}")
            os.mkdir(sub)
            paths = [os.path.join(sub, f"{i:05d}.bin") for i in range(args.files)]
            total = sum(write_random_file(p, size, seed=size + i) for i, p in enumerate(paths))
            spec["small"][key] = {"paths": paths, "size": size, "sum": total}
    if "checkpoint" in groups:
        path = os.path.join(folder, "model.safetensors")
        spec["checkpoint"] = write_checkpoint(
            path, args.checkpoint_mib << 20, args.checkpoint_tensors, args.device
        )
    return spec


def describe(spec: dict[str, Any], args: argparse.Namespace) -> dict[str, str]:
    """What each selected workload does, for the table's first column."""

    def mib(n: int) -> str:
        return f"{n >> 30} GiB" if n >= 1 << 30 and n % (1 << 30) == 0 else f"{n >> 20} MiB"

    big = mib(spec.get("big_bytes", 0))
    what = {
        "large": f"`kvikpy.read` of a warm {big} file, default settings",
        "large-1t": "the same on one I/O thread",
        "write": f"`CuFile.write` of {mib(spec.get('write_bytes', 0))} to a new file, then "
        "`os.sync()`",
        "batch-ranges": f"`read_ranges` of {args.ranges:,} random 1 MiB ranges of the {big} file",
        "stream": f"`CuFile.raw_read_async` of {mib(spec.get('stream_bytes', 0))}, a torch stream",
    }
    for kind, into in (("torch", "a torch tensor"), ("cupy", "a CuPy array"), ("host", "numpy")):
        what[f"tiny-{kind}"] = (
            f"{spec.get('tiny_count', 0):,} `CuFile.read` calls of 4 KiB, consecutive "
            f"offsets, into {into}"
        )
    for key in SMALL_SIZES:
        size = key.upper().replace("K", " KiB").replace("M", " MiB")
        what[f"small-{key}"] = (
            f"{args.files:,} files of {size} one by one: open, `CuFile.read`, close"
        )
        what[f"batch-{key}"] = f"`read_many` of {args.files:,} files of {size}"
    for name, ranges in spec.get("ranges", {}).items():
        size = (
            name.split("-")[1].removesuffix("+1").upper().replace("K", " KiB").replace("M", " MiB")
        )
        where = (
            "at 4 KiB-aligned offsets + 1" if name.endswith("+1") else "at 4 KiB-aligned offsets"
        )
        what[name] = (
            f"{len(ranges['offsets']):,} random {size} ranges {where}, one `CuFile.read` each"
        )
    if "checkpoint" in spec:
        ckpt = spec["checkpoint"]
        what["checkpoint"] = (
            f"`kvikpy.safetensors.load_file`, {mib(ckpt['bytes'])} checkpoint of "
            f"{len(ckpt['names'])} tensors"
        )
        what["checkpoint-into"] = (
            "`kvikpy.safetensors.load_into` of the same checkpoint into its tensors on the GPU"
        )
    return {w: what[w] for w in spec["workloads"]}


def summarise(
    results: dict[str, list[dict[str, float]]], units: dict[str, str], what: dict[str, str]
) -> dict[str, dict[str, Any]]:
    """Per workload: each build's median, lowest and highest round; each later build's
    median over the first's (``ratios``, keyed ``"after/before"``); the spread, the
    largest (highest - lowest) / median of any build; and whether a ratio loses more than
    that spread (``beyond_spread``)."""
    labels = list(results)
    summary: dict[str, dict[str, Any]] = {}
    for work in what:
        row: dict[str, Any] = {"unit": units[work], "what": what[work]}
        for label in labels:
            values = [run[work] for run in results[label]]
            row[label] = {
                "median": statistics.median(values),
                "min": min(values),
                "max": max(values),
            }
        row["spread"] = max((row[b]["max"] - row[b]["min"]) / row[b]["median"] for b in labels)
        first = labels[0]
        row["ratios"] = {
            f"{b}/{first}": row[b]["median"] / row[first]["median"] for b in labels[1:]
        }
        row["beyond_spread"] = {k: r < 1 - row["spread"] for k, r in row["ratios"].items()}
        summary[work] = row
    return summary


def number(value: float, scale: float) -> str:
    """``value`` rounded as ``scale`` (its row's largest median) reads best: 38.3, 412, 53,500
    (one decimal from 1 to 100, three significant digits above, two below 1)."""
    if scale >= 100:
        return f"{round(value, 2 - math.floor(math.log10(scale))):,.0f}"
    if scale >= 1:
        return f"{value:.1f}"
    places = 1 - math.floor(math.log10(scale)) if scale > 0 else 2
    return f"{value:.{places}f}"


def markdown(summary: dict[str, dict[str, Any]], labels: list[str], intro: str) -> str:
    """The table, with a paragraph naming the command, machine and method: ready to paste
    into docs/benchmarks.md."""
    first = labels[0]
    head = ["workload", "what", "unit", *labels, *(f"{b} / {first}" for b in labels[1:]), "spread"]
    lines = [intro, "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for work, row in summary.items():
        cells = [f"`{work}`", row["what"], row["unit"]]
        scale = max(row[label]["median"] for label in labels)  # one rounding per row
        for label in labels:
            m = row[label]
            low, mid, high = (number(m[k], scale) for k in ("min", "median", "max"))
            cells.append(f"{mid} ({low}-{high})")
        for key, ratio in row["ratios"].items():
            cells.append(
                f"**{ratio:.2f}** (loss beyond the spread)"
                if row["beyond_spread"][key]
                else f"{ratio:.2f}"
            )
        cells.append(f"{100 * row['spread']:.0f}%")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def parse_builds(specs: list[str]) -> dict[str, str]:
    builds: dict[str, str] = {}
    for item in specs:
        label, sep, folder = item.partition("=")
        if not sep or not label or not folder:
            raise ValueError(f"--build takes LABEL=DIR, got {item!r}")
        if label in builds or label in RESERVED or "/" in label:
            raise ValueError(f"--build label {label!r} is repeated, reserved or has a '/'")
        if not os.path.isdir(folder):
            raise ValueError(f"--build {label}: {folder!r} is not a folder")
        builds[label] = os.path.abspath(folder)
    return builds


def run_child(label: str, build: str, spec_path: str, args: argparse.Namespace) -> dict[str, Any]:
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join([build, REPO]),
        PYTHONSAFEPATH="1",
        KVIKIO_COMPAT_MODE="ON",
    )
    done = subprocess.run(
        [sys.executable, "-c", CHILD, spec_path, build, args.device, str(args.runs)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
        timeout=900,
    )
    if done.returncode:
        raise RuntimeError(f"build {label} ({build}): {done.stderr[-2000:]}")
    return dict(json.loads(done.stdout.strip().splitlines()[-1]))


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--build", action="append", required=True, help="LABEL=DIR, two or more")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--only", default=None, help="workloads or groups, comma-separated")
    parser.add_argument("--size-mib", type=int, default=4096, help="the large file")
    parser.add_argument("--files", type=int, default=2000, help="small files of each size")
    parser.add_argument("--ranges", type=int, default=2000, help="ranges per run")
    parser.add_argument("--range-budget-mib", type=int, default=1024, help="at most, per run")
    parser.add_argument("--checkpoint-mib", type=int, default=2048)
    parser.add_argument("--checkpoint-tensors", type=int, default=256)
    parser.add_argument("--stream-mib", type=int, default=1024)
    parser.add_argument("--write-mib", type=int, default=1024, help="the write workload")
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", default=None, help="the JSON results")
    parser.add_argument("--markdown", default=None, help="the table, also printed")
    args = parser.parse_args()
    try:
        builds = parse_builds(args.build)
        todo = select(args.only, args.device)
    except ValueError as e:
        parser.error(str(e))
    if len(builds) < 2:
        parser.error("compare at least two builds: --build before=DIR --build after=DIR")
    if args.size_mib < 1 or args.rounds < 1 or args.runs < 1 or args.files < 1 or args.ranges < 1:
        parser.error("--size-mib, --rounds, --runs, --files and --ranges must be at least 1")
    started = time.time()
    folder = scratch_dir("kvikpy-wheels-")
    try:
        spec = make_data(folder, args, todo)
    except ValueError as e:
        parser.error(str(e))
    spec_path = os.path.join(folder, "spec.json")
    with open(spec_path, "w") as fh:
        json.dump(spec, fh)
    print(f"data written in {time.time() - started:.0f} s", file=sys.stderr, flush=True)
    results: dict[str, list[dict[str, float]]] = {label: [] for label in builds}
    seen: dict[str, dict[str, str]] = {}
    machine = ""
    for r in range(args.rounds):
        order = list(builds) if r % 2 == 0 else list(reversed(builds))
        for label in order:
            t = time.time()
            got = run_child(label, builds[label], spec_path, args)
            results[label].append(got["results"])
            seen[label] = {"dir": builds[label], **got["kvikpy"]}
            machine = got["machine"]
            print(
                f"round {r + 1}/{args.rounds} {label}: {time.time() - t:.0f} s",
                file=sys.stderr,
                flush=True,
            )
    labels = list(builds)
    summary = summarise(results, UNITS, describe(spec, args))
    when = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M")
    raw = f"benchmarks/{os.path.basename(args.out)}" if args.out else None
    intro = (
        f"`python -m benchmarks wheels {shlex.join(sys.argv[1:])}` on {machine} "
        f"({'GPU' if args.device == 'cuda' else 'host'} memory), {when} UTC, "
        f"{time.time() - started:.0f} s in all; each build in its own fresh process per "
        f"round, alternating; each value the median of {args.runs} runs after a warm-up, "
        f"bytes verified outside the clock; the median of {args.rounds} rounds, the lowest "
        "and highest in brackets; spread: the larger (highest - lowest) / median of the "
        "builds." + (f" Raw: [{raw}]({raw})." if raw else "")
    )
    raw = {
        "versions": versions(),
        "args": vars(args),
        "device": args.device,
        "machine": machine,
        "measured_utc": when,
        "seconds": time.time() - started,
        "builds": seen,
        "checkpoint_writer": spec.get("checkpoint", {}).get("writer"),
        "summary": summary,
        "rounds": results,
    }
    write_report(markdown(summary, labels, intro), raw, args.markdown, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
