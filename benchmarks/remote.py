"""Remote reads into GPU memory: kvikpy.RemoteFile against kvikio.RemoteFile, each in
its own process, alternating, on the same file served over HTTP on loopback by one
server process (kvikpy.utils.LocalHttpServer: Python's threading server with range
support and sendfile).

For each thread count, the median GB/s of whole-file reads into a CuPy array; each run
checks every byte against the file. The server is the same for both, so the ratio
compares the clients (the absolute rates are the server's and loopback's).
Usage: python -m benchmarks remote [--size-mib 1024] [--threads 1,8,16] [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

from benchmarks.common import run_child, scratch_dir, write_random_file

CHILD = r"""
import json, sys, time
import cupy, numpy as np
lib, url, path = sys.argv[1:4]
threads, task_size, runs = map(int, sys.argv[4:7])
if lib == "kvikpy":
    import kvikpy as mod
else:
    import kvikio as mod
    import kvikio.defaults
mod.defaults.set({"num_threads": threads, "task_size": task_size})
rates = []
with mod.RemoteFile.open_http(url) as f:
    n = f.nbytes()
    buf = cupy.empty(n, dtype=cupy.uint8)
    for r in range(runs + 1):
        buf.fill(0)
        cupy.cuda.runtime.deviceSynchronize()
        t0 = time.perf_counter()
        got = f.read(buf)
        cupy.cuda.runtime.deviceSynchronize()
        dt = time.perf_counter() - t0
        assert got == n, (got, n)
        if r:
            rates.append(n / dt / 1e9)
ok = bool((cupy.asnumpy(buf) == np.fromfile(path, dtype=np.uint8)).all())
print(json.dumps({"rates": rates, "ok": ok}))
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size-mib", type=int, default=1024)
    parser.add_argument("--threads", default="1,8,16")
    parser.add_argument("--task-size-mib", type=int, default=4)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()

    from kvikpy.utils import LocalHttpServer

    folder = scratch_dir("kvikpy-remote-")
    path = os.path.join(folder, "data.bin")
    write_random_file(path, args.size_mib << 20)
    rows = []
    with LocalHttpServer(folder, max_lifetime=3600) as server:
        url = f"{server.url}/data.bin"
        for threads in map(int, args.threads.split(",")):
            rates: dict[str, list[float]] = {"kvikpy": [], "kvikio": []}
            for _ in range(args.rounds):
                for lib in rates:
                    child_args = (lib, url, path, threads, args.task_size_mib << 20, args.runs)
                    r = run_child(CHILD, *child_args, what=lib)
                    if not r["ok"]:
                        raise RuntimeError(f"{lib} read wrong bytes ({threads} threads)")
                    rates[lib] += r["rates"]
            row = {"threads": threads, "size_mib": args.size_mib}
            row |= {lib: statistics.median(v) for lib, v in rates.items()}
            rows.append(row)
            print(
                f"{threads:>3} threads, {args.size_mib} MiB over HTTP into GPU memory: kvikpy "
                f"{row['kvikpy']:.2f} GB/s  kvikio {row['kvikio']:.2f} GB/s  "
                f"({row['kvikpy'] / row['kvikio']:.2f}x)",
                flush=True,
            )
    os.unlink(path)
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(rows, fh, indent=1)


if __name__ == "__main__":
    main()
