"""The plan of a checkpoint read once for many ranks (kvikpy._read_once.plan): every
byte a rank needs reaches it, and every byte leaves storage once across the group; a
rank's share is filled straight from the files by few merged reads (share_reads,
read_into), here into host memory with real files."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvikpy._read_once import needers_of, plan, share_reads
from kvikpy._spans import Files, TensorSpan, pack, read_into


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


def file_byte(path: str, offset: int) -> int:
    """A byte of an imaginary file, different at every offset and in every file."""
    return (offset * 7 + sum(path.encode()) * 13) % 251


@settings(max_examples=300, deadline=None)
@given(checkpoints())
def test_share_reads_fill_the_share_as_the_pieces_do_with_fewest_reads(
    case: tuple[list[TensorSpan], list[set[int]], int],
) -> None:
    tensors, needers, world = case
    for r in range(world):
        p = plan(tensors, needers, r, world)
        expected = [-1] * p.share
        for t, within, length in p.my_share:
            at = p.packed[t.name] + within - r * p.share
            for k in range(length):
                expected[at + k] = file_byte(t.path, t.offset + within + k)
        got = [-1] * p.share
        reads = share_reads(p)
        for read in reads:
            assert read.length > 0 and read.at >= 0 and read.at + read.length <= p.share
            for k in range(read.length):
                assert got[read.at + k] == -1, "two reads write one byte"
                got[read.at + k] = file_byte(read.path, read.file_offset + k)
        assert got == expected
        for a, b in itertools.pairwise(reads):
            mergeable = (
                a.path == b.path
                and a.file_offset + a.length == b.file_offset
                and a.at + a.length == b.at
            )
            assert not mergeable, (a, b)


def test_adjacent_tensors_of_one_file_are_one_read() -> None:
    # Sizes that keep the 64-byte packing contiguous: each rank's share of each file is
    # one read.
    tensors = [TensorSpan(f"t{i}", f"f{i // 4}", 8 + 640 * (i % 4), 640) for i in range(8)]
    p = plan(tensors, [{0, 1}] * 8, 1, 2)
    assert [(r.path, r.file_offset, r.at, r.length) for r in share_reads(p)] == [("f1", 8, 0, 2560)]


def write_shards(folder: Path, sizes: list[int]) -> tuple[list[TensorSpan], dict[str, bytes]]:
    contents: dict[str, bytes] = {}
    tensors = []
    for f in range(2):
        path = str(folder / f"shard{f}.bin")
        data = os.urandom(sum(sizes) + 16)
        contents[path] = data
        offset = 16  # a header's worth of bytes before the tensors
        for i, size in enumerate(sizes):
            tensors.append(TensorSpan(f"s{f}t{i}", path, offset, size))
            offset += size
        Path(path).write_bytes(data)
    return tensors, contents


@pytest.mark.parametrize("world", [1, 2, 3])
def test_read_share_reads_the_files_into_place(tmp_path: Path, world: int) -> None:
    tensors, contents = write_shards(tmp_path, [1000, 64, 4096, 3, 70_000])
    for r in range(world):
        p = plan(tensors, [set(range(world))] * len(tensors), r, world)
        mine = np.zeros(p.share, dtype=np.uint8)
        with Files() as files:
            read_into(mine, share_reads(p), files)
        for t, within, length in p.my_share:
            at = p.packed[t.name] + within - r * p.share
            want = contents[t.path][t.offset + within : t.offset + within + length]
            assert mine[at : at + length].tobytes() == want


def test_read_share_of_a_file_shorter_than_planned_raises(tmp_path: Path) -> None:
    tensors, _ = write_shards(tmp_path, [4096, 4096])
    p = plan(tensors, [{0, 1}] * 4, 1, 2)  # rank 1 reads the end of the second file
    os.truncate(tensors[-1].path, tensors[-1].offset + 100)
    with (
        pytest.raises(EOFError, match="the file is shorter than its header says"),
        Files() as files,
    ):
        read_into(np.zeros(p.share, dtype=np.uint8), share_reads(p), files)


@settings(max_examples=200, deadline=None)
@given(checkpoints(), st.randoms(use_true_random=False))
def test_pack_places_every_piece_and_its_reads_fill_exactly_them(
    case: tuple[list[TensorSpan], list[set[int]], int], rnd
) -> None:
    tensors, _, _ = case
    pieces = []
    for t in tensors:
        within = rnd.randint(0, t.size)
        pieces.append((t, within, rnd.randint(0, t.size - within)))
    places, reads, total = pack(pieces)
    expected = [-1] * total
    for (t, within, length), at in zip(pieces, places, strict=True):
        assert at % 64 == 0
        for k in range(length):
            expected[at + k] = file_byte(t.path, t.offset + within + k)
    got = [-1] * total
    for read in reads:
        for k in range(read.length):
            assert got[read.at + k] == -1, "two reads write one byte"
            got[read.at + k] = file_byte(read.path, read.file_offset + k)
    assert got == expected
    assert len(reads) <= sum(1 for _, _, n in pieces if n)
