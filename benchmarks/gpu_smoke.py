"""Quick GPU-path measurements: per-call overhead of small reads, and warm large-read
throughput to the device against the pinned host-to-device ceiling, all in one process.

Usage: python benchmarks/gpu_smoke.py [--size-mib N] [--out FILE.json]
Timing: CUDA synchronised before each clock read, warm-ups first, medians reported,
bytes verified against the file.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import tempfile
import time

import numpy as np
import torch

import kvikpy


def median_time(fn, repeats: int, warmup: int = 2) -> tuple[float, float, float]:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t0)
    return statistics.median(times), min(times), max(times)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size-mib", type=int, default=2048)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    results: dict[str, object] = {
        "device": torch.cuda.get_device_name(),
        "kvikpy": kvikpy.__version__,
        "cpus": os.cpu_count(),
    }
    tmp = tempfile.mkdtemp(prefix="kvikpy-smoke-", dir="/tmp")
    rng = np.random.default_rng(0)

    # Per-call overhead: small files, end to end (open, read into the GPU, close).
    for size in (4096, 65536):
        path = os.path.join(tmp, f"small-{size}.bin")
        data = rng.integers(0, 256, size, dtype=np.uint8)
        data.tofile(path)
        t = torch.empty(size, dtype=torch.uint8, device="cuda")

        def cufile_read(path: str = path, t: torch.Tensor = t) -> None:
            with kvikpy.CuFile(path) as f:
                f.read(t)

        med, lo, hi = median_time(cufile_read, 300)
        assert np.array_equal(t.cpu().numpy(), data)
        results[f"cufile_read_{size}_us"] = [med * 1e6, lo * 1e6, hi * 1e6]
        med, lo, hi = median_time(lambda path=path: kvikpy.read(path), 300)
        results[f"kvikpy_read_{size}_us"] = [med * 1e6, lo * 1e6, hi * 1e6]

    # Large warm read to the device.
    nbytes = args.size_mib << 20
    path = os.path.join(tmp, "large.bin")
    data = rng.integers(0, 256, nbytes, dtype=np.uint8)
    data.tofile(path)
    digest = hashlib.sha256(data).hexdigest()
    del data
    with open(path, "rb") as f:  # warm the page cache
        while f.read(64 << 20):
            pass
    dev = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    pinned = torch.empty(nbytes, dtype=torch.uint8).pin_memory()
    med, _, _ = median_time(lambda: dev.copy_(pinned, non_blocking=True), 5)
    results["pinned_h2d_GBps"] = nbytes / med / 1e9
    for threads in (1, 4, 8, 16):
        for task_mib in (4, 16):
            settings = {"num_threads": threads, "task_size": task_mib << 20}
            with kvikpy.defaults.set(settings), kvikpy.CuFile(path) as f:
                med, lo, hi = median_time(lambda f=f: f.read(dev), 5)
            results[f"read_{threads}t_{task_mib}MiB_GBps"] = [
                nbytes / med / 1e9,
                nbytes / hi / 1e9,
                nbytes / lo / 1e9,
            ]
    assert hashlib.sha256(dev.cpu().numpy()).hexdigest() == digest, "wrong bytes"
    results["default_threads"] = kvikpy.defaults.get("num_threads")
    with kvikpy.CuFile(path) as f:
        med, _, _ = median_time(lambda f=f: f.read(dev), 5)
    results["read_defaults_GBps"] = nbytes / med / 1e9
    for k, v in results.items():
        print(f"{k:>28}: {v}")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(results, fh, indent=1)
    for name in os.listdir(tmp):
        os.unlink(os.path.join(tmp, name))
    os.rmdir(tmp)


if __name__ == "__main__":
    main()
