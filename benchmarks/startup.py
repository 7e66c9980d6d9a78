"""Time from `import kvikpy` to the first 1 MiB of a file in GPU memory, in a fresh
process each run (interpreter start excluded), against kvikio doing the same.

Usage: python -m benchmarks startup [--runs 7]
"""

from __future__ import annotations

import argparse
import os
import statistics

from benchmarks.common import run_child, scratch_dir, write_random_file

CHILD = r"""
import sys, time
t0 = time.perf_counter()
lib, path = sys.argv[1], sys.argv[2]
if lib == "kvikpy":
    import kvikpy, cupy  # the same consumer as kvikio's run: importing torch alone takes ~2 s
    t = cupy.from_dlpack(kvikpy.read(path, size=1 << 20))
    cupy.cuda.runtime.deviceSynchronize()
else:
    import kvikio, cupy
    t = cupy.empty(1 << 20, dtype=cupy.uint8)
    with kvikio.CuFile(path, "r") as f:
        f.read(t)
    cupy.cuda.runtime.deviceSynchronize()
print(time.perf_counter() - t0)
"""


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    folder = scratch_dir("kvikpy-start-")
    path = os.path.join(folder, "data.bin")
    write_random_file(path, 4 << 20)
    for lib in ("kvikpy", "kvikio"):
        times = [float(run_child(CHILD, lib, path, what=lib)) for _ in range(args.runs)]
        print(
            f"{lib}: import to first 1 MiB on the GPU {statistics.median(times) * 1e3:.0f} ms "
            f"(min {min(times) * 1e3:.0f}, max {max(times) * 1e3:.0f})"
        )
    os.unlink(path)


if __name__ == "__main__":
    main()
