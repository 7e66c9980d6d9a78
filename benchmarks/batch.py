"""Batch reads against per-file loops, into GPU memory: kvikpy.read_many against kvikio's
CuFile loop and kvikpy's own CuFile loop (many small files), and kvikpy.read_ranges
against kvikio's loop of CuFile.read calls (random 1 MiB ranges of one large file).

Each library in its own process, alternating; warm page cache; files (or ranges) per
second, median of the runs; every run's bytes checked against a checksum.
Usage: python -m benchmarks batch [--files 2000] [--range-file-mib 8192] [--out batch.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

from benchmarks.common import run_child, scratch_dir, versions, warm_page_cache, write_random_file

CHILD = r"""
import json, os, sys, time
import cupy, numpy as np
mode, lib, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
spec = json.loads(sys.argv[4])
if lib.startswith("kvikpy"):
    import kvikpy
if lib.startswith("kvikio"):
    import kvikio
rates = []
def checksum(buf):
    return int(cupy.asarray(buf).view(cupy.uint8).sum(dtype=cupy.int64))
for r in range(2 + runs):
    if mode == "files":
        paths, size = spec["paths"], spec["size"]
        if lib != "kvikpy-batch":
            out = cupy.empty(len(paths) * size, dtype=cupy.uint8)
            mod = kvikpy if lib == "kvikpy-loop" else kvikio
        cupy.cuda.runtime.deviceSynchronize()
        t0 = time.perf_counter()
        if lib == "kvikpy-batch":
            out = cupy.from_dlpack(kvikpy.read_many(paths).buffer)
        else:
            for i, p in enumerate(paths):
                with mod.CuFile(p, "r") as f:
                    f.read(out[i * size : (i + 1) * size])
        cupy.cuda.runtime.deviceSynchronize()
        dt = time.perf_counter() - t0
        total = checksum(out)
        count = len(paths)
    else:
        path, offsets, size = spec["path"], spec["offsets"], spec["size"]
        pairs = [(o, size) for o in offsets]
        cupy.cuda.runtime.deviceSynchronize()
        t0 = time.perf_counter()
        if lib == "kvikpy-batch":
            batch = kvikpy.read_ranges(path, pairs)
            cupy.cuda.runtime.deviceSynchronize()
            dt = time.perf_counter() - t0
            total = checksum(cupy.from_dlpack(batch.buffer))
        else:
            out = cupy.empty(len(offsets) * size, dtype=cupy.uint8)
            mod = kvikpy if lib == "kvikpy-loop" else kvikio
            with mod.CuFile(path, "r") as f:
                for i, o in enumerate(offsets):
                    f.read(out[i * size : (i + 1) * size], size, o)
            cupy.cuda.runtime.deviceSynchronize()
            dt = time.perf_counter() - t0
            total = checksum(out)
        count = len(offsets)
    if total != spec["expected"]:
        raise SystemExit(f"{lib}: wrong bytes in run {r}")
    if r >= 2:
        rates.append(count / dt)
print(json.dumps({"rates": rates}))
"""

LIBS = ["kvikpy-batch", "kvikio", "kvikpy-loop"]


def run(mode: str, spec: dict, runs: int, rounds: int) -> dict:
    samples: dict[str, list[float]] = {lib: [] for lib in LIBS}
    for _ in range(rounds):
        for lib in LIBS:
            r = run_child(CHILD, mode, lib, runs, json.dumps(spec), what=lib)
            samples[lib] += r["rates"]
    row = {lib: statistics.median(v) for lib, v in samples.items()}
    row["batch_vs_kvikio"] = row["kvikpy-batch"] / row["kvikio"]
    return row


def main() -> None:
    import numpy as np

    parser = argparse.ArgumentParser()
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--range-file-mib", type=int, default=8192)
    parser.add_argument("--ranges", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    results = []
    folder = scratch_dir("kvikpy-batch-")
    rng = np.random.default_rng(0)
    for size in (4096, 65536):
        paths, expected = [], 0
        for i in range(args.files):
            data = rng.integers(0, 256, size, dtype=np.uint8)
            expected += int(data.sum(dtype=np.int64))
            p = os.path.join(folder, f"{size}-{i:06d}")
            data.tofile(p)
            paths.append(p)
        spec = {"paths": paths, "size": size, "expected": expected}
        row = {"mode": "files", "size": size, "count": args.files}
        row |= run("files", spec, args.runs, args.rounds)
        results.append(row)
        print(json.dumps(row), flush=True)
        for p in paths:
            os.unlink(p)
    path = os.path.join(folder, "big.bin")
    write_random_file(path, args.range_file_mib << 20)
    warm_page_cache(path)
    size = 1 << 20
    offsets = rng.integers(0, ((args.range_file_mib << 20) - size) // 4096, args.ranges) * 4096
    arr = np.memmap(path, dtype=np.uint8, mode="r")
    expected = sum(int(arr[o : o + size].sum(dtype=np.int64)) for o in offsets)
    del arr
    spec = {"path": path, "offsets": offsets.tolist(), "size": size, "expected": expected}
    row = {"mode": "ranges", "size": size, "count": args.ranges}
    row |= run("ranges", spec, args.runs, args.rounds)
    results.append(row)
    print(json.dumps(row), flush=True)
    os.unlink(path)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"versions": versions(), "rows": results}, fh, indent=1)


if __name__ == "__main__":
    main()
