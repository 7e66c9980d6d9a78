"""A safetensors checkpoint into torch tensors on the GPU: kvikpy.safetensors.load_file
against safetensors.torch.load_file(device="cuda") and fastsafetensors (nogds: no
GPUDirect Storage on the test machine), each in its own process, alternating.

GB/s of the file size, median (min-max), warm page cache; every tensor compared with the
reference loader's. Usage: python -m benchmarks checkpoint [--size-mib 2048 --tensors 256]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

from benchmarks.common import run_child, scratch_dir

CHILD = r"""
import json, sys, time, torch
lib, path, runs = sys.argv[1], sys.argv[2], int(sys.argv[3])
opened = []
if lib == "kvikpy":
    from kvikpy.safetensors import load_file
    load = lambda: load_file(path, device="cuda")
elif lib == "fastsafetensors":
    from fastsafetensors import fastsafe_open
    def load():
        # Its tensors are views into a buffer freed when the file closes: keep it open
        # until the tensors have been checked (closing is outside the timing).
        while opened:
            opened.pop().__exit__(None, None, None)
        f = fastsafe_open(filenames=[path], nogds=True, device="cuda:0")
        f.__enter__()
        opened.append(f)
        return {k: f.get_tensor(k) for k in f.keys()}
else:
    from safetensors.torch import load_file
    load = lambda: load_file(path, device="cuda")
times = []
for i in range(2 + runs):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    state = load()
    torch.cuda.synchronize()
    if i >= 2:
        times.append(time.perf_counter() - t0)
    if i < 1 + runs:
        del state
sums = {k: float(v.float().sum()) for k, v in state.items()}
print(json.dumps({"times": times, "sums": sums}))
"""


def main() -> None:
    import torch
    from safetensors.torch import save_file

    parser = argparse.ArgumentParser()
    parser.add_argument("--size-mib", type=int, default=2048)
    parser.add_argument("--tensors", type=int, default=256)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    per = (args.size_mib << 20) // args.tensors // 2  # bf16 elements per tensor
    g = torch.Generator().manual_seed(0)
    state = {
        f"layer.{i}.weight": torch.randn(per, generator=g).bfloat16() for i in range(args.tensors)
    }
    folder = scratch_dir("kvikpy-ckpt-")
    path = os.path.join(folder, "model.safetensors")
    save_file(state, path)
    size = os.path.getsize(path)
    del state
    with open(path, "rb") as fh:
        while fh.read(256 << 20):
            pass
    samples: dict[str, list[float]] = {"kvikpy": [], "safetensors": [], "fastsafetensors": []}
    failed: dict[str, str] = {}
    sums: dict[str, dict[str, float]] = {}
    for _ in range(args.rounds):
        for lib in samples:
            try:
                r = run_child(CHILD, lib, path, args.runs, what=lib)
            except RuntimeError as e:
                if lib != "fastsafetensors":
                    raise
                failed[lib] = str(e)  # an optional peer: report, go on
                continue
            samples[lib] += r["times"]
            sums[lib] = r["sums"]
    for lib in sums:
        if sums[lib] != sums["safetensors"]:
            raise RuntimeError(f"{lib} loaded different tensors than safetensors")
    row: dict = {"file_bytes": size, "tensors": args.tensors, "failed": failed}
    for lib, times in samples.items():
        if not times:
            continue
        row[lib] = {
            "median_GBps": size / statistics.median(times) / 1e9,
            "min_GBps": size / max(times) / 1e9,
            "max_GBps": size / min(times) / 1e9,
        }
    row["ratio"] = row["kvikpy"]["median_GBps"] / row["safetensors"]["median_GBps"]
    if "fastsafetensors" in row:
        row["ratio_fastsafetensors"] = (
            row["kvikpy"]["median_GBps"] / row["fastsafetensors"]["median_GBps"]
        )
    print(json.dumps(row, indent=1))
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(row, fh, indent=1)
    os.unlink(path)


if __name__ == "__main__":
    main()
