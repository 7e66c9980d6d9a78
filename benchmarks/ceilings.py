"""The ceilings every result is compared against, measured on this machine in this run:
pinned host-to-device copy bandwidth, page-cache pread into pinned memory with native
threads (kvikpy's engine, `_lib.pread_ceiling`), and cold O_DIRECT disk reads.

Usage: python -m benchmarks ceilings [--size-mib 4096] [--cold] [--out ceilings.json]
--cold drops the file's pages from the page cache before each O_DIRECT run
(kvikpy.drop_file_page_cache: no root needed; "guest-cold": the host of a virtual machine
may still cache the disk).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import kvikpy
from benchmarks.common import scratch_dir, write_random_file
from kvikpy import _lib


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size-mib", type=int, default=4096)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--cold", action="store_true")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    n = args.size_mib << 20
    folder = scratch_dir("kvikpy-ceil-")
    path = os.path.join(folder, "data.bin")
    expected = write_random_file(path, n)
    results: dict[str, float] = {}
    pinned = bool(_lib.cuda_available())
    if pinned:
        import torch

        dev = torch.empty(n, dtype=torch.uint8, device="cuda")
        host = torch.empty(n, dtype=torch.uint8).pin_memory()
        times = []
        for i in range(2 + args.runs):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            dev.copy_(host, non_blocking=True)
            torch.cuda.synchronize()
            if i >= 2:
                times.append(time.perf_counter() - t0)
        results["pinned_h2d_GBps"] = n / statistics.median(times) / 1e9
        del dev, host
    for threads in (1, 4, 8, 16):
        speeds = []
        for i in range(1 + args.runs):
            s, b, total = _lib.pread_ceiling(path, threads, 4 << 20, False, pinned)
            assert b == n and total == expected, "ceiling read wrong bytes"
            if i:
                speeds.append(b / s / 1e9)
        results[f"pread_warm_{threads}t_GBps"] = statistics.median(speeds)
    if args.cold:
        for threads in (1, 4, 16):
            speeds = []
            for _ in range(3):
                kvikpy.drop_file_page_cache(path)
                s, b, total = _lib.pread_ceiling(path, threads, 4 << 20, True, pinned)
                assert total == expected
                speeds.append(b / s / 1e9)
            results[f"odirect_cold_{threads}t_GBps"] = statistics.median(speeds)
    os.unlink(path)
    for k, v in results.items():
        print(f"{k:>28}: {v:6.2f}")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(results, fh, indent=1)


if __name__ == "__main__":
    main()
