"""kvikpy.safetensors.load_into and load_pretrained on the host, with numpy targets (the
torch-specific parts, modules, the meta device and process groups, are in
tests/gpu/test_load_into_gpu.py)."""

from __future__ import annotations

import contextlib
import itertools
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_safetensors import sample, write_safetensors

import kvikpy
import kvikpy._load_into as li
import kvikpy.safetensors as kst


def zeros_like(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    return {k: np.zeros_like(v) for k, v in tensors.items()}


def spy_reads(monkeypatch: pytest.MonkeyPatch) -> list[list[li._Read]]:
    """Record the reads each _run is given."""
    calls: list[list[li._Read]] = []
    real = li._run

    def run(reads: Any, dest: Callable[..., Any] | None = None) -> list[str]:
        calls.append(list(reads))
        return real(reads, dest)

    monkeypatch.setattr(li, "_run", run)
    return calls


def test_every_tensor_lands_in_its_target(tmp_path: Path) -> None:
    tensors = sample()
    write_safetensors(tmp_path / "m.safetensors", tensors)
    target = zeros_like(tensors)
    got = kst.load_into(target, tmp_path / "m.safetensors")
    assert got == kst.LoadResult([], [])
    for name, a in tensors.items():
        np.testing.assert_array_equal(target[name], a)
        assert target[name].dtype == a.dtype


def test_adjacent_in_file_and_memory_is_one_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tensors = sample()
    write_safetensors(tmp_path / "m.safetensors", tensors)
    whole = np.zeros(sum(a.nbytes for a in tensors.values()), np.uint8)
    target: dict[str, np.ndarray] = {}
    at = 0
    for name, a in tensors.items():
        target[name] = whole[at : at + a.nbytes].view(a.dtype).reshape(a.shape)
        at += a.nbytes
    calls = spy_reads(monkeypatch)
    kst.load_into(target, str(tmp_path / "m.safetensors"))
    assert [len(c) for c in calls] == [1]
    assert calls[0][0].length == whole.nbytes
    for name, a in tensors.items():
        np.testing.assert_array_equal(target[name], a)
    # Separate arrays: one read each, all in one plan.
    calls.clear()
    kst.load_into(zeros_like(tensors), tmp_path / "m.safetensors")
    assert len(calls) == 1
    assert len(calls[0]) == sum(1 for a in tensors.values() if a.nbytes)


def test_shards_in_one_plan(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    tensors = sample()
    names = list(tensors)
    write_safetensors(tmp_path / "a.safetensors", {n: tensors[n] for n in names[:3]})
    write_safetensors(tmp_path / "b.safetensors", {n: tensors[n] for n in names[3:]})
    target = zeros_like(tensors)
    calls = spy_reads(monkeypatch)
    kst.load_into(target, [tmp_path / "a.safetensors", tmp_path / "b.safetensors"])
    assert len(calls) == 1
    assert {r.path for r in calls[0]} == {
        str(tmp_path / "a.safetensors"),
        str(tmp_path / "b.safetensors"),
    }
    for name, a in tensors.items():
        np.testing.assert_array_equal(target[name], a)


def test_tied_names_read_once_and_fill_each_other(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    emb = np.arange(48, dtype=np.float32).reshape(6, 8)
    write_safetensors(tmp_path / "one.safetensors", {"embed": emb})
    write_safetensors(tmp_path / "both.safetensors", {"embed": emb, "head": emb + 1})
    shared = np.zeros_like(emb)
    calls = spy_reads(monkeypatch)
    # The checkpoint has one name of the tied pair: the other is not missing.
    assert kst.load_into({"embed": shared, "head": shared}, tmp_path / "one.safetensors") == (
        [],
        [],
    )
    np.testing.assert_array_equal(shared, emb)
    # Both names in the checkpoint: the memory is read once, from the first name.
    shared[:] = 0
    kst.load_into({"head": shared, "embed": shared}, tmp_path / "both.safetensors")
    assert len(calls[-1]) == 1
    np.testing.assert_array_equal(shared, emb)


def test_mismatches_are_reported_like_torch_and_write_nothing(tmp_path: Path) -> None:
    tensors = sample()
    write_safetensors(tmp_path / "m.safetensors", tensors)
    target = {k: np.full_like(v, 7) for k, v in tensors.items()}
    del target["b"]
    target["extra"] = np.full(3, 7.0)
    target["w"] = np.full((33, 64), 7, np.float32)
    target["ids"] = np.full(17, 7, np.int32)
    before = {k: v.copy() for k, v in target.items()}
    with pytest.raises(kst.LoadIntoError) as info:
        kst.load_into(target, tmp_path / "m.safetensors")
    message = str(info.value)
    assert message.startswith("Error(s) in loading state_dict for the target mapping:")
    assert 'Unexpected key(s) in state_dict: "b".' in message
    assert 'Missing key(s) in state_dict: "extra".' in message
    assert message.index("Missing") < message.index("Unexpected") < message.index("size")
    assert "size mismatch for w: copying a param with shape (64, 33) from checkpoint" in message
    assert "dtype mismatch for ids: the checkpoint holds I64, the target is int32" in message
    assert info.value.missing_keys == ["extra"]
    assert info.value.unexpected_keys == ["b"]
    assert info.value.written == []
    assert isinstance(info.value, ValueError) and isinstance(info.value, RuntimeError)
    for name, a in target.items():
        np.testing.assert_array_equal(a, before[name])  # nothing written


def test_strict_false_returns_the_lists(tmp_path: Path) -> None:
    tensors = sample()
    write_safetensors(tmp_path / "m.safetensors", tensors)
    target = zeros_like(tensors)
    del target["b"]
    target["extra"] = np.zeros(3)
    got = kst.load_into(target, tmp_path / "m.safetensors", strict=False)
    assert got.missing_keys == ["extra"] and got.unexpected_keys == ["b"]
    np.testing.assert_array_equal(target["w"], tensors["w"])


def test_non_contiguous_and_read_only_targets_are_refused(tmp_path: Path) -> None:
    w = np.arange(12, dtype=np.float32).reshape(3, 4)
    write_safetensors(tmp_path / "m.safetensors", {"w": w})
    strided = np.zeros((4, 3), np.float32).T
    with pytest.raises(kst.LoadIntoError, match="w is not contiguous"):
        kst.load_into({"w": strided}, tmp_path / "m.safetensors")
    frozen = np.zeros((3, 4), np.float32)
    frozen.flags.writeable = False
    with pytest.raises(kst.LoadIntoError, match="w is read-only"):
        kst.load_into({"w": frozen}, tmp_path / "m.safetensors")


@pytest.mark.parametrize("staging", [2 << 20, 8 << 20, None])
def test_conversions_stay_within_the_staging_setting(tmp_path: Path, staging: int | None) -> None:
    """A dtype conversion stages at most ``checkpoint_staging`` (and 64 MiB, and its
    largest tensor) at a time: the host memory a load allocates is measured (numpy
    allocations are traced)."""
    import tracemalloc

    half = np.random.default_rng(2).standard_normal(6 << 20).astype(np.float16)  # 12 MiB
    write_safetensors(tmp_path / "m.safetensors", {"half": half})
    target = {"half": np.zeros(half.size, np.float32)}
    if staging is not None:
        kvikpy.defaults.set("checkpoint_staging", staging)  # restored after the test
    bound = min(li.CONVERT_STAGING, staging or (512 << 20), half.nbytes)
    assert li.staging_bytes() == (staging or 512 << 20)
    tracemalloc.start()
    try:
        kst.load_into(target, tmp_path / "m.safetensors", convert_dtype=True)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    np.testing.assert_array_equal(target["half"], half.astype(np.float32))
    # The staging buffer, and below 1 MiB of everything else; never the tensor's 12 MiB
    # under a smaller bound.
    assert bound <= peak < bound + (1 << 20), (peak, bound)


def test_dtype_conversion_is_opt_in_and_chunked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    half = (np.arange(5000, dtype=np.float32) / 7).astype(np.float16).reshape(50, 100)
    ints = np.arange(-300, 300, dtype=np.int16)
    write_safetensors(tmp_path / "m.safetensors", {"half": half, "ints": ints})
    target: dict[str, np.ndarray] = {
        "half": np.zeros((50, 100), np.float32),
        "ints": np.zeros(600, np.int64),
    }
    with pytest.raises(kst.LoadIntoError, match="convert_dtype=True"):
        kst.load_into(target, tmp_path / "m.safetensors")
    assert not target["half"].any()
    monkeypatch.setattr(li, "CONVERT_STAGING", 1000)  # many chunks per tensor
    kst.load_into(target, tmp_path / "m.safetensors", convert_dtype=True)
    np.testing.assert_array_equal(target["half"], half.astype(np.float32))
    np.testing.assert_array_equal(target["ints"], ints.astype(np.int64))


def test_a_file_cut_mid_load_names_what_was_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = np.arange(4096, dtype=np.float32)
    last = np.arange(4096, dtype=np.float64)
    path = tmp_path / "m.safetensors"
    write_safetensors(path, {"first": first, "last": last})
    real = kst._sources

    def cut_after_headers(paths: Any, files: Any) -> Any:
        out = real(paths, files)
        os.truncate(path, os.path.getsize(path) - 100)
        return out

    monkeypatch.setattr(kst, "_sources", cut_after_headers)
    target = {"first": np.zeros_like(first), "last": np.zeros_like(last)}
    with pytest.raises(kst.LoadIntoError, match="1 tensor") as info:
        kst.load_into(target, path)
    assert info.value.written == ["first"]
    assert "last" in str(info.value)
    np.testing.assert_array_equal(target["first"], first)


def test_bad_arguments_change_nothing(tmp_path: Path) -> None:
    w = np.ones(4, np.float32)
    write_safetensors(tmp_path / "m.safetensors", {"w": w})
    with pytest.raises(TypeError, match=r"torch\.nn\.Module or a mapping"):
        kst.load_into([np.zeros(4, np.float32)], tmp_path / "m.safetensors")
    with pytest.raises(TypeError, match="strict must be True or False"):
        kst.load_into({"w": np.zeros(4, np.float32)}, tmp_path / "m.safetensors", strict=1)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="target 'w' is a list"):
        kst.load_into({"w": [0.0] * 4}, tmp_path / "m.safetensors")
    with pytest.raises(ValueError, match="at least one file"):
        kst.load_into({"w": np.zeros(4, np.float32)}, [])
    with pytest.raises(FileNotFoundError):
        kst.load_into({"w": np.zeros(4, np.float32)}, tmp_path / "absent.safetensors")
    (tmp_path / "bad.safetensors").write_bytes(b"\x04" + b"\0" * 7 + b"nope")
    target = {"w": np.zeros(4, np.float32)}
    with pytest.raises(ValueError, match="not start with"):
        kst.load_into(target, tmp_path / "bad.safetensors")
    assert not target["w"].any()


_DTYPES = ["float64", "float32", "float16", "int64", "int32", "int16", "int8", "uint8", "bool"]


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(_DTYPES),
            st.lists(st.integers(0, 5), max_size=3),
            st.sampled_from(_DTYPES),
            st.lists(st.integers(0, 5), max_size=3),
        ),
        min_size=1,
        max_size=6,
    ),
    st.booleans(),
)
def test_any_mix_loads_or_refuses_cleanly(
    tmp_path: Path, specs: list[tuple[str, list[int], str, list[int]]], convert: bool
) -> None:
    rng = np.random.default_rng(len(specs))
    tensors = {
        f"t{i}": (rng.integers(0, 100, size=s_shape)).astype(s_dt)
        for i, (s_dt, s_shape, _, _) in enumerate(specs)
    }
    path = tmp_path / "h.safetensors"
    write_safetensors(path, tensors, pad_to=1)
    target = {f"t{i}": np.zeros(t_shape, t_dt) for i, (_, _, t_dt, t_shape) in enumerate(specs)}
    try:
        kst.load_into(target, path, convert_dtype=convert)
    except kst.LoadIntoError:
        assert all(not a.any() for a in target.values())
        return
    for name, a in tensors.items():
        np.testing.assert_array_equal(target[name], a.astype(target[name].dtype))


class Prefixed(dict[str, np.ndarray]):
    """A mapping target with transformers' class attributes."""

    base_model_prefix = "model"
    _checkpoint_conversion_mapping: ClassVar[dict[str, str]] = {r"^old_block\.": "block."}


def test_load_pretrained_single_and_sharded(tmp_path: Path) -> None:
    tensors = sample()
    single = tmp_path / "single"
    single.mkdir()
    write_safetensors(single / "model.safetensors", tensors)
    target = zeros_like(tensors)
    assert kst.load_pretrained(target, single) == ([], [])
    for name, a in tensors.items():
        np.testing.assert_array_equal(target[name], a)
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    names = list(tensors)
    parts = {
        "model-00001-of-00002.safetensors": names[:4],
        "model-00002-of-00002.safetensors": names[4:],
    }
    weight_map = {}
    for shard, keys in parts.items():
        write_safetensors(sharded / shard, {k: tensors[k] for k in keys})
        weight_map.update(dict.fromkeys(keys, shard))
    (sharded / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": 1}, "weight_map": weight_map})
    )
    target = zeros_like(tensors)
    kst.load_pretrained(target, str(sharded))
    for name, a in tensors.items():
        np.testing.assert_array_equal(target[name], a)


def test_load_pretrained_renames_as_transformers_does(tmp_path: Path) -> None:
    w = np.arange(6, dtype=np.float32)
    write_safetensors(
        tmp_path / "model.safetensors",
        {"layer.weight": w, "norm.gamma": w + 1, "old_block.bias": w + 2},
    )
    target = Prefixed(
        {
            "model.layer.weight": np.zeros(6, np.float32),
            "model.norm.weight": np.zeros(6, np.float32),
            "model.block.bias": np.zeros(6, np.float32),
        }
    )
    assert kst.load_pretrained(target, tmp_path) == ([], [])
    np.testing.assert_array_equal(target["model.layer.weight"], w)
    np.testing.assert_array_equal(target["model.norm.weight"], w + 1)
    np.testing.assert_array_equal(target["model.block.bias"], w + 2)
    # A checkpoint with the prefix into a base model: the prefix is stripped.
    write_safetensors(tmp_path / "model.safetensors", {"model.layer.weight": w, "head.w": w})
    base = Prefixed({"layer.weight": np.zeros(6, np.float32)})
    assert kst.load_pretrained(base, tmp_path, strict=False) == ([], ["head.w"])
    np.testing.assert_array_equal(base["layer.weight"], w)


@pytest.mark.parametrize(
    "shard",
    ["../outside.safetensors", "/etc/passwd", "sub/x.safetensors", "x.bin", ""],
)
def test_load_pretrained_index_stays_in_its_directory(tmp_path: Path, shard: str) -> None:
    (tmp_path / "ckpt").mkdir()
    write_safetensors(tmp_path / "outside.safetensors", {"w": np.ones(2, np.float32)})
    (tmp_path / "ckpt" / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"w": shard}})
    )
    target = {"w": np.zeros(2, np.float32)}
    with pytest.raises(ValueError, match=r"a shard is a \.safetensors file name"):
        kst.load_pretrained(target, tmp_path / "ckpt")
    assert not target["w"].any()


def test_load_pretrained_missing_pieces(tmp_path: Path) -> None:
    target = {"w": np.zeros(2, np.float32)}
    with pytest.raises(FileNotFoundError, match="does not exist"):
        kst.load_pretrained(target, tmp_path / "nowhere")
    with pytest.raises(FileNotFoundError, match=r"neither model\.safetensors"):
        kst.load_pretrained(target, tmp_path)
    (tmp_path / "model.safetensors.index.json").write_text(
        json.dumps({"weight_map": {"w": "model-1.safetensors"}})
    )
    with pytest.raises(FileNotFoundError, match="which is not in"):
        kst.load_pretrained(target, tmp_path)
    (tmp_path / "model.safetensors.index.json").write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        kst.load_pretrained(target, tmp_path)
    (tmp_path / "model.safetensors.index.json").write_text('{"weight_map": [1]}')
    with pytest.raises(ValueError, match="no weight_map"):
        kst.load_pretrained(target, tmp_path)


def test_shared_rounds_are_bounded_and_keep_file_order() -> None:
    from kvikpy._read_once import rounds

    sizes = [10, 100, 1000, 64, 64, 0, 3000, 1]
    cut = rounds(sizes, 256)
    assert [i for r in cut for i in r] == list(range(len(sizes)))
    for r in cut:
        padded = sum(-(-sizes[i] // 64) * 64 for i in r)
        assert padded <= 256 or len(r) == 1  # a larger tensor goes alone
    assert rounds([], 256) == []


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.one_of(
        st.binary(max_size=200),
        st.recursive(
            st.none() | st.booleans() | st.integers() | st.text(max_size=20),
            lambda inner: (
                st.lists(inner, max_size=4)
                | st.dictionaries(st.text(max_size=12), inner, max_size=4)
            ),
            max_leaves=12,
        ).map(lambda v: json.dumps({"weight_map": v}).encode()),
    )
)
def test_any_index_is_refused_cleanly(tmp_path: Path, raw: bytes) -> None:
    (tmp_path / "model.safetensors.index.json").write_bytes(raw)
    target = {"w": np.zeros(2, np.float32)}
    with contextlib.suppress(ValueError, FileNotFoundError):
        kst.load_pretrained(target, tmp_path)
    assert not target["w"].any()


def test_a_deeply_nested_index_is_a_value_error(tmp_path: Path) -> None:
    (tmp_path / "model.safetensors.index.json").write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(ValueError, match=r"nests arrays or objects too deeply|not valid JSON"):
        kst.load_pretrained({"w": np.zeros(2, np.float32)}, tmp_path)


def test_overlapping_targets_are_refused(tmp_path: Path) -> None:
    a = np.arange(8, dtype=np.float32)
    write_safetensors(tmp_path / "m.safetensors", {"a": a, "b": a + 1})
    whole = np.zeros(12, np.float32)
    target = {"a": whole[:8], "b": whole[4:]}
    with pytest.raises(kst.LoadIntoError, match="a and b overlap in memory"):
        kst.load_into(target, tmp_path / "m.safetensors")
    assert not whole.any()


def test_gpu_reads_merge_only_within_one_allocation() -> None:
    def read(offset: int, ptr: int, block: int) -> li._Read:
        return li._Read("f", offset, 0, ptr, 100, (f"t{offset}",), block)

    same = li._merged([read(100, 1100, 7), read(0, 1000, 7)])
    assert [(r.offset, r.ptr, r.length, r.names) for r in same] == [(0, 1000, 200, ("t0", "t100"))]
    apart = li._merged([read(0, 1000, 7), read(100, 1100, 8)])
    assert len(apart) == 2
    other_device = li._merged([read(0, 1000, 7), li._Read("f", 100, 1, 1100, 100, ("x",), 7)])
    assert len(other_device) == 2


@st.composite
def file_layouts(draw: st.DrawFn) -> list[li._Read]:
    """Reads of tensors laid out one after another (with gaps) in one to three files,
    in a shuffled order."""
    reads = []
    for f in range(draw(st.integers(1, 3))):
        at = draw(st.integers(0, 20))
        for gap, length in draw(
            st.lists(st.tuples(st.integers(0, 40), st.integers(1, 120)), max_size=12)
        ):
            at += gap
            reads.append(li._Read(f"f{f}", at, 0, 0, length, (f"f{f}@{at}",)))
            at += length
    return draw(st.permutations(reads))


@given(file_layouts(), st.integers(1, 300), st.integers(0, 50))
@settings(max_examples=300, deadline=None)
def test_windows_cover_each_read_once_within_the_bound(
    reads: list[li._Read], bound: int, gap: int
) -> None:
    windows = li._windows(reads, bound, gap)
    covered = [r.names for w in windows for r in w.reads]
    assert sorted(covered) == sorted(r.names for r in reads)  # each read exactly once
    for w in windows:
        assert w.reads
        assert all(r.path == w.path for r in w.reads)
        starts = [r.offset for r in w.reads]
        assert starts == sorted(starts)  # file order inside a window
        assert w.offset == w.reads[0].offset
        assert w.offset + w.length == max(r.offset + r.length for r in w.reads)
        if w.alone:  # only a read larger than the bound, read straight into its target
            assert len(w.reads) == 1 and w.reads[0].length > bound
            assert (w.offset, w.length) == (w.reads[0].offset, w.reads[0].length)
        else:
            assert w.length <= bound
            assert all(r.length <= bound for r in w.reads)
            for a, b in itertools.pairwise(w.reads):  # gaps read through are small
                assert b.offset - (a.offset + a.length) < gap
    keys = [(w.path, w.offset) for w in windows]
    assert keys == sorted(keys)  # windows in file order, not overlapping
    for one, two in itertools.pairwise(windows):
        if one.path != two.path:
            continue
        assert one.offset + one.length <= two.offset
        if not one.alone and not two.alone:  # split only at a large gap or at the bound
            first = two.reads[0]
            assert (
                first.offset - (one.offset + one.length) >= gap
                or first.offset + first.length - one.offset > bound
            )


def test_a_file_that_fits_the_bound_is_one_window() -> None:
    reads = [li._Read("f", o, 0, 0, 100, (f"t{o}",)) for o in (0, 100, 300, 2000)]
    (whole,) = li._windows(reads, 2100, 2000)
    assert (whole.offset, whole.length, len(whole.reads)) == (0, 2100, 4)
    split = li._windows(reads, 2100, 1000)  # the gap of 1600 bytes splits
    assert [(w.offset, w.length) for w in split] == [(0, 400), (2000, 100)]
    alone = li._windows([*reads, li._Read("f", 500, 0, 0, 3000, ("big",))], 2100, 2000)
    assert [(w.offset, w.length, w.alone) for w in alone] == [
        (0, 400, False),
        (500, 3000, True),
        (2000, 100, False),
    ]
