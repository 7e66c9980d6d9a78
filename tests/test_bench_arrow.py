"""``python -m benchmarks arrow --device cpu``: the Arrow tables benchmark runs end to end
on the host with a small file (its GPU run is on the GPU machine), reading fewer bytes for
2 of 10 columns than for the whole table."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import kvikpy

pytest.importorskip("pyarrow")

ROOT = Path(__file__).resolve().parent.parent


def _env() -> dict[str, str]:
    """The kvikpy under test first (an installed wheel on the GPU machine, the source
    tree here), then the benchmarks, from a folder that holds neither."""
    tested = Path(kvikpy.__file__).resolve().parent.parent
    env = {k: v for k, v in os.environ.items() if k != "PYTHONSAFEPATH"}
    env["PYTHONPATH"] = os.pathsep.join([str(tested), str(ROOT)])
    return env


def run_benchmark(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m benchmarks ARGS`` in ``folder`` with the kvikpy under test (4 minutes
    at most)."""
    return subprocess.run(
        [sys.executable, "-m", "benchmarks", *args],
        cwd=folder,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=240,
    )


def test_arrow_benchmark_smoke(tmp_path: Path) -> None:
    out = tmp_path / "arrow.json"
    args = ["--device", "cpu", "--size-mib", "24", "--runs", "1", "--out", str(out)]
    done = run_benchmark(tmp_path, "arrow", *args, "--markdown", str(tmp_path / "arrow.md"))
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(out.read_text())
    rows = {(r["cache"], r["columns"]): r for r in result["results"]}
    assert len(rows) == 4
    whole = rows["warm", "whole table"]["kvikpy"]["bytes"]
    subset = rows["warm", "2 of 10 columns"]["kvikpy"]["bytes"]
    assert 0 < subset < whole / 2
    assert whole <= result["file_bytes"]
    assert "kvikpy" in done.stdout and "pyarrow" in done.stdout
    # The table for the docs, and where the whole-table read's time goes.
    table = (tmp_path / "arrow.md").read_text()
    assert "| warm, whole table |" in table and "| cold, 2 of 10 columns |" in table
    assert set(result["phases"]) == {"metadata", "read", "export_columns"}
    assert 0 < result["phases"]["metadata"] <= result["phases"]["read"]
    assert result["first_call_seconds"] > 0
    # The whole table written back by write_ipc and by pyarrow, the same file size.
    assert result["write"]["bytes"] > whole
    assert result["write"]["kvikpy"]["seconds"] > 0 and "`write_ipc`" in table
