"""``python -m benchmarks save`` on the host (``--device cpu``: numpy state dicts): every
writer that can run here writes, reads back and checks its checkpoint and reaches the JSON
and the markdown table with its ratios, writers whose libraries are missing are reported
as skipped, and bad arguments are refused. Where torch is installed: the dcp rows, the
loads among them, as two gloo ranks of one process group; a wrong checkpoint or a wrong
load fails the run, in one rank as in two; ranks past their time are stopped. The GPU run
is on the GPU machine."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import benchmark_env

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:  # `python -m pytest` from the checkout has it already
    sys.path.append(str(REPO))

from benchmarks import save  # noqa: E402

PLACE = "shm" if os.path.isdir("/dev/shm") else "disk"
TINY = ["--size-mib", "4", "--tensors", "8", "--rounds", "1", "--runs", "1", "--device", "cpu"]


def bench(folder: Path, *args: str, startup: str = "") -> subprocess.CompletedProcess[str]:
    """``python -m benchmarks save ARGS`` in ``folder``, against this kvikpy; ``startup``
    is run first in every process of the run (a ``sitecustomize``)."""
    return subprocess.run(
        [sys.executable, "-m", "benchmarks", "save", *args],
        cwd=folder,
        env=benchmark_env(folder, startup),
        capture_output=True,
        text=True,
        check=False,
        timeout=200,
    )


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_every_writer_on_the_host_checks_its_checkpoint(tmp_path: Path) -> None:
    out, md = tmp_path / "r.json", tmp_path / "r.md"
    done = bench(tmp_path, *TINY, "--dirs", "disk,shm", "--out", str(out), "--markdown", str(md))
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["complete"] is True
    torch = importlib.util.find_spec("torch") is not None
    ran = ["kvikpy-flat", "kvikpy", "kvikpy-sync", "kvikpy-async", "kvikpy-shards"]
    torch_writers = ["torch-save", *save.DCP]
    ran += ["safetensors"] + (torch_writers if torch else [])
    places = ["disk"] + (["shm"] if os.path.isdir("/dev/shm") else [])
    assert sorted(result["results"]) == sorted(f"{w}@{p}" for w in ran for p in places)
    for key, row in result["results"].items():
        assert row["bytes"] == 4 << 20, key
        assert len(row["runs"]) == 1, key
        run = row["runs"][0]
        assert row["ranks"] == 1 and row["backend"] == ("gloo" if key[0] == "d" else None), key
        if key.split("@")[0] in save.LOADS:
            assert run["synced_s"] is None and row["synced_GBps"] is None, key
            assert 0 < run["blocked_s"] == run["written_s"], key
            continue
        assert 0 < run["blocked_s"] <= run["written_s"] <= run["synced_s"], key
        if not key.startswith(("kvikpy-async", "dcp-async", "dcp-kvikpy-async")):
            assert run["blocked_s"] == run["written_s"], key
    if not torch:
        assert result["skipped"] == {w: "torch not installed" for w in torch_writers}
    table = md.read_text()
    assert "kvikpy `save_file(sync=False, blocking=False)`" in table
    assert "disk: kvikpy save_file incl. sync / safetensors" in table
    assert "blocks for" in table and "(target below 0.1)" in table
    if torch:
        assert "| disk | 1 (gloo) |" in table and "dcp.load from the page cache" in table
        assert "`os.sync()` has no part in a load" in table


@pytest.mark.slow
@pytest.mark.timeout(240)
def test_the_dcp_rows_as_two_gloo_ranks(tmp_path: Path) -> None:
    """Each dcp row is two processes of one gloo group, each rank saving (or loading) its
    half; a row's bytes are both ranks'; the rows not of dcp stay one process."""
    pytest.importorskip("torch")
    out, md = tmp_path / "r.json", tmp_path / "r.md"
    writers = ",".join(["kvikpy", *save.DCP])
    done = bench(tmp_path, *TINY, "--dirs", PLACE, "--ranks", "2", "--writers", writers,
                 "--out", str(out), "--markdown", str(md))  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["args"]["ranks"] == 2
    assert sorted(result["results"]) == sorted(f"{w}@{PLACE}" for w in writers.split(","))
    for key, row in result["results"].items():
        w = key.split("@")[0]
        assert row["bytes"] == 4 << 20, key
        assert (row["ranks"], row["backend"]) == ((2, "gloo") if w in save.DCP else (1, None))
        assert row["page_cache_GBps"]["median"] > 0, key
        assert (row["synced_GBps"] is None) == (w in save.LOADS), key
    table = md.read_text()
    assert f"| {PLACE} | 2 (gloo) |" in table and f"| {PLACE} | 1 |" in table
    assert "The dcp rows ran as 2 ranks" in table
    assert f"{PLACE}: dcp.load from the page cache through kvikpy.dcp" in table


LOSES_A_TENSOR = """
import kvikpy.safetensors as kst
real = kst.save_file
def save_file(tensors, *args, **kwargs):
    tensors = dict(tensors)
    tensors.popitem()
    return real(tensors, *args, **kwargs)
kst.save_file = save_file
"""

FLIPS_A_BYTE = """
import numpy as np
import kvikpy.safetensors as kst
real = kst.save_file
def save_file(tensors, *args, **kwargs):
    tensors = dict(tensors)
    name = next(iter(tensors))
    tensors[name] = tensors[name].copy()
    tensors[name].view(np.uint8)[0] ^= 1
    return real(tensors, *args, **kwargs)
kst.save_file = save_file
"""


@pytest.mark.timeout(240)
@pytest.mark.parametrize("startup", [LOSES_A_TENSOR, FLIPS_A_BYTE], ids=["lost", "flipped"])
def test_a_wrong_checkpoint_fails_the_run(tmp_path: Path, startup: str) -> None:
    """The check is real: a save that loses a tensor or changes a byte fails the run."""
    done = bench(tmp_path, *TINY, "--writers", "kvikpy", "--dirs", "disk", startup=startup)
    assert done.returncode != 0 and "AssertionError" in done.stderr


#: From the second load on (the first timed run's; the warm-up's is left alone), one
#: byte of the first tensor loaded is changed, in rank 1 only (so rank 0 is left waiting).
FLIPS_A_LOADED_BYTE = """
import os
if os.environ.get("RANK") == "1":
    import kvikpy.dcp as kdcp
    real, calls = kdcp.FileSystemReader.read_data, []
    def read_data(self, plan, planner):
        done = real(self, plan, planner)
        calls.append(1)
        if len(calls) > 1:
            t = planner.resolve_tensor(plan.items[0])
            t.reshape(-1).view(__import__("torch").uint8)[0] ^= 1
        return done
    kdcp.FileSystemReader.read_data = read_data
"""

#: From the second load on, the reader leaves the last tensor unread.
SKIPS_A_TENSOR = """
import os
if "RANK" in os.environ:
    import kvikpy.dcp as kdcp
    from torch.distributed.checkpoint.planner import LoadPlan
    real, calls = kdcp.FileSystemReader.read_data, []
    def read_data(self, plan, planner):
        calls.append(1)
        if len(calls) > 1:
            plan = LoadPlan(plan.items[:-1], plan.storage_data, plan.planner_data)
        return real(self, plan, planner)
    kdcp.FileSystemReader.read_data = read_data
"""

#: kvikpy.dcp's writer changes one byte of each rank's first data file.
FLIPS_A_SAVED_BYTE = """
import os
if "RANK" in os.environ:
    import kvikpy._save
    real = kvikpy._save.write_files
    def write_files(files, sync):
        real(files, sync)
        path, pieces = files[0]  # the rank's first item, its first data file
        with open(path, "r+b") as f:
            f.seek(pieces[0][2])
            b = f.read(1)[0]
            f.seek(pieces[0][2])
            f.write(bytes([b ^ 1]))
    kvikpy._save.write_files = write_files
"""


@pytest.mark.timeout(240)
@pytest.mark.parametrize(
    ("writer", "ranks", "startup", "rank", "tensor"),
    [
        ("dcp-kvikpy-load", 2, FLIPS_A_LOADED_BYTE, "1", r"r1\.layer000"),
        ("dcp-kvikpy-load", 1, SKIPS_A_TENSOR, "0", "layer007"),
        ("dcp-kvikpy", 2, FLIPS_A_SAVED_BYTE, "([01])", r"r\1\.layer000"),
    ],
    ids=["load-flipped-2-ranks", "load-lost-1-rank", "save-flipped-2-ranks"],
)
def test_a_wrong_dcp_checkpoint_or_load_fails_the_run(
    tmp_path: Path, writer: str, ranks: int, startup: str, rank: str, tensor: str
) -> None:
    """The dcp rows' checks are real: a load that changes a byte or leaves a tensor
    unread in a timed run, or a save that changes a byte, fails the run naming the rank
    and the tensor, and a rank that fails stops its peers, which do not wait out the
    group's timeout (600 s: the run's own limit in ``bench``, 200 s, would stop it)."""
    pytest.importorskip("torch")
    done = bench(tmp_path, *TINY, "--writers", writer, "--dirs", PLACE, "--ranks", str(ranks),
                 startup=startup)  # fmt: skip
    assert done.returncode != 0, done.stderr[-3000:]
    says = rf"rank {rank} exited 1: .*AssertionError: {tensor}\.weight"
    assert re.search(says, done.stderr, re.DOTALL), done.stderr[-3000:]


@pytest.mark.timeout(200)
def test_a_stopped_run_keeps_the_rows_it_measured(tmp_path: Path) -> None:
    """The JSON and the table are written after every row: a run that stops on its second
    writer (here its child fails; a time limit the same) leaves the first one's row,
    marked incomplete."""
    out, md = tmp_path / "r.json", tmp_path / "r.md"
    fails = "import sys\nif any('spec-safetensors' in a for a in sys.argv):\n    sys.exit(3)\n"
    done = bench(tmp_path, *TINY, "--dirs", PLACE, "--writers", "kvikpy-flat,safetensors",
                 "--out", str(out), "--markdown", str(md), startup=fails)  # fmt: skip
    assert done.returncode != 0
    assert "safetensors" in done.stderr
    result = json.loads(out.read_text())
    assert result["complete"] is False
    assert list(result["results"]) == [f"kvikpy-flat@{PLACE}"]
    assert result["results"][f"kvikpy-flat@{PLACE}"]["synced_GBps"]["median"] > 0
    table = md.read_text()
    assert f"(Partial: stopped in round 1 of 1 at {PLACE}.)" in table
    assert f"| {PLACE} | 1 |" in table
    assert f"{PLACE}, round 1: kvikpy-flat " in done.stdout


@pytest.mark.timeout(120)
def test_ranks_past_their_time_are_stopped(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rank that never joins its group: the run fails once its time is up, saying so,
    with every rank stopped."""
    pytest.importorskip("torch")
    sleeps = "import os, time\nif os.environ.get('RANK') == '1':\n    time.sleep(600)\n"
    for name, value in benchmark_env(tmp_path, sleeps).items():
        monkeypatch.setenv(name, value)
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({
        "writer": "dcp", "folder": str(tmp_path), "runs": 1, "tensors": 2, "bytes": 1 << 16,
        "device": "cpu", "dcp_rows": save.DCP, "load_rows": save.LOADS,
        "torch_rows": save.NEEDS_TORCH, "group_timeout_s": 600,
    }))  # fmt: skip
    with pytest.raises(RuntimeError, match=r"dcp: past 5 s; rank 0 running: .*rank 1 running"):
        save.run_ranks(str(spec), 2, "dcp", timeout=5)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--writers", "kvikpy,nope"], "--writers takes"),
        (["--dirs", "cloud"], "--dirs takes disk and shm"),
        (["--runs", "0"], "must be at least 1"),
        (["--ranks", "0"], "must be at least 1"),
        (["--ranks", "3"], "--tensors must be a multiple of --ranks"),
        (["--ranks", "2", "--device", "cuda:1"], "--ranks above 1 takes --device cuda"),
    ],
)
def test_bad_arguments_are_refused(tmp_path: Path, args: list[str], message: str) -> None:
    done = bench(tmp_path, *TINY, *args)
    assert done.returncode != 0 and message in done.stderr
