"""Scattered reads into memory the caller owns on the GPU (``_lib.read_scattered``, the
engine's batch request): torch tensors on every device, neighbours in one allocation
whose gaps must stay untouched, small items gathered and large ones alone, a short item
failing alone; and load_into of many tensors into CUDA tensors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import kvikpy
import kvikpy.safetensors as kst
from kvikpy import _lib

torch = pytest.importorskip("torch")


def data_file(tmp_path: Path, size: int) -> tuple[Path, bytes]:
    data = np.random.default_rng(5).integers(0, 256, size, dtype=np.uint8).tobytes()
    path = tmp_path / "data.bin"
    path.write_bytes(data)
    return path, data


@pytest.mark.parametrize("bounce", [1 << 20, 16 << 20])
def test_items_land_in_cuda_tensors_and_gaps_stay_untouched(tmp_path: Path, bounce: int) -> None:
    path, data = data_file(tmp_path, 48 << 20)
    sizes = [1, 4096, 100_000, 3 << 20, 0, 9 << 20, 777, 5 << 20, 65536] * 3
    # Every item in one allocation, 8 bytes apart (gaps that must keep their 0x5A), plus
    # separate tensors and a host array: small items are gathered, large ones alone.
    whole = torch.full((sum(sizes) + 8 * len(sizes),), 0x5A, dtype=torch.uint8, device="cuda")
    separate = [torch.zeros(n, dtype=torch.uint8, device="cuda") for n in sizes]
    host = np.zeros(sum(sizes), np.uint8)
    items, want = [], []
    at, host_at, offset = 0, 0, 0
    for k, n in enumerate(sizes):
        offset = (offset + 7919 * (k + 1)) % (len(data) - n)
        items.append((0, offset, n, whole.data_ptr() + at, whole.device.index))
        items.append((0, offset, n, separate[k].data_ptr(), separate[k].device.index))
        items.append((0, offset, n, host.ctypes.data + host_at, None))
        want.append((at, host_at, offset, n))
        at += n + 8
        host_at += n
    with kvikpy.defaults.set({"bounce_buffer_size": bounce}):
        failures = _lib.read_scattered([str(path)], items, (whole, separate, host))
    assert failures == []
    got_whole = whole.cpu().numpy().tobytes()
    for k, (at, host_at, offset, n) in enumerate(want):
        expect = data[offset : offset + n]
        assert got_whole[at : at + n] == expect, k
        assert got_whole[at + n : at + n + 8] == b"\x5a" * 8, f"gap after item {k} written"
        assert separate[k].cpu().numpy().tobytes() == expect, k
        assert host[host_at : host_at + n].tobytes() == expect, k


@pytest.mark.multi_gpu
def test_items_on_two_devices(tmp_path: Path) -> None:
    path, data = data_file(tmp_path, 8 << 20)
    a = torch.zeros(5 << 20, dtype=torch.uint8, device="cuda:0")
    b = torch.zeros(3000, dtype=torch.uint8, device="cuda:1")
    c = torch.zeros(3 << 20, dtype=torch.uint8, device="cuda:1")
    items = [
        (0, 10, a.numel(), a.data_ptr(), 0),
        (0, 99, b.numel(), b.data_ptr(), 1),
        (0, 12345, c.numel(), c.data_ptr(), 1),
    ]
    assert _lib.read_scattered([str(path)], items, (a, b, c)) == []
    assert a.cpu().numpy().tobytes() == data[10 : 10 + a.numel()]
    assert b.cpu().numpy().tobytes() == data[99 : 99 + b.numel()]
    assert c.cpu().numpy().tobytes() == data[12345 : 12345 + c.numel()]


def test_a_short_item_fails_alone(tmp_path: Path) -> None:
    path, data = data_file(tmp_path, 1 << 20)
    ok = torch.zeros(1000, dtype=torch.uint8, device="cuda")
    short = torch.zeros(5000, dtype=torch.uint8, device="cuda")
    items = [
        (0, 0, ok.numel(), ok.data_ptr(), ok.device.index),
        (0, len(data) - 100, short.numel(), short.data_ptr(), short.device.index),
    ]
    failures = _lib.read_scattered([str(path)], items, (ok, short))
    assert [i for i, _ in failures] == [1]
    assert ok.cpu().numpy().tobytes() == data[:1000]


def test_an_item_on_a_missing_device_is_refused(tmp_path: Path) -> None:
    path, _ = data_file(tmp_path, 4096)
    t = torch.zeros(10, dtype=torch.uint8, device="cuda")
    with pytest.raises(ValueError, match="CUDA device"):
        _lib.read_scattered([str(path)], [(0, 0, 10, t.data_ptr(), kvikpy.device_count())], t)
    assert not t.any()


def test_load_into_many_cuda_tensors(tmp_path: Path) -> None:
    gen = torch.Generator().manual_seed(3)
    sizes = [3, 1000, 70_000, 1 << 20, 5 << 20] * 20
    tensors = {
        f"t{k:03d}": torch.randint(-1000, 1000, (n,), generator=gen, dtype=torch.int32)
        for k, n in enumerate(sizes)
    }
    st = pytest.importorskip("safetensors.torch")
    path = tmp_path / "m.safetensors"
    st.save_file(tensors, str(path))
    target = {name: torch.zeros_like(t, device="cuda") for name, t in tensors.items()}
    assert kst.load_into(target, path) == kst.LoadResult([], [])
    for name, t in tensors.items():
        assert torch.equal(target[name].cpu(), t), name
