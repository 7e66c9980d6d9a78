"""``python -m benchmarks save`` on the host (``--device cpu``: numpy state dicts): every
writer that can run here writes, reads back and checks its checkpoint and reaches the JSON
and the markdown table with its ratios, writers whose libraries are missing are reported
as skipped, and bad arguments are refused. The GPU run is on the GPU machine."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
from conftest import clean_env

import kvikpy

REPO = Path(__file__).resolve().parent.parent
TINY = ["--size-mib", "4", "--tensors", "8", "--rounds", "1", "--runs", "1", "--device", "cpu"]


def bench(folder: Path, *args: str, startup: str = "") -> subprocess.CompletedProcess[str]:
    """``python -m benchmarks save ARGS`` in ``folder``, against this kvikpy; ``startup``
    is run first in every process of the run (a ``sitecustomize``)."""
    site = Path(tempfile.mkdtemp(prefix="site-", dir=folder))
    (site / "kvikpy").symlink_to(Path(kvikpy.__file__).resolve().parent)
    if startup:
        (site / "sitecustomize.py").write_text(startup)
    env = clean_env()
    env.pop("PYTHONSAFEPATH", None)
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(REPO)])
    return subprocess.run(
        [sys.executable, "-m", "benchmarks", "save", *args],
        cwd=folder,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=200,
    )


@pytest.mark.timeout(240)
def test_every_writer_on_the_host_checks_its_checkpoint(tmp_path: Path) -> None:
    out, md = tmp_path / "r.json", tmp_path / "r.md"
    done = bench(tmp_path, *TINY, "--dirs", "disk,shm", "--out", str(out), "--markdown", str(md))
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    torch = importlib.util.find_spec("torch") is not None
    ran = ["kvikpy-flat", "kvikpy", "kvikpy-sync", "kvikpy-async", "kvikpy-shards"]
    torch_writers = ["torch-save", "dcp", "dcp-async", "dcp-kvikpy", "dcp-kvikpy-async"]
    ran += ["safetensors"] + (torch_writers if torch else [])
    places = ["disk"] + (["shm"] if os.path.isdir("/dev/shm") else [])
    assert sorted(result["results"]) == sorted(f"{w}@{p}" for w in ran for p in places)
    for key, row in result["results"].items():
        assert row["bytes"] == 4 << 20, key
        assert len(row["runs"]) == 1, key
        run = row["runs"][0]
        assert 0 < run["blocked_s"] <= run["written_s"] <= run["synced_s"], key
        if not key.startswith(("kvikpy-async", "dcp-async", "dcp-kvikpy-async")):
            assert run["blocked_s"] == run["written_s"], key
    if not torch:
        assert result["skipped"] == {w: "torch not installed" for w in torch_writers}
    table = md.read_text()
    assert "kvikpy `save_file(sync=False, blocking=False)`" in table
    assert "disk: kvikpy save_file incl. sync / safetensors" in table
    assert "blocks for" in table and "(target below 0.1)" in table


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


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--writers", "kvikpy,nope"], "--writers takes"),
        (["--dirs", "cloud"], "--dirs takes disk and shm"),
        (["--runs", "0"], "must be at least 1"),
    ],
)
def test_bad_arguments_are_refused(tmp_path: Path, args: list[str], message: str) -> None:
    done = bench(tmp_path, *TINY, *args)
    assert done.returncode != 0 and message in done.stderr
