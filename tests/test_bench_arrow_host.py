"""``python -m benchmarks arrow-host``: the host-memory table benchmark runs end to end
(kvikpy, pyarrow's read_all and its memory map, three table shapes, shapes checked)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_bench_arrow import run_benchmark

pytest.importorskip("pyarrow")


def test_arrow_host_benchmark_smoke(tmp_path: Path) -> None:
    out = tmp_path / "host.json"
    done = run_benchmark(tmp_path, "arrow-host", "--rounds", "1", "--runs", "1", "--out", str(out))
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(out.read_text())
    assert set(result["ms"]) == {"kvikpy", "pyarrow", "pyarrow-mmap"}
    assert set(result["ms"]["kvikpy"]) == {"long", "wide", "text"}
    assert "read_all / kvikpy" in done.stdout
