"""A table of many columns: kvikpy.arrow.read_ipc against pyarrow, the whole table and
columns chosen by name, on the host (no GPU needed).

One IPC file of ``--columns`` int64 columns of ``--rows`` rows (default 100,000 columns
of 4 rows), warm. Rows: the whole table; every ``--every``-th column chosen by name
(1,000 of 100,000 by default); every column chosen by name in reverse order. Each library
runs in a fresh process per round, the libraries alternating; each value is the median
of ``--runs`` runs in a process, then the median over ``--rounds`` rounds, in
milliseconds (the call alone); what each read holds is checked outside the clock.

Usage: python -m benchmarks arrow-wide [--columns 100000 --rounds 3 --runs 3 --out w.json]
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
lib, path, n, every, runs = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:6])
names = [f"c{i}" for i in range(n)]
cases = {"all": None, "chosen": names[::every], "all by name": names[::-1]}
if lib == "kvikpy":
    import kvikpy.arrow, pyarrow as pa
    def read(cols):
        return kvikpy.arrow.read_ipc(path, device="cpu", columns=cols)
    def seen(t):
        return t.num_columns, pa.table(t).column(0)[0].as_py()
else:
    import pyarrow.ipc as ipc
    def read(cols):
        t = ipc.open_file(path).read_all()
        return t if cols is None else t.select(cols)
    def seen(t):
        return t.num_columns, t.column(0)[0].as_py()
out = {}
for case, cols in cases.items():
    want = (n if cols is None else len(cols), 0 if cols is None else int(cols[0][1:]))
    got = seen(read(cols))  # checked outside the clock
    assert got == want, (lib, case, got, want)
    times = []
    for _ in range(runs):
        t0 = time.perf_counter(); read(cols); times.append(time.perf_counter() - t0)
    out[case] = statistics.median(times) * 1e3
print(json.dumps(out))
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--columns", type=int, default=100_000)
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--every", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    import pyarrow as pa
    import pyarrow.ipc as ipc

    n = args.columns
    table = pa.table(
        [pa.array(np.full(args.rows, i, dtype=np.int64)) for i in range(n)],
        names=[f"c{i}" for i in range(n)],
    )
    path = os.path.join(scratch_dir("kvikpy-wide-"), "wide.arrow")
    with ipc.new_file(path, table.schema) as w:
        w.write_table(table)
    del table
    rounds: dict[str, list[dict[str, float]]] = {"kvikpy": [], "pyarrow": []}
    for r in range(args.rounds):
        for lib in ("kvikpy", "pyarrow") if r % 2 == 0 else ("pyarrow", "kvikpy"):
            rounds[lib].append(
                run_child(CHILD, lib, path, n, args.every, args.runs, what=f"{lib} round {r}")
            )
    cases = list(rounds["kvikpy"][0])
    table_ms = {
        lib: {c: statistics.median(x[c] for x in rs) for c in cases} for lib, rs in rounds.items()
    }
    chosen = len(range(0, n, args.every))
    labels = {
        "all": f"the whole table ({n:,} columns)",
        "chosen": f"{chosen:,} columns chosen by name",
        "all by name": f"all {n:,} columns chosen by name, reversed",
    }
    print(f"| {n:,} int64 columns of {args.rows} rows, warm | kvikpy ms | pyarrow ms | ratio |")
    print("|---|---|---|---|")
    for c in cases:
        k, p = table_ms["kvikpy"][c], table_ms["pyarrow"][c]
        print(f"| {labels[c]} | {k:.0f} | {p:.0f} | {p / k:.2f}x |")
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"versions": versions(), "columns": n, "rounds": rounds}, fh, indent=1)


if __name__ == "__main__":
    main()
