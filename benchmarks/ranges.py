"""Random byte ranges of one large file into GPU memory, one range per call through one
open file: kvikpy against kvikio, each in its own process, alternating.

Ranges per second for 4 KiB, 64 KiB, 1 MiB and 16 MiB ranges, at 4 KiB-aligned offsets
and at aligned offset + 1; each run checks the bytes of its last range.
Usage: python -m benchmarks ranges [--size-mib 8192] [--count 2000]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

from benchmarks.common import run_child, scratch_dir, warm_page_cache, write_random_file

CHILD = r"""
import json, os, sys, time
import cupy, numpy as np
lib, path, size, count, shift, runs = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:7])
n = os.path.getsize(path)
rng = np.random.default_rng(size + shift)
offsets = (rng.integers(0, (n - size - 1) // 4096, count) * 4096 + shift).tolist()
buf = cupy.empty(size, dtype=cupy.uint8)
if lib == "kvikpy":
    import kvikpy as mod
else:
    import kvikio as mod
rates = []
with mod.CuFile(path, "r") as f:
    for r in range(runs + 1):
        t0 = time.perf_counter()
        for off in offsets:
            f.read(buf, size, off)
        cupy.cuda.runtime.deviceSynchronize()
        dt = time.perf_counter() - t0
        if r:
            rates.append(count / dt)
want = np.fromfile(path, dtype=np.uint8, count=size, offset=offsets[-1])
ok = bool((cupy.asnumpy(buf) == want).all())
print(json.dumps({"rates": rates, "ok": ok}))
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size-mib", type=int, default=8192)
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    folder = scratch_dir("kvikpy-ranges-")
    path = os.path.join(folder, "data.bin")
    write_random_file(path, args.size_mib << 20)
    warm_page_cache(path)
    rows = []
    for size in (4 << 10, 64 << 10, 1 << 20, 16 << 20):
        for shift in (0, 1):
            rates: dict[str, list[float]] = {"kvikpy": [], "kvikio": []}
            for _ in range(args.rounds):
                for lib in rates:
                    child_args = (lib, path, size, args.count, shift, args.runs)
                    r = run_child(CHILD, *child_args, what=lib)
                    if not r["ok"]:
                        raise RuntimeError(f"{lib} read wrong bytes ({size}, +{shift})")
                    rates[lib] += r["rates"]
            row = {"range_bytes": size, "offset_shift": shift}
            row |= {lib: statistics.median(v) for lib, v in rates.items()}
            rows.append(row)
            print(
                f"{size >> 10:>6} KiB ranges, offset +{shift}: kvikpy {row['kvikpy']:,.0f}/s  "
                f"kvikio {row['kvikio']:,.0f}/s  ({row['kvikpy'] / row['kvikio']:.2f}x)",
                flush=True,
            )
    os.unlink(path)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
