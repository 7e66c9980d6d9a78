"""The plan of a checkpoint read once for many ranks (kvikpy._shared_load.plan): every
byte a rank needs reaches it, and every byte leaves storage once across the group."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvikpy._shared_load import TensorSpan, needers_of, plan


@st.composite
def checkpoints(draw: st.DrawFn) -> tuple[list[TensorSpan], list[set[int]], int]:
    world = draw(st.integers(1, 8))
    sizes = draw(st.lists(st.integers(0, 5000), min_size=0, max_size=30))
    tensors, offset = [], 0
    for i, size in enumerate(sizes):
        path = f"shard{i % 3}"
        tensors.append(TensorSpan(f"t{i}", path, offset, size))
        offset += size + draw(st.integers(0, 9))
    ranks = st.sets(st.integers(0, world - 1), max_size=world)
    needers = [draw(ranks) for _ in tensors]
    return tensors, needers, world


@settings(max_examples=300, deadline=None)
@given(checkpoints())
def test_every_byte_read_once_and_delivered(
    case: tuple[list[TensorSpan], list[set[int]], int],
) -> None:
    tensors, needers, world = case
    plans = [plan(tensors, needers, r, world) for r in range(world)]
    by_name = {t.name: t for t in tensors}
    reads: dict[str, list[tuple[int, int]]] = {t.name: [] for t in tensors}
    for p in plans:
        assert p.share % 64 == 0
        for t in p.private:
            reads[t.name].append((0, t.size))
        for t, within, length in p.my_share:
            assert length > 0
            # The piece lies in this rank's share of the packed buffer.
            start = p.packed[t.name] + within
            assert p.rank * p.share <= start and start + length <= (p.rank + 1) * p.share
            reads[t.name].append((within, length))
    for t, who in zip(tensors, needers, strict=True):
        pieces = sorted(reads[t.name])
        if not who or t.size == 0:
            assert sum(n for _, n in pieces) == 0
            continue
        # Read exactly once: the pieces tile the tensor without overlap or gap.
        at = 0
        for within, length in pieces:
            assert within == at
            at += length
        assert at == t.size
    for p in plans:
        expected = [t.name for t, who in zip(tensors, needers, strict=True) if p.rank in who]
        assert p.wanted == expected
        # A shared tensor's bytes reach every rank: it is in the packed buffer that the
        # all-gather fills, inside world_size * share bytes, 64-byte aligned.
        for name, at in p.packed.items():
            assert at % 64 == 0
            assert at + by_name[name].size <= world * p.share
        private = {t.name for t in p.private}
        assert private.isdisjoint(p.packed)
        assert private | set(p.packed) >= set(p.wanted)


def test_packed_tensors_do_not_overlap() -> None:
    tensors = [TensorSpan(f"t{i}", "f", 100 * i, 70 + i) for i in range(5)]
    p = plan(tensors, [{0, 1}] * 5, 0, 2)
    spans = sorted((p.packed[t.name], p.packed[t.name] + t.size) for t in tensors)
    assert all(a_end <= b for (_, a_end), (b, _) in itertools.pairwise(spans))
    # 586 packed bytes (64-byte aligned starts) in two shares of 320: rank 0 reads t0, t1
    # and the first 64 bytes of t2.
    assert p.share == 320 and [(t.name, w, n) for t, w, n in p.my_share] == [
        ("t0", 0, 70),
        ("t1", 0, 71),
        ("t2", 0, 64),
    ]


def test_mapping_needers_are_checked() -> None:
    names = ["a", "b"]
    assert needers_of(names, None, 0, 3, None) == [{0, 1, 2}, {0, 1, 2}]
    assert needers_of(names, {0: ["a"], 2: ["a", "b"]}, 0, 3, None) == [{0, 2}, {2}]
    with pytest.raises(ValueError, match="ranks 0 to 2"):
        needers_of(names, {3: ["a"]}, 0, 3, None)
    with pytest.raises(KeyError, match="'c', which no file holds"):
        needers_of(names, {0: ["c"]}, 0, 3, None)
    with pytest.raises(TypeError, match="mapping from rank"):
        needers_of(names, ["a"], 0, 3, None)  # type: ignore[arg-type]
