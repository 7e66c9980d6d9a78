"""What progress=True costs: the same reads with the bar off and on, alternating in one
process, into GPU memory (host memory without CUDA).

Three workloads: kvikpy.read of a warm large file, read_many of 2,000 files of 64 KiB,
and a full pass of iter_chunks over the large file. Each read is timed on its own (the
calls return once the bytes have landed), after one warm-up of each; median of the runs;
every run's bytes are checked. The bars draw to the child's stderr, as in a terminal.

Then the first bar of a process: in each of --fresh new processes, a 1 MiB kvikpy.read
into host memory without a bar (median of 7 after 3 warm-ups), then the process's first
with progress=True (importing tqdm and making its first bar) and a second; the first
call's extra time over the warm call, median over the processes. Needs tqdm.

Usage: python -m benchmarks progress [--size-mib 2048] [--files 2000] [--runs 7]
                                     [--fresh 7] [--out progress.json]
"""

from __future__ import annotations

import argparse
import json
import os

from benchmarks.common import run_child, scratch_dir, versions, warm_page_cache, write_random_file

CHILD = r"""
import json, statistics, sys, time
import numpy as np
import kvikpy
path, runs, expected, files_expected = (
    sys.argv[1], int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5]))
with open(sys.argv[2]) as fh:
    files = json.load(fh)
device = "cuda" if kvikpy.cuda_available() else "cpu"
if device == "cuda":
    import cupy
    total = lambda buf: int(cupy.from_dlpack(buf).view(cupy.uint8).sum(dtype=cupy.int64))
else:
    total = lambda buf: int(np.from_dlpack(buf).view(np.uint8).sum(dtype=np.int64))

def whole(progress):
    return total(kvikpy.read(path, device=device, progress=progress))

def many(progress):
    return total(kvikpy.read_many(files, device=device, progress=progress).buffer)

def chunks(progress):
    s = 0
    for chunk in kvikpy.iter_chunks(path, 256 << 20, device=device, progress=progress):
        s += total(chunk)
    return s

out = {"device": device}
for name, fn, want in (("read", whole, expected), ("read_many", many, files_expected),
                       ("iter_chunks", chunks, expected)):
    times = {False: [], True: []}
    for progress in (False, True):
        fn(progress)  # warm-up
    for _ in range(runs):
        for progress in (False, True):
            t0 = time.perf_counter()
            got = fn(progress)
            times[progress].append(time.perf_counter() - t0)
            if got != want:
                raise SystemExit(f"{name}: wrong bytes (progress={progress})")
    off, on = statistics.median(times[False]), statistics.median(times[True])
    out[name] = {"off_s": off, "on_s": on, "on_vs_off": on / off}
print(json.dumps(out))
"""


FIRST = r"""
import json, statistics, sys, time
t0 = time.perf_counter()
import kvikpy
imported = time.perf_counter() - t0
path = sys.argv[1]
def timed(**kw):
    t0 = time.perf_counter()
    kvikpy.read(path, device="cpu", **kw)
    return time.perf_counter() - t0
for _ in range(3):
    timed()
warm = statistics.median(timed() for _ in range(7))
first = timed(progress=True)
second = timed(progress=True)
print(json.dumps({"import_s": imported, "warm_s": warm, "first_s": first, "second_s": second}))
"""


def first_bar(folder: str, processes: int) -> dict[str, float]:
    """What the first progress=True call of a process costs over a warm call without a
    bar (see the module's docstring)."""
    import statistics

    path = os.path.join(folder, "first.bin")
    write_random_file(path, 1 << 20)
    try:
        runs = [run_child(FIRST, path, what="first bar") for _ in range(processes)]
    finally:
        os.unlink(path)
    median = lambda key: statistics.median(r[key] for r in runs)  # noqa: E731
    return {
        "processes": processes,
        "warm_off_s": median("warm_s"),
        "first_on_s": median("first_s"),
        "second_on_s": median("second_s"),
        "first_overhead_s": statistics.median(r["first_s"] - r["warm_s"] for r in runs),
    }


def main() -> None:
    import numpy as np

    parser = argparse.ArgumentParser()
    parser.add_argument("--size-mib", type=int, default=2048)
    parser.add_argument("--files", type=int, default=2000)
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--fresh", type=int, default=7, help="processes for the first bar")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    folder = scratch_dir("kvikpy-progress-")
    path = os.path.join(folder, "big.bin")
    expected = write_random_file(path, args.size_mib << 20)
    warm_page_cache(path)
    rng = np.random.default_rng(3)
    files, files_expected = [], 0
    for i in range(args.files):
        data = rng.integers(0, 256, 64 << 10, dtype=np.uint8)
        files_expected += int(data.sum(dtype=np.int64))
        p = os.path.join(folder, f"f{i:05d}")
        data.tofile(p)
        files.append(p)
    listing = os.path.join(folder, "files.json")  # too long for a command line
    with open(listing, "w") as fh:
        json.dump(files, fh)
    try:
        result = run_child(
            CHILD,
            path,
            listing,
            args.runs,
            expected,
            files_expected,
            what="progress",
        )
    finally:
        for p in [path, listing, *files]:
            os.unlink(p)
    result |= {"size_mib": args.size_mib, "files": args.files, "runs": args.runs}
    result["first_bar"] = first = first_bar(folder, args.fresh)
    for name in ("read", "read_many", "iter_chunks"):
        r = result[name]
        print(
            f"{name:12} off {r['off_s'] * 1e3:8.2f} ms  on {r['on_s'] * 1e3:8.2f} ms  "
            f"on/off {r['on_vs_off']:.3f}"
        )
    ms = {key: value * 1e3 for key, value in first.items() if key.endswith("_s")}
    print(
        f"first bar of a process: warm call without a bar {ms['warm_off_s']:.2f} ms, "
        f"first with a bar {ms['first_on_s']:.2f} ms (+{ms['first_overhead_s']:.2f} ms), "
        f"second {ms['second_on_s']:.2f} ms; median of {args.fresh} processes"
    )
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"versions": versions(), "result": result}, fh, indent=1)


if __name__ == "__main__":
    main()
