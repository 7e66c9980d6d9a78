"""read/write/pread/pwrite with host buffers: buffer types, sizes and offsets, bad inputs,
end of file, task splitting over the thread pool, large files and opportunistic O_DIRECT."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest
from conftest import (
    PAGE,
    aligned_array,
    o_direct_supported,
    random_array,
    random_bytes,
    run_python,
)

import kvikpy

MiB = 1 << 20
DATA = random_bytes(100_000, seed=11)


def read_all(path: Path) -> bytes:
    return Path(path).read_bytes()


# ---------------------------------------------------------------------------------------
# Buffer types


def _numpy_buffers():
    rng = np.random.default_rng(12)
    return {
        "float64": rng.random(1000),
        "int32": rng.integers(-(2**31), 2**31 - 1, size=777, dtype=np.int32),
        "uint8": rng.integers(0, 256, size=4099, dtype=np.uint8),
        "complex64": (rng.random(33) + 1j * rng.random(33)).astype(np.complex64),
        "2d-C": rng.random((31, 17)),
        "2d-F": np.asfortranarray(rng.random((31, 17))),
        "3d-F-int16": np.asfortranarray(
            rng.integers(-(2**15), 2**15 - 1, size=(5, 6, 7), dtype=np.int16)
        ),
    }


NUMPY_BUFFERS = _numpy_buffers()


@pytest.mark.parametrize("name", list(NUMPY_BUFFERS))
def test_write_then_read_numpy_arrays(tmp_path, name):
    src = NUMPY_BUFFERS[name]
    path = tmp_path / "f.bin"
    with kvikpy.CuFile(path, "w") as f:
        assert f.write(src) == src.nbytes
    # Bytes on disk are the array's memory, in memory order (C or Fortran).
    assert read_all(path) == src.tobytes(order="A")
    dst = np.empty_like(src)  # same shape, dtype and memory order
    assert dst.flags.f_contiguous == src.flags.f_contiguous
    with kvikpy.CuFile(path, "r") as f:
        assert f.read(dst) == src.nbytes
    np.testing.assert_array_equal(dst, src)


@pytest.mark.parametrize("name", list(NUMPY_BUFFERS))
def test_pwrite_then_pread_numpy_arrays(tmp_path, name):
    src = NUMPY_BUFFERS[name]
    path = tmp_path / "f.bin"
    with kvikpy.CuFile(path, "w+") as f:
        assert f.pwrite(src, file_offset=3).get() == src.nbytes
        dst = np.empty_like(src)
        assert f.pread(dst, file_offset=3).get() == src.nbytes
    np.testing.assert_array_equal(dst, src)
    assert read_all(path) == bytes(3) + src.tobytes(order="A")


def test_read_into_fortran_array_fills_memory_order(file_with):
    raw = random_bytes(8 * 6 * 4, seed=13)
    path = file_with(raw)
    dst = np.empty((6, 4), dtype=np.float64, order="F")
    with kvikpy.CuFile(path) as f:
        assert f.read(dst) == len(raw)
    expected = np.frombuffer(raw, dtype=np.float64).reshape((6, 4), order="F")
    np.testing.assert_array_equal(dst, expected)


def test_bytearray_and_memoryview_buffers(tmp_path):
    path = tmp_path / "f.bin"
    with kvikpy.CuFile(path, "w+") as f:
        assert f.write(bytearray(DATA)) == len(DATA)
        assert f.write(memoryview(DATA)[10:20], file_offset=len(DATA)) == 10
        ba = bytearray(len(DATA))
        assert f.read(ba) == len(DATA)
        assert bytes(ba) == DATA
        mv = memoryview(bytearray(len(DATA) + 10))
        assert f.read(mv) == len(DATA) + 10
        assert bytes(mv) == DATA + DATA[10:20]


def test_read_into_memoryview_slice_touches_only_the_slice(file_with):
    path = file_with(DATA)
    sentinel = random_bytes(300, seed=14)
    ba = bytearray(sentinel)
    with kvikpy.CuFile(path) as f:
        assert f.read(memoryview(ba)[100:200], file_offset=50) == 100
    assert bytes(ba) == sentinel[:100] + DATA[50:150] + sentinel[200:]


def test_read_into_memoryview_of_typed_array(file_with):
    path = file_with(DATA)
    arr = np.zeros(1000, dtype=np.int32)
    with kvikpy.CuFile(path) as f:
        assert f.read(memoryview(arr)) == 4000
    assert arr.tobytes() == DATA[:4000]


@pytest.mark.parametrize(
    "buf",
    [
        DATA,
        memoryview(DATA),
        np.frombuffer(DATA, dtype=np.uint8),  # read-only numpy array
    ],
    ids=["bytes", "memoryview-of-bytes", "readonly-ndarray"],
)
def test_write_from_read_only_buffers(tmp_path, buf):
    path = tmp_path / "f.bin"
    with kvikpy.CuFile(path, "w") as f:
        assert f.write(buf) == len(DATA)
        assert f.pwrite(buf, file_offset=len(DATA)).get() == len(DATA)
    assert read_all(path) == DATA + DATA


@pytest.mark.parametrize("dtype", ["f8", "i4", "u1"])
def test_zero_dimensional_arrays(file_with, dtype):
    """A 0-d array is a contiguous buffer of one item."""
    path = file_with(DATA)
    a = np.array(np.frombuffer(DATA, dtype=dtype, count=1)[0])
    assert a.ndim == 0
    assert memoryview(a).c_contiguous
    with kvikpy.CuFile(path, "r+") as f:
        assert f.write(a, file_offset=len(DATA)) == a.nbytes
        b = np.array(np.frombuffer(DATA, dtype=dtype, count=2)[1])
        assert f.read(b, file_offset=len(DATA)) == a.nbytes
    assert b == a
    assert read_all(path) == DATA + a.tobytes()


def test_buffer_less_numpy_array_error_does_not_claim_gpu_memory(file_with):
    """numpy arrays of datetime64 cannot export a buffer; they are still host memory."""
    path = file_with(DATA)
    a = np.frombuffer(DATA, dtype="M8[s]", count=4).copy()
    with kvikpy.CuFile(path, "r+") as f:
        try:
            n = f.write(a, file_offset=len(DATA))
        except (TypeError, ValueError) as e:
            assert "GPU" not in str(e) and "device" not in str(e), str(e)
            assert read_all(path) == DATA
        else:
            assert n == a.nbytes
            assert read_all(path) == DATA + a.tobytes()


def test_empty_buffers(file_with):
    path = file_with(DATA)
    with kvikpy.CuFile(path, "r+") as f:
        assert f.read(bytearray()) == 0
        assert f.pread(np.empty(0)).get() == 0
        assert f.write(b"") == 0
        assert f.write(b"", file_offset=10 * len(DATA)) == 0
        assert f.pwrite(np.empty((0, 3))).get() == 0
    assert read_all(path) == DATA


# ---------------------------------------------------------------------------------------
# size and file_offset


def test_size_none_means_the_whole_buffer(file_with):
    path = file_with(DATA)
    buf = np.empty(100, dtype=np.float64)
    with kvikpy.CuFile(path) as f:
        assert f.read(buf, None) == 800
        assert f.pread(buf, size=None, file_offset=8).get() == 800
    assert buf.tobytes() == DATA[8:808]


def test_numpy_integers_are_accepted_as_sizes_and_offsets(file_with):
    path = file_with(DATA)
    buf = bytearray(100)
    with kvikpy.CuFile(path, "r+") as f:
        n = f.read(buf, size=np.int64(50), file_offset=np.uint32(7), task_size=np.int16(8))
        assert n == 50
        assert bytes(buf[:50]) == DATA[7:57]
        assert f.pwrite(b"abc", np.int32(3), np.int64(11)).get() == 3
    assert read_all(path) == DATA[:11] + b"abc" + DATA[14:]


def test_size_reads_only_a_prefix_of_the_buffer(file_with):
    path = file_with(DATA)
    sentinel = random_bytes(1000, seed=15)
    buf = bytearray(sentinel)
    with kvikpy.CuFile(path) as f:
        assert f.read(buf, size=123, file_offset=7) == 123
        assert bytes(buf) == DATA[7:130] + sentinel[123:]
        assert f.pread(buf, 0).get() == 0
        assert bytes(buf) == DATA[7:130] + sentinel[123:]


def test_size_writes_only_a_prefix_of_the_buffer(file_with):
    path = file_with(DATA)
    src = random_bytes(1000, seed=16)
    with kvikpy.CuFile(path, "r+") as f:
        assert f.write(src, size=10, file_offset=20) == 10
        assert f.pwrite(src, 5, 40).get() == 5
    assert read_all(path) == DATA[:20] + src[:10] + DATA[30:40] + src[:5] + DATA[45:]


def test_size_zero_write_leaves_the_file_unchanged(file_with):
    path = file_with(DATA)
    with kvikpy.CuFile(path, "r+") as f:
        assert f.write(random_bytes(100, seed=17), size=0) == 0
        assert f.write(random_bytes(100, seed=17), size=0, file_offset=len(DATA) + 5000) == 0
        assert f.pwrite(random_bytes(100, seed=17), size=0, file_offset=3).get() == 0
    assert read_all(path) == DATA
    assert os.path.getsize(path) == len(DATA)


# ---------------------------------------------------------------------------------------
# Bad inputs: the right exception, and neither file nor buffer changed


BAD_ARGS = [
    # (kwargs, exception)
    ({"size": 1001}, ValueError),
    ({"size": 10**12}, ValueError),
    ({"size": -1}, ValueError),
    ({"size": -(2**40)}, ValueError),
    ({"file_offset": -1}, ValueError),
    ({"file_offset": -(2**40)}, ValueError),
    ({"task_size": 0}, ValueError),
    ({"task_size": -1}, ValueError),
    ({"task_size": -4096}, ValueError),
]


@pytest.mark.parametrize(("kwargs", "exc"), BAD_ARGS, ids=[str(a[0]) for a in BAD_ARGS])
@pytest.mark.parametrize("method", ["read", "pread", "write", "pwrite"])
def test_bad_arguments(file_with, method, kwargs, exc):
    path = file_with(DATA)
    original = random_bytes(1000, seed=18)
    buf = bytearray(original)
    with kvikpy.CuFile(path, "r+") as f, pytest.raises(exc):
        getattr(f, method)(buf, **kwargs)
    assert bytes(buf) == original
    assert read_all(path) == DATA


def _non_contiguous_buffers():
    a = random_array(2000, seed=19)
    b = np.random.default_rng(19).random((20, 30))
    return {
        "ndarray[::2]": a[::2],
        "ndarray[::-1]": a[::-1],
        "2d-column-slice": b[:, :10],
        "2d-transpose-slice": b.T[::2],
        "memoryview[::2]": memoryview(bytearray(random_bytes(100, seed=20)))[::2],
    }


@pytest.mark.parametrize("name", list(_non_contiguous_buffers()))
@pytest.mark.parametrize("method", ["read", "pread", "write", "pwrite"])
def test_non_contiguous_buffers_raise_value_error(file_with, method, name):
    path = file_with(DATA)
    buf = _non_contiguous_buffers()[name]
    before = bytes(np.asarray(buf).tobytes())
    with kvikpy.CuFile(path, "r+") as f, pytest.raises(ValueError, match="contiguous"):
        getattr(f, method)(buf)
    assert np.asarray(buf).tobytes() == before
    assert read_all(path) == DATA


def _read_only_buffers():
    ro = np.frombuffer(bytearray(random_bytes(1000, seed=21)), dtype=np.uint8).copy()
    ro.flags.writeable = False
    return {
        "bytes": random_bytes(1000, seed=21),
        "memoryview-of-bytes": memoryview(random_bytes(1000, seed=21)),
        "ndarray-writeable-False": ro,
        "readonly-memoryview": memoryview(bytearray(random_bytes(1000, seed=21))).toreadonly(),
    }


@pytest.mark.parametrize("name", list(_read_only_buffers()))
@pytest.mark.parametrize("method", ["read", "pread"])
def test_reading_into_read_only_buffer_raises_value_error(file_with, method, name):
    path = file_with(DATA)
    buf = _read_only_buffers()[name]
    before = bytes(memoryview(buf))
    with kvikpy.CuFile(path, "r") as f, pytest.raises(ValueError, match="read-only"):
        getattr(f, method)(buf)
    assert bytes(memoryview(buf)) == before
    assert read_all(path) == DATA


@pytest.mark.parametrize("obj", [12345, 1.5, [1, 2, 3], "a string", None, object()])
@pytest.mark.parametrize("method", ["read", "pread", "write", "pwrite"])
def test_non_buffers_raise_type_error(file_with, method, obj):
    path = file_with(DATA)
    with kvikpy.CuFile(path, "r+") as f, pytest.raises(TypeError):
        getattr(f, method)(obj)
    assert read_all(path) == DATA


# ---------------------------------------------------------------------------------------
# End of file


@pytest.mark.parametrize("direct", [False, True])
@pytest.mark.parametrize("method", ["read", "pread"])
@pytest.mark.parametrize(
    ("offset", "size"),
    [
        (0, len(DATA) + 1),
        (0, len(DATA) + 5 * PAGE + 3),
        (len(DATA) - 1, 1000),
        (len(DATA) - 4 * PAGE - 7, 8 * PAGE),
        (12345, len(DATA)),
    ],
)
def test_reads_reaching_eof_return_short_count_and_leave_the_rest(
    file_with, direct, method, offset, size
):
    kvikpy.defaults.set(auto_direct_io_read=direct, task_size=PAGE * 2)
    path = file_with(DATA)
    sentinel = random_bytes(size, seed=22)
    buf = aligned_array(size)
    buf[:] = np.frombuffer(sentinel, dtype=np.uint8)
    with kvikpy.CuFile(path) as f:
        result = getattr(f, method)(buf, file_offset=offset)
        n = result if method == "read" else result.get()
    expected = len(DATA) - offset
    assert n == expected
    assert buf[:n].tobytes() == DATA[offset:]
    assert buf[n:].tobytes() == sentinel[n:], "bytes past end of file were overwritten"


@pytest.mark.parametrize("offset", [len(DATA), len(DATA) + 1, len(DATA) + 10**6, 2**62])
@pytest.mark.parametrize("method", ["read", "pread"])
def test_read_at_or_past_eof_returns_zero(file_with, method, offset):
    path = file_with(DATA)
    sentinel = random_bytes(5000, seed=23)
    buf = bytearray(sentinel)
    with kvikpy.CuFile(path) as f:
        result = getattr(f, method)(buf, file_offset=offset)
        assert (result if method == "read" else result.get()) == 0
    assert bytes(buf) == sentinel


def test_read_of_empty_file_returns_zero(file_with):
    path = file_with(b"")
    sentinel = random_bytes(5000, seed=24)
    buf = bytearray(sentinel)
    with kvikpy.CuFile(path) as f:
        assert f.read(buf) == 0
        assert f.pread(buf, task_size=7).get() == 0
    assert bytes(buf) == sentinel


@pytest.mark.parametrize("direct", [False, True])
@pytest.mark.parametrize("method", ["write", "pwrite"])
@pytest.mark.parametrize("gap", [0, 1, 4095, PAGE, 3 * MiB + 5])
def test_writes_past_eof_extend_the_file_with_zeros(file_with, direct, method, gap):
    kvikpy.defaults.set(auto_direct_io_write=direct)
    path = file_with(DATA)
    src = random_bytes(3 * PAGE + 11, seed=25)
    with kvikpy.CuFile(path, "r+") as f:
        result = getattr(f, method)(src, file_offset=len(DATA) + gap)
        assert (result if method == "write" else result.get()) == len(src)
        assert f.nbytes() == len(DATA) + gap + len(src)
    assert os.path.getsize(path) == len(DATA) + gap + len(src)
    assert read_all(path) == DATA + bytes(gap) + src


def test_write_into_an_empty_file_at_an_offset(tmp_path):
    path = tmp_path / "f.bin"
    with kvikpy.CuFile(path, "w+") as f:
        assert f.write(DATA, file_offset=7 * MiB + 3) == len(DATA)
        buf = bytearray(10)
        assert f.read(buf, file_offset=5 * MiB) == 10
        assert bytes(buf) == bytes(10)
    assert read_all(path) == bytes(7 * MiB + 3) + DATA


# ---------------------------------------------------------------------------------------
# Task splitting over the thread pool

SPLIT_CASES = [
    # (task_size, [(file_offset, size), ...])
    (1, [(0, 1), (5, 37), (4093, 300)]),
    (3, [(0, 10), (1, 4097), (4095, 9000)]),
    (4096, [(0, 4096), (1, 4096), (4095, 3 * PAGE + 2), (12345, 100_000)]),
    (4097, [(0, 4097 * 3), (1, 4097 * 3 - 2), (4095, 50_000), (7, 262_147)]),
    (65536, [(0, 1 * MiB), (12345, 1 * MiB + 3), (MiB - 1, 300_001)]),
    (MiB, [(0, 3 * MiB), (1, 3 * MiB + 17), (MiB - 3, 2 * MiB + 9)]),
    (4 * MiB + 1, [(3, 5 * MiB)]),
]


@pytest.mark.parametrize("num_threads", [1, 2, 3, 8])
@pytest.mark.parametrize(
    ("task_size", "cases"), SPLIT_CASES, ids=[f"task_size={t}" for t, _ in SPLIT_CASES]
)
def test_split_reads_and_writes_match_os_pread_pwrite(tmp_path, num_threads, task_size, cases):
    kvikpy.defaults.set({"num_threads": num_threads, "gds_threshold": 0})
    path = tmp_path / "f.bin"
    for i, (offset, size) in enumerate(cases):
        content = random_bytes(offset + size + 1000, seed=100 + i)
        path.write_bytes(content)
        # Read: kvikpy vs os.pread.
        buf = np.empty(size, dtype=np.uint8)
        with kvikpy.CuFile(path, "r+") as f:
            fut = f.pread(buf, file_offset=offset, task_size=task_size)
            assert fut.get() == size
            assert buf.tobytes() == content[offset : offset + size]
            buf[:] = 0
            assert f.read(buf, file_offset=offset, task_size=task_size) == size
            assert buf.tobytes() == content[offset : offset + size]
            # Write: kvikpy, then compare the whole file with what os.pwrite would produce.
            src = random_bytes(size, seed=200 + i)
            assert f.pwrite(src, file_offset=offset + 1, task_size=task_size).get() == size
        expected = bytearray(content)
        expected[offset + 1 : offset + 1 + size] = src
        assert read_all(path) == bytes(expected)
        with kvikpy.CuFile(path, "r+") as f:
            src2 = random_bytes(size, seed=300 + i)
            assert f.write(src2, file_offset=offset, task_size=task_size) == size
        fd = os.open(path, os.O_RDONLY)
        try:
            assert os.pread(fd, size, offset) == src2
        finally:
            os.close(fd)


@pytest.mark.parametrize("num_threads", [1, 2, 3, 8])
def test_split_read_crossing_eof_counts_only_existing_bytes(file_with, num_threads):
    kvikpy.defaults.set("num_threads", num_threads)
    path = file_with(DATA)
    buf = np.empty(3 * len(DATA), dtype=np.uint8)
    buf[:] = 7
    with kvikpy.CuFile(path) as f:
        assert f.pread(buf, file_offset=999, task_size=4097).get() == len(DATA) - 999
    assert buf[: len(DATA) - 999].tobytes() == DATA[999:]
    assert (buf[len(DATA) - 999 :] == 7).all()


def test_host_reads_use_the_shared_pool_and_no_device_pool(file_with):
    """Host transfers run on the shared pool; only device transfers make a GPU's pool,
    and the engine's phase timing (device transfers only) stays empty."""
    path = file_with(random_bytes(8 * MiB, seed=27))
    code = (
        "import sys, numpy as np, kvikpy\n"
        "from kvikpy import _lib\n"
        "kvikpy.defaults.set('num_threads', 3)\n"
        "_lib.profile_enable(True)\n"
        "buf = np.empty(8 << 20, dtype=np.uint8)\n"
        "with kvikpy.CuFile(sys.argv[1]) as f:\n"
        "    assert f.pread(buf, task_size=1 << 20).get() == 8 << 20\n"
        "phases, moved = _lib.profile_phases(reset=True)\n"
        "print(_lib.thread_pool_size(), _lib.device_pool_sizes(), moved,"
        " sorted(c for _, _, c in phases))\n"
    )
    r = run_python(code, str(path))
    assert r.returncode == 0, r.stderr
    assert r.stdout.split("\n")[0] == "3 [] 0 [0, 0, 0, 0, 0]"


def test_num_threads_setting_sizes_the_pool(file_with):
    path = file_with(random_bytes(4 * MiB, seed=26))
    buf = np.empty(4 * MiB, dtype=np.uint8)
    for n in (3, 1, 5):
        kvikpy.defaults.set("num_threads", n)
        with kvikpy.CuFile(path) as f:
            assert f.pread(buf, task_size=64 << 10).get() == 4 * MiB
        assert kvikpy._lib.thread_pool_size() == n
    assert buf.tobytes() == read_all(path)


def test_default_task_size_setting_is_used(file_with):
    """With task_size unset per call, the default applies; odd values still give right data."""
    data = random_bytes(3 * MiB + 5, seed=27)
    path = file_with(data)
    for ts in (1000, 4097, MiB):
        kvikpy.defaults.set({"task_size": ts, "gds_threshold": 0})
        buf = bytearray(len(data))
        with kvikpy.CuFile(path) as f:
            assert f.pread(buf).get() == len(data)
        assert bytes(buf) == data


def test_many_concurrent_futures_on_one_file(tmp_path):
    kvikpy.defaults.set("num_threads", 4)
    data = random_bytes(8 * MiB, seed=28)
    path = tmp_path / "f.bin"
    chunk = MiB // 4
    with kvikpy.CuFile(path, "w+") as f:
        futs = [
            f.pwrite(data[i : i + chunk], file_offset=i, task_size=4097)
            for i in range(0, len(data), chunk)
        ]
        assert kvikpy.wait_all(futs) == [chunk] * (len(data) // chunk)
        out = np.empty(len(data), dtype=np.uint8)
        futs = [
            f.pread(out[i : i + chunk], file_offset=i, task_size=8192)
            for i in range(0, len(data), chunk)
        ]
        assert sum(kvikpy.wait_all(futs)) == len(data)
    assert out.tobytes() == data
    assert read_all(path) == data


# ---------------------------------------------------------------------------------------
# Files over 4 GiB


def test_sparse_file_over_4_gib(tmp_path):
    path = tmp_path / "big.bin"
    size = 5 * 2**30
    offset = 4 * 2**30 + 12345
    payload = random_bytes(MiB, seed=29)
    try:
        with open(path, "wb") as fh:
            fh.truncate(size)
            fh.seek(offset)
            fh.write(payload)
    except OSError as e:
        pytest.skip(f"the filesystem refuses a 5 GiB sparse file: {e}")
    if os.stat(path).st_blocks * 512 > 64 * MiB:
        pytest.skip("the filesystem does not keep files sparse")
    for direct in (False, True):
        kvikpy.defaults.set("auto_direct_io_read", direct)
        buf = aligned_array(MiB, offset=3)
        with kvikpy.CuFile(path) as f:
            assert f.nbytes() == size
            assert f.read(buf, file_offset=offset) == MiB
            assert buf.tobytes() == payload
            buf[:] = 1
            assert f.pread(buf, file_offset=offset, task_size=4097).get() == MiB
            assert buf.tobytes() == payload
            # Across the end of the file, and in the hole.
            tail = np.full(10_000, 9, dtype=np.uint8)
            assert f.read(tail, file_offset=size - 100) == 100
            assert (tail[:100] == 0).all()
            assert (tail[100:] == 9).all()
    # Write above 4 GiB with kvikpy, read back with os.pread.
    new = random_bytes(MiB + 3, seed=30)
    at = 4 * 2**30 + 3 * MiB + 1
    with kvikpy.CuFile(path, "r+") as f:
        assert f.pwrite(new, file_offset=at, task_size=256 << 10).get() == len(new)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert os.pread(fd, len(new), at) == new
        assert os.pread(fd, MiB, offset) == payload
    finally:
        os.close(fd)
    assert os.path.getsize(path) == size


# ---------------------------------------------------------------------------------------
# Opportunistic O_DIRECT

DIRECT_CASES = [
    # (file_offset, size, buffer address offset from a page boundary)
    (0, 64 * PAGE, 0),
    (0, 64 * PAGE, 1),
    (1, 64 * PAGE, 0),
    (PAGE, 64 * PAGE - 1, 0),
    (PAGE - 1, 10 * PAGE + 2, 1),
    (12345, 3 * MiB + 17, 7),
    (3 * PAGE, 100, 0),
    (5, 2 * PAGE, 4095),
]


def _direct_roundtrip(path: Path, offset: int, size: int, addr: int, seed: int) -> None:
    content = random_bytes(offset + size + 3 * PAGE + 5, seed=seed)
    path.write_bytes(content)
    src = aligned_array(size, addr)
    src[:] = random_array(size, seed=seed + 1)
    with kvikpy.CuFile(path, "r+") as f:
        assert f.write(src, file_offset=offset) == size
        assert f.pwrite(src, file_offset=offset, task_size=2 * PAGE + 1).get() == size
        dst = aligned_array(size, (addr + 3) % PAGE)
        assert f.read(dst, file_offset=offset) == size
        assert dst.tobytes() == src.tobytes()
        dst2 = aligned_array(size, addr)
        assert f.pread(dst2, file_offset=offset, task_size=4 * PAGE).get() == size
        assert dst2.tobytes() == src.tobytes()
    expected = content[:offset] + src.tobytes() + content[offset + size :]
    assert read_all(path) == expected


@pytest.mark.parametrize(("offset", "size", "addr"), DIRECT_CASES)
def test_direct_io_roundtrips_are_byte_identical(tmp_path, offset, size, addr):
    kvikpy.defaults.set({"auto_direct_io_read": True, "auto_direct_io_write": True})
    _direct_roundtrip(tmp_path / "f.bin", offset, size, addr, seed=31)


@pytest.mark.parametrize(("offset", "size", "addr"), DIRECT_CASES)
def test_direct_io_on_tmpfs_falls_back_silently(tmpfs_dir, offset, size, addr):
    kvikpy.defaults.set({"auto_direct_io_read": True, "auto_direct_io_write": True})
    path = tmpfs_dir / "f.bin"
    path.write_bytes(b"x")
    with kvikpy.CuFile(path) as f:
        assert f.is_direct_io_supported() == o_direct_supported(path)
    _direct_roundtrip(path, offset, size, addr, seed=32)


@pytest.mark.parametrize("bounce", [1, 4096, 8192, 12288 + 5])
@pytest.mark.parametrize("addr", [1, 513])
def test_small_bounce_buffers_loop_over_chunks(tmp_path, bounce, addr):
    kvikpy.defaults.set(
        {
            "auto_direct_io_read": True,
            "auto_direct_io_write": True,
            "bounce_buffer_size": bounce,
            "num_threads": 2,
        }
    )
    path = tmp_path / "f.bin"
    path.write_bytes(random_bytes(2 * MiB, seed=33))
    if not o_direct_supported(path):
        pytest.skip("no O_DIRECT on this filesystem")
    size = MiB + 3 * PAGE + 77
    src = aligned_array(size, addr)
    src[:] = random_array(size, seed=34)
    with kvikpy.CuFile(path, "r+") as f:
        assert f.write(src, file_offset=PAGE + 9, task_size=512 << 10) == size
        dst = aligned_array(size, addr + 2)
        assert f.read(dst, file_offset=PAGE + 9, task_size=512 << 10) == size
    assert dst.tobytes() == src.tobytes()
    content = read_all(path)
    assert content[PAGE + 9 : PAGE + 9 + size] == src.tobytes()


def test_direct_read_of_data_just_written_through_the_page_cache(tmp_path):
    """O_DIRECT reads see data still dirty in the page cache (written a moment ago)."""
    path = tmp_path / "f.bin"
    data = random_bytes(4 * MiB, seed=35)
    with open(path, "wb") as fh:
        fh.write(data)
    kvikpy.defaults.set("auto_direct_io_read", True)
    for addr in (0, 1):
        buf = aligned_array(len(data), addr)
        with kvikpy.CuFile(path) as f:
            assert f.read(buf) == len(data)
        assert buf.tobytes() == data


def test_bounce_buffer_free_returns_bytes_released(tmp_path):
    freed = kvikpy.bounce_buffer_free()
    assert isinstance(freed, int)
    assert freed >= 0
    assert kvikpy.bounce_buffer_free() == 0, "nothing idle is left after a free"
    path = tmp_path / "f.bin"
    data = random_bytes(MiB, seed=36)
    path.write_bytes(data)
    if not o_direct_supported(path):
        pytest.skip("no O_DIRECT on this filesystem")
    kvikpy.defaults.set({"auto_direct_io_read": True, "bounce_buffer_size": 64 << 10})
    buf = aligned_array(len(data), 1)
    with kvikpy.CuFile(path) as f:
        assert f.is_direct_io_supported()
        assert f.read(buf) == len(data)
    assert buf.tobytes() == data
    freed = kvikpy.bounce_buffer_free()
    assert freed > 0
    assert freed % (64 << 10) == 0
    assert kvikpy.bounce_buffer_free() == 0


def test_bounce_buffer_free_counts_each_buffer_as_the_bounce_buffer_size_it_served(tmp_path):
    """kvikio's count: a buffer is ``bounce_buffer_size`` bytes, though kvikpy's allocation
    is rounded up to whole pages (5000 -> 8192 here)."""
    path = tmp_path / "f.bin"
    data = random_bytes(1 << 20, seed=37)
    path.write_bytes(data)
    if not o_direct_supported(path):
        pytest.skip("no O_DIRECT on this filesystem")
    kvikpy.bounce_buffer_free()
    for size in (5000, 12_345):
        kvikpy.defaults.set(
            {"auto_direct_io_read": True, "bounce_buffer_size": size, "num_threads": 1}
        )
        buf = aligned_array(len(data), 1)  # unaligned: staged through the bounce pool
        with kvikpy.CuFile(path) as f:
            assert f.read(buf) == len(data)
        assert buf.tobytes() == data
        freed = kvikpy.bounce_buffer_free()
        assert freed > 0 and freed % size == 0, (size, freed)
        assert kvikpy.bounce_buffer_free() == 0


def test_staging_memory_counts_the_bounce_buffers_held_and_their_peaks(tmp_path):
    """``_lib.staging_memory``: what the bounce pools hold now and at most (a read through
    64 KiB buffers on 4 threads, and the caller running the first task, holds at most 5
    of them at once), back to nothing once
    the idle ones are freed, the peaks restarted on request."""
    kvikpy.bounce_buffer_free()
    kvikpy._lib.staging_memory_reset_peaks()
    before = kvikpy._lib.staging_memory()
    assert before["host"] == {"held": 0, "peak_held": 0, "in_use": 0, "peak_in_use": 0}
    assert isinstance(before["pinned"], dict)
    path = tmp_path / "f.bin"
    data = random_bytes(4 * MiB, seed=38)
    path.write_bytes(data)
    if not o_direct_supported(path):
        pytest.skip("no O_DIRECT on this filesystem")
    kvikpy.defaults.set(
        {"auto_direct_io_read": True, "bounce_buffer_size": 64 << 10, "num_threads": 4}
    )
    buf = aligned_array(len(data), 1)  # unaligned: staged through the bounce pool
    with kvikpy.CuFile(path) as f:
        assert f.read(buf) == len(data)
    assert buf.tobytes() == data
    host = kvikpy._lib.staging_memory()["host"]
    assert host["in_use"] == 0  # every buffer back in the pool
    assert 0 < host["peak_in_use"] <= host["peak_held"] <= 5 * (64 << 10)
    assert host["held"] == host["peak_held"]  # idle, kept for the next read
    kvikpy.bounce_buffer_free()
    host = kvikpy._lib.staging_memory()["host"]
    assert host["held"] == 0 and host["peak_held"] > 0
    kvikpy._lib.staging_memory_reset_peaks()
    assert kvikpy._lib.staging_memory()["host"]["peak_held"] == 0


def test_exact_reads_fail_when_the_file_is_shorter_than_sized(tmp_path: Path) -> None:
    """The one short-read check is the engine's: an exact read of more bytes than the file
    holds (as after the file shrank) raises OSError naming the file, on every path."""
    p = tmp_path / "shrunk"
    data = np.random.default_rng(3).integers(1, 255, 300_000, dtype=np.uint8)
    p.write_bytes(data.tobytes())
    with kvikpy.CuFile(p) as f:
        for size in (1000, 300_000):
            buf = np.zeros(size, dtype=np.uint8)
            assert f._handle.read_exact(buf, size) == size
            assert f._handle.pread_exact(buf, size).get() == size
            assert np.array_equal(buf, data[:size])
        big = np.zeros(300_001, dtype=np.uint8)
        for attempt in (
            lambda: f._handle.read_exact(big, big.nbytes),
            lambda: f._handle.pread_exact(big, big.nbytes).get(),
            lambda: f._handle.read_exact(big[:10], 10, 299_995),
        ):
            with pytest.raises(OSError, match="shrank while being read") as info:
                attempt()
            assert "shrunk" in str(info.value)
            assert isinstance(info.value, RuntimeError), "kvikio raises RuntimeError here"
        # Not exact, the same read is short and fine (kvikio's semantics).
        assert f.read(big) == 300_000
