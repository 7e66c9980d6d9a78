"""kvikpy.safetensors.save_file from torch tensors on the GPU (and CuPy arrays): round
trips read back by safetensors and by kvikpy, files byte for byte safetensors' own, tensors
on two GPUs, and the refusals of torch tensors (shared memory, not contiguous, meta)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from test_safetensors_save import held_writes

import kvikpy
import kvikpy.safetensors as kst
from kvikpy.cufile import CuFile

torch = pytest.importorskip("torch")
st = pytest.importorskip("safetensors.torch")

FLOAT8 = [
    getattr(torch, name)
    for name in (
        "float8_e4m3fn",
        "float8_e5m2",
        "float8_e8m0fnu",
        "float8_e4m3fnuz",
        "float8_e5m2fnuz",
    )
    if hasattr(torch, name)
]


def raw(t: Any) -> Any:
    """A tensor's bytes on the host, as a flat uint8 tensor (float8 has no ``==``)."""
    return t.detach().cpu().contiguous().reshape(-1).view(torch.uint8)


def same(a: Any, b: Any) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(raw(a), raw(b))


def state(device: str, seed: int = 0) -> dict[str, Any]:
    g = torch.Generator().manual_seed(seed)
    cpu = {
        "w": torch.randn(257, 129, generator=g),
        "h": torch.randn(1001, generator=g).half(),
        "bf": torch.randn(333, generator=g).bfloat16(),
        "d": torch.randn(3, 3, generator=g).double(),
        "i": torch.randint(-(2**40), 2**40, (77,), generator=g),
        "i32": torch.randint(-(2**31), 2**31 - 1, (5,), generator=g).int(),
        "s": torch.randint(-(2**15), 2**15, (6,), generator=g).short(),
        "m": torch.randint(0, 2, (5, 7), generator=g).bool(),
        "b": torch.randint(0, 256, (3,), generator=g).to(torch.uint8),
        "c": torch.randn(4, generator=g, dtype=torch.complex64),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 3),
    }
    for k, dtype in enumerate(FLOAT8):  # random bytes: no conversion needed
        cpu[f"f8_{k}"] = torch.randint(0, 256, (9,), generator=g).to(torch.uint8).view(dtype)
    return {name: t.to(device) for name, t in cpu.items()}


def test_cuda_tensors_of_every_dtype_round_trip(tmp_path: Path) -> None:
    tensors = state("cuda")
    path = tmp_path / "model.safetensors"
    kst.save_file(tensors, path, {"format": "pt"})
    for loaded in (st.load_file(str(path)), kst.load_file(path, device="cuda")):
        assert loaded.keys() == tensors.keys()
        for name, t in tensors.items():
            assert same(loaded[name], t), name
    st.save_file(tensors, str(tmp_path / "reference.safetensors"), {"format": "pt"})
    assert path.read_bytes() == (tmp_path / "reference.safetensors").read_bytes()


def test_a_large_tensor_just_computed_is_written_as_computed(tmp_path: Path) -> None:
    """Work still queued on torch's stream is waited for before the bytes are read."""
    x = torch.arange(1 << 24, device="cuda", dtype=torch.float32)
    y = (x * 3 + 1).sin()
    kst.save_file({"y": y, "x": x}, tmp_path / "m.st")
    loaded = kst.load_file(tmp_path / "m.st", device="cuda")
    assert torch.equal(loaded["y"], y) and torch.equal(loaded["x"], x)


def test_parameters_and_host_tensors_of_every_dtype_are_saved_alongside(tmp_path: Path) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(16, 8), torch.nn.LayerNorm(8)).cuda()
    tensors = dict(model.state_dict(keep_vars=True))  # Parameters: requires_grad
    tensors.update({f"host.{n}": t for n, t in state("cpu", seed=3).items()})
    kst.save_file(tensors, tmp_path / "m.st")
    loaded = st.load_file(str(tmp_path / "m.st"))
    for name, t in tensors.items():
        assert same(loaded[name], t), name


@pytest.mark.multi_gpu
def test_tensors_on_two_gpus_round_trip(tmp_path: Path) -> None:
    zero, one = state("cuda:0", seed=1), state("cuda:1", seed=2)
    tensors = {**{f"a.{n}": t for n, t in zero.items()}, **{f"b.{n}": t for n, t in one.items()}}
    kst.save_file(tensors, tmp_path / "m.st")
    loaded = st.load_file(str(tmp_path / "m.st"))
    for name, t in tensors.items():
        assert same(loaded[name], t), name


def test_cupy_arrays_round_trip(tmp_path: Path) -> None:
    cupy = pytest.importorskip("cupy")
    arrays = {"f": cupy.arange(100, dtype=cupy.float32), "u": cupy.ones((3, 4), cupy.uint16)}
    kst.save_file(arrays, tmp_path / "m.st")
    loaded = kst.load_file(tmp_path / "m.st", framework="numpy")
    for name, a in arrays.items():
        assert (loaded[name] == cupy.asnumpy(a)).all() and loaded[name].dtype == a.dtype


def test_views_of_one_storage_that_do_not_overlap_are_saved(tmp_path: Path) -> None:
    w = torch.randn(4, 8, device="cuda")
    kst.save_file({"r0": w[0], "r1": w[1], "rest": w[2:]}, tmp_path / "m.st")
    loaded = st.load_file(str(tmp_path / "m.st"))
    assert same(loaded["r1"], w[1]) and same(loaded["rest"], w[2:])


def refused(what: str) -> tuple[dict[str, Any], str]:
    """The tensors of refusal ``what`` and what its message says."""
    w = torch.randn(4, 8, device="cuda")
    complex64 = torch.randn(3, dtype=torch.complex64, device="cuda")
    return {
        "tied": ({"embed": w, "lm_head": w}, "'embed' and 'lm_head' share memory \\(the same"),
        "overlap": ({"a": w[:2], "b": w[1:3]}, "'a' and 'b' share memory"),
        "transposed": ({"t": w.t()}, "'t' is not contiguous.*call .contiguous\\(\\)"),
        "strided": ({"s": w[:, ::2]}, "not contiguous"),
        "meta": ({"m": torch.empty(3, device="meta")}, "meta device"),
        "conj": ({"c": complex64.conj()}, "resolve_conj"),
        "complex128": ({"q": complex64.to(torch.complex128)}, "dtype torch.complex128"),
    }[what]


@pytest.mark.parametrize(
    "what", ["tied", "overlap", "transposed", "strided", "meta", "conj", "complex128"]
)
def test_refused_torch_tensors_change_nothing_on_disk(tmp_path: Path, what: str) -> None:
    tensors, message = refused(what)
    path = tmp_path / "model.safetensors"
    path.write_bytes(b"the old checkpoint")
    with pytest.raises(ValueError, match=message):
        kst.save_file(tensors, path)
    assert os.listdir(tmp_path) == ["model.safetensors"]
    assert path.read_bytes() == b"the old checkpoint"


def test_an_interrupted_write_from_the_gpu_leaves_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = CuFile.pwrite
    calls = []

    def pwrite(f: CuFile, *args: Any) -> Any:
        calls.append(args)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return real(f, *args)

    monkeypatch.setattr(CuFile, "pwrite", pwrite)
    path = tmp_path / "model.safetensors"
    with pytest.raises(KeyboardInterrupt):
        kst.save_file(state("cuda"), path)
    assert os.listdir(tmp_path) == []


# --- saving in the background (blocking=False) ---


@pytest.mark.parametrize("staging", ["default", "2MiB"])
def test_a_background_save_writes_what_the_tensors_held_at_the_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, staging: str
) -> None:
    """GPU tensors changed on the stream right after the call (and the host ones at
    once) are written as they were; with a 2 MiB staging bound the large tensor's copy
    goes to pinned host memory, the small ones stay on the GPU."""
    if staging != "default":
        kvikpy.defaults.set("checkpoint_staging", 2 << 20)  # restored after the test
    tensors = {**state("cuda"), **{f"host.{n}": t for n, t in state("cpu", seed=5).items()}}
    tensors["big"] = (torch.arange(1 << 22, device="cuda", dtype=torch.float32) * 3).sin()
    kept = {n: t.clone() for n, t in tensors.items()}
    on_gpu = sum(t.numel() * t.element_size() for t in tensors.values() if t.is_cuda)
    release = held_writes(monkeypatch)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    future = kst.save_file(tensors, tmp_path / "m.st", {"format": "pt"}, blocking=False)
    copies = torch.cuda.memory_allocated() - before  # the GPU copies, held until written
    for t in tensors.values():  # the training step goes on: same stream, new values
        t.reshape(-1).view(torch.uint8).fill_(7)
    if staging == "default":
        assert copies >= on_gpu
    else:
        assert copies <= (2 << 20) + (64 << 10)  # the big tensor went to pinned memory
    release.set()
    assert future.get(timeout=120) == (tmp_path / "m.st").stat().st_size
    loaded = st.load_file(str(tmp_path / "m.st"))
    for name, t in kept.items():
        assert same(loaded[name], t), name
    st.save_file(kept, str(tmp_path / "reference.st"), {"format": "pt"})
    assert (tmp_path / "m.st").read_bytes() == (tmp_path / "reference.st").read_bytes()


def test_a_background_save_of_cupy_arrays_and_on_a_side_stream(tmp_path: Path) -> None:
    cupy = pytest.importorskip("cupy")
    arrays = {"f": cupy.arange(1000, dtype=cupy.float32), "u": cupy.ones((3, 4), cupy.uint16)}
    expected = {n: cupy.asnumpy(a) for n, a in arrays.items()}
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        x = torch.full((1 << 20,), 3.0, device="cuda")
        future = kst.save_file({**arrays, "x": x}, tmp_path / "m.st", blocking=False)
        x.fill_(-1)  # queued on the side stream after the copy
    future.get(timeout=120)
    loaded = kst.load_file(tmp_path / "m.st", framework="numpy")
    for name, a in expected.items():
        assert (loaded[name] == a).all() and loaded[name].dtype == a.dtype
    assert (loaded["x"] == 3.0).all()
