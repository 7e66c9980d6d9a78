"""A checkpoint read once for two GPUs: two ranks with NCCL, each on its own GPU, get the
whole checkpoint (or their part) byte for byte as safetensors.torch.load_file reads it."""

from __future__ import annotations

from pathlib import Path

import pytest
from distributed_launch import expected_bytes, run_ranks
from test_safetensors_distributed import shards

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

pytestmark = [pytest.mark.gpu, pytest.mark.multi_gpu]


@pytest.mark.parametrize("how", ["all", "odd"])
def test_two_gpus_over_nccl(tmp_path: Path, how: str) -> None:
    if not dist.is_nccl_available():
        pytest.skip("torch was built without NCCL")
    files, tensors = shards(tmp_path)
    for rank, got in enumerate(run_ranks(tmp_path, "nccl", "cuda", how, files)):
        wanted = {
            n for n in tensors if how == "all" or n.startswith("shared") or int(n[-1]) % 2 == rank
        }
        assert set(got) == wanted
        for name in wanted:
            assert got[name]["device"] == f"cuda:{rank}"
            assert got[name]["hex"] == expected_bytes(tensors[name]), name
