"""kvikpy.safetensors.load_file with a torch.distributed process group, on the host: two
real ranks (gloo on loopback, started as torchrun would) each get the tensors they need,
byte for byte, read from storage once across the group. The same on two GPUs with NCCL is
tests/gpu/test_safetensors_distributed_gpu.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from distributed_launch import expected_bytes, run_ranks
from test_safetensors import write_safetensors

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available", allow_module_level=True)

RNG = np.random.default_rng(7)


def shards(tmp_path: Path) -> tuple[list[Path], dict[str, np.ndarray]]:
    """Two shards of odd-sized tensors: ``t0``..``t9`` and two ``shared*`` ones."""
    tensors = {f"t{i}": RNG.standard_normal(97 * i + 5).astype(np.float32) for i in range(10)}
    tensors["shared_emb"] = RNG.standard_normal((33, 7)).astype(np.float16)
    tensors["shared_ids"] = RNG.integers(-(2**40), 2**40, 41)
    names = sorted(tensors)
    files = [tmp_path / "model-1.safetensors", tmp_path / "model-2.safetensors"]
    write_safetensors(files[0], {n: tensors[n] for n in names[::2]})
    write_safetensors(files[1], {n: tensors[n] for n in names[1::2]})
    return files, tensors


def check(
    got: dict[str, dict[str, object]], tensors: dict[str, np.ndarray], names: set[str]
) -> None:
    assert set(got) == names
    for name in names:
        assert got[name]["shape"] == list(tensors[name].shape)
        assert got[name]["hex"] == expected_bytes(tensors[name]), name


def test_whole_checkpoint_on_every_rank(tmp_path: Path) -> None:
    files, tensors = shards(tmp_path)
    for got in run_ranks(tmp_path, "gloo", "cpu", "all", files):
        check(got, tensors, set(tensors))
        assert {v["device"] for v in got.values()} == {"cpu"}


@pytest.mark.parametrize("how", ["odd", "map"])
def test_each_rank_gets_its_part(tmp_path: Path, how: str) -> None:
    files, tensors = shards(tmp_path)
    for rank, got in enumerate(run_ranks(tmp_path, "gloo", "cpu", how, files)):
        wanted = {n for n in tensors if n.startswith("shared") or int(n[-1]) % 2 == rank}
        check(got, tensors, wanted)


def test_without_an_initialised_group(tmp_path: Path) -> None:
    import kvikpy.safetensors as kst

    files, _ = shards(tmp_path)
    with pytest.raises(ValueError, match="init_process_group"):
        kst.load_file(files, "cpu", process_group=object())
