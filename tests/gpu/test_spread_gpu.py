"""read_many / read_ranges spread over two GPUs: every element lands on the GPU it was
given, byte for byte, and the current device is left as it was."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import random_file

import kvikpy

torch = pytest.importorskip("torch")

pytestmark = [pytest.mark.gpu, pytest.mark.multi_gpu]


def test_read_many_over_two_gpus(tmp_path: Path) -> None:
    files = [random_file(tmp_path, (i + 1) * 300_001, seed=i, name=f"f{i}") for i in range(6)]
    before = torch.cuda.current_device()
    batch = kvikpy.read_many([p for p, _ in files], device=["cuda:0", "cuda:1"])
    assert torch.cuda.current_device() == before
    assert set(batch.parts) == {"cuda:0", "cuda:1"}
    for i, (_, data) in enumerate(files):
        t = torch.from_dlpack(batch[i])
        assert str(t.device) == batch.device_of(i)
        assert t.cpu().numpy().tobytes() == data
    # Runs of similar bytes: the last, largest files go to the second GPU.
    assert batch.indices == {"cuda:0": [0, 1, 2, 3], "cuda:1": [4, 5]}


def test_read_ranges_with_a_device_map(tmp_path: Path) -> None:
    path, data = random_file(tmp_path, 5_000_000, seed=9)
    ranges = [(i * 400_000 + 7, 300_000) for i in range(12)]
    batch = kvikpy.read_ranges(path, ranges, device={i: f"cuda:{i % 2}" for i in range(12)})
    for i, (o, n) in enumerate(ranges):
        t = torch.from_dlpack(batch[i])
        assert str(t.device) == f"cuda:{i % 2}"
        assert t.cpu().numpy().tobytes() == data[o : o + n]


def test_chunks_take_the_gpus_in_turn(tmp_path: Path) -> None:
    path, data = random_file(tmp_path, 10_000_019, seed=4)
    got, devices = [], []
    with kvikpy.iter_chunks(path, 1 << 20, device=["cuda:0", "cuda:1"]) as it:
        for chunk in it:
            t = torch.from_dlpack(chunk)
            devices.append(str(t.device))
            got.append(t.cpu().numpy().tobytes())
        with pytest.raises(BufferError, match="several devices"):
            it.__arrow_c_device_stream__()
    assert b"".join(got) == data
    assert devices == [f"cuda:{k % 2}" for k in range(len(got))]


def test_chunks_over_two_gpus_are_read_four_ahead(tmp_path: Path) -> None:
    """Over two GPUs the iterator keeps four reads in flight, two per GPU, whatever a
    smaller ``depth`` asks for; the bytes are the file's all the same."""
    path, data = random_file(tmp_path, 10 << 20, seed=5)
    with kvikpy.iter_chunks(path, 1 << 20, device=["cuda:0", "cuda:1"], depth=1) as it:
        first = torch.from_dlpack(next(it)).cpu().numpy().tobytes()
        ahead = sorted(it._device[id(buf)] for buf, _, _ in it._pending)
        rest = [torch.from_dlpack(c).cpu().numpy().tobytes() for c in it]
    assert ahead == [0, 0, 1, 1]
    assert first + b"".join(rest) == data


def test_each_gpu_reads_on_a_pool_of_its_own(tmp_path: Path) -> None:
    """Concurrent reads onto every GPU run on one pool per GPU (of num_threads threads
    each), never on threads that also serve another GPU; the host pool is separate."""
    import threading

    n = torch.cuda.device_count()
    files = [random_file(tmp_path, 24 << 20, seed=40 + g, name=f"g{g}") for g in range(n)]
    dst = [torch.empty(24 << 20, dtype=torch.uint8, device=f"cuda:{g}") for g in range(n)]
    with kvikpy.defaults.set({"num_threads": 3, "task_size": 1 << 20}):

        def one(g: int) -> None:
            with kvikpy.CuFile(files[g][0], "r") as f:
                assert f.read(dst[g]) == 24 << 20

        threads = [threading.Thread(target=one, args=(g,)) for g in range(n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        sizes = dict(kvikpy._lib.device_pool_sizes())
    for g in range(n):
        assert sizes.get(g) == 3, sizes
        assert dst[g].cpu().numpy().tobytes() == files[g][1]
