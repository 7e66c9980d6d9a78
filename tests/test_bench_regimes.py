"""``python -m benchmarks regimes``, kvikpy against kvikio in every regime, in its host
smoke mode (``--device cpu``: kvikpy only, tiny sizes): every row runs in its own
process, verifies its bytes and reaches the JSON and the markdown; ``--only`` selects
rows; bad arguments are refused. The GPU run is ``make gpu-bench-regimes``."""

from __future__ import annotations

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
# Appended, not put first (see tests/test_bench_wheels.py).
if str(REPO) not in sys.path:
    sys.path.append(str(REPO))

from benchmarks import regimes  # noqa: E402

TINY = ["--device", "cpu", "--size-mib", "8", "--write-mib", "4", "--calls", "32"]
TINY += ["--files", "8", "--rounds", "1", "--write-rounds", "2", "--disk-rounds", "1"]
TINY += ["--runs", "1"]


def regimes_run(*args: str) -> subprocess.CompletedProcess[str]:
    env = clean_env()
    env.pop("PYTHONSAFEPATH", None)
    # The kvikpy under test first (an installed wheel on the GPU machine, the source tree
    # here), then the benchmarks; run from elsewhere, so that `-m` and `-c` children do
    # not put the source tree's kvikpy first.
    tested = Path(kvikpy.__file__).resolve().parent.parent
    env["PYTHONPATH"] = os.pathsep.join([str(tested), str(REPO)])
    # The folder it runs in goes when it ends, however it ends.
    with tempfile.TemporaryDirectory(prefix="kvikpy-regimes-test-") as cwd:
        return subprocess.run(
            [sys.executable, "-m", "benchmarks", "regimes", *args],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            check=False,
            timeout=240,
        )


def test_every_row_on_the_host(tmp_path: Path) -> None:
    out, md = tmp_path / "r.json", tmp_path / "r.md"
    done = regimes_run(*TINY, "--evict", "fadvise", "--out", str(out), "--markdown", str(md))
    assert done.returncode == 0, done.stderr
    assert md.read_text() in done.stdout
    result = json.loads(out.read_text())
    expected = [r for r in regimes.ROWS if r not in regimes.GPU_ONLY | regimes.OPT_IN]
    assert list(result["rows"]) == expected
    assert result["skipped"] == {}
    for name, row in result["rows"].items():
        assert row["unit"] == regimes.ROWS[name][0]
        rounds = 2 if name in ("write", "write-mem", "first-read") else 1
        for label, values in row["values"].items():
            assert len(values) == rounds and all(v > 0 for v in values), (name, label)
            s = row["configs"][label]
            assert s["min"] <= s["median"] <= s["max"]
    for state in regimes.STATES:
        assert list(result["rows"][state]["configs"]) == [
            "kvikpy default",
            "kvikpy buffered",
            "kvikpy direct",
        ]
    # What each child ran with: the forced configurations reached kvikpy's settings.
    seen = result["settings_seen"]
    assert seen["cold/kvikpy direct"]["auto_direct_io_read"] is True
    assert seen["cold/kvikpy buffered"]["auto_direct_io_read"] is False
    assert seen["write/kvikpy"]["num_threads"] == regimes.THREADS
    # Each half's residency before the clock, one pair per half-warm pass.
    halves = result["rows"]["half"]["resident_halves"]
    assert len(halves) == 3 and all(len(h) == 2 and 0 <= min(h) <= max(h) <= 1 for h in halves)
    text = md.read_text()
    assert "| `percall-host` |" in text and "us/call" in text
    assert "`half`: resident before the clock, first half" in text
    assert "| `cold` (8 MiB, page cache dropped) |" in text
    assert "Disk ceiling (O_DIRECT pread" in text


def test_only_selects_rows_and_the_sweep_sets_its_knobs(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    done = regimes_run(*TINY, "--only", "write-sweep,first-read", "--out", str(out))
    assert done.returncode == 0, done.stderr
    result = json.loads(out.read_text())
    assert list(result["rows"]) == ["first-read", "write-sweep"]
    sweep = result["settings_seen"]
    for mib in regimes.SWEEP_TASKS_MIB:
        assert sweep[f"write-sweep/kvikpy {mib} MiB tasks"]["task_size"] == mib << 20
    assert "| kvikpy 16 MiB tasks, 4 MiB chunks |" in done.stdout


def test_cold_rows_are_skipped_with_a_reason_where_caches_cannot_be_dropped(
    tmp_path: Path,
) -> None:
    # A stand-in for /proc/sys/vm/drop_caches that cannot be written (its folder is
    # missing), so the test neither needs root nor drops the machine's page cache.
    blocked = str(tmp_path / "missing" / "drop_caches")
    method, reason = regimes.evict_method("drop_caches", blocked)
    assert method is None and blocked in reason
    assert regimes.evict_method("fadvise", blocked)[0] == "fadvise"
    done = regimes_run(*TINY, "--only", "warm,cold,disk", "--drop-caches", blocked)
    assert done.returncode == 0, done.stderr
    assert "`cold` skipped: dropping the page cache is not permitted here" in done.stdout
    assert "`disk` skipped:" in done.stdout
    assert "| `warm` (8 MiB in the page cache) |" in done.stdout


def test_bad_arguments_are_refused() -> None:
    done = regimes_run("--device", "cpu", "--only", "percall-torch")
    assert done.returncode == 2 and "percall-torch, which is no row on device cpu" in done.stderr
    done = regimes_run("--device", "cpu", "--rounds", "0")
    assert done.returncode == 2 and "at least 1" in done.stderr


def test_select_takes_names_and_groups() -> None:
    assert regimes.select("percall", "cuda") == ["percall-torch", "percall-cupy", "percall-host"]
    assert regimes.select("percall", "cpu") == ["percall-host"]
    assert regimes.select("large", "cpu") == ["warm", "half", "cold", "disk"]
    assert "write-sweep" not in regimes.select(None, "cuda")
    assert regimes.select("write-sweep", "cuda") == ["write-sweep"]
    with pytest.raises(ValueError, match="choose from"):
        regimes.select("nothing", "cuda")
