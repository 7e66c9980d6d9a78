"""Two builds of kvikpy side by side: the same workloads in alternating fresh processes,
one build per process, to show what an engine change costs or gains.

Each build is a folder a wheel was installed into (``pip install --target DIR``), named
on the command line as LABEL=DIR; the child processes import kvikpy from it alone.
Workloads, every byte checked against the data's sum:

* ``large``: a warm file (default 4 GiB) into GPU memory with default settings, GB/s;
* ``large-1t``: the same on one I/O thread;
* ``small``: 2,000 files of 64 KiB through ``read_many`` into GPU memory, files/s;
* ``tiny``: 2,000 reads of 4 KiB with ``CuFile.read`` into one GPU buffer (the per-call
  cost: context binding, intake, the inline path), reads/s.

Medians over ``--rounds`` rounds (each round runs every build once, in alternating
order); the spread is the lowest and highest round. Usage:
python -m benchmarks wheels --build before=/tmp/a --build after=/tmp/b [--size-mib 4096]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

from benchmarks.common import scratch_dir, versions, write_random_file

CHILD = r"""
import json, os, sys, time
import numpy as np, torch
import kvikpy
big, folder = sys.argv[1], sys.argv[2]
expected_big, expected_small, runs = map(int, sys.argv[3:6])
paths = sorted(os.path.join(folder, n) for n in os.listdir(folder))
def timed(f, check):
    check(f())  # warm up (contexts, pools, page cache) and verify the bytes
    times = []
    for _ in range(runs):
        torch.cuda.synchronize()
        t = time.perf_counter()
        result = f()
        torch.cuda.synchronize()
        times.append(time.perf_counter() - t)
    check(result)  # outside the clock: the last timed run's bytes too
    return sorted(times)[len(times) // 2]
out = {}
def check_big(buf):
    assert int(torch.from_dlpack(buf).sum(dtype=torch.int64)) == expected_big
size = os.path.getsize(big)
out["large"] = size / timed(lambda: kvikpy.read(big), check_big) / 1e9
with kvikpy.defaults.set(num_threads=1):
    out["large-1t"] = size / timed(lambda: kvikpy.read(big), check_big) / 1e9
def check_small(batch):
    assert int(torch.from_dlpack(batch.buffer).sum(dtype=torch.int64)) == expected_small
out["small"] = len(paths) / timed(lambda: kvikpy.read_many(paths), check_small)
tiny_buf = torch.empty(2000 * 4096, dtype=torch.uint8, device="cuda")
views = [tiny_buf[i * 4096 : (i + 1) * 4096] for i in range(2000)]
f = kvikpy.CuFile(big)
def tiny():
    for i, view in enumerate(views):
        f.read(view, file_offset=i * 4096)
    return tiny_buf
def check_tiny(buf):
    head = np.fromfile(big, dtype=np.uint8, count=buf.numel())
    assert int(buf.sum(dtype=torch.int64)) == int(head.sum(dtype=np.int64))
out["tiny"] = 2000 / timed(tiny, check_tiny)
print(json.dumps(out))
"""

UNITS = {"large": "GB/s", "large-1t": "GB/s", "small": "files/s", "tiny": "reads/s"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build", action="append", required=True, help="LABEL=DIR")
    parser.add_argument("--size-mib", type=int, default=4096)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    builds = dict(b.split("=", 1) for b in args.build)
    folder = scratch_dir("kvikpy-wheels-")
    big = os.path.join(folder, "big.bin")
    expected_big = write_random_file(big, args.size_mib << 20, seed=1)
    small_dir = os.path.join(folder, "small")
    os.mkdir(small_dir)
    expected_small = sum(
        write_random_file(os.path.join(small_dir, f"{i:05d}.bin"), 64 << 10, seed=10 + i)
        for i in range(2000)
    )
    results: dict[str, list[dict[str, float]]] = {label: [] for label in builds}
    for r in range(args.rounds):
        order = list(builds) if r % 2 == 0 else list(reversed(builds))
        for label in order:
            env = dict(os.environ, PYTHONPATH=builds[label], KVIKIO_COMPAT_MODE="ON")
            done = subprocess.run(
                [
                    sys.executable,
                    "-c",
                    CHILD,
                    big,
                    small_dir,
                    str(expected_big),
                    str(expected_small),
                    str(args.runs),
                ],
                capture_output=True,
                text=True,
                env=env,
                check=False,
                timeout=900,
            )
            if done.returncode:
                raise RuntimeError(f"{label}: {done.stderr[-2000:]}")
            results[label].append(json.loads(done.stdout.strip().splitlines()[-1]))
    labels = list(builds)
    summary: dict[str, dict[str, object]] = {}
    for work, unit in UNITS.items():
        row: dict[str, object] = {"unit": unit}
        for label in labels:
            values = [run[work] for run in results[label]]
            row[label] = {
                "median": statistics.median(values),
                "min": min(values),
                "max": max(values),
            }
        summary[work] = row
        cells = "  ".join(
            "{} {median:,.1f} ({min:,.1f}-{max:,.1f})".format(label, **row[label])  # type: ignore[arg-type]
            for label in labels
        )
        ratio = ""
        if len(labels) == 2:
            a, b = (row[label]["median"] for label in labels)  # type: ignore[index]
            ratio = f"  {labels[1]}/{labels[0]} {b / a:.3f}"
        print(f"{work:<9} {unit:<8} {cells}{ratio}")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(
                {"versions": versions(), "args": vars(args), "summary": summary, "rounds": results},
                fh,
                indent=1,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
