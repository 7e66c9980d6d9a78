"""The staging budget of a checkpoint load on the GPU: ``load_into`` and ``load_file``
onto cuda:0, from a local file and over HTTP, keep the pinned bounce buffers in use
within the pinned part of ``checkpoint_staging`` and ``load_into``'s staging windows
within the rest; every tensor checked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from remote_servers import Counter, CountingRangeHandler, serve

import kvikpy
import kvikpy._load_into as li
import kvikpy.safetensors as kst
from kvikpy import _lib

torch = pytest.importorskip("torch")
st = pytest.importorskip("safetensors.torch")

MiB = 1 << 20
BUDGETS = [8 * MiB, 64 * MiB]


def _checkpoint(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    """About 70 MiB in 1.5 MiB tensors (staged in windows at both budgets) and two of
    12 MiB (larger than a window at 8 MiB: read straight into their targets)."""
    torch.manual_seed(7)
    state = {f"layer{i}.weight": torch.randn(384 * 1024) for i in range(40)}
    state["big.a"] = torch.randn(3 * MiB)
    state["big.b"] = torch.randn(3 * MiB)
    path = tmp_path / "m.safetensors"
    st.save_file(state, str(path))
    return path, state


def _through_bounce_buffers(staging: int) -> tuple[int, int]:
    """Settings under which every byte goes through the pinned pool (no DMA straight
    from the page cache, which holds the file just written); the pools' counts started
    afresh. Returns the split of ``staging`` for a load into GPU memory."""
    kvikpy.defaults.set({"checkpoint_staging": staging, "page_cache_dma": False})
    kvikpy.bounce_buffer_free()
    _lib.staging_memory_reset_peaks()
    bounce, device = li.staging_split(gpu=True, host=False)
    assert bounce + device == staging
    assert bounce == min(staging // 2, _lib.staging_demand()[0])
    return bounce, device


def _pinned_peak() -> int:
    pinned = _lib.staging_memory()["pinned"]
    assert pinned[0]["in_use"] == 0, "every pinned buffer back in its pool"
    return int(pinned[0]["peak_in_use"])


@pytest.mark.parametrize("staging", BUDGETS)
def test_load_into_keeps_pinned_memory_and_windows_within_the_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, staging: int
) -> None:
    path, state = _checkpoint(tmp_path)
    bounce, device = _through_bounce_buffers(staging)
    seen: list[Any] = []
    real = li._windows

    def windows(reads: Any, bound: int, gap: int) -> Any:
        got = real(reads, bound, gap)
        seen.append((bound, got))
        return got

    monkeypatch.setattr(li, "_windows", windows)
    target = {n: torch.zeros_like(t, device="cuda:0") for n, t in state.items()}
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    assert kst.load_into(target, path) == ([], [])
    torch.cuda.synchronize()
    peak_gpu = torch.cuda.max_memory_allocated() - before
    assert [bound for bound, _ in seen] == [device // 2]
    staged = [w for _, got in seen for w in got if not w.alone]
    assert staged and all(w.length <= device // 2 for w in staged)
    assert peak_gpu <= device, (peak_gpu, device)  # the two windows, nothing else
    assert 0 < _pinned_peak() <= bounce
    for name, want in state.items():
        assert torch.equal(target[name].cpu(), want), name
    assert _lib.staging_budget() is None


@pytest.mark.parametrize("staging", BUDGETS)
def test_load_file_keeps_pinned_memory_within_the_budget(tmp_path: Path, staging: int) -> None:
    path, state = _checkpoint(tmp_path)
    bounce, _ = _through_bounce_buffers(staging)
    got = kst.load_file(path, device="cuda:0")
    torch.cuda.synchronize()
    assert 0 < _pinned_peak() <= bounce
    assert set(got) == set(state)
    for name, want in state.items():
        assert got[name].device == torch.device("cuda:0")
        assert torch.equal(got[name].cpu(), want), name


@pytest.mark.parametrize("staging", BUDGETS)
def test_a_remote_load_keeps_pinned_memory_within_the_budget(tmp_path: Path, staging: int) -> None:
    path, state = _checkpoint(tmp_path)
    bounce, _ = _through_bounce_buffers(staging)
    with serve(CountingRangeHandler, directory=str(tmp_path), counter=Counter()) as url:
        got = kst.load_file(f"{url}/{path.name}", device="cuda:0")
        torch.cuda.synchronize()
        assert 0 < _pinned_peak() <= bounce
        _lib.staging_memory_reset_peaks()
        target = {n: torch.zeros_like(t, device="cuda:0") for n, t in state.items()}
        assert kst.load_into(target, f"{url}/{path.name}") == ([], [])
        torch.cuda.synchronize()
        assert 0 < _pinned_peak() <= bounce
    for name, want in state.items():
        assert torch.equal(got[name].cpu(), want), name
        assert torch.equal(target[name].cpu(), want), name


def test_reads_outside_a_load_are_not_bounded(tmp_path: Path) -> None:
    """A plain read into GPU memory carries no budget: at a 2 MiB ``checkpoint_staging``
    it still takes its usual buffers (4 MiB tasks, more than the 1 MiB a load would
    get)."""
    path, _ = _checkpoint(tmp_path)
    _through_bounce_buffers(2 * MiB)
    kvikpy.defaults.set("task_size", 4 * MiB)
    dest = torch.empty(path.stat().st_size, dtype=torch.uint8, device="cuda:0")
    with kvikpy.CuFile(path) as f:
        assert f.read(dest) == dest.numel()
    assert _pinned_peak() > 1 * MiB
    assert torch.equal(
        dest.cpu(), torch.frombuffer(bytearray(path.read_bytes()), dtype=torch.uint8)
    )
