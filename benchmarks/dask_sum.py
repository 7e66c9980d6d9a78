"""A dask sum over a raw file read by kvikpy.dask on a cluster of one worker per GPU
(dask_cuda's LocalCUDACluster), with one GPU against all of them; on a machine without
GPUs, CPU workers (1 against 2) to check the harness.

The file holds int32 values, so the sum is exact and checked against the one computed
while writing. Warm page cache; one warm-up, then ``--runs`` timed computes (graph
building included), median reported as GB/s of the file.

Usage: python -m benchmarks dask_sum [--size-mib 16384 --chunk-mib 256 --out d.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

import numpy as np

import kvikpy
from benchmarks.common import scratch_dir, warm_page_cache


def write_ints(path: str, nbytes: int) -> int:
    """int32 values from -1000 to 999, 256 MiB at a time; their exact sum."""
    rng = np.random.default_rng(0)
    total, left = 0, nbytes // 4
    with open(path, "wb") as fh:
        while left:
            block = rng.integers(-1000, 1000, min(64 << 20, left), dtype=np.int32)
            total += int(block.sum(dtype=np.int64))
            block.tofile(fh)
            left -= len(block)
    return total


def timed_sum(path: str, items: int, chunk_items: int, workers: int, gpu: bool, runs: int,
              expected: int) -> float:  # fmt: skip
    from dask.distributed import Client, LocalCluster

    import kvikpy.dask

    if gpu:
        from dask_cuda import LocalCUDACluster

        visible = ",".join(str(g) for g in range(workers))
        cluster = LocalCUDACluster(CUDA_VISIBLE_DEVICES=visible, dashboard_address=None)
    else:
        cluster = LocalCluster(n_workers=workers, threads_per_worker=1, dashboard_address=None)
    times = []
    with cluster, Client(cluster) as client:
        client.wait_for_workers(workers)
        for i in range(1 + runs):
            t0 = time.perf_counter()
            x = kvikpy.dask.from_raw(
                path, "int32", items, chunks=chunk_items, device="cuda" if gpu else "cpu"
            )
            got = int(x.sum(dtype="int64").compute())
            if i:
                times.append(time.perf_counter() - t0)
            assert got == expected, f"sum {got} != {expected}"
    return items * 4 / statistics.median(times) / 1e9


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size-mib", type=int, default=16384)
    parser.add_argument("--chunk-mib", type=int, default=256)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    gpus = kvikpy.device_count() if kvikpy.cuda_available() else 0
    folder = scratch_dir("kvikpy-dask-")
    path = os.path.join(folder, "values.i32")
    expected = write_ints(path, args.size_mib << 20)
    warm_page_cache(path)
    items, chunk = (args.size_mib << 20) // 4, (args.chunk_mib << 20) // 4
    # One worker per GPU: all GPUs against one; one GPU alone where there is only one;
    # without GPUs, 1 and 2 CPU workers (a check of the harness).
    counts = [1, gpus] if gpus >= 2 else [1] if gpus == 1 else [1, 2]
    results: dict[str, object] = {"gpus": gpus, "file_bytes": items * 4}
    rates = []
    for workers in counts:
        rate = timed_sum(path, items, chunk, workers, gpus > 0, args.runs, expected)
        results[f"{workers}_{'gpu' if gpus else 'cpu'}_workers_GBps"] = rate
        rates.append(rate)
    if len(rates) == 2:
        results["scaling"] = rates[1] / rates[0]
    print(json.dumps(results, indent=1))
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(results, fh, indent=1)


if __name__ == "__main__":
    main()
