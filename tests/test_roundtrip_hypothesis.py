"""Property tests: kvikpy's reads and writes agree with os.pread/os.pwrite for random sizes,
offsets, task sizes, thread counts, buffer alignments and direct-I/O settings."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
from conftest import aligned_array, random_bytes
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kvikpy

KiB = 1 << 10
MiB = 1 << 20

SETTINGS = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

sizes = st.one_of(
    st.integers(0, 3 * MiB),
    st.sampled_from([0, 1, 4095, 4096, 4097, 8192, MiB, MiB + 1, 3 * MiB]),
)
offsets = st.one_of(
    st.integers(0, 4 * MiB),
    st.sampled_from([0, 1, 511, 4095, 4096, 4097, MiB - 1, MiB, 3 * MiB + 5]),
)
file_sizes = st.one_of(st.integers(0, 5 * MiB), st.sampled_from([0, 1, 4096, 4097, 2 * MiB]))
task_sizes = st.one_of(
    st.integers(KiB, 8 * MiB),
    st.sampled_from([KiB, 4095, 4096, 4097, 12345, 65536, MiB + 3, 4 * MiB, 8 * MiB]),
)
config = st.fixed_dictionaries(
    {
        "num_threads": st.integers(1, 8),
        "auto_direct_io_read": st.sampled_from([True, False, "auto"]),
        "auto_direct_io_write": st.booleans(),
        "gds_threshold": st.sampled_from([0, 4096, 16 * KiB, MiB]),
        "bounce_buffer_size": st.sampled_from([4096, 12345, 64 * KiB, 16 * MiB]),
    }
)


def pread_os(path: Path, size: int, offset: int) -> bytes:
    fd = os.open(path, os.O_RDONLY)
    try:
        out = b""
        while len(out) < size:
            chunk = os.pread(fd, size - len(out), offset + len(out))
            if not chunk:
                break
            out += chunk
        return out
    finally:
        os.close(fd)


# Every round trip draws the same things: file and request sizes, an offset, a task size,
# settings, the buffer's address modulo a page, blocking or not, and a data seed.
ROUND_TRIP = given(
    file_size=file_sizes,
    size=sizes,
    offset=offsets,
    task_size=task_sizes,
    cfg=config,
    addr=st.integers(0, 4095),
    blocking=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)


@SETTINGS
@ROUND_TRIP
def test_kvikpy_write_matches_os_pread(
    tmp_path, file_size, size, offset, task_size, cfg, addr, blocking, seed
):
    kvikpy.defaults.set(cfg)
    path = tmp_path / "w.bin"
    initial = random_bytes(file_size, seed=seed)
    path.write_bytes(initial)
    src = aligned_array(size, addr)
    src[:] = np.frombuffer(random_bytes(size, seed=seed + 1), dtype=np.uint8)
    with kvikpy.CuFile(path, "r+") as f:
        if blocking:
            n = f.write(src, file_offset=offset, task_size=task_size)
        else:
            n = f.pwrite(src, file_offset=offset, task_size=task_size).get()
    assert n == size
    assert pread_os(path, size, offset) == src.tobytes()
    if size == 0:
        expected = initial
    else:
        head = initial[:offset] + bytes(max(0, offset - file_size))
        expected = head + src.tobytes() + initial[offset + size :]
    assert path.read_bytes() == expected


@SETTINGS
@ROUND_TRIP
def test_kvikpy_read_matches_os_pread(
    tmp_path, file_size, size, offset, task_size, cfg, addr, blocking, seed
):
    kvikpy.defaults.set(cfg)
    path = tmp_path / "r.bin"
    content = random_bytes(file_size, seed=seed)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        assert os.pwrite(fd, content, 0) == file_size
    finally:
        os.close(fd)
    sentinel = random_bytes(size, seed=seed + 2)
    dst = aligned_array(size, addr)
    dst[:] = np.frombuffer(sentinel, dtype=np.uint8)
    with kvikpy.CuFile(path, "r") as f:
        if blocking:
            n = f.read(dst, file_offset=offset, task_size=task_size)
        else:
            n = f.pread(dst, file_offset=offset, task_size=task_size).get()
    expected = pread_os(path, size, offset)
    assert n == len(expected)
    assert dst[:n].tobytes() == expected
    assert dst[n:].tobytes() == sentinel[n:]


@SETTINGS
@given(
    chunks=st.lists(
        st.tuples(st.integers(0, 2 * MiB), st.integers(0, 256 * KiB)), min_size=1, max_size=8
    ),
    task_size=task_sizes,
    cfg=config,
    seed=st.integers(0, 2**32 - 1),
)
def test_concurrent_pwrites_then_preads_match_a_model(tmp_path, chunks, task_size, cfg, seed):
    """Several futures in flight at once, on disjoint or overlapping ranges."""
    kvikpy.defaults.set(cfg)
    path = tmp_path / "c.bin"
    model = bytearray()
    datas = []
    for i, (offset, size) in enumerate(chunks):
        data = random_bytes(size, seed=seed + i)
        datas.append(data)
        if size:
            end = offset + size
            if len(model) < end:
                model.extend(bytes(end - len(model)))
            model[offset:end] = data
    # Overlapping writes may land in any order: write them one future at a time where they
    # overlap, all at once otherwise.
    overlapping = any(
        a[0] < b[0] + b[1] and b[0] < a[0] + a[1] and a[1] and b[1]
        for i, a in enumerate(chunks)
        for b in chunks[i + 1 :]
    )
    with kvikpy.CuFile(path, "w+") as f:
        futs = []
        for (offset, _), data in zip(chunks, datas, strict=True):
            fut = f.pwrite(data, file_offset=offset, task_size=task_size)
            if overlapping:
                fut.get()
            futs.append(fut)
        assert kvikpy.wait_all(futs) == [len(d) for d in datas]
        assert f.nbytes() == len(model)
        bufs = [bytearray(size + 100) for _, size in chunks]
        futs = [
            f.pread(b, file_offset=offset, task_size=task_size)
            for (offset, _), b in zip(chunks, bufs, strict=True)
        ]
        counts = kvikpy.wait_all(futs)
    assert path.read_bytes() == bytes(model)
    for (offset, _), b, n in zip(chunks, bufs, counts, strict=True):
        expected = bytes(model[offset : offset + len(b)])
        assert n == len(expected)
        assert bytes(b[:n]) == expected
