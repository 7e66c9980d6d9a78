"""kvikpy's cuFile stand-in (a test double of libcufile, not NVIDIA's library) on host
memory: its C ABI through ctypes, its SONAME, and that kvikpy never loads it unasked.

Every check runs in a fresh interpreter (see tests/cufile_standin.py). Skipped when the
stand-in is not built, unless $KVIKPY_CUFILE_STANDIN names it (as `make py-test` does),
in which case a missing library fails.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import cufile_standin
import pytest
from conftest import clean_env

LIBRARY = cufile_standin.path()

if LIBRARY is None:
    pytest.skip("the cuFile stand-in is not built (make cufile-standin)", allow_module_level=True)


def test_library_exists() -> None:
    assert LIBRARY is not None and LIBRARY.is_file(), (
        f"{cufile_standin.ENV} names {LIBRARY}, which does not exist"
    )


@pytest.mark.parametrize("scenario", ["host", "soname"])
def test_scenario(tmp_path: Path, scenario: str) -> None:
    assert LIBRARY is not None
    result = cufile_standin.run(scenario, LIBRARY, tmp_path)
    assert result.returncode == 0 and result.stdout.strip().endswith("ok"), (
        result.stdout + result.stderr
    )


def test_kvikpy_does_not_load_it_unasked(tmp_path: Path) -> None:
    """Without KVIKPY_CUFILE_LIBRARY, reading and writing files with kvikpy leaves no stand-in
    in the process."""
    code = """
import sys, numpy as np, kvikpy
path = sys.argv[1]
a = np.arange(100_000, dtype=np.uint8)
with kvikpy.CuFile(path, "w") as f:
    f.write(a)
b = np.empty_like(a)
with kvikpy.CuFile(path, "r") as f:
    assert f.read(b) == a.nbytes
assert (a == b).all()
maps = open("/proc/self/maps").read()
assert "cufile_standin" not in maps, "the stand-in was loaded"
print("ok")
"""
    env = clean_env()
    env.pop("KVIKPY_CUFILE_LIBRARY", None)
    result = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path / "f.bin")],
        check=False,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0 and result.stdout.strip() == "ok", result.stdout + result.stderr
