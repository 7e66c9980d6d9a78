"""A warm file into host memory (a numpy array): kvikpy against the page-cache pread
ceiling with the same threads, and against numpy.fromfile, in one process.

The ceiling is N Python threads calling os.preadv on disjoint 4 MiB pieces of the same
preallocated array (os.preadv releases the GIL). Median of the runs, bytes verified.
Usage: python -m benchmarks host [--size-mib 1024] [--threads 16]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np

import kvikpy
from benchmarks.common import scratch_dir


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--threads", type=int, default=kvikpy.defaults.get("num_threads"))
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    n = args.size_mib << 20
    piece = 4 << 20
    folder = scratch_dir("kvikpy-host-")
    path = os.path.join(folder, "data.bin")
    data = np.random.default_rng(0).integers(0, 256, n, dtype=np.uint8)
    data.tofile(path)
    digest = hashlib.sha256(data).hexdigest()
    del data
    out = np.empty(n, dtype=np.uint8)
    fd = os.open(path, os.O_RDONLY)
    pool = ThreadPoolExecutor(args.threads)

    def ceiling() -> None:
        view = memoryview(out)

        def part(off: int) -> None:
            os.preadv(fd, [view[off : off + piece]], off)

        list(pool.map(part, range(0, n, piece)))

    def with_kvikpy() -> None:
        with kvikpy.CuFile(path) as f:
            f.read(out)

    def with_numpy() -> None:
        np.fromfile(path, dtype=np.uint8)

    results = {}
    settings = {"num_threads": args.threads, "task_size": piece}
    with kvikpy.defaults.set(settings):
        for name, fn in [("ceiling", ceiling), ("kvikpy", with_kvikpy), ("numpy", with_numpy)]:
            for _ in range(2):
                fn()
            times = []
            for _ in range(args.runs):
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
            results[name] = n / statistics.median(times) / 1e9
            if name != "numpy":
                assert hashlib.sha256(out).hexdigest() == digest, name
    os.close(fd)
    os.unlink(path)
    print(
        f"{args.size_mib} MiB warm into numpy, {args.threads} threads: "
        f"pread ceiling {results['ceiling']:.1f} GB/s, kvikpy {results['kvikpy']:.1f} GB/s "
        f"({results['kvikpy'] / results['ceiling']:.0%} of ceiling), numpy.fromfile "
        f"{results['numpy']:.1f} GB/s (kvikpy {results['kvikpy'] / results['numpy']:.1f}x)"
    )


if __name__ == "__main__":
    main()
