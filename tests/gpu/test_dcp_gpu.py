"""kvikpy.dcp on GPUs: CUDA tensors of every dtype saved through kvikpy's storage straight
from GPU memory and loaded straight into CUDA tensors (and across: GPU to host, another
dtype), byte for byte; PyTorch's own checkpoints of CUDA tensors read by kvikpy's reader;
ranks with NCCL, one GPU each, with a DTensor resharded on loading."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
from distributed_launch import run_ranks

torch = pytest.importorskip("torch")
dcp = pytest.importorskip("torch.distributed.checkpoint")
from test_safetensors_save_gpu import same, state  # noqa: E402

import kvikpy.dcp as kdcp  # noqa: E402

WORKER = Path(__file__).resolve().parent.parent / "dcp_worker.py"


def quietly(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """DCP without a process group, whose warning that it assumes one process is expected."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        return fn(*args, **kwargs)


@pytest.mark.parametrize("writer", ["kvikpy", "torch"])
def test_cuda_tensors_of_every_dtype_round_trip(tmp_path: Path, writer: str) -> None:
    tensors = state("cuda")
    tensors["big"] = (torch.arange(1 << 22, device="cuda", dtype=torch.float32) * 3).sin()
    storage = kdcp.FileSystemWriter if writer == "kvikpy" else dcp.FileSystemWriter
    quietly(dcp.save, tensors, storage_writer=storage(tmp_path))
    into = {n: torch.zeros_like(t) for n, t in tensors.items()}
    quietly(dcp.load, into, storage_reader=kdcp.FileSystemReader(tmp_path))
    for name, t in tensors.items():
        assert into[name].device == t.device and same(into[name], t), name


def test_gpu_tensors_load_into_host_tensors_and_other_dtypes(tmp_path: Path) -> None:
    w = torch.randn(300, 7, device="cuda")
    quietly(dcp.save, {"w": w, "h": w.half()}, storage_writer=kdcp.FileSystemWriter(tmp_path))
    into = {"w": torch.zeros(300, 7), "h": torch.zeros(300, 7, device="cuda")}
    quietly(dcp.load, into, storage_reader=kdcp.FileSystemReader(tmp_path))
    assert torch.equal(into["w"], w.cpu())
    assert torch.equal(into["h"], w.half().float())


@pytest.mark.multi_gpu
@pytest.mark.timeout(300)
@pytest.mark.parametrize("writer", ["kvikpy", "kvikpy-files", "torch"])
def test_ranks_over_nccl_save_and_load_a_resharded_dtensor(tmp_path: Path, writer: str) -> None:
    import torch.distributed as dist

    if not dist.is_nccl_available():
        pytest.skip("torch was built without NCCL")
    world = min(torch.cuda.device_count(), 4)
    folder = tmp_path / "ckpt"
    results = run_ranks(tmp_path, "nccl", "cuda", writer, [folder], world=world, worker=WORKER)
    for rank, got in enumerate(results):
        assert got["checked"] == sorted([f"rank{rank}.ids", "shared.w", "sharded", "step"])
    data = [f for f in results[0]["files"] if f != ".metadata"]
    if writer == "kvikpy":
        assert data == [f"__{r}_0.kvikpy" for r in range(world)]
    elif writer == "kvikpy-files":  # thread_count=3: up to three files a rank, none empty
        for rank in range(world):
            mine = sorted(f for f in data if f.startswith(f"__{rank}_"))
            assert mine == [f"__{rank}_{i}.kvikpy" for i in range(len(mine))]
            assert 1 <= len(mine) <= 3
