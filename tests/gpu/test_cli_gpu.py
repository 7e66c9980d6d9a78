"""``kvikpy bench --device cuda``: timed reads into GPU memory, bytes checked on the host."""

from __future__ import annotations

import json
import zlib
from pathlib import Path

import pytest
from conftest import random_file, run_cli

import kvikpy
import kvikpy._cli as cli
from kvikpy._cli import common


def test_bench_cuda_json_in_a_subprocess(tmp_path: Path) -> None:
    p, data = random_file(tmp_path, (6 << 20) + 7, seed=401)
    args = ["bench", str(p), "--device", "cuda", "--json", "--threads", "4", "--repeat", "3"]
    r = run_cli(*args, "--task-size", "1MiB")
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    assert result["device"] == "cuda:0"
    assert result["size"] == len(data) == p.stat().st_size
    assert (result["threads"], result["task_size"], result["repeat"]) == (4, 1 << 20, 3)
    assert len(result["times_s"]) == 3 and all(t > 0 for t in result["times_s"])
    assert 0 < result["min_gbps"] <= result["median_gbps"] <= result["max_gbps"]
    assert result["first_gbps"] > 0
    assert result["setup_read"] is Path("/dev/shm").is_dir()
    assert result["verified"] is True
    assert result["crc32"] == result["file_crc32"] == f"{zlib.crc32(data):08x}"


def test_bench_auto_picks_the_gpu_and_checks_across_chunks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The GPU bytes are copied back in chunks for the check; chunk edges lose nothing."""
    monkeypatch.setattr(common, "VERIFY_CHUNK", 1 << 20)
    p, data = random_file(tmp_path, (5 << 20) + 4097, seed=402)
    assert cli.main(["bench", str(p), "--repeat", "1", "--json"]) == 0
    result = json.loads(capsys.readouterr().out)
    assert result["device"].startswith("cuda:")
    assert result["verified"] is True
    assert result["crc32"] == f"{zlib.crc32(data):08x}"


def test_bench_cuda_line_and_a_missing_device(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    p, _ = random_file(tmp_path, 1 << 20, seed=403)
    assert cli.main(["bench", str(p), "--device", "cuda:0", "--repeat", "1"]) == 0
    line = capsys.readouterr().out
    assert " into cuda:0, " in line and "bytes verified (crc32 " in line
    missing = kvikpy.device_count()
    assert cli.main(["bench", str(p), "--device", f"cuda:{missing}"]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    last = "" if missing == 1 else f" to --device cuda:{missing - 1},"
    assert err == (
        f"kvikpy bench: error: CUDA device {missing} does not exist: "
        f"this machine has {missing} GPU(s); use --device cuda:0{last} or --device cpu\n"
    )


def test_info_lists_the_devices(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["info", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["cuda_available"] is True and d["cuda_unavailable_reason"] is None
    assert d["device_count"] == kvikpy.device_count() >= 1
    assert d["devices"] == [f"cuda:{i}" for i in range(d["device_count"])]
