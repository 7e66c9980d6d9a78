"""``python -m benchmarks arrow-wide``: the many-columns benchmark runs end to end on a
small table and checks what each library read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_bench_arrow import run_benchmark

pytest.importorskip("pyarrow")


def test_arrow_wide_benchmark_smoke(tmp_path: Path) -> None:
    out = tmp_path / "wide.json"
    args = ["--columns", "300", "--every", "10", "--rounds", "2", "--runs", "1"]
    done = run_benchmark(tmp_path, "arrow-wide", *args, "--out", str(out))
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["columns"] == 300
    assert set(result["rounds"]) == {"kvikpy", "pyarrow"}
    assert all(len(r) == 2 for r in result["rounds"].values())
    assert "30 columns chosen by name" in done.stdout
