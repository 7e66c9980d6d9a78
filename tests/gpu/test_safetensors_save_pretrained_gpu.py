"""kvikpy.safetensors.save_pretrained from torch modules and tensors on the GPU: a tiny
transformers model saved in shards and loaded back by transformers' from_pretrained and by
kvikpy's load_pretrained, tied weights saved once and tied again, the default metadata,
and tied tensors in a mapping refused."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from test_load_into_gpu import THIRD_PARTY_WARNINGS, tiny_llama

import kvikpy.safetensors as kst

torch = pytest.importorskip("torch")
st = pytest.importorskip("safetensors.torch")
safetensors = pytest.importorskip("safetensors")


def shards(directory: Path) -> list[str]:
    index = json.loads((directory / "model.safetensors.index.json").read_text())
    return sorted(set(index["weight_map"].values()))


def equal_states(a: Any, b: Any) -> None:
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for name, t in sa.items():
        assert t.dtype == sb[name].dtype and torch.equal(t.cpu(), sb[name].cpu()), name


@THIRD_PARTY_WARNINGS[0]
@THIRD_PARTY_WARNINGS[1]
def test_a_model_saved_in_shards_loads_in_transformers_and_kvikpy(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    accelerate = pytest.importorskip("accelerate")
    config = tiny_llama()
    torch.manual_seed(0)
    source = transformers.LlamaForCausalLM(config).cuda()
    assert source.lm_head.weight.data_ptr() == source.model.embed_tokens.weight.data_ptr()
    kst.save_pretrained(source, tmp_path, max_shard_size="100KB")
    source.config.save_pretrained(tmp_path)
    files = shards(tmp_path)
    assert len(files) > 2
    assert not (tmp_path / "model.safetensors").exists()
    index = json.loads((tmp_path / "model.safetensors.index.json").read_text())
    # The head is tied to the embedding and declared so: saved once, as the embedding.
    assert "lm_head.weight" not in index["weight_map"]
    assert "model.embed_tokens.weight" in index["weight_map"]
    assert set(index["weight_map"]) == set(source.state_dict()) - {"lm_head.weight"}
    for file in files:
        assert os.path.getsize(tmp_path / file) < 100_000 + 10_000  # the header's share
        with safetensors.safe_open(str(tmp_path / file), framework="pt") as f:
            assert f.metadata() == {"format": "pt"}

    ref = transformers.AutoModelForCausalLM.from_pretrained(tmp_path).cuda()
    equal_states(ref, source)
    assert ref.lm_head.weight.data_ptr() == ref.model.embed_tokens.weight.data_ptr()

    with accelerate.init_empty_weights():
        model = transformers.AutoModelForCausalLM.from_config(config)
    assert kst.load_pretrained(model, tmp_path, device="cuda") == ([], [])
    equal_states(model, source)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()

    ids = torch.randint(0, config.vocab_size, (2, 11), device="cuda")
    for m in (source, ref, model):
        m.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, source(ids).logits)
        torch.testing.assert_close(ref(ids).logits, source(ids).logits)


class Tied(torch.nn.Module):  # type: ignore[misc, name-defined]
    """An embedding and a head tied to it, with nothing declared: the first name in
    state-dict order is kept."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(50, 16)
        self.norm = torch.nn.LayerNorm(16, dtype=torch.bfloat16)
        self.head = torch.nn.Linear(16, 50, bias=False)
        self.head.weight = self.embed.weight


def test_a_module_with_undeclared_tied_weights_keeps_the_first_name(tmp_path: Path) -> None:
    torch.manual_seed(1)
    source = Tied().cuda()
    kst.save_pretrained(source, tmp_path)
    assert os.listdir(tmp_path) == ["model.safetensors"]
    saved = st.load_file(str(tmp_path / "model.safetensors"))
    assert set(saved) == {"embed.weight", "norm.weight", "norm.bias"}
    target = Tied().cuda()
    assert kst.load_pretrained(target, tmp_path) == ([], [])
    equal_states(target, source)
    assert target.head.weight.data_ptr() == target.embed.weight.data_ptr()


def test_gpu_and_host_tensors_round_trip_in_shards(tmp_path: Path) -> None:
    g = torch.Generator().manual_seed(2)
    tensors = {
        f"w{k}": torch.randn(1000, generator=g).to("cuda" if k % 2 else "cpu") for k in range(6)
    }
    tensors["bf"] = torch.randn(500, generator=g).bfloat16().cuda()
    kst.save_pretrained(tensors, tmp_path, max_shard_size=8000)
    files = shards(tmp_path)
    assert len(files) == 4
    loaded: dict[str, Any] = {}
    for file in files:
        loaded.update(st.load_file(str(tmp_path / file)))
        assert kst.read_header(tmp_path / file)[2] == {"format": "pt"}
    for name, t in tensors.items():
        assert torch.equal(loaded[name], t.cpu()), name


def test_tied_tensors_in_a_mapping_are_refused(tmp_path: Path) -> None:
    state = Tied().cuda().state_dict()
    with pytest.raises(ValueError, match="share memory"):
        kst.save_pretrained(state, tmp_path / "c")
    assert not (tmp_path / "c").exists()
