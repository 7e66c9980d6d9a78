"""``_lib.read_scattered``: many byte ranges of files straight into memory the caller
owns (here numpy arrays), as one engine batch request; its checks at the boundary, each
item's failure reported alone, and Ctrl-C."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from stalling_servers import stalling_server
from test_interrupts import (
    BOUND,
    SIZE,
    _sized_to_last,
    assert_abandoned_work_stops,
    interrupt_latency,
)

import kvikpy
from kvikpy import _lib


def data_file(tmp_path: Path, size: int, name: str = "data.bin") -> tuple[Path, bytes]:
    data = np.random.default_rng(size).integers(0, 256, size, dtype=np.uint8).tobytes()
    path = tmp_path / name
    path.write_bytes(data)
    return path, data


def test_items_of_several_files_land_in_their_arrays(tmp_path: Path) -> None:
    a, da = data_file(tmp_path, 3 << 20, "a")
    b, db = data_file(tmp_path, 100_000, "b")
    big = np.zeros(5 << 20, np.uint8)
    small = [np.zeros(n, np.uint8) for n in (1, 0, 4096, 99_999)]
    items = [
        (0, 17, 2 << 20, big.ctypes.data + 5, None),
        (1, 0, 100_000, big.ctypes.data + (3 << 20), None),
    ]
    items += [(1, 1, s.size, s.ctypes.data, None) for s in small]
    with kvikpy.defaults.set({"bounce_buffer_size": 1 << 20, "num_threads": 4}):
        assert _lib.read_scattered([str(a), str(b)], items, (big, small)) == []
    assert big[5 : 5 + (2 << 20)].tobytes() == da[17 : 17 + (2 << 20)]
    assert big[3 << 20 : (3 << 20) + 100_000].tobytes() == db
    assert not big[:5].any() and not big[5 + (2 << 20) : 3 << 20].any()  # untouched
    for s in small:
        assert s.tobytes() == db[1 : 1 + s.size]


@settings(max_examples=40, deadline=None)
@given(
    picks=st.lists(
        st.tuples(st.integers(0, 199_999), st.integers(0, 70_000), st.integers(0, 64)),
        max_size=30,
    )
)
def test_random_items_read_what_a_plain_read_reads(tmp_path_factory: Any, picks: Any) -> None:
    path, data = data_file(tmp_path_factory.mktemp("s"), 200_000)
    dest = np.full(sum(n + gap for _, n, gap in picks) + 1, 0xEE, np.uint8)
    items, want, at = [], [], 0
    for offset, n, gap in picks:
        n = min(n, len(data) - offset)
        at += gap
        items.append((0, offset, n, dest.ctypes.data + at, None))
        want.append((at, offset, n))
        at += n
    assert _lib.read_scattered([str(path)], items[::-1], dest) == []
    mask = np.ones(dest.size, bool)
    for at, offset, n in want:
        assert dest[at : at + n].tobytes() == data[offset : offset + n]
        mask[at : at + n] = False
    assert (dest[mask] == 0xEE).all()


def test_a_short_item_fails_alone_and_the_rest_are_read(tmp_path: Path) -> None:
    path, data = data_file(tmp_path, 10_000)
    ok = np.zeros(100, np.uint8)
    short = np.zeros(200, np.uint8)
    items = [(0, 10_000 - 50, 200, short.ctypes.data, None), (0, 5, 100, ok.ctypes.data, None)]
    failures = _lib.read_scattered([str(path)], items, (ok, short))
    assert [i for i, _ in failures] == [0]
    assert "ended after 50 of the 200 bytes" in str(failures[0][1])
    assert ok.tobytes() == data[5:105]


def test_a_missing_file_raises_before_any_read(tmp_path: Path) -> None:
    path, _ = data_file(tmp_path, 100)
    out = np.zeros(10, np.uint8)
    items = [(0, 0, 10, out.ctypes.data, None), (1, 0, 10, out.ctypes.data, None)]
    with pytest.raises(FileNotFoundError):
        _lib.read_scattered([str(path), str(tmp_path / "missing")], items, out)
    assert not out.any()


@pytest.mark.parametrize(
    ("item", "error", "match"),
    [
        ((0, 0, 10, "x", None), TypeError, "address must be an integer, not str"),
        ((0, 0, 10.0, 1, None), TypeError, "length must be an integer, not float"),
        ((True, 0, 10, 1, None), TypeError, "file must be an integer, not bool"),
        ((0, 0, 10, 1, False), TypeError, "device must be an integer, not bool"),
        ((0, -1, 10, 1, None), ValueError, "offset must be a non-negative integer"),
        ((0, 0, 2**64, 1, None), ValueError, "length must be a non-negative integer"),
        ((1, 0, 10, 1, None), ValueError, "reads file 1, but only 1 file"),
        ((0, 2**63 - 5, 10, 1, None), ValueError, "past the largest file offset"),
        ((0, 0, 10, 2**64 - 5, None), ValueError, "overflows 64 bits"),
        ((0, 0, 10, 0, None), ValueError, "null pointer"),
        ((0, 0, 10, 1), ValueError, "got 4 fields"),
        ([0, 0, 10, 1, None], TypeError, "must be a tuple"),
        ((0, 0, 10, 1, 10**6), ValueError, "CUDA device"),
    ],
)
def test_bad_items_are_refused_before_any_read(
    tmp_path: Path, item: Any, error: type[Exception], match: str
) -> None:
    path, _ = data_file(tmp_path, 100)
    out = np.zeros(10, np.uint8)
    good = (0, 0, 10, out.ctypes.data, None)
    with pytest.raises(error, match=match):
        _lib.read_scattered([str(path)], [good, item], out)
    assert not out.any(), "a refused call read nothing"


def test_ctrl_c_interrupts_a_scattered_read_of_a_stalled_server() -> None:
    out = np.zeros(SIZE, np.uint8)
    item = (0, 0, SIZE, out.ctypes.data, None)
    with (
        kvikpy.defaults.set({"http_timeout": 30, "http_max_attempts": 3}),
        stalling_server(SIZE) as server,
    ):
        latency = interrupt_latency(lambda: _lib.read_scattered([server.url], [item], out))
        assert latency < BOUND
        assert_abandoned_work_stops(server)


def test_ctrl_c_interrupts_a_large_local_scattered_read(tmp_path: Path) -> None:
    path, _ = data_file(tmp_path, 1 << 20)
    out = np.zeros(1 << 20, np.uint8)

    def make(n: int) -> list[tuple[int, int, int, int, None]]:
        return [
            (0, (i * 64) % (1 << 20), 64, out.ctypes.data + (i * 64) % (1 << 20), None)
            for i in range(n)
        ]

    with kvikpy.defaults.set("num_threads", 1):
        items = _sized_to_last(make, lambda it: _lib.read_scattered([str(path)], it, out), 3.0)
        latency = interrupt_latency(lambda: _lib.read_scattered([str(path)], items, out))
        assert latency < BOUND
        assert_abandoned_work_stops()


def test_load_into_reads_a_sharded_checkpoint_with_one_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from test_load_into import write_safetensors

    import kvikpy.safetensors as kst

    rng = np.random.default_rng(1)
    shards = [tmp_path / "a.safetensors", tmp_path / "b.safetensors"]
    tensors = [
        {
            f"a{k}": rng.standard_normal(n).astype(np.float32)
            for k, n in enumerate((3, 5000, 70_000))
        },
        {f"b{k}": rng.integers(0, 9, n).astype(np.int64) for k, n in enumerate((1, 300_000))},
    ]
    for shard, part in zip(shards, tensors, strict=True):
        write_safetensors(shard, part)
    calls: list[int] = []
    real = _lib.read_scattered

    def spy(paths: list[str], items: Any, keep: Any, progress: Any = None) -> Any:
        calls.append(len(items))
        return real(paths, items, keep, progress)

    monkeypatch.setattr(_lib, "read_scattered", spy)
    want = {**tensors[0], **tensors[1]}
    target = {name: np.zeros_like(a) for name, a in want.items()}
    kst.load_into(target, shards)
    assert calls == [len(want)], "every read of the load in one call"
    for name, a in want.items():
        np.testing.assert_array_equal(target[name], a)
