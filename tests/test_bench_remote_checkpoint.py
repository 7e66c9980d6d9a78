"""``python -m benchmarks remote-checkpoint``, a safetensors checkpoint from a loopback S3
server, on the host (``--device cpu``: kvikpy and boto3 into numpy arrays, and the server's
ceiling): moto's server starts and is gone afterwards, every contender verifies its bytes
and reaches the JSON and the markdown table, libraries that cannot be imported are
reported as skipped, and bad arguments are refused. Where torch is installed, the local
rows (the same checkpoint from the local file, warm) run beside kvikpy's remote row, and a
local row whose bytes differ from the checkpoint's fails naming the tensor. The GPU run is
on the GPU machine."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import benchmark_env

pytest.importorskip("boto3")
pytest.importorskip("moto.server")
pytest.importorskip("safetensors")

REPO = Path(__file__).resolve().parent.parent
TINY = ["--size-mib", "4", "--tensors", "8", "--rounds", "1", "--runs", "1", "--device", "cpu"]


def bench(folder: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``python -m benchmarks remote-checkpoint ARGS`` in ``folder``, with ``env`` added."""
    return subprocess.run(
        [sys.executable, "-m", "benchmarks", "remote-checkpoint", *args],
        cwd=folder,
        env=benchmark_env(folder) | env,
        capture_output=True,
        text=True,
        check=False,
        timeout=200,
    )


def child(folder: Path, code: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -c CODE ARGS`` in ``folder``, in a benchmark process's environment."""
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        cwd=folder,
        env=benchmark_env(folder),
        capture_output=True,
        text=True,
        check=False,
        timeout=100,
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


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_the_local_rows_beside_the_remote_one(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    out, md = tmp_path / "r.json", tmp_path / "r.md"
    libs = (
        "kvikpy,local-kvikpy,local-kvikpy-into,local-safetensors,local-instanttensor,"
        "local-flashpack,ceiling"
    )
    done = bench(tmp_path, *TINY, "--libs", libs, "--out", str(out), "--markdown", str(md))
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["checkpoint"]["dtypes"] == ["F32", "F16", "BF16"]  # torch wrote it
    assert result["checkpoint"]["local_filesystem"]
    tensor_bytes = result["checkpoint"]["tensor_bytes"]
    # FlashPack runs where it is installed, else it is skipped with the reason.
    flashpack = "local-flashpack" in result["results"]
    assert flashpack or "No module named" in result["skipped"]["local-flashpack"]
    local = ["local-kvikpy", "local-kvikpy-into", "local-safetensors"]
    for lib in ["kvikpy", *local] + (["local-flashpack"] if flashpack else []):
        row = result["results"][lib]
        assert 0 < row["min_GBps"] <= row["median_GBps"] <= row["max_GBps"], lib
        assert len(row["seconds"]) == 1
        # The warm-up and the timed load, every tensor's bytes verified.
        assert row["verified_loads"] == 2
        assert row["verified_bytes"] == 2 * tensor_bytes, lib
        assert row["rss_peak_mib"][0] >= row["rss_start_mib"][0] > 0
        assert row["gpu_peak_mib"] == row["gpu_held_mib"] == []
        if lib != "kvikpy":  # warm: the file read just before the process
            assert row["page_cache_resident"][0] > 0.99, lib
    for lib in ("local-kvikpy", "local-kvikpy-into"):
        assert result["results"][lib]["settings"]["task_size"] > 0
    if flashpack:
        settings = result["results"]["local-flashpack"]["settings"]
        assert settings["pack_bytes"] >= tensor_bytes and settings["convert_seconds"] > 0
        assert settings["FLASHPACK_CPU_PARALLEL_READ"] == "1"  # read, not mapped lazily
    why = result["skipped"]["local-instanttensor"]
    assert "InstantTensor loads onto CUDA devices only" in why
    assert result["failed"] == {}
    # kvikpy against the local peers, and from the server against from the local file.
    peers = ["local-safetensors"] + (["local-flashpack"] if flashpack else [])
    assert set(result["ratios"]) == {
        f"{own}_vs_{peer}" for own in ("local-kvikpy", "local-kvikpy-into") for peer in peers
    } | {"kvikpy_vs_local-kvikpy"}
    assert gone(result["server"]["pid"])
    text = md.read_text()
    assert text in done.stdout
    assert "The `local-*` rows read the same checkpoint from a file on the local disk" in text
    for lib in local:
        line = next(x for x in text.splitlines() if x.startswith(f"| `{lib}` |"))
        assert "warm page cache (every page of the file cached before each process)" in line
        assert line.split(" | ")[3] == "-"  # no share of the server's ceiling
    assert "kvikpy / local-kvikpy: " in text
    assert "local-kvikpy / local-safetensors: " in text
    assert "`local-instanttensor` skipped: InstantTensor loads onto CUDA devices only" in text


# A local row whose file holds other bytes than the checkpoint's sums say (its last byte
# flipped after they were taken): the check outside the clock fails the process.
WRONG = """
import json, os, sys
from benchmarks.common import run_child
from benchmarks.remote_checkpoint import CHILD, CONVERT, write_checkpoint
lib, folder = sys.argv[1:3]
path = os.path.join(folder, "model.safetensors")
expected = write_checkpoint(path, 1, 4, True)
expected |= {"local_path": path, "staging": {}, "tensor_bytes": 0}
with open(path, "r+b") as fh:
    fh.seek(-1, os.SEEK_END)
    last = fh.read(1)[0]
    fh.seek(-1, os.SEEK_END)
    fh.write(bytes([last ^ 0xFF]))
if lib == "local-flashpack":
    pack = os.path.join(folder, "model.flashpack")
    got = run_child(CONVERT, path, pack, what="converting")
    expected |= {"flashpack_path": pack, "flashpack_bytes": got["bytes"],
                 "flashpack_seconds": got["seconds"]}
expected_path = os.path.join(folder, "expected.json")
with open(expected_path, "w") as fh:
    json.dump(expected, fh)
try:
    run_child(CHILD, lib, "s3://bucket/key", "cpu", 1, expected_path, what=lib)
except RuntimeError as e:
    print(e)
    sys.exit(3)
"""


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    "lib", ["local-kvikpy", "local-kvikpy-into", "local-safetensors", "local-flashpack"]
)
def test_a_local_row_with_other_bytes_fails_naming_the_tensor(tmp_path: Path, lib: str) -> None:
    pytest.importorskip("torch")
    if lib == "local-flashpack" and importlib.util.find_spec("flashpack") is None:
        pytest.skip("flashpack is not installed")
    done = child(tmp_path, WRONG, lib, str(tmp_path))
    assert done.returncode == 3, done.stderr[-3000:]
    assert f"{lib}: model.layers." in done.stdout
    assert "holds different bytes" in done.stdout


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
    done = child(tmp_path, SERVE, str(tmp_path / "moto.log"), end)
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
