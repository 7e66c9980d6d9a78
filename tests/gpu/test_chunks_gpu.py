"""iter_chunks into GPU memory: the chunks tile the file and kept chunks stay intact."""

from __future__ import annotations

import pytest

import kvikpy

cupy = pytest.importorskip("cupy")

from test_chunks import data_file  # noqa: E402


def test_gpu_chunks_tile_the_file_and_kept_ones_stay(tmp_path):
    p, data = data_file(tmp_path, (9 << 20) + 5)
    it = kvikpy.iter_chunks(p, 1 << 20, depth=2)
    kept = []
    out = b""
    for i, c in enumerate(it):
        out += cupy.asnumpy(cupy.from_dlpack(c)).tobytes()
        if i % 4 == 0:
            kept.append((i, cupy.from_dlpack(c)))
    assert out == data
    for i, a in kept:
        assert cupy.asnumpy(a).tobytes() == data[i << 20 : (i + 1) << 20]
