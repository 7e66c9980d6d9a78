"""`make demo`: write a sample file, read it with kvikpy and with numpy.fromfile, compare.

Reads go into host memory (a numpy array) in this build; the numbers are medians of
warm-page-cache reads, each verified against the data written.

Usage: python benchmarks/demo.py [--size-mib N] [--repeats N]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import sys
import tempfile
import time

import numpy as np

import kvikpy


def timed(fn: object, repeats: int) -> list[float]:
    assert callable(fn)
    fn()  # warm-up (and page cache)
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    nbytes = args.size_mib << 20

    print(f"kvikpy {kvikpy.__version__}: {kvikpy.defaults.get('num_threads')} I/O threads")
    gpu = kvikpy.cuda_available()
    print("destination:", "GPU memory (kvikpy.Buffer)" if gpu else "host memory (numpy array)")
    data = np.random.default_rng(0).integers(0, 256, nbytes, dtype=np.uint8)
    digest = hashlib.sha256(data).hexdigest()

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "sample.bin")
        data.tofile(path)
        out = np.empty(nbytes, dtype=np.uint8)

        gpu_out = kvikpy.read(path) if gpu else None  # also warms up CUDA

        def read_kvikpy() -> None:
            with kvikpy.CuFile(path, "r") as f:
                assert f.read(gpu_out if gpu_out is not None else out) == nbytes

        from_numpy: list[np.ndarray] = []

        def read_numpy() -> None:
            from_numpy[:] = [np.fromfile(path, dtype=np.uint8)]

        to_gpu = None
        if gpu:
            try:  # what a numpy.fromfile user does to reach the GPU
                import torch

                def to_gpu(a: np.ndarray) -> None:
                    torch.from_numpy(a).cuda()
                    torch.cuda.synchronize()
            except ImportError:
                pass
        peer = "numpy.fromfile" + (" + .cuda()" if to_gpu else "")

        def read_peer() -> None:
            read_numpy()
            if to_gpu is not None:
                to_gpu(from_numpy[0])

        rows = []
        for name, fn in [("kvikpy CuFile.read", read_kvikpy), (peer, read_peer)]:
            times = timed(fn, args.repeats)
            rows.append((name, nbytes / statistics.median(times) / 1e9, times))
        if gpu_out is not None:
            out[:] = gpu_out.to_numpy()
        assert hashlib.sha256(out).hexdigest() == digest, "kvikpy read wrong bytes"
        assert hashlib.sha256(from_numpy[0]).hexdigest() == digest, "numpy read wrong bytes"

    print(f"\n{args.size_mib} MiB file, warm page cache, median of {args.repeats} (min..max):")
    for name, gbps, times in rows:
        lo, hi = nbytes / max(times) / 1e9, nbytes / min(times) / 1e9
        print(f"  {name:<20} {gbps:6.2f} GB/s  ({lo:.2f}..{hi:.2f})")
    print(f"  kvikpy / numpy: {rows[0][1] / rows[1][1]:.2f}x   (bytes verified by SHA-256)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
