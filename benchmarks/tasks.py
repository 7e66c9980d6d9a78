"""kvikpy alone against itself: warm whole-file reads at several task sizes, to choose the
default `task_size`.

One process; for each file size and destination (GPU memory, pinned host memory, ordinary
host memory), the task sizes take turns read by read (so drift hits them alike), 2
warm-ups each, then --runs timed reads each; median GB/s; every read's bytes checked.
Thread count: the default (one per CPU, at most 16).

Usage: python -m benchmarks tasks [--sizes-mib 64,256,1024,4096] [--tasks-mib 4,8,16,32]
                                  [--runs 7] [--out tasks.json]
"""

from __future__ import annotations

import argparse
import json
import os

from benchmarks.common import run_child, scratch_dir, versions, warm_page_cache, write_random_file

CHILD = r"""
import json, statistics, sys, time
import cupy, numpy as np
import kvikpy
files = json.loads(sys.argv[1])  # [[path, size, checksum], ...]
tasks = [int(t) << 20 for t in sys.argv[2].split(",")]
runs = int(sys.argv[3])
biggest = max(n for _, n, _ in files)
dev = cupy.empty(biggest, dtype=cupy.uint8)
pinned = np.frombuffer(cupy.cuda.alloc_pinned_memory(biggest), dtype=np.uint8, count=biggest)
host = np.empty(biggest, dtype=np.uint8)
host.fill(1)  # fault the pages in before timing
dests = {
    "device": (dev, lambda n: int(dev[:n].sum(dtype=cupy.int64))),
    "pinned": (pinned, lambda n: int(pinned[:n].sum(dtype=np.int64))),
    "host": (host, lambda n: int(host[:n].sum(dtype=np.int64))),
}
rows = []
for path, n, want in files:
    for dest, (buf, total) in dests.items():
        times = {t: [] for t in tasks}
        with kvikpy.CuFile(path, "r") as f:
            for r in range(2 + runs):
                for t in tasks:
                    with kvikpy.defaults.set(task_size=t):
                        t0 = time.perf_counter()
                        got = f.read(buf[:n])
                        dt = time.perf_counter() - t0
                    if got != n or total(n) != want:
                        raise SystemExit(f"wrong bytes: {dest} {n} task {t}")
                    if r >= 2:
                        times[t].append(dt)
        for t, ts in times.items():
            rows.append({"size": n, "dest": dest, "task_MiB": t >> 20,
                         "median_GBps": n / statistics.median(ts) / 1e9,
                         "min_GBps": n / max(ts) / 1e9, "max_GBps": n / min(ts) / 1e9})
print(json.dumps({"threads": kvikpy.defaults.get("num_threads"), "rows": rows}))
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes-mib", default="64,256,1024,4096")
    parser.add_argument("--tasks-mib", default="4,8,16,32")
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    folder = scratch_dir("kvikpy-tasks-")
    files = []
    for i, mib in enumerate(int(s) for s in args.sizes_mib.split(",")):
        path = os.path.join(folder, f"f{mib}.bin")
        files.append([path, mib << 20, write_random_file(path, mib << 20, seed=i + 1)])
        warm_page_cache(path)
    try:
        result = run_child(
            CHILD, json.dumps(files), args.tasks_mib, args.runs, what="kvikpy", timeout=540
        )
    finally:
        for path, _, _ in files:
            os.unlink(path)
    tasks = [int(t) for t in args.tasks_mib.split(",")]
    print(f"GB/s, median of {args.runs}; {result['threads']} threads; columns: task size MiB")
    print(f"{'dest':8} {'size MiB':>9} " + " ".join(f"{t:>7}" for t in tasks))
    table: dict[tuple[str, int], dict[int, float]] = {}
    for r in result["rows"]:
        table.setdefault((r["dest"], r["size"]), {})[r["task_MiB"]] = r["median_GBps"]
    for (dest, size), by_task in table.items():
        cells = " ".join(f"{by_task[t]:7.2f}" for t in tasks)
        print(f"{dest:8} {size >> 20:>9} {cells}")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"versions": versions(), "result": result}, fh, indent=1)


if __name__ == "__main__":
    main()
