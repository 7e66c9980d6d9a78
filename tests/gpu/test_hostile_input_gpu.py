"""Endless devices and bad arguments on the GPU: a sized device read of ``/dev/zero``
reads exactly that many bytes, CuFile reads of it into GPU memory fill the buffer
however they are split, and an unsized one is refused (see tests/test_hostile_input.py
for the host side)."""

from __future__ import annotations

import os

import pytest

import kvikpy

cupy = pytest.importorskip("cupy")

pytestmark = pytest.mark.skipif(not os.path.exists("/dev/zero"), reason="no /dev/zero")


def test_a_sized_device_read_of_dev_zero_reads_that_many_bytes() -> None:
    for size in (10, 3 << 20):
        a = cupy.from_dlpack(kvikpy.read("/dev/zero", offset=5, size=size))
        assert a.size == size and int(a.sum()) == 0


def test_an_unsized_device_read_of_dev_zero_is_refused() -> None:
    with pytest.raises(ValueError, match=r"character device.*size="):
        kvikpy.read("/dev/zero")


@pytest.mark.parametrize("task_size", [None, 4096, 1 << 16])
def test_cufile_fills_a_gpu_buffer_from_dev_zero(task_size: int | None) -> None:
    buf = cupy.full(1 << 20, 7, dtype=cupy.uint8)
    with kvikpy.CuFile("/dev/zero") as f:
        assert f.read(buf, task_size=task_size) == 1 << 20
        assert int(buf.sum()) == 0
        buf[:] = 7
        assert f.pread(buf, file_offset=5, task_size=task_size).get() == 1 << 20
        assert int(buf.sum()) == 0


def test_cufile_gpu_calls_refuse_bools_and_floats() -> None:
    buf = cupy.empty(8, dtype=cupy.uint8)
    with kvikpy.CuFile("/dev/zero") as f:
        for kwargs in ({"file_offset": True}, {"size": 1.5}, {"task_size": False}):
            with pytest.raises(TypeError):
                f.read(buf, **kwargs)
        for kwargs in ({"dev_offset": True}, {"file_offset": 1.5}):
            with pytest.raises(TypeError):
                f.raw_read(buf, **kwargs)
