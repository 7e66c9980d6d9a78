"""kvikpy against kvikio: warm reads of one large file into GPU memory, side by side.

Each measurement runs in its own process (fresh pools, no shared state), libraries
alternate A/B/A/B, every run is timed with the device synchronised, the bytes are
verified (a GPU-side sum against the file's), and the median is reported with min and
max. kvikio runs with KVIKIO_COMPAT_MODE=ON (POSIX: the GPU machine has no GPUDirect
Storage).

Usage (GPU machine, kvikio installed): python -m benchmarks large
    [--size-mib 4096] [--rounds 2] [--out results.json] [--markdown results.md]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time

from benchmarks.common import run_child, scratch_dir, versions, warm_page_cache, write_random_file

CHILD = r"""
import json, os, sys, time
import cupy
lib, path = sys.argv[1], sys.argv[2]
threads, task, runs, expected = (int(a) for a in sys.argv[3:7])
mode = sys.argv[7]
n = os.path.getsize(path)
buf = cupy.empty(n, dtype=cupy.uint8)
import numpy as np
if mode == "write":  # fill the source 256 MiB at a time (keeps host RSS small)
    step = 256 << 20
    for off in range(0, n, step):
        part = np.fromfile(path, dtype=np.uint8, count=min(step, n - off), offset=off)
        buf[off : off + part.size].set(part)
if lib == "kvikpy":
    import kvikpy as mod
else:
    import kvikio as mod
    import kvikio.defaults
if threads:
    mod.defaults.set({"num_threads": threads, "task_size": task})
if mode == "cold" and threads:
    mod.defaults.set("auto_direct_io_read", True)  # the tuned cold configuration
out = path + ".out"
def once():
    if mode == "write":
        with mod.CuFile(out, "w") as f:
            got = f.write(buf)
            os.fsync(f.fileno())
        return got
    with mod.CuFile(path, "r") as f:
        got = f.read(buf)
    cupy.cuda.runtime.deviceSynchronize()
    return got
import resource
times = []
cpu = 0.0
for i in range(2 + runs):
    if mode != "write":
        buf.fill(0)
    cupy.cuda.runtime.deviceSynchronize()
    if mode == "cold":  # each library evicts the file itself (no root needed)
        mod.drop_file_page_cache(path)
    r0 = resource.getrusage(resource.RUSAGE_SELF)
    t0 = time.perf_counter()
    got = once()
    dt = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_SELF)
    if i >= 2:
        cpu += (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    assert got == n, (got, n)
    if i >= 2:
        times.append(dt)
    if mode != "write" and int(buf.sum(dtype=cupy.int64)) != expected:
        raise SystemExit(f"run {i}: wrong bytes")  # every run's bytes, outside the timing
if mode == "write":
    written = np.memmap(out, dtype=np.uint8, mode="r")
    ok = int(written.sum(dtype=np.int64)) == expected
    del written
    os.unlink(out)
else:
    ok = int(buf.sum(dtype=cupy.int64)) == expected
print(json.dumps({"times": times, "ok": ok, "threads": mod.defaults.get("num_threads"),
                  "task_size": mod.defaults.get("task_size"),
                  "cpu_s_per_GB": cpu / (runs * n / 1e9),
                  "peak_rss_MiB": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size-mib", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", default=None)
    parser.add_argument("--markdown", default=None)
    parser.add_argument(
        "--mode",
        choices=["warm", "cold", "write"],
        default="warm",
        help="warm reads (page cache), cold reads (caches dropped before each run; tuned "
        "runs use auto_direct_io_read for both), or writes from GPU memory incl. fsync",
    )
    parser.add_argument("--threads", default="1,4,16", help="comma-separated thread counts")
    args = parser.parse_args()
    nbytes = args.size_mib << 20
    tmp = scratch_dir("kvikpy-bench-")
    path = os.path.join(tmp, "data.bin")
    expected = write_random_file(path, nbytes)
    warm_page_cache(path)  # cold runs drop it themselves
    header_mode = args.mode
    counts = [int(t) for t in args.threads.split(",")]
    configs = [(0, 0)] + [(t, s << 20) for t in counts for s in (4, 16)]
    rows = []
    for threads, task in configs:
        samples: dict[str, list[float]] = {"kvikpy": [], "kvikio": []}
        seen: dict[str, dict] = {}
        for _ in range(args.rounds):
            for lib in ("kvikpy", "kvikio"):
                r = run_child(
                    CHILD, lib, path, threads, task, args.runs, expected, args.mode, what=lib
                )
                if not r["ok"]:
                    raise RuntimeError(f"{lib} read wrong bytes ({threads} threads, {task})")
                samples[lib] += r["times"]
                seen[lib] = r
        row = {"threads": threads or "defaults", "task_MiB": (task >> 20) or "defaults"}
        for lib, times in samples.items():
            row[lib] = {
                "median_GBps": nbytes / statistics.median(times) / 1e9,
                "min_GBps": nbytes / max(times) / 1e9,
                "max_GBps": nbytes / min(times) / 1e9,
                "threads": seen[lib]["threads"],
                "task_size": seen[lib]["task_size"],
                "cpu_s_per_GB": seen[lib]["cpu_s_per_GB"],
                "peak_rss_MiB": seen[lib]["peak_rss_MiB"],
            }
        row["ratio"] = row["kvikpy"]["median_GBps"] / row["kvikio"]["median_GBps"]
        rows.append(row)
        print(json.dumps(row), flush=True)
    os.unlink(path)
    import cupy

    header = {
        "device": cupy.cuda.runtime.getDeviceProperties(0)["name"].decode(),
        "driver": cupy.cuda.runtime.driverGetVersion(),
        "versions": versions(),
        "file_MiB": args.size_mib,
        "mode": header_mode,
        "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"header": header, "rows": rows}, fh, indent=1)
    what = {"warm": "Warm read into", "cold": "Cold read into", "write": "Write from"}
    lines = [
        f"{what[args.mode]} GPU memory, {args.size_mib} MiB, {header['device']}, "
        f"driver {header['driver']}, {header['date']}; GB/s, median (min-max) of "
        f"{args.rounds * args.runs} runs in {args.rounds} alternating processes per library.",
        "",
        "| threads | task | kvikpy | kvikio 26.10 | kvikpy / kvikio | CPU s/GB | peak RSS MiB |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        a, b = r["kvikpy"], r["kvikio"]
        lines.append(
            f"| {r['threads']} ({a['threads']} vs {b['threads']}) | {r['task_MiB']} | "
            f"{a['median_GBps']:.1f} ({a['min_GBps']:.1f}-{a['max_GBps']:.1f}) | "
            f"{b['median_GBps']:.1f} ({b['min_GBps']:.1f}-{b['max_GBps']:.1f}) | "
            f"{r['ratio']:.2f}x | {a['cpu_s_per_GB']:.2f} / {b['cpu_s_per_GB']:.2f} | "
            f"{a['peak_rss_MiB']:.0f} / {b['peak_rss_MiB']:.0f} |"
        )
    text = "\n".join(lines)
    print(text)
    if args.markdown:
        with open(args.markdown, "w") as fh:
            fh.write(text + "\n")


if __name__ == "__main__":
    main()
