"""``python -m benchmarks arrow-zstd --device cpu``: the compressed-table benchmark runs
end to end on the host with a small file (its GPU run, nvCOMP against host decoding, is
on the GPU machine)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from test_bench_arrow import run_benchmark

pytest.importorskip("pyarrow")


@pytest.mark.parametrize("codec", ["zstd", "lz4"])
def test_arrow_zstd_benchmark_smoke(tmp_path: Path, codec: str) -> None:
    out = tmp_path / "arrow-zstd.json"
    args = ["--device", "cpu", "--size-mib", "4", "--runs", "1", "--codec", codec]
    done = run_benchmark(tmp_path, "arrow-zstd", *args, "--out", str(out))
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(out.read_text())
    assert result["codec"] == codec and result["decoded_bytes"] > 0
    assert set(result["routes"]) == {"kvikpy decode=host", "pyarrow read_all"}
    assert "GB/s" in done.stdout
