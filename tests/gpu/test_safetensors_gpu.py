"""kvikpy.safetensors.load_file into torch on the GPU, against safetensors itself."""

from __future__ import annotations

from pathlib import Path

import pytest

import kvikpy.safetensors as kst

torch = pytest.importorskip("torch")
st = pytest.importorskip("safetensors.torch")


def test_matches_safetensors_on_the_gpu(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(0)
    tensors = {
        "w": torch.randn(257, 129, generator=g),
        "h": torch.randn(1001, generator=g).half(),
        "bf": torch.randn(333, generator=g).bfloat16(),
        "i": torch.randint(-(2**40), 2**40, (77,), generator=g),
        "m": torch.randint(0, 2, (5, 7), generator=g).bool(),
        "b": torch.randint(0, 256, (3,), generator=g).to(torch.uint8),
    }
    p = tmp_path / "m.safetensors"
    st.save_file(tensors, str(p))
    ours = kst.load_file(p, device="cuda")
    ref = st.load_file(str(p), device="cuda")
    assert set(ours) == set(ref)
    for name in ref:
        assert ours[name].is_cuda and ours[name].dtype == ref[name].dtype, name
        assert torch.equal(ours[name], ref[name]), name
    on_cpu = kst.load_file(p, device="cpu")
    assert all(torch.equal(on_cpu[n], tensors[n]) for n in tensors)
