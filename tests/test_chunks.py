"""iter_chunks into host memory (runs without a GPU): the chunks tile the file, a plain
loop cycles through depth + 2 buffers, and chunks the caller keeps are never
overwritten."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import kvikpy


def data_file(tmp_path, n: int):
    data = np.random.default_rng(n).integers(1, 256, n, dtype=np.uint8).tobytes()
    p = tmp_path / "c.bin"
    p.write_bytes(data)
    return p, data


def host_bytes(chunk) -> bytes:
    return np.from_dlpack(chunk).tobytes()


@pytest.mark.parametrize(
    ("n", "chunk"), [(0, 10), (5, 10), (10, 10), (1_000_003, 100_000), (300_000, 1 << 20)]
)
def test_chunks_tile_the_file(tmp_path, n, chunk):
    p, data = data_file(tmp_path, n)
    sizes, out = [], b""
    for c in kvikpy.iter_chunks(p, chunk, device="cpu"):
        sizes.append(c.nbytes)
        out += host_bytes(c)
    assert out == data
    assert sizes == [min(chunk, n - o) for o in range(0, n, chunk)]


@pytest.mark.parametrize("depth", [1, 2, 4])
def test_a_plain_loop_cycles_through_depth_plus_two_buffers(tmp_path, depth):
    p, data = data_file(tmp_path, 50 * 4096)
    it = kvikpy.iter_chunks(p, 4096, device="cpu", depth=depth)
    total = 0
    for c in it:
        total += int(np.from_dlpack(c).sum(dtype=np.int64))
    assert total == int(np.frombuffer(data, dtype=np.uint8).sum(dtype=np.int64))
    assert it.allocations == depth + 2


def test_kept_chunks_are_never_overwritten(tmp_path):
    p, data = data_file(tmp_path, 64 * 1000 + 7)
    it = kvikpy.iter_chunks(p, 1000, device="cpu", depth=2)
    kept = list(it)  # every chunk held at once
    assert b"".join(host_bytes(c) for c in kept) == data
    assert it.allocations == len(kept)


def test_chunks_kept_through_dlpack_are_never_overwritten(tmp_path):
    p, data = data_file(tmp_path, 40 * 512)
    arrays = []
    for i, c in enumerate(kvikpy.iter_chunks(p, 512, device="cpu")):
        if i % 3 == 0:
            arrays.append((i, np.from_dlpack(c)))  # the export holds the memory
        del c
        gc.collect()
    for i, a in arrays:
        assert a.tobytes() == data[i * 512 : (i + 1) * 512]


def test_bad_arguments_and_closing(tmp_path):
    p, _ = data_file(tmp_path, 100)
    with pytest.raises(ValueError, match="chunk_size"):
        kvikpy.iter_chunks(p, 0, device="cpu")
    with pytest.raises(ValueError, match="depth"):
        kvikpy.iter_chunks(p, 10, device="cpu", depth=0)
    with pytest.raises(FileNotFoundError):
        kvikpy.iter_chunks(tmp_path / "missing", 10, device="cpu")
    with kvikpy.iter_chunks(p, 10, device="cpu") as it:
        assert next(it).nbytes == 10
    assert list(it) == []  # closed: nothing more
    assert "10-byte chunks" in repr(it)
