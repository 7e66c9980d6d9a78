"""The safetensors loaders' read plan, made by the engine (``_lib.safetensors_merge``,
``safetensors_pack``, ``safetensors_windows``) and wrapped by ``kvikpy._spans`` and
``kvikpy._load_into``: equal to the small pure-Python model of each below (the
planning those modules did in Python before), and any numbers at all a plan or a
``ValueError`` (``TypeError`` for what is not an integer), never a crash."""

from __future__ import annotations

import itertools
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import kvikpy._lib as _lib
import kvikpy._load_into as li
from kvikpy._spans import FileRead, TensorSpan, merged, pack

TOP = 2**64 - 1  # the largest offset, length or end the plan takes

# --- the models: plain Python, the planning as kvikpy did it before the engine did ---


def model_merge(reads: list[li._Read], sort: bool) -> list[tuple[Any, ...]]:
    """Reads as ``(path, offset, device, block, ptr, length, names)``, merged where they
    follow each other in one file and in one memory (same device and allocation)."""
    if sort:
        reads = sorted(reads, key=lambda r: (r.path, r.offset))
    out: list[tuple[Any, ...]] = []
    for r in reads:
        if out:
            path, offset, device, block, ptr, length, names = out[-1]
            if (
                (path, device, block) == (r.path, r.device, r.block)
                and offset + length == r.offset
                and ptr + length == r.ptr
            ):
                out[-1] = (path, offset, device, block, ptr, length + r.length, names + r.names)
                continue
        out.append((r.path, r.offset, r.device, r.block, r.ptr, r.length, r.names))
    return out


def model_windows(reads: list[li._Read], bound: int, gap: int) -> list[tuple[Any, ...]]:
    """``(path, offset, length, alone, names of its reads)`` per window."""
    out: list[tuple[Any, ...]] = []
    cur: list[li._Read] = []
    start = end = 0

    def close() -> None:
        out.append((cur[0].path, start, end - start, False, [r.names for r in cur]))

    for r in sorted(reads, key=lambda r: (r.path, r.offset, r.length)):
        if r.length > bound:
            if cur:
                close()
                cur = []
            out.append((r.path, r.offset, r.length, True, [r.names]))
            continue
        if (
            cur
            and r.path == cur[0].path
            and r.offset - end < gap
            and max(end, r.offset + r.length) - start <= bound
        ):
            cur.append(r)
            end = max(end, r.offset + r.length)
            continue
        if cur:
            close()
        cur, start, end = [r], r.offset, r.offset + r.length
    if cur:
        close()
    return out


def model_pack(
    pieces: list[tuple[TensorSpan, int, int]],
) -> tuple[list[int], list[FileRead], int]:
    places: list[int] = []
    reads: list[FileRead] = []
    end = 0
    for t, within, length in pieces:
        end = -(-end // 64) * 64
        places.append(end)
        if length:
            last = reads[-1] if reads else None
            if (
                last is not None
                and last.path == t.path
                and last.file_offset + last.length == t.offset + within
                and last.at + last.length == end
            ):
                reads[-1] = FileRead(t.path, last.file_offset, last.at, last.length + length)
            else:
                reads.append(FileRead(t.path, t.offset + within, end, length))
        end += length
    return places, reads, end


# --- inputs: tensors one after another in a few files, many of them mergeable ---


@st.composite
def layouts(draw: st.DrawFn) -> list[li._Read]:
    """Reads of tensors laid out with small gaps (or overlaps) in up to three files, into
    up to two devices and allocations whose memory follows the file or skips a little,
    in a shuffled order."""
    reads = []
    memory: dict[tuple[int | None, int], int] = {}
    for f in draw(st.lists(st.sampled_from(["b", "a", "c"]), min_size=1, max_size=3)):
        at = draw(st.integers(0, 20))
        for k, (gap, length, device, block, skip) in enumerate(
            draw(
                st.lists(
                    st.tuples(
                        st.integers(-8, 40),
                        st.integers(0, 120),
                        st.sampled_from([None, 0, 1]),
                        st.integers(0, 1),
                        st.sampled_from([0, 0, 0, 5]),
                    ),
                    max_size=12,
                )
            )
        ):
            at = max(0, at + gap)
            ptr = memory.get((device, block), 1000 * (1 + block)) + skip
            memory[(device, block)] = ptr + length
            reads.append(li._Read(f, at, device, ptr, length, (f"{f}{k}.{len(reads)}",), block))
            at += length
    return draw(st.permutations(reads))


@settings(max_examples=300, deadline=None)
@given(layouts())
def test_load_into_merge_equals_the_model(reads: list[li._Read]) -> None:
    got = li._merged(reads)
    assert [(r.path, r.offset, r.device, r.block, r.ptr, r.length, r.names) for r in got] == (
        model_merge(reads, sort=True)
    )
    lone = [r for r in got if len(r.names) == 1]
    assert all(any(r is x for x in reads) for r in lone)  # unmerged reads come back as is


@settings(max_examples=300, deadline=None)
@given(layouts())
def test_spans_merge_keeps_the_given_order_and_equals_the_model(reads: list[li._Read]) -> None:
    as_file_reads = [FileRead(r.path, r.offset, r.ptr, r.length) for r in reads]
    # One destination: the model's reads all in device None, allocation 0.
    one_dest = [li._Read(r.path, r.offset, None, r.ptr, r.length, r.names) for r in reads]
    want = [
        FileRead(path, offset, ptr, length)
        for path, offset, _, _, ptr, length, _ in model_merge(one_dest, sort=False)
    ]
    assert merged(as_file_reads) == want


@settings(max_examples=300, deadline=None)
@given(layouts(), st.integers(1, 300), st.integers(0, 50))
def test_windows_equal_the_model(reads: list[li._Read], bound: int, gap: int) -> None:
    got = li._windows(reads, bound, gap)
    assert [
        (w.path, w.offset, w.length, w.alone, [r.names for r in w.reads]) for w in got
    ] == model_windows(reads, bound, gap)
    assert sorted(r.names for w in got for r in w.reads) == sorted(r.names for r in reads)
    given_ids = {id(r) for r in reads}
    assert all(id(r) in given_ids for w in got for r in w.reads)  # the reads given, as is


@settings(max_examples=300, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["x", "y"]),
            st.integers(0, 400),
            st.integers(0, 100),
            st.integers(0, 100),
        ),
        max_size=20,
    )
)
def test_pack_equals_the_model(spec: list[tuple[str, int, int, int]]) -> None:
    pieces = [
        (TensorSpan(f"t{i}", path, offset, within + length), within, length)
        for i, (path, offset, within, length) in enumerate(spec)
    ]
    assert pack(pieces) == model_pack(pieces)


def test_examples_of_each_rule() -> None:
    def read(path: str, offset: int, ptr: int, length: int = 100, block: int = 7) -> li._Read:
        return li._Read(path, offset, 0, ptr, length, (f"{path}{offset}",), block)

    # Sorted by file then offset; merged only within one allocation of one device.
    got = li._merged([read("b", 0, 0), read("a", 100, 1100), read("a", 0, 1000)])
    assert [(r.path, r.offset, r.length, r.names) for r in got] == [
        ("a", 0, 200, ("a0", "a100")),
        ("b", 0, 100, ("b0",)),
    ]
    assert len(li._merged([read("a", 0, 1000), read("a", 100, 1100, block=8)])) == 2
    # Given order: reads out of order stay apart.
    one, two = FileRead("f", 0, 0, 10), FileRead("f", 10, 10, 10)
    assert merged([one, two]) == [FileRead("f", 0, 0, 20)]
    assert merged([two, one]) == [two, one]
    # Windows are in path order, the alone one between the others.
    reads = [read("f", o, 0) for o in (0, 100, 300, 2000)] + [read("f", 500, 0, 3000)]
    assert [(w.offset, w.length, w.alone) for w in li._windows(reads, 2100, 2000)] == [
        (0, 400, False),
        (500, 3000, True),
        (2000, 100, False),
    ]
    t = TensorSpan("t", "f", 10, 100)
    assert pack([(t, 0, 30), (t, 30, 0), (t, 30, 70)]) == (
        [0, 64, 64],
        [FileRead("f", 10, 0, 30), FileRead("f", 40, 64, 70)],
        134,
    )


# --- malformed input: a ValueError (or TypeError), never a crash ---

numbers = st.one_of(
    st.integers(0, 1000),
    st.integers(TOP - 1000, TOP),
    st.integers(-(2**70), 2**70),
    st.sampled_from([-1, 2**64, TOP]),
)


def fits(n: int) -> bool:
    return 0 <= n <= TOP


@settings(max_examples=500, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), numbers, numbers, st.integers(0, 1), numbers)))
def test_any_numbers_are_a_merge_or_a_value_error(
    items: list[tuple[int, int, int, int, int]],
) -> None:
    good = all(
        fits(offset) and fits(length) and fits(at) and fits(offset + length) and fits(at + length)
        for _, offset, length, _, at in items
    )
    for sort in (False, True):
        if good:
            runs = _lib.safetensors_merge(items, sort)
            assert sorted(i for *_, members in runs for i in members) == list(range(len(items)))
        else:
            with pytest.raises(ValueError, match=r"overflows 64 bits|below 2\*\*64"):
                _lib.safetensors_merge(items, sort)


@settings(max_examples=500, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), numbers, numbers)), numbers, numbers)
def test_any_numbers_are_windows_or_a_value_error(
    items: list[tuple[int, int, int]], bound: int, gap: int
) -> None:
    bound, gap = abs(bound) % 2**64, abs(gap) % 2**64
    good = all(fits(o) and fits(n) and fits(o + n) for _, o, n in items)
    if good:
        windows = _lib.safetensors_windows(items, bound, gap)
        assert sorted(i for *_, members in windows for i in members) == list(range(len(items)))
    else:
        with pytest.raises(ValueError, match=r"overflows 64 bits|below 2\*\*64"):
            _lib.safetensors_windows(items, bound, gap)


@settings(max_examples=500, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), numbers, numbers), max_size=4))
def test_any_numbers_are_a_pack_or_a_value_error(items: list[tuple[int, int, int]]) -> None:
    good = all(fits(o) and fits(n) and fits(o + n) for _, o, n in items)
    end = 0
    for _, _, n in items:
        end = -(-end // 64) * 64 + n
        good = good and fits(end)
    if good:
        places, _, total = _lib.safetensors_pack(items, 64)
        assert len(places) == len(items) and total == end
    else:
        with pytest.raises(ValueError, match=r"overflows 64 bits|below 2\*\*64|2\*\*64 bytes"):
            _lib.safetensors_pack(items, 64)


def test_overflowing_offsets_through_the_loaders_are_value_errors() -> None:
    with pytest.raises(ValueError, match=r"read 0: file offset .* overflows 64 bits"):
        li._merged([li._Read("f", TOP, None, 0, 1, ("t",))])
    with pytest.raises(ValueError, match=r"read 1: destination offset .* overflows 64 bits"):
        merged([FileRead("f", 0, 0, 1), FileRead("f", 1, TOP, 1)])
    with pytest.raises(ValueError, match=r"read 0: file offset .* overflows 64 bits"):
        li._windows([li._Read("f", TOP - 1, 0, 0, 2, ("t",))], 10, 10)
    with pytest.raises(ValueError, match=r"span more than 2\*\*64 bytes"):
        pack([(TensorSpan("a", "f", 0, TOP), 0, TOP), (TensorSpan("b", "f", 0, 1), 0, 1)])
    with pytest.raises(ValueError, match=r"below 2\*\*64"):
        li._merged([li._Read("f", -1, None, 0, 1, ("t",))])


@pytest.mark.parametrize(
    "items",
    [
        [(0, 1, 2)],  # too few fields
        [(0, 1, 2, 3, 4, 5)],  # too many
        [[0, 1, 2, 3, 4]],  # not a tuple
        [(0, 1.5, 2, 3, 4)],  # not an integer
        [(0, True, 2, 3, 4)],  # a bool is not an offset
        [(2**64, 0, 1, 0, 0)],  # a file index out of range
    ],
)
def test_malformed_items_are_refused(items: list[Any]) -> None:
    with pytest.raises((ValueError, TypeError)):
        _lib.safetensors_merge(items, True)


def test_pairs_of_runs_from_the_engine_could_not_merge_further() -> None:
    reads = [li._Read("f", o, 0, 1000 + o, 10, (str(o),)) for o in range(0, 100, 10)]
    reads[5] = li._Read("f", 50, 0, 99_999, 10, ("50",))  # breaks the run in memory
    got = li._merged(reads)
    assert [r.length for r in got] == [50, 10, 40]
    for a, b in itertools.pairwise(got):
        assert not (a.offset + a.length == b.offset and a.ptr + a.length == b.ptr)
