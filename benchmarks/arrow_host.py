"""Arrow IPC tables into host memory: kvikpy.arrow.read_ipc(device="cpu") against
pyarrow's read_all (the file read into memory pyarrow allocates) and pyarrow on a memory
map (no copy: the table's buffers are views of the mapped file), for three table shapes,
on a machine without a GPU.

Shapes (uncompressed, warm): ``long`` 1,000,000 rows of 4 numeric columns in 10 record
batches; ``wide`` 100,000 rows of 50 float64 columns in one batch; ``text`` 1,000,000
rows of an int64 and a short-string column in 10 batches. Each library runs in a fresh
process per round, alternating; each value is the median of ``--runs`` calls after a
warm-up in a process, then the median over ``--rounds`` rounds, in milliseconds; what
each call returns is checked (rows and columns) outside the clock.

Usage: python -m benchmarks arrow-host [--rounds 3 --runs 15 --out h.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

import numpy as np

from benchmarks.common import run_child, scratch_dir, versions

CHILD = r"""
import json, statistics, sys, time
lib, runs, *paths = sys.argv[1], int(sys.argv[2]), *sys.argv[3:]
if lib == "kvikpy":
    import kvikpy.arrow
    read = lambda p: kvikpy.arrow.read_ipc(p, device="cpu")
    shape = lambda t: (t.num_rows, t.num_columns)
else:
    import pyarrow as pa, pyarrow.ipc as ipc
    if lib == "pyarrow":
        read = lambda p: ipc.open_file(p).read_all()
    else:
        read = lambda p: ipc.open_file(pa.memory_map(p)).read_all()
    shape = lambda t: (t.num_rows, t.num_columns)
out = {}
for p in paths:
    out[p] = {"shape": shape(read(p))}
    times = []
    for _ in range(runs):
        t0 = time.perf_counter(); read(p); times.append(time.perf_counter() - t0)
    out[p]["ms"] = statistics.median(times) * 1e3
print(json.dumps(out))
"""

LIBS = ("kvikpy", "pyarrow", "pyarrow-mmap")


def tables() -> dict[str, object]:
    import pyarrow as pa

    rng = np.random.default_rng(0)
    n = 1_000_000
    long = pa.table(
        {
            "a": rng.integers(0, 1 << 40, n),
            "b": rng.random(n),
            "c": rng.integers(0, 100, n).astype(np.int32),
            "d": rng.random(n).astype(np.float32),
        }
    )
    wide = pa.table({f"f{i}": rng.random(100_000) for i in range(50)})
    text = pa.table({"id": np.arange(n), "s": pa.array([f"row {i % 9973}" for i in range(n)])})
    return {"long": (long, 10), "wide": (wide, 1), "text": (text, 10)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    import pyarrow.ipc as ipc

    folder = scratch_dir("kvikpy-arrow-host-")
    paths: dict[str, str] = {}
    sizes: dict[str, int] = {}
    for name, (table, batches) in tables().items():
        path = os.path.join(folder, f"{name}.arrow")
        with ipc.new_file(path, table.schema) as w:  # type: ignore[attr-defined]
            for b in table.to_batches(max_chunksize=-(-table.num_rows // batches)):  # type: ignore[attr-defined]
                w.write_batch(b)
        paths[name], sizes[name] = path, os.path.getsize(path)
    rounds: dict[str, list[dict[str, float]]] = {lib: [] for lib in LIBS}
    for r in range(args.rounds):
        order = LIBS[r % 3 :] + LIBS[: r % 3]
        for lib in order:
            res = run_child(CHILD, lib, args.runs, *paths.values(), what=f"{lib} round {r}")
            rounds[lib].append({name: res[p]["ms"] for name, p in paths.items()})
            shapes = {name: tuple(res[p]["shape"]) for name, p in paths.items()}
            assert shapes == {
                "long": (1_000_000, 4),
                "wide": (100_000, 50),
                "text": (1_000_000, 2),
            }, (lib, shapes)
    ms = {
        lib: {n: statistics.median(x[n] for x in rs) for n in paths} for lib, rs in rounds.items()
    }
    print(
        "| table (uncompressed, warm) | MB | kvikpy ms | pyarrow read_all ms "
        "| pyarrow memory map ms | read_all / kvikpy |"
    )
    print("|---|---|---|---|---|---|")
    for n in paths:
        k, p, m = ms["kvikpy"][n], ms["pyarrow"][n], ms["pyarrow-mmap"][n]
        print(f"| {n} | {sizes[n] / 1e6:.0f} | {k:.1f} | {p:.1f} | {m:.1f} | {p / k:.2f}x |")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(
                {"versions": versions(), "sizes": sizes, "rounds": rounds, "ms": ms}, fh, indent=1
            )


if __name__ == "__main__":
    main()
