"""Every GPU of a host at once: what limits concurrent reads onto several GPUs, and how
close kvikpy comes to it.

Measured in one run, warm page cache, medians:

- pinned host-to-device copies on every GPU at once (one thread and one pinned buffer per
  GPU, released together), against one GPU alone;
- page-cache ``pread`` into pinned memory with kvikpy's engine at several thread counts
  (``--threads``), the host side's ceiling;
- kvikpy: one file per GPU read with ``read_many(files, device=[every GPU])`` against the
  same files read onto one GPU, at kvikpy's default thread count and at the others of
  ``--threads``. Every file's bytes are checked on its GPU.

Usage: python -m benchmarks multi_gpu [--file-mib 2048 --threads 16,24,32 --out m.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import threading
import time

import kvikpy
from benchmarks.common import scratch_dir, write_random_file
from kvikpy import _lib


def pinned_copies(gpus: list[int], nbytes: int, runs: int) -> float:
    """GB/s in all of one pinned host-to-device copy per GPU, all started together."""
    import torch

    pairs = []
    for g in gpus:
        with torch.cuda.device(g):
            pairs.append((torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{g}"),
                          torch.empty(nbytes, dtype=torch.uint8).pin_memory()))  # fmt: skip
    start = threading.Barrier(len(gpus) + 1)
    done = threading.Barrier(len(gpus) + 1)

    def copier(g: int, dev: object, host: object) -> None:
        with torch.cuda.device(g):
            for _ in range(1 + runs):
                start.wait()
                dev.copy_(host, non_blocking=True)  # type: ignore[attr-defined]
                torch.cuda.synchronize()
                done.wait()

    threads = [
        threading.Thread(target=copier, args=(g, *p)) for g, p in zip(gpus, pairs, strict=True)
    ]
    for t in threads:
        t.start()
    times = []
    for i in range(1 + runs):
        start.wait()
        t0 = time.perf_counter()
        done.wait()
        if i:
            times.append(time.perf_counter() - t0)
    for t in threads:
        t.join()
    return nbytes * len(gpus) / statistics.median(times) / 1e9


def host_bytes_sum(buf: object) -> int:
    """The sum of a buffer's bytes, computed where it lives (CuPy on a GPU)."""
    device = buf.device  # type: ignore[attr-defined]
    if device == "cpu":
        import numpy as np

        return int(np.frombuffer(memoryview(buf), dtype=np.uint8).sum(dtype=np.int64))  # type: ignore[call-overload]
    import cupy

    with cupy.cuda.Device(int(device.split(":")[1])):
        return int(cupy.from_dlpack(buf).sum(dtype=cupy.int64).item())


def kvikpy_reads(files: list[str], device: object, sums: list[int], runs: int) -> float:
    """GB/s of ``read_many(files, device=device)``, bytes checked."""
    total = sum(os.path.getsize(f) for f in files)
    times = []
    for i in range(1 + runs):
        t0 = time.perf_counter()
        batch = kvikpy.read_many(files, device=device)  # type: ignore[call-overload]
        times.append(time.perf_counter() - t0)
        if i == 0:
            assert [host_bytes_sum(b) for b in batch] == sums, "read the wrong bytes"
        del batch
    return total / statistics.median(times[1:]) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--file-mib", type=int, default=2048)
    parser.add_argument("--threads", default="16,24,32")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    counts = [int(t) for t in args.threads.split(",")]
    gpus = list(range(kvikpy.device_count() if kvikpy.cuda_available() else 0))
    n = args.file_mib << 20
    folder = scratch_dir("kvikpy-multi-")
    files = [os.path.join(folder, f"f{i}.bin") for i in range(max(len(gpus), 1))]
    sums = [write_random_file(f, n, seed=i) for i, f in enumerate(files)]
    results: dict[str, object] = {"gpus": len(gpus), "file_bytes": n, "files": len(files)}
    if gpus:
        results["pinned_h2d_1gpu_GBps"] = pinned_copies(gpus[:1], n, args.runs)
        results[f"pinned_h2d_{len(gpus)}gpu_GBps"] = pinned_copies(gpus, n, args.runs)
    for threads in counts:
        speeds = []
        for i in range(1 + args.runs):
            s, b, total = _lib.pread_ceiling(files[0], threads, 4 << 20, False, bool(gpus))
            assert b == n and total == sums[0], "ceiling read wrong bytes"
            if i:
                speeds.append(b / s / 1e9)
        results[f"pread_pinned_{threads}t_GBps"] = statistics.median(speeds)
    everyone = [f"cuda:{g}" for g in gpus] or ["cpu"]
    one = everyone[0]
    for threads in [None, *counts]:
        label = "default" if threads is None else f"{threads}t"
        with kvikpy.defaults.set({} if threads is None else {"num_threads": threads}):
            results[f"kvikpy_{label}_one_device_GBps"] = kvikpy_reads(files, one, sums, args.runs)
            results[f"kvikpy_{label}_all_devices_GBps"] = kvikpy_reads(
                files, everyone, sums, args.runs
            )
    results["default_num_threads"] = kvikpy.defaults.get("num_threads")
    for k, v in results.items():
        print(f"{k:>36}: {v:8.2f}" if isinstance(v, float) else f"{k:>36}: {v}")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(results, fh, indent=1)


if __name__ == "__main__":
    main()
