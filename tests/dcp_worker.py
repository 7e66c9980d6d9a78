"""One rank of a torch.distributed.checkpoint save and load through kvikpy's storage,
started by the tests (torchrun-style: MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE in the
environment).

Usage: python dcp_worker.py BACKEND DEVICE HOW OUT DIR

HOW is the writer, ``kvikpy``, ``kvikpy-files`` (three data files a rank) or ``torch``
(PyTorch's own FileSystemWriter); the load is
always kvikpy's FileSystemReader. Each rank saves a tensor every rank holds (saved once), a
tensor of its own, a DTensor sharded by rows over the ranks and a plain value, then loads
them into zeros (the DTensor sharded by columns: resharded on loading), checks every value
and writes the names checked and the checkpoint's files to OUT as JSON.
"""

from __future__ import annotations

import json
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.tensor import Shard, distribute_tensor, init_device_mesh

import kvikpy.dcp as kdcp


def main() -> None:
    backend, device, how, out, folder = sys.argv[1:]
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if device == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group(backend)
    try:
        mesh = init_device_mesh(device, (world,))
        on = f"cuda:{rank}" if device == "cuda" else "cpu"
        g = torch.Generator().manual_seed(0)
        shared = torch.randn(64, 33, generator=g).to(on)
        mine = (torch.arange(1000, dtype=torch.int64) * (rank + 1)).to(on)
        full = torch.arange(12 * 10, dtype=torch.float32).reshape(12, 10).to(on)
        state = {
            "shared.w": shared,
            f"rank{rank}.ids": mine,
            "sharded": distribute_tensor(full, mesh, [Shard(0)]),
            "step": 41,
        }
        writer = (
            kdcp.FileSystemWriter(folder)
            if how == "kvikpy"
            else kdcp.FileSystemWriter(folder, thread_count=3)
            if how == "kvikpy-files"
            else dcp.FileSystemWriter(folder)
        )
        dcp.save(state, storage_writer=writer)
        into = {
            "shared.w": torch.zeros_like(shared),
            f"rank{rank}.ids": torch.zeros_like(mine),
            "sharded": distribute_tensor(torch.zeros_like(full), mesh, [Shard(1)]),
            "step": 0,
        }
        dcp.load(into, storage_reader=kdcp.FileSystemReader(folder))
        assert torch.equal(into["shared.w"], shared), "shared.w"
        assert torch.equal(into[f"rank{rank}.ids"], mine), "ids"
        assert torch.equal(into["sharded"].full_tensor(), full), "sharded"
        assert into["step"] == 41, into["step"]
        with open(out, "w") as fh:
            json.dump({"checked": sorted(into), "files": sorted(os.listdir(folder))}, fh)
        # Every rank's collectives finished before the group goes. PyTorch's gloo frees a
        # finished all-gather's tensors on its own thread, which takes the GIL: landing
        # during the interpreter's exit, that aborted about one run in twenty ("terminate
        # called without an active exception"); none in 60 runs with the barrier.
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
