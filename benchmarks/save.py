"""Saving a checkpoint: a state dict written to new files by kvikpy and by the writers a
training job uses today, each in its own process, to the local disk and to ``/dev/shm``;
and the same checkpoint loaded back by ``torch.distributed.checkpoint`` through PyTorch's
storage and kvikpy's, by one rank or several.

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
* ``dcp``: ``torch.distributed.checkpoint.save`` with ``FileSystemWriter(thread_count=8)``;
* ``dcp-async``: ``torch.distributed.checkpoint.async_save`` with the same writer: blocked
  and total as for ``kvikpy-async``;
* ``dcp-kvikpy`` and ``dcp-kvikpy-async``: the same two with
  ``kvikpy.dcp.FileSystemWriter(thread_count=8)`` (read back with
  ``kvikpy.dcp.FileSystemReader``, PyTorch's with its own reader);
* ``dcp-none``: ``dcp.save`` through ``kvikpy.dcp.FileSystemWriter`` with its file
  write left out (a probe, not a writer): PyTorch's planning, item resolution, collectives
  and ``.metadata`` file, the time no storage writer can go below; checked for its
  metadata only;
* ``dcp-load``: ``torch.distributed.checkpoint.load`` with PyTorch's ``FileSystemReader``
  of a checkpoint PyTorch's ``FileSystemWriter(thread_count=8)`` wrote;
* ``dcp-kvikpy-load``: the same with ``kvikpy.dcp.FileSystemReader`` of a checkpoint
  ``kvikpy.dcp.FileSystemWriter`` wrote.

The two load rows write their checkpoint outside the clock just before each load and read
its files once (kvikpy's direct writes leave none of it in the page cache), so the load
reads it from a warm page cache; it loads into tensors allocated beforehand on the
state dict's device (zeroed outside the clock before every load), and the clock stops
once the GPU is done. ``os.sync()`` has no part in a load: their column of rates
including it is empty (``None`` in the JSON), and their blocked time is the whole load.

The seven ``dcp`` rows run as ``--ranks`` processes forming one process group on
127.0.0.1 (default 1, a gloo group of one): with more, NCCL where ``--device cuda`` finds
at least that many GPUs (rank ``r`` on GPU ``r``; gloo beside it for what ``async_save``
does on the CPU), else gloo (ranks sharing the GPUs round robin, or on the host with
``--device cpu``). Each rank holds its own shard: ``--tensors / --ranks`` of the tensors
(named ``r{rank}.layer{k}.weight``, so no name is shared between ranks), ``--size-mib /
--ranks`` of the bytes. Every rank waits at a barrier before its clock starts and again
before it stops; a run's time is the slowest rank's, and its rate is the bytes of all
ranks over that time. The other rows are not distributed: each is one process with the
whole state dict, whatever ``--ranks`` is; the table's ``ranks`` column says which is
which, with the group's backend.

Each save is made into an empty folder and timed twice: to the page cache (the call
returning; for the async writers, the save finishing) and including ``os.sync()`` after
it. A process (or group of ranks) writes once as a warm-up, reads that checkpoint back
(kvikpy's ``load_file`` into host memory, ``torch.load``, or ``dcp.load``; for the load
rows, the load itself) and checks every tensor's bytes against sums taken when the state
dict was made, then makes ``--runs`` timed runs, whose checkpoints (or loaded tensors)
are checked the same way outside the clock. Rounds rotate the order of the writers; a
row is the median over all timed runs, with the lowest and highest. Writers whose
libraries cannot be imported are reported as skipped.

Usage: python -m benchmarks save [--size-mib 2048 --tensors 256 --device cuda
    --dirs disk,shm --writers ... --ranks 1 --rounds 2 --runs 2 --out F.json --markdown F.md]
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import importlib.util
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from typing import IO, Any

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
    "dcp-kvikpy": (
        "`torch.distributed.checkpoint.save`, `kvikpy.dcp.FileSystemWriter(thread_count=8)`"
    ),
    "dcp-kvikpy-async": "`torch.distributed.checkpoint.async_save`, `kvikpy.dcp.FileSystemWriter`",
    "dcp-none": "`torch.distributed.checkpoint.save` writing no tensor bytes (DCP's own work)",
    "dcp-load": "`torch.distributed.checkpoint.load`, `FileSystemReader` (load, warm)",
    "dcp-kvikpy-load": "`torch.distributed.checkpoint.load`, `kvikpy.dcp.FileSystemReader` "
    "(load, warm)",
}
#: The rows run by ``--ranks`` processes in one process group.
DCP = (
    "dcp",
    "dcp-async",
    "dcp-kvikpy",
    "dcp-kvikpy-async",
    "dcp-none",
    "dcp-load",
    "dcp-kvikpy-load",
)
#: The rows that time a load, not a save.
LOADS = ("dcp-load", "dcp-kvikpy-load")
NEEDS_TORCH = ("torch-save", *DCP)
#: The ratios of rates printed under the table: (writer, against, which rate, the line,
#: with the ratio's place).
RATIOS = (
    (
        "kvikpy-sync",
        "safetensors",
        "synced_GBps",
        "kvikpy save_file incl. sync / safetensors {:.2f}x (target 2.5x)",
    ),
    (
        "kvikpy",
        "kvikpy-flat",
        "synced_GBps",
        "kvikpy save_file / its flat write of the same bytes {:.2f} (target 0.9)",
    ),
    (
        "kvikpy-sync",
        "kvikpy-flat",
        "synced_GBps",
        "kvikpy save_file with its file synced / the flat write of the same bytes {:.2f}",
    ),
    ("kvikpy-sync", "dcp", "synced_GBps", "kvikpy save_file incl. sync / dcp.save {:.2f}x"),
    (
        "dcp-kvikpy",
        "dcp",
        "synced_GBps",
        "dcp.save incl. sync through kvikpy.dcp / through PyTorch's storage {:.2f}x (target 2x)",
    ),
    (
        "dcp-kvikpy",
        "dcp-none",
        "page_cache_GBps",
        "dcp.save through kvikpy.dcp / DCP's own work with no bytes written {:.2f}",
    ),
    (
        "dcp-kvikpy-load",
        "dcp-load",
        "page_cache_GBps",
        "dcp.load from the page cache through kvikpy.dcp / through PyTorch's storage {:.2f}x",
    ),
)
#: Seconds a process group waits in a collective (the rendezvous included) before failing.
GROUP_TIMEOUT_S = 600

#: One writer's process, or one rank of a dcp row: ``python -c CHILD spec.json``; prints
#: one JSON line.
CHILD = r"""
import json, os, sys, time, shutil
from datetime import timedelta
import numpy as np
spec = json.load(open(sys.argv[1]))
writer, folder, runs = spec["writer"], spec["folder"], spec["runs"]
n, each, cuda = spec["tensors"], spec["bytes"] // spec["tensors"] // 4, spec["device"] != "cpu"
device = spec["device"]
import kvikpy, kvikpy.safetensors as kst
TORCH, LOADS = tuple(spec["torch_rows"]), tuple(spec["load_rows"])
group = writer in spec["dcp_rows"]
rank, world = (int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])) if group else (0, 1)
if cuda or writer in TORCH:
    import torch
backend = None
if group:
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    import kvikpy.dcp as kdcp
    backend = "gloo"
    if cuda and world > 1:
        gpus = torch.cuda.device_count()
        device = f"cuda:{rank % gpus}"
        backend = "nccl" if gpus >= world else "gloo"
    if cuda:
        torch.cuda.set_device(torch.device(device).index or 0)
    # async_save needs a CPU backend in the group: NCCL comes with gloo beside it.
    dist.init_process_group("cpu:gloo,cuda:nccl" if backend == "nccl" else "gloo",
                            timeout=timedelta(seconds=spec["group_timeout_s"]))
rng = np.random.default_rng(11 + rank)
prefix = f"r{rank}." if world > 1 else ""
host = {f"{prefix}layer{k:03d}.weight": rng.standard_normal(each, dtype=np.float32)
        for k in range(n // world)}
sums = {name: int(a.view(np.uint8).sum(dtype=np.uint64)) for name, a in host.items()}
if cuda:
    state = {name: torch.from_numpy(a).to(device) for name, a in host.items()}
    torch.cuda.synchronize()
elif writer in TORCH:
    state = {name: torch.from_numpy(a) for name, a in host.items()}
else:
    state = host
del host
total = sum(a.nbytes for a in state.values()) if not cuda else sum(
    t.numel() * t.element_size() for t in state.values())
if writer == "kvikpy-flat":
    flat = (torch.cat([t.reshape(-1) for t in state.values()]) if cuda
            else np.concatenate(list(state.values())))
    flat_sum = sum(sums.values())
if writer in LOADS:
    into = {name: torch.empty_like(t) for name, t in state.items()}  # the load's targets

def storage_writer(out):
    # Both storages write 8 data files a rank (PyTorch's: one per writing thread).
    return kdcp.FileSystemWriter(out, thread_count=8) if "kvikpy" in writer else (
        dcp.FileSystemWriter(out, thread_count=8))

if writer == "dcp-none":  # DCP's own work: kvikpy.dcp's writer with its file write left out
    kdcp.write_files = lambda files, sync: None
    storage_writer = lambda out: kdcp.FileSystemWriter(out, sync_files=False)

def warm(out):
    # Every file of the checkpoint read once through the page cache (a direct write
    # leaves none of it there), so that every load reads from memory.
    if rank == 0:
        buf = bytearray(16 << 20)
        for name in sorted(os.listdir(out)):
            with open(os.path.join(out, name), "rb", buffering=0) as f:
                while f.readinto(buf):
                    pass

def storage_reader(out):
    return kdcp.FileSystemReader(out) if "kvikpy" in writer else dcp.FileSystemReader(out)

def settle():
    # The GPU's work done and, in a process group, every rank here.
    if cuda:
        torch.cuda.synchronize()
    if group:
        dist.barrier()

def target(k):
    out = os.path.join(folder, f"run{k}")
    if rank == 0:
        shutil.rmtree(out, ignore_errors=True)
        os.makedirs(out)
    settle()
    return out

def write(out):
    # Returns (seconds blocked, seconds until written to the page cache, or loaded).
    if writer in LOADS:  # the checkpoint to load, written outside the clock
        dcp.save(state, storage_writer=storage_writer(out))
        for t in into.values():
            t.zero_()
        settle()
        warm(out)
    settle()
    t0 = time.perf_counter()
    future = None
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
    elif writer in ("dcp", "dcp-kvikpy", "dcp-none"):
        dcp.save(state, storage_writer=storage_writer(out))
    elif writer in ("dcp-async", "dcp-kvikpy-async"):
        future = dcp.async_save(state, storage_writer=storage_writer(out))
    elif writer in LOADS:
        dcp.load(into, storage_reader=storage_reader(out))
    else:
        raise SystemExit(f"unknown writer {writer}")
    blocked = time.perf_counter() - t0
    if writer == "kvikpy-async":
        future.get()
    elif future is not None:
        future.result()
    settle()
    took = time.perf_counter() - t0
    return (blocked if future is not None else took), took

def check(out):
    # Every tensor's bytes against the sums taken when the state dict was made.
    if writer == "dcp-none":  # nothing was written; its metadata is all there is
        assert os.path.exists(os.path.join(out, ".metadata")), "metadata"
        return
    if writer == "kvikpy-flat":
        got = np.fromfile(os.path.join(out, "flat.bin"), np.uint8)
        assert got.size == total and int(got.sum(dtype=np.uint64)) == flat_sum, "flat file"
        return
    if writer in LOADS:
        loaded = {k: v.cpu().numpy() for k, v in into.items()}
    elif writer == "torch-save":
        loaded = {k: v.numpy() for k, v in torch.load(os.path.join(out, "m.pt"),
                                                       map_location="cpu").items()}
    elif group:
        back = {k: torch.zeros(each, dtype=torch.float32) for k in sums}
        dcp.load(back, storage_reader=storage_reader(out))
        loaded = {k: v.numpy() for k, v in back.items()}
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
    synced = None
    if writer not in LOADS:
        t0 = time.perf_counter()
        if rank == 0:
            os.sync()  # the whole machine's: once for the group
        settle()
        synced = written + time.perf_counter() - t0
    check(out)
    settle()
    if rank == 0:
        shutil.rmtree(out)
    rows.append({"blocked_s": blocked, "written_s": written, "synced_s": synced})
if group:
    dist.destroy_process_group()
print(json.dumps({"bytes": total, "runs": rows, "backend": backend, "device": device}))
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


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_ranks(spec: str, ranks: int, what: str, timeout: float) -> list[Any]:
    """Run ``python -c CHILD spec`` as ``ranks`` processes of one process group, each with
    the environment torchrun gives a rank (``MASTER_ADDR`` 127.0.0.1 and a free
    ``MASTER_PORT``, ``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``) and
    ``KVIKIO_COMPAT_MODE=ON``, as ``run_child`` does.

    Parameters
    ----------
    spec
        The path of the run's JSON spec.
    ranks
        How many processes.
    what
        What the run is, for the error message.
    timeout
        Seconds the ranks may take in all.

    Returns
    -------
    list
        The JSON value of each rank's last line of output, by rank.

    Raises
    ------
    RuntimeError
        When a rank fails or the ranks run past ``timeout``, with the exit status and the
        end of the stderr of every rank that failed (of every rank, past the time); the
        ranks still running are killed, so that none waits for a failed peer.
    """
    port = free_port()
    procs: list[subprocess.Popen[str]] = []
    logs: list[tuple[IO[str], IO[str]]] = []
    with contextlib.ExitStack() as files:
        try:
            for rank in range(ranks):
                logs.append(
                    (
                        files.enter_context(tempfile.TemporaryFile("w+")),
                        files.enter_context(tempfile.TemporaryFile("w+")),
                    )
                )
                env = dict(
                    os.environ,
                    KVIKIO_COMPAT_MODE="ON",
                    MASTER_ADDR="127.0.0.1",
                    MASTER_PORT=str(port),
                    RANK=str(rank),
                    LOCAL_RANK=str(rank),
                    WORLD_SIZE=str(ranks),
                )
                command = [sys.executable, "-c", CHILD, spec]
                procs.append(
                    subprocess.Popen(
                        command, stdout=logs[-1][0], stderr=logs[-1][1], text=True, env=env
                    )
                )
            deadline = time.monotonic() + timeout
            while (codes := [p.poll() for p in procs]).count(0) < ranks:
                failed = [r for r, c in enumerate(codes) if c]
                if failed or time.monotonic() > deadline:
                    told = []
                    for r in failed or range(ranks):
                        logs[r][1].seek(0)
                        state = "running" if codes[r] is None else f"exited {codes[r]}"
                        told.append(f"rank {r} {state}: {logs[r][1].read()[-2000:]}")
                    why = "" if failed else f"past {timeout} s; "
                    raise RuntimeError(f"{what}: {why}{'; '.join(told)}")
                time.sleep(0.05)
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait()
        for out, _ in logs:
            out.seek(0)
        return [json.loads(out.read().strip().splitlines()[-1]) for out, _ in logs]


def merge(ranks: list[dict[str, Any]]) -> dict[str, Any]:
    """One result of the ranks' results: their bytes added up, each run's times the
    slowest rank's (``None`` where they are ``None``: the loads' ``synced_s``), the
    backend of their process group and how many they were."""
    runs = [
        {k: None if step[0][k] is None else max(s[k] for s in step) for k in step[0]}
        for step in zip(*(r["runs"] for r in ranks), strict=True)
    ]
    return {
        "bytes": sum(r["bytes"] for r in ranks),
        "runs": runs,
        "ranks": len(ranks),
        "backend": ranks[0]["backend"],
    }


def summary(runs: list[dict[str, Any]], nbytes: int, key: str) -> dict[str, float] | None:
    """GB/s of ``nbytes`` over the runs' ``key`` times: median, lowest and highest
    (``None`` where the runs have no such time: a load's ``synced_s``)."""
    if any(r[key] is None for r in runs):
        return None
    rates = sorted(nbytes / r[key] / 1e9 for r in runs)
    return {"median": statistics.median(rates), "min": rates[0], "max": rates[-1]}


def rate(s: dict[str, float] | None) -> str:
    """A ``summary`` as a table cell: the median with the range; empty for ``None``."""
    return "" if s is None else f"{s['median']:.2f} ({s['min']:.2f}-{s['max']:.2f})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mib", type=int, default=2048)
    parser.add_argument("--tensors", type=int, default=256)
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu")
    parser.add_argument("--dirs", default="disk,shm", help="disk, shm or both")
    parser.add_argument("--writers", default=",".join(WRITERS))
    parser.add_argument("--ranks", type=int, default=1, help="processes of each dcp row")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--out", default=None)
    parser.add_argument("--markdown", default=None)
    args = parser.parse_args()
    writers = [w for w in args.writers.split(",") if w]
    unknown = [w for w in writers if w not in WRITERS]
    if unknown or not writers:
        raise SystemExit(f"--writers takes {', '.join(WRITERS)}; got {args.writers!r}")
    if min(args.size_mib, args.tensors, args.ranks, args.rounds, args.runs) < 1:
        raise SystemExit("--size-mib, --tensors, --ranks, --rounds and --runs must be at least 1")
    if (args.size_mib << 20) // args.tensors < 4:
        raise SystemExit("--size-mib is too small for that many --tensors")
    if args.tensors % args.ranks:
        raise SystemExit("--tensors must be a multiple of --ranks (each rank holds its share)")
    if args.ranks > 1 and args.device.startswith("cuda:"):
        raise SystemExit("--ranks above 1 takes --device cuda (rank r on GPU r) or cpu")
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
                    "dcp_rows": DCP,
                    "load_rows": LOADS,
                    "torch_rows": NEEDS_TORCH,
                    "group_timeout_s": GROUP_TIMEOUT_S,
                }
                path = os.path.join(folder, f"spec-{w}.json")
                with open(path, "w") as fh:
                    json.dump(spec, fh)
                what = f"{w} ({where})"
                if w in DCP:
                    got = merge(run_ranks(path, args.ranks, what, timeout=1800))
                else:
                    got = merge([run_child(CHILD, path, what=what, timeout=1800)])
                row = results.setdefault(f"{w}@{where}", {**got, "runs": []})
                row["runs"] += got["runs"]
                done = summary(got["runs"], got["bytes"], "synced_s") or summary(
                    got["runs"], got["bytes"], "written_s"
                )
                print(f"{where}, round {r + 1}: {w} {rate(done)} GB/s", flush=True)
                # What is measured so far, on file, should the run be stopped.
                table, raw = report(results, run, places, args, skipped)
                partial = f"\n\n(Partial: stopped in round {r + 1} of {args.rounds} at {where}.)"
                write_report(
                    table + partial, {**raw, "complete": False}, args.markdown, args.out, echo=False
                )
            print(f"{where}: round {r + 1} of {args.rounds} done", flush=True)
    table, raw = report(results, run, places, args, skipped)
    write_report(table, {**raw, "complete": True}, args.markdown, args.out)


def report(
    results: dict[str, dict[str, Any]],
    run: list[str],
    places: dict[str, str],
    args: argparse.Namespace,
    skipped: dict[str, str],
) -> tuple[str, dict[str, Any]]:
    """The Markdown table (with its notes and ratios) and the raw results of ``results``,
    the rows measured so far."""
    lines = [
        "| writer | where | ranks | GB/s, page cache | GB/s incl. `os.sync()` | blocked, s |",
        "|---|---|---|---|---|---|",
    ]
    for key, row in results.items():
        w, where = key.split("@")
        cached = summary(row["runs"], row["bytes"], "written_s")
        synced = summary(row["runs"], row["bytes"], "synced_s")
        blocked = statistics.median(r["blocked_s"] for r in row["runs"])
        row.update({"page_cache_GBps": cached, "synced_GBps": synced, "blocked_s": blocked})
        ranks = f"{row['ranks']} ({row['backend']})" if row["backend"] else "1"
        lines.append(
            f"| {WRITERS[w]} | {where} | {ranks} | {rate(cached)} | {rate(synced)} "
            f"| {blocked:.3f} |"
        )
    notes = []
    if any(w in LOADS for w in run):
        notes.append(
            "The load rows read a checkpoint just written, from the page cache, into tensors "
            "allocated beforehand; `os.sync()` has no part in a load, so their column "
            "including it is empty."
        )
    if args.ranks > 1:
        notes.append(
            f"The dcp rows ran as {args.ranks} ranks, each saving or loading its "
            f"1/{args.ranks} of the state dict; their rate is all ranks' bytes over the "
            "slowest rank's time. The other rows are one process with the whole state dict."
        )
    ratios = []
    for where in places:
        for top, bottom, which, what in RATIOS:
            if f"{top}@{where}" in results and f"{bottom}@{where}" in results:
                a, b = (results[f"{w}@{where}"][which]["median"] for w in (top, bottom))
                ratios.append(f"{where}: {what.format(a / b)}")
        if f"kvikpy-async@{where}" in results and f"kvikpy-sync@{where}" in results:
            sync_s = statistics.median(
                r["written_s"] for r in results[f"kvikpy-sync@{where}"]["runs"]
            )
            ratios.append(
                f"{where}: kvikpy's background save blocks for "
                f"{results[f'kvikpy-async@{where}']['blocked_s'] / sync_s:.3f} of a "
                "synced save's time (target below 0.1)"
            )
    table = "\n".join(lines + [f"\n{n}" for n in notes] + (["", *ratios] if ratios else []))
    raw = {
        "versions": versions(),
        "args": vars(args),
        "skipped": skipped,
        "results": results,
    }
    return table, raw


if __name__ == "__main__":
    main()
