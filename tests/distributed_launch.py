"""Start the ranks of a torch.distributed job as real processes on loopback, the way
torchrun does (MASTER_ADDR, MASTER_PORT, RANK, LOCAL_RANK, WORLD_SIZE), and collect what
each rank of tests/distributed_load_worker.py wrote."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

WORKER = Path(__file__).with_name("distributed_load_worker.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_ranks(
    tmp_path: Path,
    backend: str,
    device: str,
    how: str,
    shards: list[Path],
    world: int = 2,
    worker: Path = WORKER,
) -> list[dict[str, Any]]:
    """Run ``world`` ranks to completion; each rank's ``{name: {dtype, shape, hex}}``."""
    port = free_port()
    procs, outs = [], []
    for rank in range(world):
        out = tmp_path / f"rank{rank}.json"
        env = dict(
            os.environ,
            MASTER_ADDR="127.0.0.1",
            MASTER_PORT=str(port),
            RANK=str(rank),
            LOCAL_RANK=str(rank),
            WORLD_SIZE=str(world),
            # The workers import their shared helper from beside them, also where
            # PYTHONSAFEPATH keeps a script's folder off sys.path (the GPU machine).
            PYTHONPATH=os.pathsep.join(
                filter(None, [os.environ.get("PYTHONPATH"), str(worker.parent)])
            ),
        )
        args = [sys.executable, str(worker), backend, device, how, str(out)]
        procs.append(
            subprocess.Popen(
                [*args, *map(str, shards)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
        outs.append(out)
    logs = []
    for p in procs:
        try:
            logs.append(p.communicate(timeout=180)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            raise
    for rank, p in enumerate(procs):
        assert p.returncode == 0, f"rank {rank} exited {p.returncode}:\n{logs[rank]}"
    return [json.loads(out.read_text()) for out in outs]


def expected_bytes(a: np.ndarray) -> str:
    return np.ascontiguousarray(a).tobytes().hex()
