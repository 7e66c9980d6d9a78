"""Saving a checkpoint: a state dict written to new files by kvikpy and by the writers a
training job uses today, each in its own process, to the local disk and to ``/dev/shm``.

The state dict is ``--tensors`` float32 tensors of random values, ``--size-mib`` in all,
on the GPU (``--device cuda``, torch) or in host memory (``--device cpu``: numpy arrays,
for machines without torch or a GPU). Writers (``--writers``):

* ``kvikpy-flat``: ``CuFile.write`` of one buffer holding the same bytes (kvikpy's own
  write path with nothing to lay out: the ceiling the others are held to);
* ``kvikpy``: ``kvikpy.safetensors.save_file(..., sync=False)``;
* ``kvikpy-sync``: ``save_file(...)`` at its default, the file and its rename synced;
* ``kvikpy-async``: ``save_file(..., sync=False, blocking=False)``: the time until the
  call returns (the caller blocked) and until ``get()`` returns (the file written);
* ``kvikpy-shards``: ``kvikpy.safetensors.save_pretrained`` in 4 shards and an index;
* ``safetensors``: ``safetensors.torch.save_file`` (``safetensors.numpy.save_file`` on
  the host);
* ``torch-save``: ``torch.save(state_dict, path)``;
* ``dcp``: ``torch.distributed.checkpoint.save`` with ``FileSystemWriter(thread_count=8)``,
  one rank (a gloo process group of one);
* ``dcp-async``: ``torch.distributed.checkpoint.async_save`` with the same writer: blocked
  and total as for ``kvikpy-async``;
* ``dcp-kvikpy`` and ``dcp-kvikpy-async``: the same two with ``kvikpy.dcp.FileSystemWriter``
  (read back with ``kvikpy.dcp.FileSystemReader``, PyTorch's with its own reader).

Each run writes into an empty folder and is timed twice: to the page cache (the call
returning; for the async writers, the save finishing) and including ``os.sync()`` after
it. A process writes once as a warm-up, reads that checkpoint back (kvikpy's
``load_file`` into host memory, ``torch.load``, or ``dcp.load``) and checks every
tensor's bytes against sums taken when the state dict was made, then makes ``--runs``
timed runs, whose checkpoints are checked the same way outside the clock. Rounds rotate
the order of the writers; a row is the median over all timed runs, with the lowest and
highest. Writers whose libraries cannot be imported are reported as skipped.

Usage: python -m benchmarks save [--size-mib 2048 --tensors 256 --device cuda
    --dirs disk,shm --writers ... --rounds 2 --runs 2 --out F.json --markdown F.md]
"""

from __future__ import annotations

import argparse
import atexit
import importlib.util
import json
import os
import shutil
import statistics
import tempfile
from typing import Any

from benchmarks.common import run_child, scratch_dir, versions, write_report

WRITERS = {
    "kvikpy-flat": "kvikpy `CuFile.write` of the same bytes as one buffer",
    "kvikpy": "kvikpy `save_file(sync=False)`",
    "kvikpy-sync": "kvikpy `save_file()` (file and rename synced)",
    "kvikpy-async": "kvikpy `save_file(sync=False, blocking=False)`",
    "kvikpy-shards": "kvikpy `save_pretrained`, 4 shards",
    "safetensors": "`safetensors` `save_file`",
    "torch-save": "`torch.save`",
    "dcp": "`torch.distributed.checkpoint.save`, `FileSystemWriter(thread_count=8)`",
    "dcp-async": "`torch.distributed.checkpoint.async_save`, the same writer",
    "dcp-kvikpy": "`torch.distributed.checkpoint.save`, `kvikpy.dcp.FileSystemWriter`",
    "dcp-kvikpy-async": "`torch.distributed.checkpoint.async_save`, `kvikpy.dcp.FileSystemWriter`",
}
NEEDS_TORCH = ("torch-save", "dcp", "dcp-async", "dcp-kvikpy", "dcp-kvikpy-async")
#: The ratios of rates including ``os.sync()`` printed under the table: (writer, against,
#: the line, with the ratio's place).
RATIOS = (
    (
        "kvikpy-sync",
        "safetensors",
        "kvikpy save_file incl. sync / safetensors {:.2f}x (target 2.5x)",
    ),
    (
        "kvikpy",
        "kvikpy-flat",
        "kvikpy save_file / its flat write of the same bytes {:.2f} (target 0.9)",
    ),
    ("kvikpy-sync", "dcp", "kvikpy save_file incl. sync / dcp.save {:.2f}x"),
    (
        "dcp-kvikpy",
        "dcp",
        "dcp.save incl. sync through kvikpy.dcp / through PyTorch's storage {:.2f}x (target 2x)",
    ),
)

#: One writer's process: ``python -c CHILD spec.json``; prints one JSON line.
CHILD = r"""
import json, os, sys, time, shutil
import numpy as np
spec = json.load(open(sys.argv[1]))
writer, folder, runs = spec["writer"], spec["folder"], spec["runs"]
n, each, cuda = spec["tensors"], spec["bytes"] // spec["tensors"] // 4, spec["device"] != "cpu"
import kvikpy, kvikpy.safetensors as kst
TORCH = ("torch-save", "dcp", "dcp-async", "dcp-kvikpy", "dcp-kvikpy-async")
if cuda or writer in TORCH:
    import torch
rng = np.random.default_rng(11)
host = {f"layer{k:03d}.weight": rng.standard_normal(each, dtype=np.float32) for k in range(n)}
sums = {name: int(a.view(np.uint8).sum(dtype=np.uint64)) for name, a in host.items()}
if cuda:
    state = {name: torch.from_numpy(a).to(spec["device"]) for name, a in host.items()}
    torch.cuda.synchronize()
elif writer in TORCH:
    state = {name: torch.from_numpy(a) for name, a in host.items()}
else:
    state = host
del host
total = sum(a.nbytes for a in state.values()) if not cuda else sum(
    t.numel() * t.element_size() for t in state.values())
if writer.startswith("dcp"):
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    import kvikpy.dcp as kdcp
    dist.init_process_group("gloo", rank=0, world_size=1,
                            init_method="file://" + os.path.join(folder, "pg"))
if writer == "kvikpy-flat":
    flat = (torch.cat([t.reshape(-1) for t in state.values()]) if cuda
            else np.concatenate(list(state.values())))
    flat_sum = sum(sums.values())

def target(k):
    out = os.path.join(folder, f"run{k}")
    shutil.rmtree(out, ignore_errors=True)
    os.makedirs(out)
    return out

def write(out):
    # Returns (seconds blocked, seconds until written to the page cache).
    t0 = time.perf_counter()
    if writer == "kvikpy-flat":
        with kvikpy.CuFile(os.path.join(out, "flat.bin"), "w") as f:
            f.write(flat)
    elif writer == "kvikpy":
        kst.save_file(state, os.path.join(out, "m.safetensors"), sync=False)
    elif writer == "kvikpy-sync":
        kst.save_file(state, os.path.join(out, "m.safetensors"))
    elif writer == "kvikpy-async":
        future = kst.save_file(state, os.path.join(out, "m.safetensors"), sync=False,
                               blocking=False)
        t1 = time.perf_counter()
        future.get()
        return t1 - t0, time.perf_counter() - t0
    elif writer == "kvikpy-shards":
        kst.save_pretrained(state, out, max_shard_size=total // 4 + 1, sync=False)
    elif writer == "safetensors":
        if cuda:
            import safetensors.torch as sf
        else:
            import safetensors.numpy as sf
        sf.save_file(state, os.path.join(out, "m.safetensors"))
    elif writer == "torch-save":
        torch.save(state, os.path.join(out, "m.pt"))
    elif writer == "dcp":
        dcp.save(state, storage_writer=dcp.FileSystemWriter(out, thread_count=8))
    elif writer == "dcp-async":
        future = dcp.async_save(state, storage_writer=dcp.FileSystemWriter(out, thread_count=8))
        t1 = time.perf_counter()
        future.result()
        return t1 - t0, time.perf_counter() - t0
    elif writer == "dcp-kvikpy":
        dcp.save(state, storage_writer=kdcp.FileSystemWriter(out))
    elif writer == "dcp-kvikpy-async":
        future = dcp.async_save(state, storage_writer=kdcp.FileSystemWriter(out))
        t1 = time.perf_counter()
        future.result()
        return t1 - t0, time.perf_counter() - t0
    else:
        raise SystemExit(f"unknown writer {writer}")
    if cuda:
        torch.cuda.synchronize()
    t1 = time.perf_counter()
    return t1 - t0, t1 - t0

def check(out):
    # Every tensor's bytes against the sums taken when the state dict was made.
    if writer == "kvikpy-flat":
        got = np.fromfile(os.path.join(out, "flat.bin"), np.uint8)
        assert got.size == total and int(got.sum(dtype=np.uint64)) == flat_sum, "flat file"
        return
    if writer in ("torch-save",):
        loaded = {k: v.numpy() for k, v in torch.load(os.path.join(out, "m.pt"),
                                                       map_location="cpu").items()}
    elif writer.startswith("dcp"):
        into = {k: torch.zeros(each, dtype=torch.float32) for k in sums}
        reader = kdcp.FileSystemReader if "kvikpy" in writer else dcp.FileSystemReader
        dcp.load(into, storage_reader=reader(out))
        loaded = {k: v.numpy() for k, v in into.items()}
    elif writer == "kvikpy-shards":
        files = sorted(f for f in os.listdir(out) if f.endswith(".safetensors"))
        assert len(files) == 4, files
        loaded = {}
        for f in files:
            loaded.update(kst.load_file(os.path.join(out, f), framework="numpy"))
    else:
        loaded = kst.load_file(os.path.join(out, "m.safetensors"), framework="numpy")
    assert sorted(loaded) == sorted(sums), "names"
    for name, want in sums.items():
        a = loaded[name]
        assert a.dtype == np.float32 and a.shape == (each,), name
        assert int(a.view(np.uint8).sum(dtype=np.uint64)) == want, name

out = target(0)
write(out)
check(out)
rows = []
for k in range(1, runs + 1):
    out = target(k)
    blocked, written = write(out)
    t0 = time.perf_counter()
    os.sync()
    synced = written + time.perf_counter() - t0
    check(out)
    shutil.rmtree(out)
    rows.append({"blocked_s": blocked, "written_s": written, "synced_s": synced})
if writer.startswith("dcp"):
    dist.destroy_process_group()
print(json.dumps({"bytes": total, "runs": rows}))
"""


def available(writer: str, device: str) -> str | None:
    """Why ``writer`` cannot run here, or ``None`` if it can."""
    missing = [
        m
        for m in (["torch"] if writer in NEEDS_TORCH or device != "cpu" else [])
        + (["safetensors"] if writer == "safetensors" else [])
        if importlib.util.find_spec(m) is None
    ]
    return f"{', '.join(missing)} not installed" if missing else None


def folders(names: list[str]) -> dict[str, str]:
    """The destinations: ``disk`` (a scratch folder in /tmp) and ``shm`` (one in
    /dev/shm, where it exists), each removed at exit."""
    out = {}
    for name in names:
        if name == "disk":
            out[name] = scratch_dir("kvikpy-save-")
        elif name == "shm":
            if not os.path.isdir("/dev/shm"):
                print("no /dev/shm here: its rows are left out", flush=True)
                continue
            path = tempfile.mkdtemp(prefix="kvikpy-save-", dir="/dev/shm")
            atexit.register(shutil.rmtree, path, ignore_errors=True)
            out[name] = path
        else:
            raise SystemExit(f"--dirs takes disk and shm, not {name!r}")
    return out


def summary(runs: list[dict[str, float]], nbytes: int, key: str) -> dict[str, float]:
    """GB/s of ``nbytes`` over the runs' ``key`` times: median, lowest and highest."""
    rates = sorted(nbytes / r[key] / 1e9 for r in runs)
    return {"median": statistics.median(rates), "min": rates[0], "max": rates[-1]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mib", type=int, default=2048)
    parser.add_argument("--tensors", type=int, default=256)
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu")
    parser.add_argument("--dirs", default="disk,shm", help="disk, shm or both")
    parser.add_argument("--writers", default=",".join(WRITERS))
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--out", default=None)
    parser.add_argument("--markdown", default=None)
    args = parser.parse_args()
    writers = [w for w in args.writers.split(",") if w]
    unknown = [w for w in writers if w not in WRITERS]
    if unknown or not writers:
        raise SystemExit(f"--writers takes {', '.join(WRITERS)}; got {args.writers!r}")
    if args.size_mib < 1 or args.tensors < 1 or args.rounds < 1 or args.runs < 1:
        raise SystemExit("--size-mib, --tensors, --rounds and --runs must be at least 1")
    if (args.size_mib << 20) // args.tensors < 4:
        raise SystemExit("--size-mib is too small for that many --tensors")
    skipped = {w: why for w in writers if (why := available(w, args.device))}
    for w, why in skipped.items():
        print(f"{w}: skipped ({why})", flush=True)
    run = [w for w in writers if w not in skipped]
    places = folders(args.dirs.split(","))
    results: dict[str, dict[str, Any]] = {}
    for where, folder in places.items():
        for r in range(args.rounds):
            order = run[r % len(run) :] + run[: r % len(run)] if run else []
            for w in order:
                spec = {
                    "writer": w,
                    "folder": folder,
                    "runs": args.runs,
                    "tensors": args.tensors,
                    "bytes": args.size_mib << 20,
                    "device": args.device,
                }
                path = os.path.join(folder, f"spec-{w}.json")
                with open(path, "w") as fh:
                    json.dump(spec, fh)
                got = run_child(CHILD, path, what=f"{w} ({where})", timeout=1800)
                row = results.setdefault(f"{w}@{where}", {"bytes": got["bytes"], "runs": []})
                row["runs"] += got["runs"]
            print(f"{where}: round {r + 1} of {args.rounds} done", flush=True)
    lines = [
        "| writer | where | GB/s, page cache | GB/s incl. `os.sync()` | blocked, s |",
        "|---|---|---|---|---|",
    ]
    for key, row in results.items():
        w, where = key.split("@")
        cached = summary(row["runs"], row["bytes"], "written_s")
        synced = summary(row["runs"], row["bytes"], "synced_s")
        blocked = statistics.median(r["blocked_s"] for r in row["runs"])
        row.update({"page_cache_GBps": cached, "synced_GBps": synced, "blocked_s": blocked})
        lines.append(
            f"| {WRITERS[w]} | {where} | {cached['median']:.2f} ({cached['min']:.2f}-"
            f"{cached['max']:.2f}) | {synced['median']:.2f} ({synced['min']:.2f}-"
            f"{synced['max']:.2f}) | {blocked:.3f} |"
        )
    ratios = []
    for where in places:
        rate = {
            w: results[f"{w}@{where}"]["synced_GBps"]["median"]
            for w in run
            if f"{w}@{where}" in results
        }
        for top, bottom, what in RATIOS:
            if top in rate and bottom in rate:
                ratios.append(f"{where}: {what.format(rate[top] / rate[bottom])}")
        if f"kvikpy-async@{where}" in results and f"kvikpy-sync@{where}" in results:
            sync_s = statistics.median(
                r["written_s"] for r in results[f"kvikpy-sync@{where}"]["runs"]
            )
            ratios.append(
                f"{where}: kvikpy's background save blocks for "
                f"{results[f'kvikpy-async@{where}']['blocked_s'] / sync_s:.3f} of a "
                "synced save's time (target below 0.1)"
            )
    table = "\n".join(lines + (["", *ratios] if ratios else []))
    raw = {
        "versions": versions(),
        "args": vars(args),
        "skipped": skipped,
        "results": results,
    }
    write_report(table, raw, args.markdown, args.out)


if __name__ == "__main__":
    main()
