"""A sharded safetensors checkpoint onto every GPU of a host, each rank of a
``torch.distributed`` job needing the whole of it: kvikpy reading it once for the group
(``process_group=``) against kvikpy read by every rank alone, InstantTensor's
distributed mode (``process_group=``, its buffered backend) and fastsafetensors' (the
shards split over the ranks, tensors broadcast; nogds).

Two more kvikpy rows: ``kvikpy-into`` is ``load_into(..., process_group=)`` into tensors
allocated beforehand, and ``kvikpy-reads`` has each rank only read its 1/``--ranks`` of
the checkpoint's bytes onto its GPU, with no exchange: the floor under any read-once load
(every byte must leave the page cache once).

Each library runs in its own job of ``--ranks`` processes started by torchrun. A run's
time is the slowest rank's, from a barrier to the moment its last tensor is on its GPU;
one warm-up, then ``--runs`` timed runs, median reported as GB/s of checkpoint delivered
to every GPU. Cold runs drop the shards' pages (``drop_file_page_cache``) before each run.
Every rank's tensors are checked against sums computed here from the data written.

``--also LABEL:LIB:VAR=VALUE[,VAR=VALUE]`` adds a row ``LIB, LABEL``: library ``LIB``'s
job again with these environment variables set in every rank (for example
``--also small-pieces:kvikpy:KVIKPY_GPU_THREADS=16,KVIKPY_READ_CHUNK_SIZE=1048576``).

``--timeline`` adds, to the ``kvikpy`` and ``kvikpy-into`` rows, where the read-once
load's time went in its last run: for each round of the exchange, on each rank, when its
reads were done (the host clock, as the exchange waits for them) and when its all-gather
was (a CUDA event after it; on the host, when the wait for it returned), in seconds from
the call (:func:`timeline`). ``--round-mib`` sets the bytes of one round of
``load_files`` (128 MiB in kvikpy), to see what the round size does.

Usage: python -m benchmarks distributed [--size-mib 4096 --shards 4 --ranks 2 --cold]
    [--libs kvikpy,instanttensor] [--also LABEL:LIB:VAR=VALUE] [--timeline --round-mib N]
(``--device cpu --backend gloo`` runs kvikpy's two variants on the host, to check the
harness on a machine without GPUs.)
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

import numpy as np

from benchmarks.common import scratch_dir, versions

RANK = r"""
import json, os, sys, time
import torch, torch.distributed as dist
lib, device, backend, runs, cold, out, *shards = sys.argv[1:]
runs, cold = int(runs), cold == "1"
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
if device == "cuda":
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    device = f"cuda:{torch.cuda.current_device()}"
dist.init_process_group(backend)
group = dist.group.WORLD
import kvikpy
import kvikpy.safetensors

def sync():
    if device != "cpu":
        torch.cuda.synchronize()

from kvikpy import _read_once
if os.environ.get("BENCH_ROUND_BYTES"):  # --round-mib
    _read_once.ROUND = int(os.environ["BENCH_ROUND_BYTES"])
marks = []  # --timeline: this run's rounds, in the order the exchange gathers them
t0 = start = 0.0
if os.environ.get("BENCH_TIMELINE") == "1":
    gather = _read_once._all_gather

    class Timed:
        def __init__(self, work, mark):
            self.work, self.mark = work, mark

        def wait(self):
            self.work.wait()
            if device != "cpu":  # done on the GPU: an event after the collective
                self.mark["event"] = torch.cuda.Event(enable_timing=True)
                self.mark["event"].record()
            else:
                self.mark["gathered"] = time.perf_counter() - t0

    def timed(packed, mine, world_size, group, async_op=False):
        mark = {"reads_done": time.perf_counter() - t0}
        marks.append(mark)
        work = gather(packed, mine, world_size, group, async_op=async_op)
        if work is None:
            mark["gathered"] = time.perf_counter() - t0
            return None
        return Timed(work, mark)

    _read_once._all_gather = timed

targets = None
if lib == "kvikpy-into":  # the model's tensors exist before the clock starts
    targets = {}
    for s in shards:
        for name, meta in kvikpy.safetensors.read_header(s)[1].items():
            targets[name] = torch.empty(meta["shape"], dtype=torch.float32, device=device)
if lib == "kvikpy-reads":  # this rank's 1/world of the bytes, no exchange: the floor
    sizes = [os.path.getsize(s) for s in shards]
    total = sum(sizes)
    per = -(-total // world)
    lo, hi = rank * per, min(total, (rank + 1) * per)
    pieces, at, start = [], 0, 0
    for s, size in zip(shards, sizes):
        a, b = max(lo, start), min(hi, start + size)
        if a < b:
            pieces.append((s, a - start, b - a, at))
            at += b - a
        start += size
    floor = torch.empty(max(at, 1), dtype=torch.uint8, device=device)

def load():
    if lib == "kvikpy-into":
        kvikpy.safetensors.load_into(targets, shards, process_group=group)
        return targets
    if lib == "kvikpy-reads":
        futures = []
        handles = [kvikpy.CuFile(s, "r") for s, *_ in pieces]
        for f, (s, off, n, at) in zip(handles, pieces):
            futures.append(f.pread(floor[at:at + n], n, off))
        for fut in futures:
            fut.get()
        for f in handles:
            f.close()
        return {}
    if lib == "kvikpy":
        return kvikpy.safetensors.load_files(shards, device, process_group=group)
    if lib == "kvikpy-alone":
        return kvikpy.safetensors.load_files(shards, device)
    if lib == "instanttensor":
        from instanttensor import BackendPolicy, safe_open
        with safe_open(shards, framework="pt", device=torch.cuda.current_device(),
                       process_group=group, backend=BackendPolicy.BUFFERED) as f:
            return dict(f.tensors())
    if lib == "fastsafetensors":
        from fastsafetensors import fastsafe_open
        mine = {r: shards[r::world] for r in range(world)}
        f = fastsafe_open(mine, pg=group, device=device, nogds=True)
        state = {k: f.get_tensor(k) for k in f.keys()}
        sync()
        return state
    raise SystemExit(f"unknown library {lib}")

times = []
for i in range(1 + runs):
    if cold and rank == 0:
        for s in shards:
            kvikpy.drop_file_page_cache(s)
    dist.barrier()
    sync()
    marks.clear()
    if device != "cpu":
        start = torch.cuda.Event(enable_timing=True)
        start.record()
    t0 = time.perf_counter()
    state = load()
    sync()
    took = torch.tensor([time.perf_counter() - t0], dtype=torch.float64,
                        device="cpu" if backend == "gloo" else device)
    dist.all_reduce(took, op=dist.ReduceOp.MAX)  # the slowest rank's time
    if i:
        times.append(float(took.item()))
    if i < runs:
        del state
sums = {k: float(v.double().sum().item()) for k, v in state.items()}
if lib == "kvikpy-reads":
    sums = {"floor": int(floor[:at].sum(dtype=torch.int64).item())}
for m in marks:  # the last run's rounds
    if "event" in m:
        m["gathered"] = start.elapsed_time(m.pop("event")) / 1e3
with open(f"{out}.{rank}", "w") as fh:
    json.dump({"times": times, "sums": sums, "rounds": marks}, fh)
dist.destroy_process_group()
"""


def write_shards(folder: str, size_mib: int, shards: int) -> tuple[list[str], dict[str, float]]:
    """float32 tensors of random values, 32 per shard; their sums, computed here."""
    from safetensors.numpy import save_file

    rng = np.random.default_rng(0)
    per = (size_mib << 20) // shards // 32 // 4
    paths, sums = [], {}
    for s in range(shards):
        tensors = {
            f"shard{s}.layer{i}.weight": rng.standard_normal(per, dtype=np.float32)
            for i in range(32)
        }
        path = os.path.join(folder, f"model-{s + 1:05d}-of-{shards:05d}.safetensors")
        save_file(tensors, path)
        paths.append(path)
        sums.update({k: float(v.sum(dtype=np.float64)) for k, v in tensors.items()})
    return paths, sums


def rank_bytes_sum(shards: list[str], rank: int, world: int) -> int:
    """The sum of the bytes of rank ``rank``'s 1/``world`` of the shards laid end to end."""
    sizes = [os.path.getsize(s) for s in shards]
    per = -(-sum(sizes) // world)
    lo, hi = rank * per, (rank + 1) * per
    total, start = 0, 0
    for s, size in zip(shards, sizes, strict=True):
        a, b = max(lo, start), min(hi, start + size)
        if a < b:
            data = np.memmap(s, dtype=np.uint8, mode="r", offset=a - start, shape=(b - a,))
            total += int(data.sum(dtype=np.int64))
        start += size
    return total


def run_job(
    lib: str, args: argparse.Namespace, shards: list[str], out: str, env: dict[str, str]
) -> list[dict]:
    """One library's job of ``args.ranks`` processes, with ``env`` added to their
    environment; each rank's result."""
    # torchrun runs a file: the rank's code goes beside the shards.
    script = os.path.join(os.path.dirname(out), "rank.py")
    with open(script, "w") as fh:
        fh.write(RANK)
    launch = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command = [*launch, f"--nproc-per-node={args.ranks}", script]
    done = subprocess.run(
        [*command, lib, args.device, args.backend, str(args.runs), str(int(args.cold)), out,
         *shards],
        capture_output=True, text=True, timeout=1800, check=False,
        env=dict(os.environ, KVIKIO_COMPAT_MODE="ON", OMP_NUM_THREADS="1", **env),
    )  # fmt: skip
    if done.returncode:
        # torchrun's own report ends stderr; the rank's traceback, the cause, comes first.
        first = done.stderr.find("Traceback (most recent call last)")
        cause = done.stderr[first : first + 2500] if first >= 0 else done.stderr[-2500:]
        raise RuntimeError(f"{lib}: exit status {done.returncode}; {cause}")
    results = []
    for rank in range(args.ranks):
        with open(f"{out}.{rank}") as fh:
            results.append(json.load(fh))
    return results


def timeline(rounds: list[dict[str, float]]) -> dict[str, object]:
    """One rank's rounds of the exchange (``reads_done`` and ``gathered``, seconds from
    the call, in the order gathered) in milliseconds: every round's, and the first, middle
    and last round's, which tell whether the all-gathers kept up with the reads."""
    if not rounds:
        return {"rounds": 0}
    ms = {k: [round(r[k] * 1e3, 2) for r in rounds] for k in ("reads_done", "gathered")}
    picks = sorted({0, len(rounds) // 2, len(rounds) - 1})
    return {
        "rounds": len(rounds),
        "first_middle_last": {k: [v[i] for i in picks] for k, v in ms.items()},
        "last_gather_after_last_reads": round(ms["gathered"][-1] - ms["reads_done"][-1], 2),
        **ms,
    }


def plan_jobs(libs: list[str], also: list[str]) -> list[tuple[str, str, dict[str, str]]]:
    """The jobs to run, as (row, library, environment): each of ``libs`` as it is, then
    each ``--also`` value (``LABEL:LIB:VAR=VALUE[,VAR=VALUE]``) as row ``LIB, LABEL``.
    ``ValueError`` names a value that is not of that form or whose ``LIB`` is not in
    ``libs``."""
    jobs: list[tuple[str, str, dict[str, str]]] = [(lib, lib, {}) for lib in libs]
    for a in also:
        label, lib, assignments = [*a.split(":", 2), "", ""][:3]
        pairs = [kv.split("=", 1) for kv in assignments.split(",") if kv]
        if not label or lib not in libs or not pairs or any(len(p) != 2 or not p[0] for p in pairs):
            raise ValueError(
                f"--also {a!r}: give LABEL:LIB:VAR=VALUE[,VAR=VALUE] with LIB one of --libs "
                f"({', '.join(libs)})"
            )
        jobs.append((f"{lib}, {label}", lib, {k: v for k, v in pairs}))
    return jobs


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size-mib", type=int, default=4096)
    parser.add_argument("--shards", type=int, default=4)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--cold", action="store_true")
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--backend", default="nccl", choices=["nccl", "gloo"])
    parser.add_argument(
        "--libs",
        default="kvikpy,kvikpy-into,kvikpy-reads,kvikpy-alone,instanttensor,fastsafetensors",
    )
    parser.add_argument(
        "--also",
        action="append",
        default=[],
        help="LABEL:LIB:VAR=VALUE[,VAR=VALUE]: library LIB's job again as row 'LIB, LABEL', "
        "with these environment variables",
    )
    parser.add_argument(
        "--timeline",
        action="store_true",
        help="record each round of the read-once exchange (kvikpy, kvikpy-into rows)",
    )
    parser.add_argument(
        "--round-mib", type=int, default=0, help="bytes of one round of load_files, in MiB"
    )
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    if args.round_mib < 0:
        parser.error(f"--round-mib must be 0 (kvikpy's own) or more, not {args.round_mib}")
    try:
        jobs = plan_jobs(args.libs.split(","), args.also)
    except ValueError as e:
        parser.error(str(e))
    folder = scratch_dir("kvikpy-dist-")
    shards, expected = write_shards(folder, args.size_mib, args.shards)
    total = sum(os.path.getsize(p) for p in shards)
    row: dict = {
        "versions": versions(),
        "checkpoint_bytes": total,
        "shards": args.shards,
        "ranks": args.ranks,
        "mode": "cold" if args.cold else "warm",
        "failed": {},
    }
    for n, (name, lib, env) in enumerate(jobs):
        if args.timeline:
            env = {"BENCH_TIMELINE": "1", **env}
        if args.round_mib:
            env = {"BENCH_ROUND_BYTES": str(args.round_mib << 20), **env}
        try:
            ranks = run_job(lib, args, shards, os.path.join(folder, f"job{n}.json"), env)
        except (RuntimeError, subprocess.TimeoutExpired) as e:
            row["failed"][name] = str(e)[:3000]  # a peer that fails is reported, not fatal
            if name == "kvikpy":
                raise
            continue
        for rank, result in enumerate(ranks):
            got = result["sums"]
            if lib == "kvikpy-reads":
                if got["floor"] != rank_bytes_sum(shards, rank, args.ranks):
                    raise RuntimeError(f"{name}: rank {rank} read different bytes")
                continue
            if set(got) != set(expected) or any(
                not np.isclose(got[k], expected[k], rtol=1e-5, atol=1e-3) for k in expected
            ):
                raise RuntimeError(f"{name}: rank {rank} loaded different tensors")
        times = ranks[0]["times"]
        row[name] = {
            "median_GBps": total / statistics.median(times) / 1e9,
            "min_GBps": total / max(times) / 1e9,
            "max_GBps": total / min(times) / 1e9,
        }
        if args.timeline and lib in ("kvikpy", "kvikpy-into"):
            row[name]["timeline"] = [timeline(r["rounds"]) for r in ranks]
    for name, _, _ in jobs:
        if name != "kvikpy" and name in row:
            row[f"kvikpy_vs_{name}"] = row["kvikpy"]["median_GBps"] / row[name]["median_GBps"]
    print(json.dumps(row, indent=1))
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(row, fh, indent=1)


if __name__ == "__main__":
    main()
