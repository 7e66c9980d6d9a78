"""load_pretrained into a model built on the meta device (``torch.device("meta")``, where
buffers are on the meta device too), on the CPU, where torch is installed: a transformers
model's non-persistent buffers (a rotary embedding's) are computed by its own
``_init_weights``, as transformers computes them, and the model then equals the one the
checkpoint was saved from; buffers nothing computes are refused and the model stays on
the meta device."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")

import kvikpy.safetensors as kst  # noqa: E402


def test_a_transformers_model_built_on_meta_loads_its_rotary_buffers(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
    )
    torch.manual_seed(0)
    ref = transformers.LlamaForCausalLM(config).eval()
    kst.save_pretrained(ref, tmp_path)
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config)
    if not [n for n, b in model.named_buffers() if b.is_meta]:
        pytest.skip("this transformers builds its buffers off the meta device")
    assert kst.load_pretrained(model, tmp_path, device="cpu") == ([], [])
    buffers = dict(ref.named_buffers())
    for name, b in model.named_buffers():
        assert torch.equal(b, buffers[name]), name
    ids = torch.arange(10).reshape(1, 10)
    with torch.no_grad():
        assert torch.equal(model.eval()(ids).logits, ref(ids).logits)


class Scaled(torch.nn.Module):  # type: ignore[misc]
    """A layer with a non-persistent buffer its constructor computes, and (``init``) an
    ``_init_weights`` that computes it again, or (``lazy``) one that does not."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how
        self.proj = torch.nn.Linear(4, 4)
        self.register_buffer("scale", torch.arange(4, dtype=torch.float32), persistent=False)

    def _init_weights(self, module: Any) -> None:
        if self.how == "init" and module is self:
            self.scale.copy_(torch.arange(4, dtype=torch.float32))


@pytest.mark.parametrize("how", ["init", "lazy"])
def test_buffers_only_an_init_that_computes_them_can_fill(tmp_path: Path, how: str) -> None:
    torch.manual_seed(1)
    ref = Scaled(how)
    path = tmp_path / "model.safetensors"
    kst.save_file(dict(ref.state_dict()), path)
    with torch.device("meta"):
        model = Scaled(how)
    if how == "init":
        kst.load_into(model, path, device="cpu")
        assert torch.equal(model.scale, ref.scale)
        assert torch.equal(model.proj.weight, ref.proj.weight)  # the checkpoint's, not init's
        return
    with pytest.raises(kst.LoadIntoError, match=r"scale.*which its _init_weights does not"):
        kst.load_into(model, path, device="cpu")
    assert model.proj.weight.is_meta and model.scale.is_meta  # back on the meta device


def test_a_module_without_init_weights_is_refused_untouched(tmp_path: Path) -> None:
    ref = torch.nn.Linear(4, 4)
    path = tmp_path / "model.safetensors"
    kst.save_file(dict(ref.state_dict()), path)
    with torch.device("meta"):
        model = torch.nn.Linear(4, 4)
        model.register_buffer("scratch", torch.zeros(3), persistent=False)
    with pytest.raises(kst.LoadIntoError, match="scratch"):
        kst.load_into(model, path, device="cpu")
    assert model.weight.is_meta
