"""Per-call cost of small reads into GPU memory (4 KiB and 64 KiB files, open + read +
close), through CuFile into a preallocated tensor and through kvikpy.read.

Large reads are `python -m benchmarks large`, ceilings `python -m benchmarks ceilings`.
Usage: python -m benchmarks smoke [--out FILE.json]
Timing: CUDA synchronised before each clock read, warm-ups first, medians reported,
bytes verified against the file.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np
import torch

import kvikpy
from benchmarks.common import scratch_dir


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
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    results: dict[str, object] = {
        "device": torch.cuda.get_device_name(),
        "kvikpy": kvikpy.__version__,
        "cpus": os.cpu_count(),
    }
    tmp = scratch_dir("kvikpy-smoke-")
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

    for k, v in results.items():
        print(f"{k:>28}: {v}")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(results, fh, indent=1)
    for name in os.listdir(tmp):
        os.unlink(os.path.join(tmp, name))


if __name__ == "__main__":
    main()
