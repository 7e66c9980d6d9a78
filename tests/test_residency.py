"""Reads by residency (``auto_direct_io_read="auto"``, the default): cold, warm and
half-warm files read the same bytes in every mode; the uncached parts of large reads go
with O_DIRECT and the cached ones through the page cache; small reads are not probed;
the setting and ``KVIKIO_AUTO_DIRECT_IO_READ`` answer and choose the mode."""

from __future__ import annotations

import json
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest
from conftest import PAGE, aligned_array, o_direct_supported, random_file, run_python
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kvikpy
from kvikpy import _lib

MiB = 1 << 20
# 24 MiB and a bit: the last block is partial and must not be read with O_DIRECT.
FILE_LEN = 24 * MiB + 1234
WHOLE_BLOCKS = FILE_LEN // PAGE * PAGE
HALF = FILE_LEN // 2 // PAGE * PAGE


def cached_pages(path: Path, offset: int = 0, length: int = 0) -> int:
    return kvikpy.get_page_cache_info(str(path), offset, length)[0]


class DataFile(NamedTuple):
    """The test file and its bytes; its repr leaves the 24 MiB out, so that Hypothesis can
    report a failing example (it prints every argument, fixtures included)."""

    path: Path
    data: bytes

    def __repr__(self) -> str:
        return f"DataFile({str(self.path)!r}, <{len(self.data)} bytes>)"


@pytest.fixture
def data_file(tmp_path: Path) -> DataFile:
    path, data = random_file(tmp_path, FILE_LEN, seed=21)
    if not o_direct_supported(path):
        pytest.skip("the temporary directory's file system has no O_DIRECT")
    kvikpy.drop_file_page_cache(str(path))
    if cached_pages(path) != 0:
        pytest.skip("this file system keeps its pages after POSIX_FADV_DONTNEED")
    return DataFile(path, data)


def make(path: Path, state: str, *, exact: bool = True) -> None:
    """Leave ``path`` cold, warm, or with only its first half cached.

    The kernel may evict pages at any time (other processes need memory), so the state is
    tried three times. With ``exact`` a state not reached skips the test (its premise does
    not hold on this machine now; tests/test_page_cache.py checks the eviction itself);
    without it the caller only needs the bytes to be right whatever is cached."""
    expected = {"cold": 0, "warm": -(-FILE_LEN // PAGE), "half": HALF // PAGE}[state]
    got = -1
    for _ in range(3):
        kvikpy.drop_file_page_cache(str(path))
        if state in ("warm", "half"):
            path.read_bytes()
        if state == "half":
            # Reading the first half alone would read ahead into the second.
            kvikpy.drop_file_page_cache(str(path), HALF)
        got = cached_pages(path)
        if got == expected:
            return
    if exact:
        pytest.skip(f"could not make the file {state}: {got} pages cached, {expected} wanted")


def read_counted(
    path: Path,
    mode: object,
    offset: int = 0,
    size: int | None = None,
    misalign: int = 0,
    task_size: int = 4 * MiB,
) -> tuple[bytes, int, int]:
    """Read with ``auto_direct_io_read=mode``; the bytes and the counter deltas (bytes read
    with O_DIRECT, residency probes)."""
    size = FILE_LEN - offset if size is None else size
    buf = aligned_array(size, misalign)
    before = _lib.read_path_counters()
    # Two threads: with more, a 24 MiB read is cut into fewer-MiB tasks, one per thread.
    config = {"auto_direct_io_read": mode, "task_size": task_size, "num_threads": 2}
    with kvikpy.defaults.set(config), kvikpy.CuFile(path, "r") as f:
        n = f.pread(buf, size, offset).get()
    direct, probes = (a - b for a, b in zip(_lib.read_path_counters(), before, strict=True))
    return bytes(buf[:n]), direct, probes


COLD_HALF = WHOLE_BLOCKS - HALF
# For each mode and state: the bytes expected to go with O_DIRECT.
EXPECTED_DIRECT = {
    ("auto", "cold"): WHOLE_BLOCKS,
    ("auto", "warm"): 0,
    ("auto", "half"): COLD_HALF,
    (True, "cold"): WHOLE_BLOCKS,
    (True, "warm"): WHOLE_BLOCKS,
    (True, "half"): WHOLE_BLOCKS,
    (False, "cold"): 0,
    (False, "warm"): 0,
    (False, "half"): 0,
}


@pytest.mark.parametrize("state", ["cold", "warm", "half"])
@pytest.mark.parametrize("mode", ["auto", True, False])
def test_every_mode_reads_the_same_bytes_by_the_expected_path(data_file, mode, state):
    path, data = data_file
    make(path, state)
    got, direct, probes = read_counted(path, mode)
    assert got == data
    assert direct == EXPECTED_DIRECT[(mode, state)]
    # One probe per MiB of each 4 MiB task, and only when reading by residency.
    assert probes == (24 if mode == "auto" else 0)
    # O_DIRECT leaves the cold parts uncached; the page cache keeps what it read.
    if mode == "auto" and state == "cold":
        assert cached_pages(path, 0, HALF) <= 1
    if mode is False:
        assert cached_pages(path, 0, WHOLE_BLOCKS) == WHOLE_BLOCKS // PAGE


@pytest.mark.parametrize(
    ("offset", "size", "misalign"), [(1000, 20 * MiB + 77, 3), (PAGE, 9 * MiB, 0)]
)
def test_unaligned_reads_of_a_cold_file(data_file, offset, size, misalign):
    path, data = data_file
    make(path, "cold")
    got, direct, _ = read_counted(path, "auto", offset, size, misalign)
    assert got == data[offset : offset + size]
    assert direct >= size - 4 * MiB


def test_reads_past_the_end_of_a_cold_file_stop_at_it(data_file):
    path, data = data_file
    make(path, "cold")
    offset = FILE_LEN - 3 * MiB - 10
    buf = np.full(4 * MiB, 0xEE, dtype=np.uint8)
    with kvikpy.CuFile(path, "r") as f:
        n = f.pread(buf, 4 * MiB, offset).get()
    assert n == FILE_LEN - offset
    assert bytes(buf[:n]) == data[offset:]
    assert (buf[n:] == 0xEE).all(), "bytes past the end of the file untouched"


def test_small_reads_are_not_probed(data_file):
    path, data = data_file
    make(path, "cold")
    # Less than 1 MiB of whole blocks per task: through the page cache, no probe.
    got, direct, probes = read_counted(path, "auto", 100, MiB)
    assert got == data[100 : 100 + MiB]
    assert (direct, probes) == (0, 0)
    got, direct, probes = read_counted(path, "auto", 0, 8 * MiB, task_size=512 << 10)
    assert got == data[: 8 * MiB]
    assert (direct, probes) == (0, 0)


def test_tmpfs_files_read_through_the_page_cache(tmpfs_dir):
    """tmpfs pages are always resident: by residency reads them through the page cache.
    (Forced O_DIRECT opens there on Linux 6.6 and later, and fails to open before.)"""
    path, data = random_file(tmpfs_dir, 6 * MiB + 5, seed=4)
    got, direct, probes = read_counted(path, "auto", 0, len(data))
    assert got == data
    assert direct == 0
    assert probes > 0
    got, _, _ = read_counted(path, True, 0, len(data))
    assert got == data


def test_choices():
    kvikpy.defaults.set("auto_direct_io_read", "auto")  # the default (the variable unset)
    for value, expected in [(True, True), (False, False), ("auto", "auto"), (" AUTO ", "auto")]:
        with kvikpy.defaults.set("auto_direct_io_read", value):
            assert kvikpy.defaults.get("auto_direct_io_read") == expected
        assert kvikpy.defaults.get("auto_direct_io_read") == "auto"
    for bad in ("maybe", "", None, 1, 0.5, ["auto"]):
        with pytest.raises(ValueError, match="auto_direct_io_read"):
            kvikpy.defaults.set("auto_direct_io_read", bad)
        assert kvikpy.defaults.get("auto_direct_io_read") == "auto"


SCENARIO = """
import json, sys, kvikpy
from kvikpy import _lib
path = sys.argv[1]
kvikpy.drop_file_page_cache(path)
buf = bytearray(24 << 20)
before = _lib.read_path_counters()[0]
with kvikpy.CuFile(path, "r") as f:
    f.pread(buf, task_size=4 << 20).get()
direct = _lib.read_path_counters()[0] - before
print(json.dumps([kvikpy.defaults.get("auto_direct_io_read"), direct]))
"""


@pytest.mark.parametrize(
    ("value", "setting", "direct"),
    [
        (None, "auto", True),
        ("auto", "auto", True),
        ("0", False, False),
        ("1", True, True),
        ("off", False, False),
    ],
)
def test_the_variable_chooses_the_mode(data_file, value, setting, direct):
    """What a benchmark running with the variable unset, =0 and =1 gets: by residency,
    the page cache, O_DIRECT."""
    path, _ = data_file
    env = {"KVIKIO_NTHREADS": "2"}
    if value is not None:
        env["KVIKIO_AUTO_DIRECT_IO_READ"] = value
    r = run_python(SCENARIO, str(path), env=env, timeout=120)
    assert r.returncode == 0, r.stderr
    got_setting, got_direct = json.loads(r.stdout)
    assert got_setting == setting
    assert got_direct == (24 * MiB if direct else 0)


def test_a_malformed_variable_names_it():
    r = run_python(
        "import kvikpy\ntry:\n    kvikpy.defaults.get('auto_direct_io_read')\n"
        "except kvikpy.ConfigError as e:\n    print(e)",
        env={"KVIKIO_AUTO_DIRECT_IO_READ": "automatic"},
    )
    assert r.returncode == 0, r.stderr
    assert "KVIKIO_AUTO_DIRECT_IO_READ" in r.stdout
    assert "auto" in r.stdout.split("expected")[-1]


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    state=st.sampled_from(["cold", "warm", "half"]),
    offset=st.integers(0, FILE_LEN),
    size=st.integers(0, 12 * MiB),
    misalign=st.sampled_from([0, 1, 4095]),
    task_size=st.sampled_from([MiB, 4 * MiB, 3 * MiB + 4097, 16 * MiB]),
    threads=st.integers(1, 4),
)
def test_reads_by_residency_match_the_file(
    data_file, state, offset, size, misalign, task_size, threads
):
    path, data = data_file
    make(path, state, exact=False)
    buf = aligned_array(size, misalign)
    buf[:] = 0xEE
    with (
        kvikpy.defaults.set(
            {"task_size": task_size, "num_threads": threads, "auto_direct_io_read": "auto"}
        ),
        kvikpy.CuFile(path, "r") as f,
    ):
        n = f.pread(buf, size, offset).get()
    expected = data[offset : offset + size]
    assert n == len(expected)
    assert bytes(buf[:n]) == expected
    assert (buf[n:] == 0xEE).all()
