"""kvikpy.dcp: torch.distributed.checkpoint's FileSystemWriter and FileSystemReader with
the data files written and read by kvikpy. Where torch is installed: exact round trips of
every dtype and plain values, checkpoints of PyTorch's own writer read by kvikpy's reader,
what PyTorch's reader does with kvikpy's files, loads into other dtypes and views,
async_save, a failed write that leaves no checkpoint, and two gloo ranks on loopback with
a DTensor resharded on loading. Without torch, importing kvikpy.dcp says what is missing."""

from __future__ import annotations

import contextlib
import importlib.util
import os
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from distributed_launch import run_ranks
from hypothesis import given
from hypothesis import strategies as hs

from kvikpy.cufile import CuFile

HAVE_TORCH = importlib.util.find_spec("torch") is not None
WORKER = Path(__file__).with_name("dcp_worker.py")


@pytest.mark.skipif(HAVE_TORCH, reason="torch is installed here")
def test_without_torch_the_import_says_what_is_missing() -> None:
    done = subprocess.run(
        [sys.executable, "-c", "import kvikpy.dcp"], capture_output=True, text=True, check=False
    )
    assert done.returncode != 0
    assert "kvikpy.dcp is storage for torch.distributed.checkpoint and needs torch" in done.stderr


torch_only = pytest.mark.skipif(not HAVE_TORCH, reason="needs torch")


def state() -> dict[str, Any]:
    import torch

    g = torch.Generator().manual_seed(3)
    return {
        "w": torch.randn(300, 7, generator=g),
        "d": torch.randn(9, generator=g).double(),
        "h": torch.randn(5, generator=g).half(),
        "bf": torch.randn(1 << 19, generator=g).bfloat16(),  # 1 MiB: page-aligned
        "ids": torch.randint(-(2**40), 2**40, (77,), generator=g),
        "i8": torch.randint(-128, 127, (3,), generator=g).to(torch.int8),
        "u8": torch.randint(0, 255, (11,), generator=g).to(torch.uint8),
        "m": torch.randint(0, 2, (4, 5), generator=g).bool(),
        "c": torch.randn(4, generator=g, dtype=torch.complex64),
        "scalar": torch.tensor(3.5),
        "empty": torch.zeros(0, 3),
        "step": 12,
        "name": "run-a",
        "nested": {"lr": 0.1, "betas": [0.9, 0.99]},
    }


def zeros_like(s: dict[str, Any]) -> dict[str, Any]:
    import torch

    out: dict[str, Any] = {}
    for k, v in s.items():
        out[k] = torch.zeros_like(v) if isinstance(v, torch.Tensor) else None
    out["step"], out["name"], out["nested"] = 0, "", {"lr": 0.0, "betas": [0.0, 0.0]}
    return out


def assert_same(got: dict[str, Any], want: dict[str, Any]) -> None:
    import torch

    assert got.keys() == want.keys()
    for k, v in want.items():
        if isinstance(v, torch.Tensor):
            assert got[k].dtype == v.dtype and torch.equal(got[k], v), k
        else:
            assert got[k] == v, k


@contextlib.contextmanager
def one_process() -> Iterator[None]:
    """DCP without a process group, whose warning that it assumes one process is
    expected here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def round_trip(folder: Path, writer: Any, reader: Any) -> None:
    """``state()`` saved with ``writer`` into ``folder`` and loaded back exactly."""
    import torch.distributed.checkpoint as dcp

    s = state()
    with one_process():
        dcp.save(s, storage_writer=writer(folder))
        into = zeros_like(s)
        dcp.load(into, storage_reader=reader(folder))
    assert_same(into, s)


@torch_only
def test_a_checkpoint_round_trips_exactly(tmp_path: Path) -> None:
    import kvikpy.dcp as kdcp

    round_trip(tmp_path, kdcp.FileSystemWriter, kdcp.FileSystemReader)
    assert sorted(os.listdir(tmp_path)) == [".metadata", "__0_0.kvikpy"]


@torch_only
@pytest.mark.parametrize("files", [2, 3, 50])
def test_a_rank_writes_thread_count_files_of_about_equal_bytes(tmp_path: Path, files: int) -> None:
    import kvikpy.dcp as kdcp

    round_trip(
        tmp_path, lambda p: kdcp.FileSystemWriter(p, thread_count=files), kdcp.FileSystemReader
    )
    data = sorted(f for f in os.listdir(tmp_path) if f != ".metadata")
    # thread_count files, or one per item where there are fewer items (fewer than 50
    # here), none of them empty.
    if files < 50:
        assert len(data) == files
    else:
        assert len(state()) <= len(data) < 50
    assert data == sorted(f"__0_{i}.kvikpy" for i in range(len(data)))
    sizes = [os.path.getsize(tmp_path / f) for f in data]
    assert all(sizes) or files == 50  # 50: the empty tensor may be a file of its own
    if files == 2:  # the largest item alone in one file, the rest in the other
        biggest = max(t.numel() * t.element_size() for t in state().values() if hasattr(t, "numel"))
        assert max(sizes) >= biggest


@torch_only
@given(
    sizes=hs.lists(hs.integers(min_value=0, max_value=1 << 30), max_size=60),
    files=hs.integers(min_value=1, max_value=70),
)
def test_items_spread_over_files_keep_their_order_and_balance(sizes: list[int], files: int) -> None:
    from kvikpy.dcp import _spread

    items = [(k, None, n) for k, n in enumerate(sizes)]
    spread = _spread(items, files)
    # min(files, items) lists (one, empty, for no items), none empty where there are
    # items, every item once, each list in the items' order.
    assert len(spread) == max(1, min(files, len(items)))
    assert all(spread) or not items
    assert sorted(i for part in spread for i, _, _ in part) == list(range(len(items)))
    assert all([i for i, _, _ in part] == sorted(i for i, _, _ in part) for part in spread)
    # Largest first onto the lightest: no list outweighs another by more than one item.
    loads = [sum(n for _, _, n in part) for part in spread]
    assert max(loads) - min(loads) <= max(sizes, default=0)


@torch_only
@pytest.mark.parametrize("bad", [0, -1, 1025, 2.0, True, "4"])
def test_thread_count_is_a_count_of_files(tmp_path: Path, bad: Any) -> None:
    import kvikpy.dcp as kdcp

    with pytest.raises(
        TypeError if not isinstance(bad, int) or bad is True else ValueError, match="thread_count"
    ):
        kdcp.FileSystemWriter(tmp_path, thread_count=bad)
    assert os.listdir(tmp_path) == []


@torch_only
def test_pytorchs_own_checkpoints_load_through_kvikpys_reader(tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp

    import kvikpy.dcp as kdcp

    round_trip(tmp_path, dcp.FileSystemWriter, kdcp.FileSystemReader)
    assert not [f for f in os.listdir(tmp_path) if f.endswith(kdcp.SUFFIX)]


@torch_only
def test_pytorchs_reader_fails_on_kvikpys_data_files(tmp_path: Path) -> None:
    """As documented: PyTorch's reader unpickles each tensor, and kvikpy's are raw bytes."""
    import torch
    import torch.distributed.checkpoint as dcp

    import kvikpy.dcp as kdcp

    with one_process():
        dcp.save({"w": torch.ones(8)}, storage_writer=kdcp.FileSystemWriter(tmp_path))
        with pytest.raises(BaseException, match=r"(?i)unpickl|weights only"):
            dcp.load({"w": torch.zeros(8)}, storage_reader=dcp.FileSystemReader(tmp_path))


@torch_only
def test_loads_into_another_dtype_and_into_a_strided_view(tmp_path: Path) -> None:
    import torch
    import torch.distributed.checkpoint as dcp

    import kvikpy.dcp as kdcp

    s = state()
    with one_process():
        dcp.save(s, storage_writer=kdcp.FileSystemWriter(tmp_path))
        into = {
            "w": torch.zeros(300, 7, dtype=torch.float64),
            "d": torch.zeros(9, 2, dtype=torch.float64)[:, 1],
        }
        strided = torch.zeros(7, 300).t()  # not contiguous: read aside, then copied
        dcp.load({"w": strided}, storage_reader=kdcp.FileSystemReader(tmp_path))
        dcp.load(into, storage_reader=kdcp.FileSystemReader(tmp_path))
    assert torch.equal(strided, s["w"])
    assert torch.equal(into["w"], s["w"].double())
    assert torch.equal(into["d"], s["d"])


@torch_only
def test_async_save_through_kvikpy(tmp_path: Path) -> None:
    import torch.distributed.checkpoint as dcp

    import kvikpy.dcp as kdcp

    s = state()
    with one_process():
        dcp.async_save(s, storage_writer=kdcp.FileSystemWriter(tmp_path)).result(timeout=120)
        into = zeros_like(s)
        dcp.load(into, storage_reader=kdcp.FileSystemReader(tmp_path))
    assert_same(into, s)


@torch_only
def test_a_failed_write_leaves_no_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import errno

    import torch.distributed.checkpoint as dcp

    import kvikpy.dcp as kdcp

    class Full:
        def get(self) -> int:
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(CuFile, "pwrite", lambda *a, **k: Full())
    for files in (1, 3):
        with one_process(), pytest.raises(BaseException, match="No space left"):
            dcp.save(state(), storage_writer=kdcp.FileSystemWriter(tmp_path, thread_count=files))
        assert os.listdir(tmp_path) == []  # no data file, no metadata


@torch_only
@pytest.mark.timeout(300)
@pytest.mark.parametrize("writer", ["kvikpy", "kvikpy-files", "torch"])
def test_two_gloo_ranks_save_and_load_a_resharded_dtensor(tmp_path: Path, writer: str) -> None:
    folder = tmp_path / "ckpt"
    results = run_ranks(tmp_path, "gloo", "cpu", writer, [folder], world=2, worker=WORKER)
    for rank, got in enumerate(results):
        assert got["checked"] == sorted([f"rank{rank}.ids", "shared.w", "sharded", "step"])
    data = [f for f in results[0]["files"] if f != ".metadata"]
    if writer == "kvikpy":
        assert data == ["__0_0.kvikpy", "__1_0.kvikpy"]
    elif writer == "kvikpy-files":  # thread_count=3: up to three files a rank
        for rank in (0, 1):
            mine = sorted(f for f in data if f.startswith(f"__{rank}_"))
            assert mine and mine == [f"__{rank}_{i}.kvikpy" for i in range(len(mine))]
            assert len(mine) <= 3
        assert len([f for f in data if f.startswith("__0_")]) == 3
    else:
        assert data and not [f for f in data if f.endswith(".kvikpy")]


@torch_only
@pytest.mark.parametrize("name", ["../outside.kvikpy", "/etc/passwd.kvikpy", "sub/x.kvikpy"])
def test_metadata_naming_a_file_outside_the_checkpoint_is_refused(
    tmp_path: Path, name: str
) -> None:
    import pickle

    import torch
    import torch.distributed.checkpoint as dcp

    import kvikpy.dcp as kdcp

    folder = tmp_path / "ckpt"
    with one_process():
        dcp.save({"w": torch.ones(8)}, storage_writer=kdcp.FileSystemWriter(folder))
    meta_path = folder / ".metadata"
    meta = pickle.loads(meta_path.read_bytes())
    for info in meta.storage_data.values():
        info.relative_path = name
    meta_path.write_bytes(pickle.dumps(meta))
    (tmp_path / "outside.kvikpy").write_bytes(bytes(64))
    with one_process(), pytest.raises(BaseException, match="not a file of the checkpoint"):
        dcp.load({"w": torch.zeros(8)}, storage_reader=kdcp.FileSystemReader(folder))


@torch_only
def test_a_load_keeps_its_bounce_buffers_within_the_staging_budget(tmp_path: Path) -> None:
    # O_DIRECT reads into a target whose bytes sit at another offset within a page than
    # the file's stage through host bounce buffers: 8 threads could hold 2 MiB of them
    # at once, the load's budget (checkpoint_staging 2 MiB) leaves them 1 MiB.
    import torch
    import torch.distributed.checkpoint as dcp
    from conftest import PAGE, o_direct_supported

    import kvikpy
    import kvikpy.dcp as kdcp
    from kvikpy import _lib

    n = 6 << 20
    data = torch.randint(0, 256, (n,), dtype=torch.uint8)
    with one_process():
        dcp.save({"w": data}, storage_writer=kdcp.FileSystemWriter(tmp_path))
        learn = kdcp.FileSystemReader(tmp_path)
        dcp.load({"w": torch.zeros(n, dtype=torch.uint8)}, storage_reader=learn)
    [info] = learn.storage_data.values()
    if not o_direct_supported(tmp_path / info.relative_path):
        pytest.skip("no O_DIRECT on this filesystem")
    room = torch.zeros(n + 2 * PAGE, dtype=torch.uint8)
    shift = (info.offset + 100 - room.data_ptr()) % PAGE  # 100 bytes off the file's
    target = room[shift : shift + n]
    kvikpy.defaults.set(
        {
            "auto_direct_io_read": True,
            "bounce_buffer_size": 256 << 10,
            "num_threads": 8,
            "task_size": 512 << 10,
            "checkpoint_staging": 2 << 20,
        }
    )
    kvikpy.bounce_buffer_free()
    _lib.staging_memory_reset_peaks()
    bounce, _ = _lib.staging_split(False, True)
    assert bounce == 1 << 20
    with one_process():
        dcp.load({"w": target}, storage_reader=kdcp.FileSystemReader(tmp_path))
    assert torch.equal(target, data)
    host = _lib.staging_memory()["host"]
    assert host["in_use"] == 0, "every buffer back in the pool"
    assert 0 < host["peak_in_use"] <= bounce, (host, bounce)
    assert _lib.staging_budget() is None, "the load left its budget"
