"""The staging budget of a checkpoint load (``checkpoint_staging``) on the host: the bounce
buffers a load's reads hold stay within the part of the setting they are given, one task
always goes, and reads outside a load carry no budget."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import PAGE, aligned_array, o_direct_supported, random_bytes
from remote_servers import Counter, CountingRangeHandler, serve
from test_safetensors import write_safetensors

import kvikpy
import kvikpy._load_into as li
import kvikpy.safetensors as kst
from kvikpy import _lib

KiB, MiB = 1 << 10, 1 << 20
BOUNCE = 256 * KiB
THREADS = 8


def _checkpoint(tmp_path: Path, size: int = 6 * MiB) -> tuple[Path, np.ndarray, int]:
    """A one-tensor checkpoint of ``size`` random bytes, the tensor, and where its data
    starts in the file; skips where the filesystem has no O_DIRECT."""
    data = np.frombuffer(random_bytes(size, seed=71), dtype=np.uint8)
    path = tmp_path / "m.safetensors"
    write_safetensors(path, {"w": data})
    if not o_direct_supported(path):
        pytest.skip("no O_DIRECT on this filesystem")
    data_start, _, _ = kst.read_header(path)
    return path, data, data_start


def _staged_reads(staging: int) -> None:
    """Settings under which a host load stages through the host pool: O_DIRECT, small
    bounce buffers, several threads; and the pools' counts started afresh."""
    kvikpy.defaults.set(
        {
            "auto_direct_io_read": True,
            "bounce_buffer_size": BOUNCE,
            "num_threads": THREADS,
            "task_size": 512 * KiB,
            "checkpoint_staging": staging,
        }
    )
    kvikpy.bounce_buffer_free()
    _lib.staging_memory_reset_peaks()


def _unaligned_target(n: int, data_start: int) -> np.ndarray:
    """A host array whose bytes sit at a different offset within a page than the file's
    data, so that every O_DIRECT read of it goes through a bounce buffer."""
    return aligned_array(n, (data_start + 100) % PAGE)


@pytest.mark.parametrize("staging", [2 * MiB, 8 * MiB])
def test_a_host_load_keeps_its_bounce_buffers_within_its_part_of_the_setting(
    tmp_path: Path, staging: int
) -> None:
    path, data, data_start = _checkpoint(tmp_path)
    _staged_reads(staging)
    bounce, device = li.staging_split(gpu=False, host=True)
    uncapped = _lib.staging_demand()[1]
    assert uncapped == THREADS * BOUNCE
    assert bounce == min(staging // 2, uncapped) and bounce + device == staging
    target = _unaligned_target(data.size, data_start)
    assert kst.load_into({"w": target}, path) == ([], [])
    np.testing.assert_array_equal(target, data)
    host = _lib.staging_memory()["host"]
    assert host["in_use"] == 0, "every buffer back in the pool"
    assert 0 < host["peak_in_use"] <= bounce, (host, bounce)
    assert _lib.staging_budget() is None, "the load left its budget"


def test_load_file_into_host_memory_keeps_within_its_budget(tmp_path: Path) -> None:
    path, data, data_start = _checkpoint(tmp_path)
    _staged_reads(2 * MiB)
    bounce, _ = li.staging_split(gpu=False, host=True)
    out = kst.load_file(path, framework="numpy")
    np.testing.assert_array_equal(out["w"], data)
    host = _lib.staging_memory()["host"]
    assert host["in_use"] == 0
    assert host["peak_in_use"] <= bounce, (host, bounce)
    # numpy chose the array's address: staged unless it happens to match the file's.
    if (out["w"].ctypes.data - data_start) % PAGE:
        assert host["peak_in_use"] > 0


@pytest.mark.parametrize(
    ("limit", "buffer", "alone"), [(100 * KiB, 64 * KiB, False), (1, PAGE, True)]
)
def test_a_small_budget_lets_one_task_go_at_a_time(
    tmp_path: Path, limit: int, buffer: int, alone: bool
) -> None:
    """A load inside a budget entered already keeps that budget (one load, one budget).
    Its tasks stage through buffers that fit it (64 KiB in 100 KiB: one at a time), down
    to one page; a budget below even that lets each task go alone, and the load
    completes."""
    path, data, data_start = _checkpoint(tmp_path, 3 * MiB)
    _staged_reads(8 * MiB)
    target = _unaligned_target(data.size, data_start)
    depth = _lib.staging_enter(limit)
    try:
        kst.load_into({"w": target}, path)
        used = _lib.staging_budget()
    finally:
        _lib.staging_leave(depth)
    np.testing.assert_array_equal(target, data)
    assert used is not None
    assert used["limit"] == limit and used["in_use"] == 0
    assert used["peak"] == buffer, "one bounce buffer at a time"
    assert (used["over"] > 0) == alone, used
    assert _lib.staging_memory()["host"]["peak_in_use"] == buffer
    assert _lib.staging_budget() is None


def test_reads_outside_a_checkpoint_load_carry_no_budget(tmp_path: Path) -> None:
    """A plain read is untouched: no budget, buffers of the configured size as before."""
    path, data, data_start = _checkpoint(tmp_path)
    _staged_reads(2 * MiB)
    assert _lib.staging_budget() is None
    buf = _unaligned_target(data.size, data_start)
    with kvikpy.CuFile(path) as f:
        assert f.read(buf, data.size, data_start) == data.size
    np.testing.assert_array_equal(buf, data)
    host = _lib.staging_memory()["host"]
    assert host["peak_in_use"] % BOUNCE == 0 and host["peak_in_use"] > 0
    assert host["peak_in_use"] <= (THREADS + 1) * BOUNCE


def test_the_default_split_and_the_windows() -> None:
    """At the defaults: the bounce buffers get at most half the setting, never more than
    the reads would hold uncapped; load_into's two GPU windows share the rest."""
    total = li.staging_bytes()
    assert total == 512 * MiB
    pinned, host = _lib.staging_demand()
    assert pinned > 0 and host > 0
    bounce, device = li.staging_split()
    assert (bounce, device) == (min(total // 2, pinned), total - min(total // 2, pinned))
    assert li.window_bytes() == device // 2
    assert li.staging_split(gpu=True, host=True)[0] == min(total // 2, pinned + host)
    assert li.staging_split(gpu=False, host=False) == (0, total)


def test_info_reports_the_budget_and_the_staging_memory() -> None:
    staging: dict[str, Any] = kvikpy.info()["staging"]
    total = int(kvikpy.defaults.get("checkpoint_staging"))
    assert staging["checkpoint_staging"] == total
    assert staging["gpu_load"]["bounce"] + staging["gpu_load"]["windows"] == total
    assert staging["host_load"]["bounce"] == li.staging_split(gpu=False, host=True)[0]
    assert staging["uncapped"] == dict(zip(("pinned", "host"), _lib.staging_demand(), strict=True))
    assert set(staging["memory"]) == {"host", "pinned"}
    assert set(staging["memory"]["host"]) == {"held", "peak_held", "in_use", "peak_in_use"}


def test_a_remote_load_into_host_memory_under_a_small_budget(tmp_path: Path) -> None:
    """Over HTTP, host targets are read straight into their memory: a 2 MiB setting
    changes nothing but the budget the load carries."""
    data = np.frombuffer(random_bytes(5 * MiB, seed=72), dtype=np.uint8)
    write_safetensors(tmp_path / "m.safetensors", {"w": data})
    kvikpy.defaults.set("checkpoint_staging", 2 * MiB)
    with serve(CountingRangeHandler, directory=str(tmp_path), counter=Counter()) as url:
        target = np.zeros(data.size, np.uint8)
        assert kst.load_into({"w": target}, f"{url}/m.safetensors") == ([], [])
        got = kst.load_file(f"{url}/m.safetensors", framework="numpy")
    np.testing.assert_array_equal(target, data)
    np.testing.assert_array_equal(got["w"], data)
    assert _lib.staging_budget() is None
