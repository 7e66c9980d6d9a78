"""Plain CuPy arrays are taken by their pointer and their device's current stream, not
through ``__cuda_array_interface__``: the ordering stays the interface's (work queued on
CuPy's current stream before the call is finished before the read lands or the write
reads), and everything else (subclasses, other layouts, managed memory) takes the
interfaces as before, with their messages. Each ordering case queues a long spin kernel
and then the kernel that makes the array's bytes, and calls kvikpy at once: without the
wait, kvikpy would see (or be overwritten by) the bytes from before."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import kvikpy

cupy = pytest.importorskip("cupy")

N = 16 << 20
# About 0.1 s of spinning on an H100 (clock64 counts GPU clock cycles): far longer than
# kvikpy's call takes to start its copy.
SPIN = 200_000_000

_SPIN_SOURCE = r"""
extern "C" __global__ void spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) {}
}
"""


def spin() -> None:
    """Queue a kernel that keeps CuPy's current stream busy for about 0.1 s."""
    kernel = cupy.RawKernel(_SPIN_SOURCE, "spin")
    kernel((1,), (1,), (cupy.int64(SPIN),))


@pytest.fixture(params=["default stream", "side stream"])
def on_stream(request: pytest.FixtureRequest) -> Iterator[None]:
    if request.param == "default stream":
        yield
        return
    with cupy.cuda.Stream(non_blocking=True):
        yield


@pytest.fixture
def interface_calls(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Count the calls of ``cupy.ndarray``'s ``__cuda_array_interface__`` and
    ``__dlpack__`` (subclasses inherit the counting)."""
    calls: list[str] = []
    interface = cupy.ndarray.__cuda_array_interface__  # the descriptor, from the class
    dlpack = cupy.ndarray.__dlpack__

    def counted_interface(self: object) -> object:
        calls.append("__cuda_array_interface__")
        return interface.__get__(self)

    def counted_dlpack(self: object, *args: object, **kwargs: object) -> object:
        calls.append("__dlpack__")
        return dlpack(self, *args, **kwargs)

    monkeypatch.setattr(cupy.ndarray, "__cuda_array_interface__", property(counted_interface))
    monkeypatch.setattr(cupy.ndarray, "__dlpack__", counted_dlpack)
    return calls


class ArraySubclass(cupy.ndarray):
    """A subclass: kvikpy takes it through its interface, not the plain-array path."""


def test_a_read_lands_after_the_kernels_already_queued_on_the_array(tmp_path: Path, on_stream):
    data = os.urandom(N)
    (tmp_path / "in.bin").write_bytes(data)
    a = cupy.empty(N, dtype=cupy.uint8)
    cupy.cuda.Device().synchronize()
    spin()
    a.fill(0)  # queued behind the spin: it must not overwrite what the read brings
    with kvikpy.CuFile(tmp_path / "in.bin") as f:
        assert f.read(a) == N
    cupy.cuda.Device().synchronize()
    assert cupy.asnumpy(a).tobytes() == data


def test_a_write_waits_for_the_kernel_that_computed_the_array(tmp_path: Path, on_stream):
    a = cupy.zeros(N, dtype=cupy.uint8)
    cupy.cuda.Device().synchronize()
    spin()
    a.fill(7)  # queued behind the spin: not done when the write starts
    with kvikpy.CuFile(tmp_path / "out.bin", "w") as f:
        assert f.write(a) == N
    assert (tmp_path / "out.bin").read_bytes() == b"\x07" * N


@pytest.mark.parametrize("kind", ["plain", "subclass", "slice of a larger array"])
def test_small_reads_wait_too_whatever_the_array(tmp_path: Path, on_stream, kind: str):
    data = os.urandom(4096)
    (tmp_path / "in.bin").write_bytes(data)
    whole = cupy.empty(3 * 4096, dtype=cupy.uint8)
    a = whole[4096 : 2 * 4096] if kind == "slice of a larger array" else whole[:4096]
    if kind == "subclass":
        a = cupy.empty(4096, dtype=cupy.uint8).view(ArraySubclass)
    cupy.cuda.Device().synchronize()
    spin()
    a.fill(0)
    with kvikpy.CuFile(tmp_path / "in.bin") as f:
        assert f.read(a) == 4096
    cupy.cuda.Device().synchronize()
    assert cupy.asnumpy(a).tobytes() == data


def test_plain_arrays_skip_the_interfaces_and_others_take_them(
    tmp_path: Path, interface_calls: list[str]
):
    data = os.urandom(4096)
    (tmp_path / "in.bin").write_bytes(data)
    plain = cupy.zeros(1024, dtype=cupy.float32)
    sub = cupy.zeros(4096, dtype=cupy.uint8).view(ArraySubclass)
    with kvikpy.CuFile(tmp_path / "in.bin") as f:
        assert f.read(plain) == 4096
        assert interface_calls == []
        assert f.read(sub) == 4096
        assert interface_calls, "a subclass must go through its interface"
    cupy.cuda.Device().synchronize()
    assert cupy.asnumpy(plain).tobytes() == data
    assert cupy.asnumpy(sub).tobytes() == data


def test_raw_read_async_orders_cupys_stream_before_its_own_without_blocking(tmp_path: Path):
    data = os.urandom(N)
    (tmp_path / "in.bin").write_bytes(data)
    expected = sum(data)
    a = cupy.empty(N, dtype=cupy.uint8)
    producer = cupy.cuda.Stream(non_blocking=True)
    consumer = cupy.cuda.Stream(non_blocking=True)
    cupy.cuda.Device().synchronize()
    with producer:
        spin()
        a.fill(0)
        with kvikpy.CuFile(tmp_path / "in.bin") as f:
            started = time.perf_counter()
            future = f.raw_read_async(a, consumer)
            returned_after = time.perf_counter() - started
            with consumer:
                total = a.sum(dtype=cupy.int64)  # later work on the read's stream
            assert future.check_bytes_done() == N
    consumer.synchronize()
    assert int(total) == expected
    assert returned_after < 0.05, "raw_read_async must not block on either stream"


def test_arrays_the_fast_path_leaves_alone_keep_their_errors(tmp_path: Path):
    (tmp_path / "in.bin").write_bytes(os.urandom(8192))
    strided = cupy.zeros(8192, dtype=cupy.uint8)[::2]
    fortran = cupy.zeros((64, 32), dtype=cupy.uint8, order="F")
    with kvikpy.CuFile(tmp_path / "in.bin") as f:
        with pytest.raises(ValueError, match="not C-contiguous"):
            f.read(strided)
        with pytest.raises(ValueError, match="not C-contiguous"):
            f.read(fortran)
        plain = cupy.zeros(16, dtype=cupy.uint8)
        with pytest.raises(ValueError, match="larger than the buffer"):
            f.read(plain, 32)
        with pytest.raises(ValueError, match="outside the buffer"):
            f.raw_read(plain, 1, 0, 17)
    assert not strided.any() and not fortran.any() and not plain.any()


def test_empty_arrays_read_nothing(tmp_path: Path):
    (tmp_path / "in.bin").write_bytes(os.urandom(64))
    with kvikpy.CuFile(tmp_path / "in.bin") as f:
        assert f.read(cupy.empty(0, dtype=cupy.uint8)) == 0


@pytest.mark.parametrize("memory", ["cudaMalloc, no pool", "managed", "unowned"])
def test_arrays_in_every_kind_of_memory_read_right(tmp_path: Path, memory: str):
    data = os.urandom(4096)
    (tmp_path / "in.bin").write_bytes(data)
    if memory == "cudaMalloc, no pool":
        with cupy.cuda.using_allocator(lambda n: cupy.cuda.MemoryPointer(cupy.cuda.Memory(n), 0)):
            a = cupy.zeros(4096, dtype=cupy.uint8)
    elif memory == "managed":
        with cupy.cuda.using_allocator(cupy.cuda.malloc_managed):
            a = cupy.zeros(4096, dtype=cupy.uint8)
    else:
        owner = cupy.zeros(4096, dtype=cupy.uint8)
        unowned = cupy.cuda.UnownedMemory(owner.data.ptr, 4096, owner)
        a = cupy.ndarray((4096,), dtype=cupy.uint8, memptr=cupy.cuda.MemoryPointer(unowned, 0))
    with kvikpy.CuFile(tmp_path / "in.bin") as f:
        assert f.read(a) == 4096
    cupy.cuda.Device().synchronize()
    assert cupy.asnumpy(a).tobytes() == data


@pytest.mark.multi_gpu
def test_a_read_into_device_0_waits_for_device_0_while_device_1_is_current(tmp_path: Path):
    data = os.urandom(N)
    (tmp_path / "in.bin").write_bytes(data)
    with cupy.cuda.Device(0):
        a = cupy.empty(N, dtype=cupy.uint8)
        side = cupy.cuda.Stream(non_blocking=True)
        cupy.cuda.Device(0).synchronize()
        with side:
            spin()
            a.fill(0)  # on device 0's current stream, behind the spin
            with cupy.cuda.Device(1), kvikpy.CuFile(tmp_path / "in.bin") as f:
                assert f.read(a) == N
    cupy.cuda.Device(0).synchronize()
    assert cupy.asnumpy(a).tobytes() == data
