"""kvikpy.safetensors.load_into and load_pretrained with torch: modules on the GPU and on
the meta device, tied weights, dtype conversion, process groups (gloo on the host, NCCL
on two GPUs), and transformers checkpoints against from_pretrained, peak memory bounded."""

from __future__ import annotations

import gc
import time
from pathlib import Path
from typing import Any

import pytest
from distributed_launch import expected_bytes, run_ranks
from test_safetensors_distributed import shards

import kvikpy
import kvikpy.safetensors as kst

torch = pytest.importorskip("torch")
st = pytest.importorskip("safetensors.torch")

WORKER = Path(__file__).parent.parent / "load_into_worker.py"


class Tied(torch.nn.Module):  # type: ignore[misc, name-defined]
    """Tied embedding and head, odd dtypes (float16, bfloat16), int64 and bool buffers."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(37, 24)
        self.body = torch.nn.Linear(24, 24).half()
        self.head = torch.nn.Linear(24, 37, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("steps", torch.arange(5, dtype=torch.int64))
        self.register_buffer("flags", torch.ones(7, dtype=torch.bool))
        self.norm = torch.nn.LayerNorm(24, dtype=torch.bfloat16)


def saved(tmp_path: Path) -> tuple[Path, Any]:
    torch.manual_seed(0)
    model = Tied()
    with torch.no_grad():
        model.flags[::2] = False
        model.steps += 3
        model.norm.weight.normal_()
    path = tmp_path / "tied.safetensors"
    st.save_model(model, str(path))  # writes one name of the tied pair
    return path, model


def assert_same_state(got: Any, want: Any) -> None:
    a, b = got.state_dict(), want.state_dict()
    assert list(a) == list(b)
    for name in b:
        assert a[name].dtype == b[name].dtype, name
        assert torch.equal(a[name].cpu(), b[name].cpu()), name


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_module_on_a_device(tmp_path: Path, device: str) -> None:
    path, ref = saved(tmp_path)
    torch.manual_seed(1)
    model = Tied().to(device)
    ptrs = {n: p.data_ptr() for n, p in model.state_dict().items()}
    assert kst.load_into(model, path) == ([], [])
    assert_same_state(model, ref)
    assert model.head.weight is model.embed.weight
    assert {n: p.data_ptr() for n, p in model.state_dict().items()} == ptrs  # in place


def test_meta_module_is_materialised_tied_and_bounded(tmp_path: Path) -> None:
    path, ref = saved(tmp_path)
    with torch.device("meta"):
        model = Tied()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    kst.load_into(model, path, device="cuda:0")
    peak = torch.cuda.max_memory_allocated() - before
    weights = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    tied = model.embed.weight.numel() * model.embed.weight.element_size()
    # The model itself (tied weight once, each allocation rounded to 512 bytes) and the
    # staging of its one window (the whole file, under the bound), no more.
    assert peak <= weights - tied + 512 * len(model.state_dict()) + path.stat().st_size
    assert model.head.weight is model.embed.weight
    assert model.embed.weight.device == torch.device("cuda", 0)
    assert model.embed.weight.requires_grad
    assert_same_state(model, ref)


def test_meta_non_persistent_buffer_is_refused_untouched(tmp_path: Path) -> None:
    path, _ = saved(tmp_path)
    with torch.device("meta"):
        model = Tied()
        model.register_buffer("scratch", torch.zeros(3), persistent=False)
    with pytest.raises(kst.LoadIntoError, match="scratch"):
        kst.load_into(model, path)
    assert model.embed.weight.is_meta  # nothing materialised


def test_mapping_over_gpus_and_host_in_one_window(tmp_path: Path) -> None:
    import kvikpy._load_into as li

    g = torch.Generator().manual_seed(0)
    tensors = {f"t{i}": torch.randn(1000 + i * 64, generator=g) for i in range(6)}
    path = tmp_path / "m.safetensors"
    st.save_file(tensors, str(path))
    flat = torch.zeros(sum(t.numel() for t in tensors.values()), device="cuda")
    views, at = {}, 0
    for name, t in tensors.items():
        views[name] = flat[at : at + t.numel()]
        at += t.numel()
    seen: list[int] = []
    real = li._windows

    def windows(reads: Any, bound: int, gap: int) -> Any:
        got = real(reads, bound, gap)
        seen.append(len(got))
        return got

    li._windows = windows
    try:
        kst.load_into(views, path)
    finally:
        li._windows = real
    assert seen == [1]  # the whole file fits the bound: one read
    for name, t in tensors.items():
        assert torch.equal(views[name].cpu(), t)
    last = torch.cuda.device_count() - 1
    mixed = {
        n: torch.zeros_like(t, device=f"cuda:{last}" if i % 2 else "cpu")
        for i, (n, t) in enumerate(tensors.items())
    }
    kst.load_into(mixed, path)
    for name, t in tensors.items():
        assert torch.equal(mixed[name].cpu(), t)


def test_dtype_conversion_on_the_gpu(tmp_path: Path) -> None:
    import kvikpy._load_into as li

    g = torch.Generator().manual_seed(0)
    tensors = {
        "w": torch.randn(300, 257, generator=g).bfloat16(),
        "h": torch.randn(77, generator=g).half(),
    }
    path = tmp_path / "bf.safetensors"
    st.save_file(tensors, str(path))
    target = {
        n: torch.zeros(t.shape, dtype=torch.float32, device="cuda") for n, t in tensors.items()
    }
    with pytest.raises(kst.LoadIntoError, match="dtype mismatch for w"):
        kst.load_into(target, path)
    assert not target["w"].any()
    old = li.CONVERT_STAGING
    li.CONVERT_STAGING = 4096  # many chunks
    try:
        kst.load_into(target, path, convert_dtype=True)
    finally:
        li.CONVERT_STAGING = old
    for name, t in tensors.items():
        assert torch.equal(target[name].cpu(), t.float()), name


def test_non_contiguous_parameter_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "w.safetensors"
    st.save_file({"w": torch.randn(4, 6)}, str(path))
    target = {"w": torch.zeros(6, 4, device="cuda").t()}
    with pytest.raises(kst.LoadIntoError, match="not contiguous"):
        kst.load_into(target, path)


def test_process_group_gloo_on_the_host(tmp_path: Path) -> None:
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_available() or not dist.is_gloo_available():
        pytest.skip("torch.distributed with gloo is not available")
    files, tensors = shards(tmp_path)
    for how in ("all", "odd"):
        for rank, got in enumerate(run_ranks(tmp_path, "gloo", "cpu", how, files, worker=WORKER)):
            wanted = {
                n
                for n in tensors
                if how == "all" or n.startswith("shared") or int(n[-1]) % 2 == rank
            }
            assert set(got) == wanted
            for name in wanted:
                assert got[name]["hex"] == expected_bytes(tensors[name]), name
    for got in run_ranks(tmp_path, "gloo", "cpu", "bad", files, worker=WORKER):
        assert "error" in got  # every rank raises, none waits for the other


@pytest.mark.multi_gpu
def test_process_group_nccl_on_two_gpus(tmp_path: Path) -> None:
    dist = pytest.importorskip("torch.distributed")
    if not dist.is_nccl_available():
        pytest.skip("torch was built without NCCL")
    files, tensors = shards(tmp_path)
    for rank, got in enumerate(run_ranks(tmp_path, "nccl", "cuda", "odd", files, worker=WORKER)):
        wanted = {n for n in tensors if n.startswith("shared") or int(n[-1]) % 2 == rank}
        assert set(got) == wanted
        for name in wanted:
            assert got[name]["device"] == f"cuda:{rank}"
            assert got[name]["hex"] == expected_bytes(tensors[name]), name


# transformers and accelerate may warn about their own deprecations; those are not
# what these tests check.
THIRD_PARTY_WARNINGS = [
    pytest.mark.filterwarnings("ignore:::transformers.*"),
    pytest.mark.filterwarnings("ignore:::accelerate.*"),
]


def tiny_llama() -> Any:
    transformers = pytest.importorskip("transformers")
    return transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=3,
        vocab_size=300,
        tie_word_embeddings=True,
    )


@pytest.mark.parametrize("shard", [None, "100KB"])
@THIRD_PARTY_WARNINGS[0]
@THIRD_PARTY_WARNINGS[1]
def test_transformers_checkpoint_into_an_empty_model(tmp_path: Path, shard: str | None) -> None:
    transformers = pytest.importorskip("transformers")
    accelerate = pytest.importorskip("accelerate")
    config = tiny_llama()
    torch.manual_seed(0)
    source = transformers.LlamaForCausalLM(config)
    if shard is None:
        source.save_pretrained(tmp_path)
        assert (tmp_path / "model.safetensors").exists()
    else:
        source.save_pretrained(tmp_path, max_shard_size=shard)
        assert (tmp_path / "model.safetensors.index.json").exists()
    ref = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, device_map="cuda")
    with accelerate.init_empty_weights():
        model = transformers.AutoModelForCausalLM.from_config(config)
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    got = kst.load_pretrained(model, tmp_path, device="cuda")
    peak = torch.cuda.max_memory_allocated() - before
    assert got == ([], [])
    state = model.state_dict()
    distinct = {t.data_ptr(): t.numel() * t.element_size() for t in state.values()}
    # The model itself, each allocation rounded up to 512 bytes, and the staging of the
    # windows (each file, under the bound, one window; two buffers at most).
    files = list(tmp_path.glob("*.safetensors"))
    staging = min(2, len(files)) * max(f.stat().st_size for f in files)
    assert peak <= sum(distinct.values()) + 512 * len(state) + staging + 2 * sum(
        b.numel() * b.element_size() for b in model.buffers()
    )
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    ids = torch.randint(0, config.vocab_size, (2, 11), device="cuda")
    model.eval()
    ref.eval()
    with torch.no_grad():
        torch.testing.assert_close(model(ids).logits, ref(ids).logits)


@THIRD_PARTY_WARNINGS[0]
@THIRD_PARTY_WARNINGS[1]
def test_transformers_mismatched_checkpoint(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    config = tiny_llama()
    transformers.LlamaForCausalLM(config).save_pretrained(tmp_path)
    config.intermediate_size = 96
    model = transformers.LlamaForCausalLM(config).cuda()
    before = {n: t.clone() for n, t in model.state_dict().items()}
    with pytest.raises(kst.LoadIntoError, match=r"size mismatch for model\.layers\.0\.mlp"):
        kst.load_pretrained(model, tmp_path)
    for name, t in model.state_dict().items():
        assert torch.equal(t, before[name]), name


class Wide(torch.nn.Module):  # type: ignore[misc, name-defined]
    """Tensors around a 1 MiB staging bound: a tied embedding and head, one weight of
    3 MiB (larger than the bound), float16 weights of 512 KiB, small float32, float16
    and bfloat16 ones."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(300, 256)  # 300 KiB, float32
        self.big = torch.nn.Linear(1024, 768)  # 3 MiB
        self.mid = torch.nn.ModuleList(torch.nn.Linear(512, 512).half() for _ in range(12))
        self.norm = torch.nn.LayerNorm(256, dtype=torch.bfloat16)
        self.head = torch.nn.Linear(256, 300, bias=False)
        self.head.weight = self.embed.weight


def wide_shards(tmp_path: Path) -> tuple[list[Path], Any]:
    torch.manual_seed(0)
    ref = Wide()
    with torch.no_grad():
        for p in ref.parameters():
            p.normal_()
    state = {n: t.detach().clone() for n, t in ref.state_dict().items() if n != "head.weight"}
    names = list(state)
    files = [tmp_path / "a.safetensors", tmp_path / "b.safetensors"]
    half = len(names) // 2
    st.save_file({n: state[n] for n in names[:half]}, str(files[0]))
    st.save_file({n: state[n] for n in names[half:]}, str(files[1]))
    return files, ref


@pytest.mark.timeout(300)
@pytest.mark.parametrize("side_stream", [False, True])
def test_windows_under_a_small_staging_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, side_stream: bool
) -> None:
    import kvikpy._load_into as li

    files, ref = wide_shards(tmp_path)
    kvikpy.defaults.set("checkpoint_staging", 2 << 20)  # restored after the test
    # The pinned bounce buffers take half (the reads would hold more), the windows the rest.
    assert li.staging_split() == (1 << 20, 1 << 20)
    assert li.window_bytes() == 1 << 19
    seen: list[Any] = []
    real = li._windows

    def windows(reads: Any, bound: int, gap: int) -> Any:
        got = real(reads, bound, gap)
        seen.extend(got)
        return got

    monkeypatch.setattr(li, "_windows", windows)
    torch.manual_seed(1)
    model = Wide().cuda()
    ptrs = {n: p.data_ptr() for n, p in model.state_dict().items()}
    model_bytes = sum(
        p.numel() * p.element_size() for p in {p.data_ptr(): p for p in model.parameters()}.values()
    )
    # Earlier tests' garbage (a transformers model's reference cycles) freed by the
    # collector while this one runs would take the count below `before` for good.
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    stream = torch.cuda.Stream() if side_stream else torch.cuda.current_stream()
    with torch.cuda.stream(stream):
        assert kst.load_into(model, files) == ([], [])
    peak = torch.cuda.max_memory_allocated() - before
    assert peak <= li.staging_bytes()  # the two staging buffers, nothing else
    # Freed at the end (the engine lets go at once): polled until it is, memory that
    # stays held failing the test through pytest-timeout.
    while torch.cuda.memory_allocated() > before:
        time.sleep(0.01)
    assert model_bytes > li.staging_bytes()  # the bound is below the model's size
    staged = [w for w in seen if not w.alone]
    assert len(staged) >= 4  # many windows: the two buffers were refilled
    assert all(w.length <= li.window_bytes() for w in staged)
    assert [w.reads[0].names for w in seen if w.alone] == [("big.weight",)]
    assert_same_state(model, ref)
    assert model.head.weight is model.embed.weight
    assert {n: p.data_ptr() for n, p in model.state_dict().items()} == ptrs  # in place


def test_a_failed_window_names_exactly_what_was_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import kvikpy._load_into as li

    files, ref = wide_shards(tmp_path)
    kvikpy.defaults.set("checkpoint_staging", 2 << 20)  # restored after the test
    real = li._windows
    plan: list[Any] = []

    def windows(reads: Any, bound: int, gap: int) -> Any:
        got = real(reads, bound, gap)
        plan.extend(got)
        # The first file is cut inside its third window, after its header was read.
        third = [w for w in got if w.path == str(files[0])][2]
        with open(third.path, "r+b") as f:
            f.truncate(third.offset + third.length // 2)
        return got

    monkeypatch.setattr(li, "_windows", windows)
    target = {n: torch.zeros_like(t, device="cuda") for n, t in ref.state_dict().items()}
    del target["head.weight"]
    with pytest.raises(kst.LoadIntoError, match="were not or only in part") as info:
        kst.load_into(target, files)
    ours = [w for w in plan if w.path == str(files[0])]
    before_cut = [n for w in plan[: plan.index(ours[2])] for r in w.reads for n in r.names]
    assert info.value.written == before_cut
    assert before_cut  # the windows read before the cut were copied out
    want = ref.state_dict()
    for name in before_cut:
        assert torch.equal(target[name].cpu(), want[name]), name
    for name in ours[2].reads[0].names:
        assert name not in info.value.written
