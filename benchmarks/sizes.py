"""Throughput against file size (4 KiB to 8 GiB), warm, into GPU memory, pinned host memory
and ordinary host memory: kvikpy (defaults), kvikio at its defaults and tuned (16 threads,
16 MiB tasks), and the naive numpy.fromfile (+ cupy.asarray for the GPU).

Each (library, destination) runs in its own process, alternating over rounds; every read
opens and closes its file inside the timing; 2 warm-ups and --runs timed reads per size;
the bytes of every run are checked (a sum of the buffer against the file's). numpy skips
files over 1 GiB (it reads at about 2 GB/s, and allocates a fresh array each time).
Usage: python -m benchmarks sizes [--min-mib 0] [--max-mib 8192] [--runs 7] [--out sizes.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

from benchmarks.common import run_child, scratch_dir, versions, warm_page_cache, write_random_file

SIZES = [4 << 10, 64 << 10, 1 << 20, 16 << 20, 256 << 20, 1 << 30, 8 << 30]
LIBS = ["kvikpy", "kvikio", "kvikio-tuned", "numpy"]
DESTS = ["device", "pinned", "host"]

CHILD = r"""
import json, os, resource, sys, time
import cupy, numpy as np
lib, dest, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
files = json.loads(sys.argv[4])  # [[path, size, checksum], ...]
biggest = max(s for _, s, _ in files)
if dest == "device":
    buf = cupy.empty(biggest, dtype=cupy.uint8)
    total = lambda n: int(buf[:n].sum(dtype=cupy.int64))
elif dest == "pinned":
    mem = cupy.cuda.alloc_pinned_memory(biggest)
    buf = np.frombuffer(mem, dtype=np.uint8, count=biggest)
    total = lambda n: int(buf[:n].sum(dtype=np.int64))
else:
    buf = np.empty(biggest, dtype=np.uint8)
    buf.fill(1)  # fault the pages in before timing
    total = lambda n: int(buf[:n].sum(dtype=np.int64))
if lib == "kvikpy":
    import kvikpy as mod
elif lib.startswith("kvikio"):
    import kvikio as mod
    import kvikio.defaults
    if lib == "kvikio-tuned":
        mod.defaults.set({"num_threads": 16, "task_size": 16 << 20})
out = []
for path, n, want in files:
    def once():
        if lib == "numpy":
            a = np.fromfile(path, dtype=np.uint8)
            if dest == "device":
                buf[:n] = cupy.asarray(a)
            else:
                buf[:n] = a
        else:
            with mod.CuFile(path, "r") as f:
                assert f.read(buf[:n]) == n
        if dest == "device":
            cupy.cuda.runtime.deviceSynchronize()
    times = []
    cpu = 0.0
    for i in range(2 + runs):
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        if dest == "device":
            cupy.cuda.runtime.deviceSynchronize()
        t0 = time.perf_counter()
        once()
        dt = time.perf_counter() - t0
        r1 = resource.getrusage(resource.RUSAGE_SELF)
        if i >= 2:
            times.append(dt)
            cpu += (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
        if total(n) != want:
            raise SystemExit(f"{lib} {dest} {n}: wrong bytes")
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    out.append({"size": n, "times": times, "cpu_s_per_GB": cpu / (runs * n / 1e9),
                "peak_rss_MiB": rss})
print(json.dumps(out))
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-mib", type=int, default=8192)
    parser.add_argument("--min-mib", type=float, default=0, help="skip smaller sizes")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    sizes = [s for s in SIZES if args.min_mib * (1 << 20) <= s <= args.max_mib << 20]
    folder = scratch_dir("kvikpy-sizes-")
    files = []
    for i, n in enumerate(sizes):
        path = os.path.join(folder, f"f{n}.bin")
        files.append([path, n, write_random_file(path, n, seed=i + 1)])
        warm_page_cache(path)
    samples: dict[tuple[str, str, int], list[float]] = {}
    usage: dict[tuple[str, str, int], list[tuple[float, float]]] = {}
    for _ in range(args.rounds):
        for dest in DESTS:
            for lib in LIBS:
                if lib == "numpy" and dest == "pinned":
                    continue
                mine = [f for f in files if lib != "numpy" or f[1] <= 1 << 30]
                if not mine:
                    continue
                result = run_child(CHILD, lib, dest, args.runs, json.dumps(mine), what=lib)
                for r in result:
                    key = (lib, dest, r["size"])
                    samples.setdefault(key, []).extend(r["times"])
                    usage.setdefault(key, []).append((r["cpu_s_per_GB"], r["peak_rss_MiB"]))
    rows = []
    for (lib, dest, n), times in sorted(samples.items(), key=lambda kv: (kv[0][1], kv[0][2])):
        rows.append(
            {
                "lib": lib,
                "dest": dest,
                "size": n,
                "median_GBps": n / statistics.median(times) / 1e9,
                "min_GBps": n / max(times) / 1e9,
                "max_GBps": n / min(times) / 1e9,
                "median_us": statistics.median(times) * 1e6,
                "runs": len(times),
                # getrusage over the timed reads (getrusage's resolution makes the
                # smallest sizes coarse); peak RSS of the process (ru_maxrss).
                "cpu_s_per_GB": statistics.median(u[0] for u in usage[(lib, dest, n)]),
                "peak_rss_MiB": max(u[1] for u in usage[(lib, dest, n)]),
            }
        )
    for dest in DESTS:
        print(f"\n{dest}: GB/s median by size")
        print("size      " + "".join(f"{lib:>14}" for lib in LIBS))
        for n in sizes:
            cells = []
            for lib in LIBS:
                r = [x for x in rows if (x["lib"], x["dest"], x["size"]) == (lib, dest, n)]
                cells.append(f"{r[0]['median_GBps']:14.2f}" if r else f"{'-':>14}")
            print(f"{n >> 10:>8}K " + "".join(cells))
    import cupy

    header = {
        "device": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(),
        "driver": cupy.cuda.runtime.driverGetVersion(),
        "versions": versions(),
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
        "runs_per_process": args.runs,
        "rounds": args.rounds,
    }
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"header": header, "rows": rows}, fh, indent=1)
    for path, _, _ in files:
        os.unlink(path)


if __name__ == "__main__":
    main()
