"""Hostile input: files that never end, writes that are refused or fail, and arguments of
the wrong type or range.

* Devices and pipes report a size of 0 and may never end (``/dev/zero``): reads that name
  a size read exactly that many bytes, reads to the end refuse them, and nothing reads on
  until memory runs out (each scenario runs in a child with an address-space limit and a
  timeout, so a runaway read fails the test instead of the machine).
* A write that is refused, or fails, leaves no file behind that it created, and never
  removes one it did not.
* One rule for every integer argument: non-integers (floats, strings, bools, ``None``)
  are ``TypeError``; out-of-range integers ``ValueError`` or ``OverflowError``; numpy
  integers and objects with ``__index__`` are integers.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import clean_env, random_bytes, run_python
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import kvikpy
import kvikpy.arrow
import kvikpy.numpy

MiB = 1 << 20
ARG_ERRORS = (TypeError, ValueError, OverflowError)

# The child's address space: far more than the scenario needs, far less than a runaway
# read of /dev/zero takes before the timeout.
_LIMITED = textwrap.dedent(
    """
    import resource
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
    import kvikpy, kvikpy.numpy, numpy as np
    """
)


def run_limited(code: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a child limited to 4 GiB of address space; fail on a timeout."""
    try:
        return run_python(_LIMITED + textwrap.dedent(code), timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the child did not finish within {timeout} s: {code!r}")


def check(result: subprocess.CompletedProcess[str], expected: str) -> None:
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == expected, result.stdout


needs_dev_zero = pytest.mark.skipif(
    not os.path.exists("/dev/zero"), reason="no /dev/zero on this system"
)


# ---- files that never end -------------------------------------------------------------


@needs_dev_zero
def test_a_sized_read_of_an_endless_device_reads_that_many_bytes() -> None:
    code = """
        a = np.from_dlpack(kvikpy.read("/dev/zero", size=10, device="cpu"))
        b = np.from_dlpack(kvikpy.read("/dev/zero", offset=5, size=3 << 20, device="cpu"))
        c = np.from_dlpack(kvikpy.read("/dev/urandom", size=16, device="cpu"))
        print(a.nbytes, int(a.sum()), b.nbytes, int(b.sum()), c.nbytes)
    """
    check(run_limited(code), f"10 0 {3 << 20} 0 16")


@needs_dev_zero
def test_a_read_to_the_end_of_an_endless_device_is_refused_at_once() -> None:
    code = """
        for call in (
            lambda: kvikpy.read("/dev/zero", device="cpu"),
            lambda: kvikpy.read("/dev/urandom", offset=4, device="cpu"),
            lambda: kvikpy.numpy.fromfile("/dev/zero"),
        ):
            try:
                call()
            except ValueError as e:
                assert "character device" in str(e) and "size=" in str(e), e
            else:
                raise AssertionError("no error")
        print("refused")
    """
    check(run_limited(code), "refused")


@needs_dev_zero
def test_numpy_fromfile_with_a_count_reads_that_many_items_of_an_endless_device() -> None:
    code = """
        a = kvikpy.numpy.fromfile("/dev/zero", dtype="int32", count=5)
        b = kvikpy.numpy.fromfile("/dev/zero", dtype="u1", count=2 << 20, offset=7)
        print(a.tolist(), a.dtype, b.size, int(b.sum()))
    """
    check(run_limited(code), f"[0, 0, 0, 0, 0] int32 {2 << 20} 0")


@needs_dev_zero
def test_cufile_reads_a_given_buffer_from_an_endless_device_whatever_the_split() -> None:
    # Before, a read split into several tasks was cut to the size the device reports
    # (0): it returned 0 bytes where one task returned them all.
    code = """
        f = kvikpy.CuFile("/dev/zero")
        out = []
        for task_size in (None, 4096, 1 << 16):
            b = bytearray(b"x" * (1 << 20))
            out.append(f.read(b, task_size=task_size))
            assert b == bytes(1 << 20)
            b = bytearray(1 << 20)
            out.append(f.pread(b, file_offset=5, task_size=task_size).get())
        print(out)
    """
    check(run_limited(code), str([1 << 20] * 6))


def test_a_pseudo_file_is_read_to_its_end_or_for_the_size_given() -> None:
    maps = "/proc/self/maps"
    if not os.path.exists(maps):
        pytest.skip("no /proc here")
    whole = bytes(np.from_dlpack(kvikpy.read(maps, device="cpu")))
    assert whole.count(b"\n") > 3
    head = bytes(np.from_dlpack(kvikpy.read(maps, size=8, device="cpu")))
    assert len(head) == 8 and head.strip()
    assert len(bytes(np.from_dlpack(kvikpy.read(maps, size=100, device="cpu")))) == 100
    # One that goes on past the bound (64 MiB) is refused: the engine's extent tests.


def test_a_sized_read_past_the_end_of_a_pseudo_file_says_where_it_ended() -> None:
    version = "/proc/version"
    if not os.path.exists(version):
        pytest.skip("no /proc here")
    n = len(Path(version).read_bytes())
    with pytest.raises(ValueError, match=f"ended after {n} bytes"):
        kvikpy.read(version, size=n + 100, device="cpu")


@pytest.mark.parametrize("task_size", [None, 4096])
def test_cufile_reads_a_pseudo_file_into_a_given_buffer_whatever_the_split(
    task_size: int | None,
) -> None:
    # Before, a read split into several tasks was cut to the reported size (0).
    version = "/proc/version"
    if not os.path.exists(version):
        pytest.skip("no /proc here")
    expected = Path(version).read_bytes()
    buf = bytearray(1 << 20)
    with kvikpy.CuFile(version) as f:
        n = f.pread(buf, task_size=task_size).get()
    assert bytes(buf[:n]) == expected


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs on this system")
@pytest.mark.parametrize(
    "call",
    [
        "kvikpy.read(path, device='cpu')",
        "kvikpy.read(path, size=10, device='cpu')",
        "kvikpy.numpy.fromfile(path)",
        "kvikpy.CuFile(path).read(bytearray(10))",
    ],
)
def test_a_fifo_nobody_writes_answers_ctrl_c(tmp_path: Path, call: str) -> None:
    path = tmp_path / "fifo"
    os.mkfifo(path)
    code = f"import kvikpy, kvikpy.numpy, sys; path = sys.argv[1]; print('go', flush=True); {call}"
    child = subprocess.Popen(
        [sys.executable, "-c", code, str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=clean_env(),
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().strip() == "go"
        time.sleep(0.5)  # let it block in the open
        child.send_signal(signal.SIGINT)
        _, err = child.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        child.kill()
        child.communicate()
        pytest.fail(f"{call} on a FIFO did not answer Ctrl-C within 30 s")
    assert child.returncode != 0
    assert "KeyboardInterrupt" in err, err[-2000:]


# ---- refused and failed writes ----------------------------------------------------------


@pytest.mark.parametrize(
    ("offset", "error"),
    [
        (-1, ValueError),
        (2**63, OverflowError),
        (2**64, OverflowError),
        (2**63 - 2, OverflowError),  # the write would end past 2**63 - 1
        (1.5, TypeError),
        (None, TypeError),
        (True, TypeError),
        ("1", TypeError),
    ],
)
def test_a_refused_write_creates_no_file(tmp_path: Path, offset: Any, error: type) -> None:
    path = tmp_path / "new.bin"
    with pytest.raises(error):
        kvikpy.write(path, b"abc", offset=offset)
    assert not path.exists()


def test_a_write_the_os_refuses_removes_the_file_it_created(tmp_path: Path) -> None:
    # 2**63 - 10 passes the argument check; the OS refuses it (EFBIG) after the open.
    path = tmp_path / "new.bin"
    with pytest.raises(OSError):
        kvikpy.write(path, b"abc", offset=2**63 - 10)
    assert not path.exists()
    # A file that was there before is kept, bytes and all.
    path.write_bytes(b"kept")
    with pytest.raises(OSError):
        kvikpy.write(path, b"abc", offset=2**63 - 10)
    assert path.read_bytes() == b"kept"


def test_failed_one_shot_writes_remove_only_files_they_created(tmp_path: Path) -> None:
    # A file-size limit makes the write itself fail (EFBIG) once the file exists.
    code = """
        import os, resource, signal, sys
        import numpy as np
        import kvikpy, kvikpy.numpy
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (10, 10))
        folder = sys.argv[1]
        out = []
        for name, call in [
            ("write", lambda p: kvikpy.write(p, bytes(100))),
            ("progress", lambda p: kvikpy.write(p, bytes(100), progress=True)),
            ("tofile", lambda p: kvikpy.numpy.tofile(np.zeros(100), p)),
        ]:
            path = os.path.join(folder, name)
            try:
                call(path)
            except OSError:
                out.append(os.path.exists(path))
            old = os.path.join(folder, name + ".old")
            with open(old, "wb") as f:
                f.write(b"old")
            try:
                call(old)
            except OSError:
                out.append(os.path.exists(old))
        print(out)
    """
    result = run_python(textwrap.dedent(code), str(tmp_path), timeout=60)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == str([False, True] * 3)


def test_a_successful_write_still_creates_and_keeps_files(tmp_path: Path) -> None:
    path = tmp_path / "new.bin"
    assert kvikpy.write(path, b"abc", offset=np.int64(2)) == 3
    assert path.read_bytes() == b"\0\0abc"
    assert kvikpy.write(path, b"x") == 1
    assert path.read_bytes() == b"x\0abc"
    kvikpy.numpy.tofile(np.arange(3, dtype="u1"), path)
    assert path.read_bytes() == b"\0\1\2"


# ---- one rule for integer arguments ---------------------------------------------------


@pytest.fixture
def data_file(tmp_path: Path) -> Path:
    path = tmp_path / "data.bin"
    path.write_bytes(random_bytes(MiB, 6))
    return path


@pytest.mark.parametrize(
    "kwargs",
    [
        {"offset": 1.5},
        {"offset": 1.5, "size": 4},
        {"size": 1.5},
        {"offset": True},
        {"size": True},
        {"offset": "1"},
        {"size": "4"},
        {"offset": None},
        {"offset": np.float64(1)},
        {"size": np.bool_(True)},
    ],
)
def test_read_refuses_non_integers_with_type_error(data_file: Path, kwargs: dict) -> None:
    with pytest.raises(TypeError, match="integer"):
        kvikpy.read(data_file, device="cpu", **kwargs)


def test_read_takes_numpy_integers_and_index_objects(data_file: Path) -> None:
    class Index:
        def __index__(self) -> int:
            return 3

    data = data_file.read_bytes()
    a = kvikpy.read(data_file, offset=np.int64(1), size=np.uint8(4), device="cpu")
    assert bytes(np.from_dlpack(a)) == data[1:5]
    b = kvikpy.read(data_file, offset=Index(), size=Index(), device="cpu")
    assert bytes(np.from_dlpack(b)) == data[3:6]


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"offset": -1}, ValueError),
        ({"size": -1}, ValueError),
        ({"offset": 2**64}, OverflowError),
        ({"size": 2**64}, OverflowError),
        ({"offset": 2**62, "size": 2**62}, OverflowError),
    ],
)
def test_read_refuses_out_of_range_integers(data_file: Path, kwargs: dict, error: type) -> None:
    with pytest.raises(error):
        kvikpy.read(data_file, device="cpu", **kwargs)


@pytest.mark.parametrize(
    ("ranges", "error"),
    [
        ([(1.9, 4)], TypeError),
        ([("8", 4)], TypeError),
        ([(0, 4.0)], TypeError),
        ([(True, 4)], TypeError),
        ([(None, 4)], TypeError),
        ([(0, 4, 5)], TypeError),
        ((np.array([1.5, 2.0]), np.array([3, 4])), TypeError),
        ([(-1, 4)], ValueError),
        ([(0, -4)], ValueError),
        ([(2**64, 4)], OverflowError),
        ([(2**63 - 2, 4)], OverflowError),
    ],
)
def test_read_ranges_refuses_bad_ranges(data_file: Path, ranges: Any, error: type) -> None:
    with pytest.raises(error, match="range 0"):
        kvikpy.read_ranges(data_file, ranges, device="cpu")


def test_read_ranges_takes_numpy_integers(data_file: Path) -> None:
    data = data_file.read_bytes()
    batch = kvikpy.read_ranges(data_file, (np.array([1, 8]), np.array([3, 4])), device="cpu")
    assert [bytes(np.from_dlpack(b)) for b in batch] == [data[1:4], data[8:12]]
    batch = kvikpy.read_ranges(data_file, [(np.uint32(2), np.int8(2))], device="cpu")
    assert bytes(np.from_dlpack(batch[0])) == data[2:4]


def test_iter_chunks_clamps_a_chunk_larger_than_the_file(data_file: Path) -> None:
    # Before, a 1 TiB chunk size allocated 1 TiB for a 1 MiB file.
    chunks = [bytes(np.from_dlpack(c)) for c in kvikpy.iter_chunks(data_file, 2**40, device="cpu")]
    assert chunks == [data_file.read_bytes()]
    it = kvikpy.iter_chunks(data_file, 2**62, device="cpu", depth=2**40)
    with it:
        assert next(it).nbytes == MiB


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"chunk_size": 1.5}, TypeError),
        ({"chunk_size": True}, TypeError),
        ({"chunk_size": "4"}, TypeError),
        ({"chunk_size": 0}, ValueError),
        ({"chunk_size": 2**64}, OverflowError),
        ({"chunk_size": 4, "depth": 1.5}, TypeError),
        ({"chunk_size": 4, "depth": 0}, ValueError),
    ],
)
def test_iter_chunks_checks_its_integers(data_file: Path, kwargs: dict, error: type) -> None:
    with pytest.raises(error):
        kvikpy.iter_chunks(data_file, device="cpu", **kwargs)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"file_offset": True}, TypeError),
        ({"size": True}, TypeError),
        ({"task_size": True}, TypeError),
        ({"file_offset": 1.5}, TypeError),
        ({"size": "4"}, TypeError),
        ({"file_offset": None}, TypeError),
        ({"file_offset": -1}, ValueError),
        ({"size": -1}, ValueError),
        ({"task_size": 0}, ValueError),
        ({"file_offset": 2**63}, OverflowError),
        ({"file_offset": 2**64}, OverflowError),
    ],
)
@pytest.mark.parametrize("method", ["read", "pread", "write", "pwrite"])
def test_cufile_checks_its_integers(
    data_file: Path, method: str, kwargs: dict, error: type
) -> None:
    with kvikpy.CuFile(data_file, "r+") as f:
        call = getattr(f, method)
        with pytest.raises(error):
            result = call(bytearray(8), **kwargs)
            if hasattr(result, "get"):
                result.get()


@pytest.mark.parametrize("method", ["raw_read", "raw_write"])
def test_cufile_raw_calls_check_their_integers(data_file: Path, method: str) -> None:
    with kvikpy.CuFile(data_file, "r+") as f:
        for kwargs in ({"dev_offset": True}, {"dev_offset": 1.5}, {"file_offset": False}):
            with pytest.raises(TypeError):
                getattr(f, method)(bytearray(8), **kwargs)


def test_cufile_takes_numpy_integers(data_file: Path) -> None:
    data = data_file.read_bytes()
    b = bytearray(8)
    with kvikpy.CuFile(data_file) as f:
        assert f.read(b, size=np.int32(4), file_offset=np.uint64(3), task_size=np.int8(2)) == 4
    assert b[:4] == data[3:7]


def test_mmap_checks_its_integers(data_file: Path) -> None:
    for kwargs in ({"initial_map_size": True}, {"initial_map_offset": 1.5}):
        with pytest.raises(TypeError):
            kvikpy.Mmap(data_file, **kwargs)
    with kvikpy.Mmap(data_file) as m:
        for kwargs in ({"size": True}, {"offset": 1.5}, {"offset": "1"}):
            with pytest.raises(TypeError):
                m.read(bytearray(8), **kwargs)
        with pytest.raises(OverflowError):
            m.read(bytearray(8), offset=2**64)
        assert m.read(bytearray(8), size=np.int64(4), offset=np.int64(2)) == 4


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"offset": 1.5}, TypeError),
        ({"count": 1.5}, TypeError),
        ({"count": True}, TypeError),
        ({"count": "3"}, TypeError),
        ({"offset": -1}, ValueError),
        ({"count": -2}, ValueError),
        ({"count": 2**62, "dtype": "f8"}, OverflowError),
    ],
)
def test_numpy_fromfile_checks_its_integers(data_file: Path, kwargs: dict, error: type) -> None:
    with pytest.raises(error):
        kvikpy.numpy.fromfile(data_file, **{"dtype": "u1", **kwargs})


INT_SETTINGS = [
    "num_threads",
    "task_size",
    "gds_threshold",
    "bounce_buffer_size",
    "http_max_attempts",
    "http_timeout",
]


@pytest.mark.parametrize("name", INT_SETTINGS)
@pytest.mark.parametrize("value", [1.5, "4", True, None, np.float32(2), [4]])
def test_integer_settings_refuse_non_integers_with_type_error(name: str, value: Any) -> None:
    before = kvikpy.defaults.get(name)
    with pytest.raises(TypeError, match=name):
        kvikpy.defaults.set(name, value)
    assert kvikpy.defaults.get(name) == before


@pytest.mark.parametrize("name", INT_SETTINGS)
def test_integer_settings_take_numpy_integers_and_refuse_out_of_range(name: str) -> None:
    kvikpy.defaults.set(name, np.int64(3))
    assert kvikpy.defaults.get(name) == 3
    for value in (-1, 2**64):
        with pytest.raises((ValueError, OverflowError)):
            kvikpy.defaults.set(name, value)
    assert kvikpy.defaults.get(name) == 3


@pytest.mark.parametrize("codes", [[42], [1000], [99], [600], [429, 0], [2**70]])
def test_http_status_codes_setting_takes_100_to_599_only(codes: list[int]) -> None:
    before = kvikpy.defaults.get("http_status_codes")
    with pytest.raises(ValueError, match="100 to 599"):
        kvikpy.defaults.set("http_status_codes", codes)
    assert kvikpy.defaults.get("http_status_codes") == before
    kvikpy.defaults.set("http_status_codes", [np.int16(100), 599])
    assert kvikpy.defaults.get("http_status_codes") == [100, 599]
    for bad in ([True], [429.0], ["429"], 429):
        with pytest.raises(TypeError):
            kvikpy.defaults.set("http_status_codes", bad)


@pytest.mark.parametrize("value", ["5000", "042", "099", "600", "429,1000"])
def test_http_status_codes_variable_takes_100_to_599_only(value: str) -> None:
    result = run_python(
        "import kvikpy; kvikpy.defaults.get('http_status_codes')",
        env={"KVIKIO_HTTP_STATUS_CODES": value},
    )
    assert result.returncode != 0
    assert "ConfigError" in result.stderr and "100 to 599" in result.stderr, result.stderr


# Anything that is no integer, or an integer out of every range.
hostile = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=4),
    st.booleans(),
    st.none(),
    st.integers(max_value=-1),
    st.integers(min_value=2**63),
    st.sampled_from([np.float64(2.0), np.bool_(False), b"1", [1], (1,), 1j, object()]),
)


# Where None is allowed (the default: the buffer's or the file's size, the setting).
OPTIONAL = {"read size", "CuFile.read size", "CuFile.pread task_size", "CuFile.pwrite size"}


def _calls(path: Path, target: Path) -> dict[str, Callable[[Any], object]]:
    """Every public entry point taking an integer, with the hostile value in one place."""

    def cufile(method: str, **kw: Any) -> Callable[[Any], object]:
        def call(v: Any) -> object:
            with kvikpy.CuFile(path, "r+") as f:
                result = getattr(f, method)(bytearray(8), **{k: v for k in kw})
                return result.get() if hasattr(result, "get") else result

        return call

    return {
        "read offset": lambda v: kvikpy.read(path, offset=v, device="cpu"),
        "read size": lambda v: kvikpy.read(path, size=v, device="cpu"),
        "write offset": lambda v: kvikpy.write(target, b"abc", offset=v),
        "read_ranges offset": lambda v: kvikpy.read_ranges(path, [(v, 1)], device="cpu"),
        "read_ranges size": lambda v: kvikpy.read_ranges(path, [(0, v)], device="cpu"),
        "iter_chunks chunk_size": lambda v: kvikpy.iter_chunks(path, v, device="cpu"),
        "iter_chunks depth": lambda v: kvikpy.iter_chunks(path, 4, depth=v, device="cpu"),
        "fromfile offset": lambda v: kvikpy.numpy.fromfile(path, "u1", offset=v),
        "fromfile count": lambda v: kvikpy.numpy.fromfile(path, "u1", count=v),
        "CuFile.read size": cufile("read", size=0),
        "CuFile.read file_offset": cufile("read", file_offset=0),
        "CuFile.pread task_size": cufile("pread", task_size=0),
        "CuFile.write file_offset": cufile("write", file_offset=0),
        "CuFile.pwrite size": cufile("pwrite", size=0),
        "Mmap initial_map_offset": lambda v: kvikpy.Mmap(path, initial_map_offset=v),
        "defaults num_threads": lambda v: kvikpy.defaults.set("num_threads", v),
        "defaults task_size": lambda v: kvikpy.defaults.set("task_size", v),
        "defaults http_timeout": lambda v: kvikpy.defaults.set("http_timeout", v),
        "defaults http_status_codes": lambda v: kvikpy.defaults.set("http_status_codes", [v]),
    }


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(entry=st.sampled_from(sorted(_calls(Path(), Path()))), value=hostile)
def test_hostile_integers_raise_argument_errors_only(
    tmp_path: Path, data_file: Path, entry: str, value: Any
) -> None:
    assume(not (value is None and entry in OPTIONAL))
    # numpy's count=-1 means every item, as in numpy.fromfile: not a hostile value.
    assume(not (entry == "fromfile count" and type(value) is int and value == -1))
    target = tmp_path / "target.bin"
    before = data_file.read_bytes()
    call = _calls(data_file, target)[entry]
    with pytest.raises(ARG_ERRORS):
        call(value)
    assert not target.exists()
    assert data_file.read_bytes() == before


def test_failed_writes_leave_an_existing_file_exactly_as_it_was(tmp_path: Path) -> None:
    """Every writer replaces a file whole or not at all: a write that fails part-way (here
    a file-size limit, as a full disk would) leaves the old file's bytes and no
    temporary file, through kvikpy's own IPC writer and pyarrow's, a whole write and one
    that keeps the bytes around its range."""
    pytest.importorskip("pyarrow")
    code = """
        import os, resource, signal, sys
        import numpy as np
        import pyarrow as pa
        import kvikpy, kvikpy.arrow, kvikpy.numpy
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        folder = sys.argv[1]
        table = pa.table({"x": np.arange(100_000, dtype=np.int64)})
        data = np.arange(100_000, dtype=np.int64)
        calls = {
            "write_ipc": lambda p: kvikpy.arrow.write_ipc(p, table),
            "write_ipc_zstd": lambda p: kvikpy.arrow.write_ipc(p, table, compression="zstd"),
            "write": lambda p: kvikpy.write(p, data),
            "write_part": lambda p: kvikpy.write(p, data, offset=10),
            "tofile": lambda p: kvikpy.numpy.tofile(data, p),
        }
        old = bytes(range(256)) * 16
        for name in calls:
            with open(os.path.join(folder, name), "wb") as f:
                f.write(old)
        resource.setrlimit(resource.RLIMIT_FSIZE, (8192, 8192))
        out = {}
        for name, call in calls.items():
            path = os.path.join(folder, name)
            try:
                call(path)
                out[name] = "written"
            except OSError:
                with open(path, "rb") as f:
                    out[name] = "kept" if f.read() == old else "changed"
        left = sorted(n for n in os.listdir(folder) if ".kvikpy-" in n)
        print(out, left)
    """
    result = run_python(textwrap.dedent(code), str(tmp_path), timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    kept = {n: "kept" for n in ("write_ipc", "write_ipc_zstd", "write", "write_part", "tofile")}
    assert result.stdout.strip().splitlines()[-1] == f"{kept} []"


def test_a_replaced_file_keeps_its_permissions_and_sync_is_a_setting(tmp_path: Path) -> None:
    path = tmp_path / "kept.bin"
    path.write_bytes(b"0123456789")
    path.chmod(0o640)
    with kvikpy.defaults.set(write_sync=True):
        assert kvikpy.write(path, b"ab", offset=4) == 2
    assert path.read_bytes() == b"0123ab6789"
    assert path.stat().st_mode & 0o777 == 0o640
    assert not [p for p in tmp_path.iterdir() if ".kvikpy-" in p.name]


def test_a_source_that_fails_mid_table_leaves_the_old_file(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    schema = pa.schema([("x", pa.int64())])

    def batches() -> Any:
        yield pa.record_batch([pa.array(np.arange(1000))], schema=schema)
        raise RuntimeError("the source failed")

    for compression in (None, "zstd"):
        path = tmp_path / f"old-{compression}.arrow"
        path.write_bytes(b"old bytes")
        reader = pa.RecordBatchReader.from_batches(schema, batches())
        with pytest.raises(Exception, match="the source failed"):
            kvikpy.arrow.write_ipc(path, reader, compression=compression)
        assert path.read_bytes() == b"old bytes"
    assert not [p for p in tmp_path.iterdir() if ".kvikpy-" in p.name]


def test_an_interrupted_write_leaves_the_old_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C in the middle of a write (here raised after half the bytes went to the new
    file) leaves the target as it was, new or existing, and no temporary file."""
    real = kvikpy.CuFile.write

    def half_then_interrupt(self: Any, buf: Any, *args: Any, **kwargs: Any) -> int:
        real(self, memoryview(buf)[: len(memoryview(buf)) // 2], *args, **kwargs)
        raise KeyboardInterrupt

    monkeypatch.setattr(kvikpy.CuFile, "write", half_then_interrupt)
    existing = tmp_path / "existing.bin"
    existing.write_bytes(b"old" * 1000)
    for call in (
        lambda p: kvikpy.write(p, bytes(range(256)) * 64),
        lambda p: kvikpy.write(p, b"x" * 100, offset=7),
        lambda p: kvikpy.numpy.tofile(np.arange(1000), p),
    ):
        with pytest.raises(KeyboardInterrupt):
            call(existing)
        assert existing.read_bytes() == b"old" * 1000
        fresh = tmp_path / "fresh.bin"
        with pytest.raises(KeyboardInterrupt):
            call(fresh)
        assert not fresh.exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["existing.bin"]
