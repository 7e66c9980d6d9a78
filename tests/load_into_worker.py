"""One rank of a process-group load_into, started by tests/gpu/test_load_into_gpu.py
(torchrun-style environment: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE).

Usage: python load_into_worker.py BACKEND DEVICE HOW OUT SHARD [SHARD ...]

HOW is ``all`` (every rank loads every tensor), ``odd`` (each rank its half plus the
``shared*`` tensors) or ``bad`` (rank 1's target has a tensor of the wrong shape: every
rank must raise, none may hang). The shared read runs in rounds of 200 bytes, so a
checkpoint of a few KiB takes many rounds. Writes each tensor (or ``{"error": message}``)
to OUT as JSON (see worker_results.py).
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
import worker_results

import kvikpy._load_into as li
import kvikpy.safetensors as kst


def main() -> None:
    backend, device, how, out, *shards = sys.argv[1:]
    rank = int(os.environ["RANK"])
    if device == "cuda":
        torch.cuda.set_device(rank)
        device = f"cuda:{rank}"
    li.SHARED_ROUND = 200
    dist.init_process_group(backend)
    try:
        state = kst.load_file(shards, "cpu")
        names = sorted(state)
        if how == "odd":
            names = [n for n in names if n.startswith("shared") or int(n[-1]) % 2 == rank]
        target = {n: torch.zeros_like(state[n], device=device) for n in names}
        if how == "bad" and rank == 1:
            target[names[0]] = torch.zeros(3, 3, device=device)
        try:
            kst.load_into(target, shards, process_group=dist.group.WORLD, strict=False)
        except kst.LoadIntoError as e:
            worker_results.write_error(out, str(e))
        else:
            worker_results.write(out, target)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
