"""``python -m benchmarks remote-checkpoint``, a safetensors checkpoint from a loopback S3
server, on the host (``--device cpu``: kvikpy and boto3 into numpy arrays, and the server's
ceiling): moto's server starts and is gone afterwards, every contender verifies its bytes
and reaches the JSON and the markdown table, libraries that cannot be imported are
reported as skipped, and bad arguments are refused. The GPU run is on the GPU machine."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from conftest import clean_env

import kvikpy

pytest.importorskip("boto3")
pytest.importorskip("moto.server")
pytest.importorskip("safetensors")

REPO = Path(__file__).resolve().parent.parent
TINY = ["--size-mib", "4", "--tensors", "8", "--rounds", "1", "--runs", "1", "--device", "cpu"]


def child_env(folder: Path) -> dict[str, str]:
    """The environment of a benchmark process: the kvikpy under test (an installed wheel,
    or a build in another checkout) through a link of its own, then this checkout's
    benchmarks."""
    site = Path(tempfile.mkdtemp(prefix="site-", dir=folder))
    (site / "kvikpy").symlink_to(Path(kvikpy.__file__).resolve().parent)
    env = clean_env()
    env.pop("PYTHONSAFEPATH", None)
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(REPO)])
    return env


def bench(folder: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``python -m benchmarks remote-checkpoint ARGS`` in ``folder``, with ``env`` added."""
    return subprocess.run(
        [sys.executable, "-m", "benchmarks", "remote-checkpoint", *args],
        cwd=folder,
        env=child_env(folder) | env,
        capture_output=True,
        text=True,
        check=False,
        timeout=200,
    )


def gone(pid: int) -> bool:
    """Whether process ``pid`` has ended (a zombie no reaper collected counts as ended)."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


@pytest.mark.timeout(240)
def test_a_tiny_checkpoint_on_the_host(tmp_path: Path) -> None:
    out, md = tmp_path / "r.json", tmp_path / "r.md"
    libs = "kvikpy-numpy,boto3-numpy,ceiling,runai"
    done = bench(tmp_path, *TINY, "--libs", libs, "--out", str(out), "--markdown", str(md))
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    size = result["checkpoint"]["bytes"]
    assert result["checkpoint"]["tensors"] == 8
    assert 4 << 20 <= size < (4 << 20) + 4096
    assert result["checkpoint"]["dtypes"] == ["F32", "F16"]  # numpy has no bfloat16
    for lib in ("kvikpy-numpy", "boto3-numpy", "ceiling"):
        row = result["results"][lib]
        assert 0 < row["min_GBps"] <= row["median_GBps"] <= row["max_GBps"], lib
        assert len(row["seconds"]) == 1
        # The warm-up and the timed load, each verified in full.
        assert row["verified_loads"] == 2
        whole = size if lib == "ceiling" else result["checkpoint"]["tensor_bytes"]
        assert row["verified_bytes"] == 2 * whole, lib
        assert row["rss_peak_mib"][0] >= row["rss_start_mib"][0] > 0
        assert row["gpu_peak_mib"] == row["gpu_held_mib"] == []
    assert result["results"]["kvikpy-numpy"]["settings"]["task_size"] > 0
    assert result["results"]["ceiling"]["settings"]["streams"] == 16
    # The Run:ai streamer needs torch (and its own packages): run, or skipped with the reason.
    assert "runai" in result["results"] or "runai" in result["skipped"]
    assert "No module named" in result["skipped"].get("runai", "No module named")
    assert result["failed"] == {}
    peers = {"boto3-numpy"} | ({"runai"} & set(result["results"]))
    assert set(result["ratios"]) == {f"kvikpy-numpy_vs_{peer}" for peer in peers}
    assert result["versions"]["moto"] and result["versions"]["boto3"]
    # moto's server ran in a process of its own, which is gone.
    server = result["server"]
    assert server["endpoint"].startswith("http://127.0.0.1:")
    assert gone(server["pid"])
    text = md.read_text()
    assert text in done.stdout
    assert "| `kvikpy-numpy` |" in text and "| `boto3-numpy` |" in text
    assert "| server ceiling | 16 concurrent signed ranged GETs" in text
    assert "The server's ceiling: moto's server sent the object at" in text


@pytest.mark.timeout(120)
def test_a_failing_kvikpy_is_reported_and_fails_the_run(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    libs = "kvikpy-numpy,ceiling"
    done = bench(tmp_path, *TINY, "--libs", libs, "--out", str(out), KVIKIO_TASK_SIZE="abc")
    assert done.returncode == 1, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert "KVIKIO_TASK_SIZE" in result["failed"]["kvikpy-numpy"]
    assert list(result["results"]) == ["ceiling"]
    assert "`kvikpy-numpy` failed: kvikpy.errors.ConfigError" in done.stdout
    assert gone(result["server"]["pid"])


SERVE = """
import os, sys
from benchmarks.remote_checkpoint import moto_server
with moto_server(True, sys.argv[1]) as (endpoint, pid):
    print(pid, flush=True)
    if sys.argv[2] == "raise":
        raise KeyboardInterrupt
    os.kill(os.getpid(), 9)
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize("end", ["raise", "killed"])
def test_the_server_stops_however_the_benchmark_ends(tmp_path: Path, end: str) -> None:
    # Interrupted: the block's exit stops it; killed: it sees its standard input close.
    done = subprocess.run(
        [sys.executable, "-c", SERVE, str(tmp_path / "moto.log"), end],
        cwd=tmp_path,
        env=child_env(tmp_path),
        capture_output=True,
        text=True,
        check=False,
        timeout=100,
    )
    assert done.returncode != 0 and done.stdout.strip().isdigit(), done.stderr[-2000:]
    pid = int(done.stdout)
    deadline = time.monotonic() + 30
    while not gone(pid) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert gone(pid)


def test_bad_arguments_are_refused(tmp_path: Path) -> None:
    done = bench(tmp_path, "--libs", "kvikpy-numpy", "--device", "cuda:0")
    assert done.returncode == 2 and "only with --device cpu" in done.stderr
    done = bench(tmp_path, "--libs", "kvikpy,nothing")
    assert done.returncode == 2 and "choose each at most once" in done.stderr
    done = bench(tmp_path, "--rounds", "0")
    assert done.returncode == 2 and "at least 1" in done.stderr
