"""``python -m benchmarks wheels``, the two-builds comparison, on the host (``--device cpu``):
every workload runs, verifies its bytes and reaches the JSON and the markdown table; the
summary flags a loss beyond the run-to-run spread; a build folder without kvikpy is refused.
The GPU side runs on the GPU machine (``make gpu-bench-wheels``)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import clean_env
from hypothesis import given, settings
from hypothesis import strategies as st

import kvikpy

REPO = Path(__file__).resolve().parent.parent
PACKAGE = Path(kvikpy.__file__).resolve().parent
# Appended, not put first: the interpreters this session spawns inherit its sys.path,
# and the checkout first would make them import the source tree's kvikpy (which has no
# built extension where the tests run against an installed wheel) instead of that wheel.
if str(REPO) not in sys.path:  # `python -m pytest` from the checkout has it already
    sys.path.append(str(REPO))

from benchmarks import wheels  # noqa: E402


def build(folder: Path) -> Path:
    """A build folder: one holding (a link to) the kvikpy under test."""
    folder.mkdir()
    (folder / "kvikpy").symlink_to(PACKAGE, target_is_directory=True)
    return folder


def compare(*args: str) -> subprocess.CompletedProcess[str]:
    env = clean_env()
    env.pop("PYTHONSAFEPATH", None)
    return subprocess.run(
        [sys.executable, "-m", "benchmarks", "wheels", "--device", "cpu", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )


SMALL = ["--size-mib", "32", "--files", "16", "--ranges", "16", "--range-budget-mib", "16"]
SMALL += ["--checkpoint-mib", "2", "--checkpoint-tensors", "8", "--rounds", "1", "--runs", "1"]
SMALL += ["--write-mib", "4"]


def test_every_workload_on_the_host(tmp_path: Path) -> None:
    a, b = build(tmp_path / "a"), build(tmp_path / "b")
    out, md = tmp_path / "w.json", tmp_path / "w.md"
    done = compare(
        f"--build=before={a}",
        f"--build=after={b}",
        *SMALL,
        "--out",
        str(out),
        "--markdown",
        str(md),
    )
    assert done.returncode == 0, done.stderr
    assert md.read_text() in done.stdout
    result = json.loads(out.read_text())
    expected = [w for w in wheels.UNITS if w not in wheels.GPU_ONLY]
    assert list(result["summary"]) == expected
    assert set(expected) == set(wheels.UNITS) - {
        "stream",
        "tiny-torch",
        "tiny-cupy",
        "checkpoint-into",
    }
    assert {"tiny-host", "write"} <= set(expected)
    for label, folder in (("before", a), ("after", b)):
        assert result["builds"][label]["file"] == str(folder / "kvikpy" / "__init__.py")
        [round_] = result["rounds"][label]
        assert list(round_) == expected
        assert all(v > 0 for v in round_.values()), round_
    for work, row in result["summary"].items():
        assert row["unit"] == wheels.UNITS[work]
        assert row["before"]["min"] <= row["before"]["median"] <= row["before"]["max"]
        assert row["ratios"]["after/before"] == pytest.approx(
            row["after"]["median"] / row["before"]["median"]
        )
    # The printed table is what --markdown writes: one row per workload, both builds.
    done = compare(
        f"--build=before={a}", f"--build=after={b}", *SMALL, "--only", "large,checkpoint"
    )
    assert done.returncode == 0, done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("| `")]
    assert [r.split("`")[1] for r in rows] == ["large", "large-1t", "checkpoint"]
    assert "| before | after | after / before | spread |" in done.stdout


def test_a_build_folder_without_kvikpy_is_refused(tmp_path: Path) -> None:
    a = build(tmp_path / "a")
    empty = tmp_path / "empty"
    empty.mkdir()
    done = compare(f"--build=a={a}", f"--build=b={empty}", *SMALL, "--only", "tiny")
    assert done.returncode != 0
    assert f"build b ({empty})" in done.stderr
    assert "not from the build folder" in done.stderr


def test_bad_arguments_are_refused(tmp_path: Path) -> None:
    a = build(tmp_path / "a")
    done = compare(f"--build=a={a}", "--only", "large")
    assert done.returncode == 2 and "at least two builds" in done.stderr
    done = compare(f"--build=a={a}", f"--build=b={a}", "--only", "stream")
    assert done.returncode == 2 and "stream, which is no workload on device cpu" in done.stderr
    done = compare(f"--build=a={a}", f"--build=a={a}")
    assert done.returncode == 2 and "repeated" in done.stderr
    done = compare(f"--build=a={a}", f"--build=b={tmp_path / 'missing'}")
    assert done.returncode == 2 and "is not a folder" in done.stderr


def test_select_takes_names_and_groups() -> None:
    assert wheels.select("large", "cpu") == ["large", "large-1t"]
    ranges = wheels.select("ranges", "cuda")
    assert len(ranges) == 8 and "batch-ranges" not in ranges
    assert wheels.select("batch-ranges,tiny", "cuda") == [
        "tiny-torch",
        "tiny-cupy",
        "tiny-host",
        "batch-ranges",
    ]
    assert wheels.select("tiny", "cpu") == ["tiny-host"]
    assert wheels.select("write", "cpu") == ["write"]
    assert "stream" in wheels.select(None, "cuda")
    assert "stream" not in wheels.select(None, "cpu")
    with pytest.raises(ValueError, match="choose from"):
        wheels.select("nothing", "cuda")


def test_summary_flags_a_loss_beyond_the_spread() -> None:
    results = {
        "before": [{"x": 10.0, "y": 100.0}, {"x": 10.5, "y": 95.0}, {"x": 9.5, "y": 105.0}],
        "after": [{"x": 8.0, "y": 97.0}, {"x": 8.1, "y": 93.0}, {"x": 7.9, "y": 99.0}],
    }
    units = {"x": "GB/s", "y": "files/s"}
    summary = wheels.summarise(results, units, {"x": "lost", "y": "within"})
    assert summary["x"]["spread"] == pytest.approx(0.1)  # before: (10.5 - 9.5) / 10
    assert summary["x"]["ratios"] == {"after/before": pytest.approx(0.8)}
    assert summary["x"]["beyond_spread"] == {"after/before": True}
    assert summary["y"]["spread"] == pytest.approx(0.1)
    assert summary["y"]["beyond_spread"] == {"after/before": False}  # 0.97 >= 0.9
    table = wheels.markdown(summary, ["before", "after"], "intro")
    assert "| `x` | lost | GB/s | 10.0 (9.5-10.5) | 8.0 (7.9-8.1) | **0.80** (loss" in table
    assert "| `y` | within | files/s | 100 (95-105) | 97 (93-99) | 0.97 | 10% |" in table


@pytest.fixture(scope="module")
def page_file(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, np.ndarray]:
    data = np.random.default_rng(5).integers(0, 256, 64 * 4096, dtype=np.uint8)
    path = tmp_path_factory.mktemp("sums") / "data.bin"
    data.tofile(path)
    return path, data


@settings(max_examples=60, deadline=None)
@given(page=st.integers(0, 40), shift=st.integers(0, 4095), pages=st.integers(1, 20))
def test_range_sums_match_numpy(
    page_file: tuple[Path, np.ndarray], page: int, shift: int, pages: int
) -> None:
    path, data = page_file
    offset, size = page * 4096 + shift, pages * 4096
    want = int(data[offset : offset + size].sum(dtype=np.int64))
    assert wheels._RangeSums(str(path))(offset, size) == want
