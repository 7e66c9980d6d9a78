"""One rank of a distributed checkpoint load, started by the tests (torchrun-style: the
rendezvous comes from MASTER_ADDR, MASTER_PORT, RANK and WORLD_SIZE in the environment).

Usage: python distributed_load_worker.py BACKEND DEVICE FILTER OUT SHARD [SHARD ...]

FILTER is ``all``, ``odd`` (a callable: tensors whose name ends in an odd digit on rank 1,
the rest on rank 0, plus every tensor named ``shared*`` on both) or ``map`` (the same as a
rank-to-names mapping). Writes each tensor's device, dtype, shape and bytes to OUT as
JSON (see worker_results.py), and exits 0.
"""

from __future__ import annotations

import os
import sys

import torch
import torch.distributed as dist
import worker_results

import kvikpy.safetensors as kst


def odd(rank: int):  # type: ignore[no-untyped-def]
    def wanted(name: str) -> bool:
        return name.startswith("shared") or int(name[-1]) % 2 == rank

    return wanted


def main() -> None:
    backend, device, how, out, *shards = sys.argv[1:]
    rank = int(os.environ["RANK"])
    if device == "cuda":
        torch.cuda.set_device(rank)
        device = f"cuda:{rank}"
    dist.init_process_group(backend)
    try:
        names = [n for shard in shards for n in kst.read_header(shard)[1]]
        if how == "all":
            tensor_filter = None
        elif how == "odd":
            tensor_filter = odd(rank)
        else:
            tensor_filter = {r: [n for n in names if odd(r)(n)] for r in range(2)}
        state = kst.load_file(
            shards, device, process_group=dist.group.WORLD, tensor_filter=tensor_filter
        )
        worker_results.write(out, state)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
