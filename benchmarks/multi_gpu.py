"""Every GPU of a host at once: warm files read onto 1, 2, 4... GPUs from one process and
from one process per GPU, by kvikpy and kvikio, beside the host's ceilings, in one run.

One file per GPU (``--file-mib`` each, random bytes, warm in the page cache). Rows:

- ceilings: one pinned host-to-device copy per GPU at once (PCIe), page-cache ``preadv``
  into pinned memory of every file at once from 16, 32 and 64 threads (the page-cache
  copy, no GPU; 64 MiB calls), and torch's memory copy on as many threads (the host's
  memory, which the page-cache copy reads and writes once per byte, and the DMA reads
  once more), and the page-cache copy as kvikpy's I/O threads make it
  (``kvikpy._lib.copy_wall``: native threads, each reading pieces of every file into one
  pinned buffer of its own that it reuses, no DMA: the wall any one-process read meets),
  with pieces of kvikpy's chunk (4 MiB), 1 MiB and 16 MiB, since the copy is fastest
  while the buffers in use fit in the CPU's last-level cache;
- kvikpy in one process: one ``CuFile.read`` per GPU from Python threads started
  together, at each ``--threads`` value (``gpu_threads``: the threads of each GPU's pool;
  ``auto``: kvikpy's defaults), and ``read_many(files, device=[...])`` (which allocates
  its destinations: the allocation is in the time), ``read_ranges`` of one file holding
  every GPU's part in turn with the parts spread over the GPUs (allocation in the time),
  and ``iter_chunks`` of that file over the GPUs in turn (``--chunk-mib`` chunks; its
  first pass checks every byte with a sync per chunk, the timed passes only iterate);
  ``--no-spread`` leaves these two out; ``--also`` adds rows run under other
  environment variables (e.g. ``--also lanes:KVIKPY_PAGE_CACHE_DMA_LANES=2``);
- kvikpy with one process per GPU, started together (each its own pools);
- kvikio 26.10 the same two ways (16 MiB tasks, ``--kvikio-threads`` threads), when it is
  installed.

Each library runs in processes of its own; rounds alternate the libraries and rotate
their order; a row is the median over rounds of each round's median run, in GB/s of file
bytes delivered to all GPUs (a run's time is from the first read's start to the last
read's end). Every GPU's bytes are checked against the file's sum. kvikpy's one-process
runs at the first ``--threads`` value also report where its I/O threads spent their
time (``kvikpy._lib.profile_phases``).

Usage: python -m benchmarks multi_gpu [--file-mib 2048 --gpus 1,2,4 --threads auto,8,16
--also LABEL:VAR=VALUE --rounds 2 --runs 5 --out m.json --markdown m.md]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from typing import Any

from benchmarks.common import (
    scratch_dir,
    versions,
    warm_page_cache,
    write_random_file,
    write_report,
)

MIB = 1 << 20

#: How each one-process way of reading is named in the table.
WAY_NAMES = {
    "read_many": "read_many",
    "read_ranges": "read_ranges of one file holding every GPU's part",
    "iter_chunks": "iter_chunks over the GPUs in turn",
}

#: The code of every worker process: ``python -c WORKER spec.json``; prints one JSON line.
WORKER = r"""
import json, os, sys, threading, time
import torch
spec = json.load(open(sys.argv[1]))
lib, files, sums, gpus = spec["lib"], spec["files"], spec["sums"], spec["gpus"]
if lib == "kvikpy":
    import kvikpy as io
    if spec["threads"]:  # each GPU's pool; 0: kvikpy's defaults
        io.defaults.set({"gpu_threads": spec["threads"]})
else:
    import kvikio as io
    import kvikio.defaults
    io.defaults.set({"num_threads": spec["threads"], "task_size": 16 << 20})
nbytes = os.path.getsize(files[0])
dst = {g: torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{g}") for g in gpus}
torch.cuda.synchronize()

def check(g, buf):
    got = int(buf.sum(dtype=torch.int64).item())
    assert got == sums[g], f"{lib} read wrong bytes onto cuda:{g}: sum {got}, want {sums[g]}"

def cufile(use):
    spans = {}
    def one(g):
        t0 = time.time()
        with io.CuFile(files[g], "r") as f:
            n = f.read(dst[g])
        assert n == nbytes, f"short read {n}"
        spans[g] = (t0, time.time())
    threads = [threading.Thread(target=one, args=(g,)) for g in use]
    for t in threads: t.start()
    for t in threads: t.join()
    if len(spans) != len(use):
        raise RuntimeError("a read failed")
    return min(s[0] for s in spans.values()), max(s[1] for s in spans.values())

def read_many(use):
    t0 = time.time()
    batch = io.read_many([files[g] for g in use], device=[f"cuda:{g}" for g in use])
    t1 = time.time()
    for g, buf in zip(use, batch):
        check(g, torch.from_dlpack(buf))
    return t0, t1

def read_ranges(use):
    # One file holding every GPU's part, its parts spread over the GPUs in one call.
    t0 = time.time()
    batch = io.read_ranges(spec["spread"][str(max(spec["counts"]))],
                           [(k * nbytes, nbytes) for k in range(len(use))],
                           device=[f"cuda:{g}" for g in use])
    t1 = time.time()
    for g, buf in zip(use, batch):
        check(g, torch.from_dlpack(buf))
    return t0, t1

checked = set()
def iter_chunks(use):
    # The file of these GPUs' parts in chunks taking the GPUs in turn; every byte's sum
    # checked on the first pass (a sync per chunk), the timed passes only iterate.
    verify = len(use) not in checked
    total = 0
    t0 = time.time()
    for chunk in io.iter_chunks(spec["spread"][str(len(use))], spec["chunk_bytes"],
                                device=[f"cuda:{g}" for g in use]):
        if verify:
            total += int(torch.from_dlpack(chunk).sum(dtype=torch.int64).item())
    for g in use:
        torch.cuda.synchronize(g)
    t1 = time.time()
    if verify:
        want = sum(sums[g] for g in use)
        assert total == want, f"iter_chunks read wrong bytes: sum {total}, want {want}"
        checked.add(len(use))
    return t0, t1

WAYS = {"cufile": cufile, "read_many": read_many, "read_ranges": read_ranges,
        "iter_chunks": iter_chunks}
out = {"runs": {}, "phases": {}}
for label, counts in spec["plan"]:
    for count in counts:
        use = gpus[:count]
        fn = WAYS[label]
        profile = lib == "kvikpy" and spec.get("profile") and label == "cufile"
        fn(use)  # warm-up: pools, pinned buffers, contexts
        spans = []
        if profile:
            io._lib.profile_enable(True); io._lib.profile_phases(reset=True)
        # One process per GPU: run k starts at slots[k], the same moment in every process.
        slots = spec.get("slots") or [None] * spec["runs"]
        for at in slots:
            while at and time.time() < at:
                time.sleep(0.0002)
            spans.append(fn(use))
        if profile:
            io._lib.profile_enable(False)
            phases, moved = io._lib.profile_phases(reset=True)
            out["phases"][str(count)] = {"phases": phases, "bytes": moved,
                                         "seconds": sum(b - a for a, b in spans)}
        if label == "cufile":
            for g in use:
                check(g, dst[g])
        out["runs"][f"{label}:{count}"] = spans
print(json.dumps(out))
"""

#: Ceilings, in a process of their own: pinned copies and page-cache preadv.
CEILINGS = r"""
import json, os, sys, threading, time, statistics
import torch
spec = json.load(open(sys.argv[1]))
files, gpus, runs = spec["files"], spec["gpus"], spec["runs"]
nbytes = os.path.getsize(files[0])
out = {"pinned": {}, "preadv": {}}
pairs = {}
for g in gpus:
    with torch.cuda.device(g):
        pairs[g] = (torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{g}"),
                    torch.randint(0, 255, (nbytes,), dtype=torch.uint8).pin_memory())
for count in spec["counts"]:
    use = gpus[:count]
    times = []
    for r in range(runs + 1):
        start = threading.Barrier(count + 1)
        def copy(g):
            with torch.cuda.device(g):
                start.wait()
                pairs[g][0].copy_(pairs[g][1], non_blocking=True)
                torch.cuda.synchronize(g)
        threads = [threading.Thread(target=copy, args=(g,)) for g in use]
        for t in threads: t.start()
        start.wait(); t0 = time.perf_counter()
        for t in threads: t.join()
        if r:
            times.append(time.perf_counter() - t0)
    out["pinned"][str(count)] = nbytes * count / statistics.median(times) / 1e9
hosts = [pairs[g][1] for g in gpus]
views = [memoryview(h.numpy()) for h in hosts]
piece = 64 << 20  # few calls: the syscall's copy, not Python, sets the pace
for nthreads in spec["preadv_threads"]:
    times = []
    for r in range(runs + 1):
        jobs = [(i, off) for i in range(len(gpus)) for off in range(0, nbytes, piece)]
        shares = [jobs[k::nthreads] for k in range(nthreads)]
        fds = [os.open(files[i], os.O_RDONLY) for i in range(len(gpus))]
        start = threading.Barrier(nthreads + 1)
        def reader(share):
            start.wait()
            for i, off in share:
                os.preadv(fds[i], [views[i][off:off + piece]], off)
        threads = [threading.Thread(target=reader, args=(s,)) for s in shares]
        for t in threads: t.start()
        start.wait(); t0 = time.perf_counter()
        for t in threads: t.join()
        if r:
            times.append(time.perf_counter() - t0)
        for fd in fds: os.close(fd)
    out["preadv"][str(nthreads)] = nbytes * len(gpus) / statistics.median(times) / 1e9
# Host memory: torch's copy of half of each pinned buffer onto its other half, on as many
# threads (native, OpenMP): a read and a write per byte, as the page-cache copy does.
out["memcpy"] = {}
for nthreads in spec["preadv_threads"]:
    torch.set_num_threads(nthreads)
    times = []
    for r in range(runs + 1):
        t0 = time.perf_counter()
        for h in hosts:
            h[nbytes // 2 :].copy_(h[: nbytes // 2])
        if r:
            times.append(time.perf_counter() - t0)
    out["memcpy"][str(nthreads)] = nbytes // 2 * len(gpus) / statistics.median(times) / 1e9
# The page-cache copy as kvikpy's I/O threads make it: native threads, each pread'ing pieces
# of every file into one pinned buffer of its own that it reuses, with no DMA after; pieces
# of kvikpy's chunk (4 MiB), of 1 MiB and of 16 MiB (the CPU's cache sets the pace).
import numpy as np
import kvikpy._lib as _lib
mine = files[: len(gpus)]
sampled = sum(int(np.fromfile(f, np.uint8)[::4096].sum(dtype=np.uint64)) for f in mine)
out["copy_wall"] = {}
for mib in spec["wall_pieces"]:
    by = out["copy_wall"][str(mib)] = {}
    for nthreads in spec["preadv_threads"]:
        times = []
        for r in range(runs + 1):
            seconds, moved, check = _lib.copy_wall(mine, nthreads, mib << 20, True)
            if (moved, check) != (nbytes * len(gpus), sampled):
                sys.exit(f"copy_wall read {moved} bytes, sample sum {check}; expected {sampled}")
            if r:
                times.append(seconds)
        by[str(nthreads)] = moved / statistics.median(times) / 1e9
print(json.dumps(out))
"""


def spawn(
    code: str, spec: dict[str, Any], folder: str, env: dict[str, str]
) -> subprocess.Popen[str]:
    """Start ``python -c code spec.json`` with ``env`` added to this process's."""
    path = os.path.join(folder, f"spec-{time.monotonic_ns()}.json")
    with open(path, "w") as fh:
        json.dump(spec, fh)
    return subprocess.Popen(
        [sys.executable, "-c", code, path],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, **env),
    )


def collect(procs: list[subprocess.Popen[str]], what: str, timeout: float) -> list[Any]:
    """Each process's JSON line; a failure raises ``RuntimeError`` naming ``what``."""
    results = []
    for p in procs:
        out, err = p.communicate(timeout=timeout)
        if p.returncode:
            raise RuntimeError(f"{what} failed: {err[-3000:]}")
        results.append(json.loads(out.strip().splitlines()[-1]))
    return results


def gbps(nbytes: int, spans: list[tuple[float, float]]) -> float:
    """GB/s of the median run."""
    return nbytes / statistics.median(b - a for a, b in spans) / 1e9


def per_gpu_spans(results: list[Any], key: str) -> list[tuple[float, float]]:
    """Run ``r`` of every process merged into one span: first start to last end."""
    mine = [r["runs"][key] for r in results if key in r["runs"]]
    return [(min(s[i][0] for s in mine), max(s[i][1] for s in mine)) for i in range(len(mine[0]))]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--file-mib", type=int, default=2048)
    parser.add_argument(
        "--gpus", default=None, help="GPU counts, e.g. 1,2,4 (default: 1, 2, 4... up to all)"
    )
    parser.add_argument(
        "--threads",
        default="auto",
        help="kvikpy gpu_threads values (threads of each GPU's pool; auto: its defaults)",
    )
    parser.add_argument(
        "--also",
        action="append",
        default=[],
        help="LABEL:VAR=VALUE[,VAR=VALUE]: one more kvikpy one-process row, at the first "
        "--threads value, with these environment variables",
    )
    parser.add_argument("--kvikio-threads", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--no-kvikio", action="store_true")
    parser.add_argument(
        "--no-spread",
        action="store_true",
        help="leave out the read_ranges and iter_chunks rows (and the files they read)",
    )
    parser.add_argument("--chunk-mib", type=int, default=256, help="iter_chunks' chunk size")
    parser.add_argument("--out", default=None)
    parser.add_argument("--markdown", default=None)
    args = parser.parse_args()

    import torch

    total = torch.cuda.device_count()
    if not total:
        raise SystemExit("multi_gpu needs at least one CUDA GPU")
    counts = (
        [int(c) for c in args.gpus.split(",")]
        if args.gpus
        else [c for c in (1, 2, 4, 8, 16) if c <= total]
    )
    if max(counts) > total:
        raise SystemExit(f"--gpus asks for {max(counts)} GPUs; this host has {total}")
    gpus = list(range(max(counts)))
    threads = [0 if t == "auto" else int(t) for t in args.threads.split(",")]
    also: list[tuple[str, dict[str, str]]] = []
    for a in args.also:
        label, _, assignments = a.partition(":")
        also.append((label, dict(kv.split("=", 1) for kv in assignments.split(",") if kv)))
    libs = ["kvikpy"]
    if not args.no_kvikio:
        try:
            import kvikio  # noqa: F401

            libs.append("kvikio")
        except ImportError:
            print("kvikio is not installed: its rows are left out", flush=True)

    folder = scratch_dir("kvikpy-multi-")
    nbytes = args.file_mib * MIB
    files = [os.path.join(folder, f"f{g}.bin") for g in gpus]
    sums = [write_random_file(f, nbytes, seed=g) for g, f in enumerate(files)]
    for f in files:
        warm_page_cache(f)
    # For read_ranges and iter_chunks: one file of the first c GPUs' parts for each count.
    spread: dict[str, str] = {}
    if not args.no_spread:
        for c in counts:
            spread[str(c)] = files[0] if c == 1 else os.path.join(folder, f"spread{c}.bin")
            if c > 1:
                with open(spread[str(c)], "wb") as out:
                    for f in files[:c]:
                        with open(f, "rb") as part:
                            shutil.copyfileobj(part, out, 64 * MIB)
                warm_page_cache(spread[str(c)])
    env = {"KVIKIO_COMPAT_MODE": "ON", "NCCL_NVLS_ENABLE": "0"}
    base = {
        "files": files,
        "sums": sums,
        "gpus": gpus,
        "runs": args.runs,
        "spread": spread,
        "counts": counts,
        "chunk_bytes": args.chunk_mib * MIB,
    }

    (ceil,) = collect(
        [
            spawn(
                CEILINGS,
                {
                    **base,
                    "counts": counts,
                    "preadv_threads": [16, 32, 64],
                    "wall_pieces": [4, 1, 16],
                },
                folder,
                env,
            )
        ],
        "ceilings",
        600,
    )

    def named(t: int) -> str:
        return f"{t} threads per GPU" if t else "its default threads"

    # Configurations: (row, library, threads, one process per GPU?, environment)
    configs: list[tuple[str, str, int, bool, dict[str, str]]] = [
        (f"kvikpy, one process, {named(t)}", "kvikpy", t, False, {}) for t in threads
    ]
    configs += [
        (f"kvikpy, one process, {named(threads[0])}, {label}", "kvikpy", threads[0], False, e)
        for label, e in also
    ]
    configs.append(
        (f"kvikpy, one process per GPU, {named(threads[0])}", "kvikpy", threads[0], True, {})
    )
    if "kvikio" in libs:
        k = args.kvikio_threads
        configs.append((f"kvikio, one process, {k} threads, 16 MiB tasks", "kvikio", k, False, {}))
        configs.append((f"kvikio, one process per GPU, {k} threads each", "kvikio", k, True, {}))
    spans: dict[str, dict[str, list[list[tuple[float, float]]]]] = {}
    phases: dict[str, Any] = {}
    gap = 0.3 + nbytes / 1e9 / 5  # a run at 5 GB/s per GPU fits a slot

    def measure(row: str, lib: str, t: int, per_gpu: bool, extra: dict[str, str]) -> None:
        """One configuration's runs of this round, into ``spans`` (and ``phases``)."""
        nonlocal phases
        plan: list[tuple[str, list[int]]] = [("cufile", counts)]
        if lib == "kvikpy" and not per_gpu:
            plan.append(("read_many", [c for c in counts if c > 1] or counts))
            if spread:
                plan.append(("read_ranges", [c for c in counts if c > 1] or counts))
                plan.append(("iter_chunks", counts))
        spec = {
            **base,
            "lib": lib,
            "threads": t,
            "plan": plan,
            "profile": lib == "kvikpy" and t == threads[0] and not per_gpu and not extra,
        }
        if not per_gpu:
            (res,) = collect([spawn(WORKER, spec, folder, {**env, **extra})], row, 900)
            for key, s in res["runs"].items():
                spans.setdefault(row, {}).setdefault(key, []).append(s)
            if res["phases"]:
                phases = res["phases"]
            return
        # One process per GPU: process g reads its own file in every run of each
        # count that includes it, all processes starting a run at the same moment.
        start_at = time.time() + 12.0 + 0.5 * len(gpus)
        slot = {
            c: [start_at + gap * (k * args.runs + r) for r in range(args.runs)]
            for k, c in enumerate(counts)
        }
        procs = []
        for g in gpus:
            mine = [c for c in counts if g < c]
            one = {
                **spec,
                "gpus": [g],
                "plan": [("cufile", [1])],
                "slots": [at for c in mine for at in slot[c]],
            }
            procs.append(spawn(WORKER, one, folder, env))
        results = collect(procs, row, 900)
        for c in counts:
            merged = []
            for r in range(args.runs):
                part = []
                for g in range(c):
                    mine = [x for x in counts if g < x]
                    part.append(results[g]["runs"]["cufile:1"][mine.index(c) * args.runs + r])
                merged.append((min(p[0] for p in part), max(p[1] for p in part)))
            spans.setdefault(row, {}).setdefault(f"cufile:{c}", []).append(merged)

    def report(stopped: str | None) -> None:
        """The table and the raw results of the rows measured so far, printed (``stopped``
        None: the run is complete) or written only, marked partial, so that a run stopped
        by a time limit keeps what it measured."""
        table: dict[str, dict[str, float]] = {}
        for row, keys in spans.items():
            for key, rounds in keys.items():
                label, count = key.split(":")
                name = (
                    row
                    if label == "cufile"
                    else row.replace("one process", f"one process, {WAY_NAMES[label]}")
                )
                name = (
                    name
                    if label != "cufile" or "per GPU" in row
                    else name + ", one CuFile.read per GPU"
                )
                table.setdefault(name, {})[count] = statistics.median(
                    gbps(nbytes * int(count), r) for r in rounds
                )
        results = {
            "versions": versions(),
            "gpus": torch.cuda.get_device_name(0),
            "host_cpus": os.cpu_count(),
            "file_bytes": nbytes,
            "rounds": args.rounds,
            "runs": args.runs,
            "ceilings": ceil,
            "rows": table,
            "kvikpy_phases": phases,
        }
        lines = [
            "| one run, GB/s in all | "
            + " | ".join(f"{c} GPU{'s' if c > 1 else ''}" for c in counts)
            + " |",
            "|---|" + "---|" * len(counts),
        ]
        lines.append(
            "| pinned host-to-device copy, one per GPU at once (PCIe) | "
            + " | ".join(f"{ceil['pinned'][str(c)]:.1f}" for c in counts)
            + " |"
        )
        pre = " / ".join(f"{v:.1f}" for v in ceil["preadv"].values())
        lines.append(
            "| page-cache preadv into pinned memory, every file, 16 / 32 / 64 threads | "
            + " | ".join([""] * (len(counts) - 1) + [pre])
            + " |"
        )
        for mib, by in ceil.get("copy_wall", {}).items():
            wall = " / ".join(f"{v:.1f}" for v in by.values())
            what = "kvikpy's chunk" if mib == "4" else "pieces"
            lines.append(
                "| page-cache copy as kvikpy's threads make it (native threads, a "
                f"{mib} MiB pinned buffer each ({what}), reused; no DMA), every file, "
                "16 / 32 / 64 threads | " + " | ".join([""] * (len(counts) - 1) + [wall]) + " |"
            )
        mem = " / ".join(f"{v:.1f}" for v in ceil["memcpy"].values())
        lines.append(
            "| host memory copy (torch, half of each pinned buffer onto its other half), 16 / 32 "
            "/ 64 threads | " + " | ".join([""] * (len(counts) - 1) + [mem]) + " |"
        )
        for name, by in table.items():
            lines.append(
                f"| {name} | "
                + " | ".join(f"{by[str(c)]:.1f}" if str(c) in by else "" for c in counts)
                + " |"
            )
        one = table.get(f"kvikpy, one process, {named(threads[0])}, one CuFile.read per GPU", {})
        each = table.get(f"kvikpy, one process per GPU, {named(threads[0])}", {})
        if one and each:
            ratios = ", ".join(
                f"{c} GPU(s) {one[str(c)] / each[str(c)]:.2f}"
                for c in counts
                if str(c) in one and str(c) in each
            )
            lines += ["", f"kvikpy, one process / one process per GPU: {ratios}"]
        if phases:
            top = str(max(int(c) for c in phases))
            p = phases[top]
            busy = sum(ns for _, ns, _ in p["phases"]) or 1
            lines.append("")
            lines.append(
                f"kvikpy's I/O threads, one process onto {top} GPUs, {named(threads[0])}: "
                + ", ".join(f"{name} {100 * ns / busy:.0f}%" for name, ns, _ in p["phases"])
            )
        text = "\n".join(lines)
        if stopped is not None:
            text += f"\n\n(Partial: {stopped}.)"
        results["complete"] = stopped is None
        write_report(text, results, args.markdown, args.out, echo=stopped is None)

    for rnd in range(args.rounds):
        order = configs[rnd % len(configs) :] + configs[: rnd % len(configs)]
        for row, lib, t, per_gpu, extra in order:
            try:
                measure(row, lib, t, per_gpu, extra)
            except (RuntimeError, subprocess.TimeoutExpired) as e:
                print(f"{row}: failed, left out of this round: {e}", flush=True)
            report(f"stopped in round {rnd + 1} of {args.rounds}, after {row}")
        print(f"round {rnd + 1} of {args.rounds} done", flush=True)
    report(None)


if __name__ == "__main__":
    main()
