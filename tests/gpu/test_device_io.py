"""Reads and writes of GPU memory through CuFile: torch, CuPy, JAX, CUDA Array Interface."""

from __future__ import annotations

import os

# JAX would otherwise take 75% of GPU memory at its first use, starving later tests.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
from pathlib import Path

import numpy as np
import pytest
from conftest import caller_context_kept, random_file

import kvikpy

torch = pytest.importorskip("torch")
cupy = pytest.importorskip("cupy")


SIZES = [1, 4095, 4096, 65_536 + 3, (4 << 20) + 17, (40 << 20) + 4097]


@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("direct", [False, True])
def test_read_into_torch_and_cupy(tmp_path: Path, n: int, direct: bool) -> None:
    p, data = random_file(tmp_path, n, seed=n)
    expected = np.frombuffer(data, dtype=np.uint8)
    with kvikpy.defaults.set({"auto_direct_io_read": direct, "task_size": 1 << 20}):
        t = torch.empty(n, dtype=torch.uint8, device="cuda")
        with kvikpy.CuFile(p) as f:
            assert f.read(t) == n
        assert np.array_equal(t.cpu().numpy(), expected)
        c = cupy.empty(n, dtype=cupy.uint8)
        with kvikpy.CuFile(p) as f:
            assert f.pread(c).get() == n
        assert np.array_equal(cupy.asnumpy(c), expected)


@pytest.mark.parametrize("threads", [1, 3, 8])
@pytest.mark.parametrize("offset", [0, 1, 4096, 12_345])
def test_ranges_threads_and_short_reads(tmp_path: Path, threads: int, offset: int) -> None:
    n = (9 << 20) + 123
    p, data = random_file(tmp_path, n, seed=threads + offset)
    with kvikpy.defaults.set({"num_threads": threads, "task_size": 1 << 20}):
        size = 5 << 20
        t = torch.full((size,), 0xAB, dtype=torch.uint8, device="cuda")
        with kvikpy.CuFile(p) as f:
            assert f.read(t, file_offset=offset) == size
            assert bytes(t.cpu().numpy()) == data[offset : offset + size]
            # A read crossing EOF returns the short count and leaves the rest alone.
            t.fill_(0xAB)
            start = n - 1000
            assert f.read(t, file_offset=start) == 1000
            host = t.cpu().numpy()
            assert bytes(host[:1000]) == data[start:]
            assert (host[1000:] == 0xAB).all()
            assert f.read(t, file_offset=n + 5) == 0
            assert bytes(t.cpu().numpy()[:1000]) == data[start:]  # a 0-byte read wrote nothing


@pytest.mark.parametrize("direct", [False, True])
def test_write_from_device(tmp_path: Path, direct: bool) -> None:
    n = (17 << 20) + 5
    src = torch.randint(0, 256, (n,), dtype=torch.uint8, device="cuda")
    p = tmp_path / "w.bin"
    settings = {"auto_direct_io_write": direct, "task_size": 4 << 20}
    with kvikpy.defaults.set(settings), kvikpy.CuFile(p, "w") as f:
        assert f.write(src) == n
        assert f.pwrite(src[:4096], file_offset=n + 100).get() == 4096
    on_disk = p.read_bytes()
    host = src.cpu().numpy().tobytes()
    assert on_disk[:n] == host
    assert on_disk[n : n + 100] == bytes(100)
    assert on_disk[n + 100 :] == host[:4096]


def test_typed_and_2d_arrays(tmp_path: Path) -> None:
    a = cupy.random.standard_normal((300, 257), dtype=cupy.float32)
    p = tmp_path / "a.bin"
    with kvikpy.CuFile(p, "w") as f:
        f.write(a)
    b = cupy.empty_like(a)
    with kvikpy.CuFile(p) as f:
        f.read(b)
    assert bool((a == b).all())
    assert np.array_equal(np.fromfile(p, dtype=np.float32).reshape(300, 257), cupy.asnumpy(a))


class CAI:
    """A minimal __cuda_array_interface__ producer over a CuPy array."""

    def __init__(self, arr: object, version: int, readonly: bool = False, stream: object = None):
        self._arr = arr
        iface = dict(arr.__cuda_array_interface__)  # type: ignore[attr-defined]
        iface["version"] = version
        iface["data"] = (iface["data"][0], readonly)
        if version >= 3:
            iface["stream"] = stream
        else:
            iface.pop("stream", None)
        self.__cuda_array_interface__ = iface


@pytest.mark.parametrize("version", [2, 3])
def test_cuda_array_interface(tmp_path: Path, version: int) -> None:
    p, data = random_file(tmp_path, 1 << 20, seed=version)
    c = cupy.zeros(1 << 20, dtype=cupy.uint8)
    s = cupy.cuda.Stream(non_blocking=True)
    obj = CAI(c, version, stream=s.ptr if version == 3 else None)
    with kvikpy.CuFile(p) as f:
        assert f.read(obj) == 1 << 20
    assert cupy.asnumpy(c).tobytes() == data


def test_cai_v3_stream_is_waited_for(tmp_path: Path) -> None:
    """Data produced on the CAI stream is complete before kvikpy writes it to the file."""
    n = 8 << 20
    s = torch.cuda.Stream()
    t = torch.zeros(n, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(s):
        torch.cuda._sleep(200_000_000)  # ~0.1 s of GPU time before the fill
        t.fill_(0x5A)
    obj = CAI(cupy.asarray(t), 3, stream=s.cuda_stream)
    p = tmp_path / "w.bin"
    with kvikpy.CuFile(p, "w") as f:
        f.write(obj)
    assert p.read_bytes() == b"\x5a" * n


def test_read_only_and_non_contiguous_are_rejected(tmp_path: Path) -> None:
    p, data = random_file(tmp_path, 8192)
    c = cupy.zeros(8192, dtype=cupy.uint8)
    with kvikpy.CuFile(p) as f:
        with pytest.raises(ValueError, match="read-only"):
            f.read(CAI(c, 3, readonly=True))
        with pytest.raises(ValueError, match="contiguous"):
            f.read(cupy.zeros((64, 256), dtype=cupy.uint8)[:, ::2])
        with pytest.raises(ValueError, match="contiguous"):
            f.read(torch.zeros((64, 256), dtype=torch.uint8, device="cuda").t())
        with pytest.raises(ValueError, match="larger than the buffer"):
            f.read(c, size=8193)
    assert p.read_bytes() == data


def test_jax_arrays_are_read_only_but_writable_from(tmp_path: Path) -> None:
    jax = pytest.importorskip("jax")
    jnp = pytest.importorskip("jax.numpy")
    with caller_context_kept():
        if not any(d.platform == "gpu" for d in jax.devices()):
            pytest.skip("JAX sees no GPU")
        x = jnp.arange(4096, dtype=jnp.float32)
        x.block_until_ready()
    p = tmp_path / "j.bin"
    with kvikpy.CuFile(p, "w") as f:
        assert f.write(x) == 4096 * 4
    assert np.array_equal(np.fromfile(p, dtype=np.float32), np.arange(4096, dtype=np.float32))
    with kvikpy.CuFile(p) as f, pytest.raises(ValueError, match="JAX"):
        f.read(x)


def test_pinned_and_managed_memory(tmp_path: Path) -> None:
    p, data = random_file(tmp_path, (3 << 20) + 7)
    pinned = torch.empty(len(data), dtype=torch.uint8).pin_memory()
    with kvikpy.CuFile(p) as f:
        assert f.read(pinned) == len(data)
    assert pinned.numpy().tobytes() == data
    mem = cupy.cuda.malloc_managed(len(data))
    managed = cupy.ndarray((len(data),), dtype=cupy.uint8, memptr=mem)
    with kvikpy.CuFile(p) as f:
        assert f.read(managed) == len(data)
    assert cupy.asnumpy(managed).tobytes() == data


def test_raw_read_and_write_with_dev_offset(tmp_path: Path) -> None:
    p, data = random_file(tmp_path, 1 << 20)
    c = cupy.zeros(2 << 20, dtype=cupy.uint8)
    with kvikpy.CuFile(p) as f:
        assert f.raw_read(c, size=4096, file_offset=100, dev_offset=5000) == 4096
        with pytest.raises(ValueError, match="host"):
            f.raw_read(bytearray(10))
        with pytest.raises(ValueError, match="dev_offset"):
            f.raw_read(c, dev_offset=(2 << 20) + 1)
    host = cupy.asnumpy(c)
    assert host[5000 : 5000 + 4096].tobytes() == data[100:4196]
    assert not host[:5000].any()
    out = tmp_path / "o.bin"
    with kvikpy.CuFile(out, "w") as f:
        assert f.raw_write(c, size=4096, dev_offset=5000) == 4096
    assert out.read_bytes() == data[100:4196]


@pytest.mark.parametrize("bounce", [1 << 20, 64 << 20])
def test_raw_read_async_is_stream_ordered(tmp_path: Path, bounce: int) -> None:
    """Earlier work on the stream finishes before the read; later work sees its bytes.

    With 1 MiB bounce buffers the read is 16 chunks through a ring of two, so the
    stream and the worker hand buffers back and forth many times.
    """
    import time

    kvikpy.defaults.set("bounce_buffer_size", bounce)
    n = 16 << 20
    p, data = random_file(tmp_path, n, seed=7)
    # First use of a bounce size allocates pinned buffers (cuMemHostAlloc, and freeing
    # buffers of the old size) which can synchronise the device; warm the pool first.
    warm = torch.zeros(n, dtype=torch.uint8, device="cuda")
    with kvikpy.CuFile(p) as f:
        f.raw_read_async(warm, 0).check_bytes_done()
    expected = int(np.frombuffer(data, dtype=np.uint8).astype(np.int64).sum())
    s = torch.cuda.Stream()
    t = torch.zeros(n, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    with kvikpy.CuFile(p) as f, torch.cuda.stream(s):
        torch.cuda._sleep(300_000_000)  # earlier work: long, then overwrites the target
        t.fill_(1)
        t0 = time.perf_counter()
        fut = f.raw_read_async(t, s)
        returned_after = time.perf_counter() - t0
        total = t.to(torch.int64).sum()  # later work on the same stream
        assert fut.check_bytes_done() == n
    s.synchronize()
    assert int(total) == expected
    assert returned_after < 0.05, "raw_read_async must not block on the stream"


@pytest.mark.parametrize("bounce", [256 << 10, 64 << 20])
def test_raw_write_async_is_stream_ordered(tmp_path: Path, bounce: int) -> None:
    kvikpy.defaults.set("bounce_buffer_size", bounce)
    n = 4 << 20
    s = torch.cuda.Stream()
    t = torch.zeros(n, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    p = tmp_path / "w.bin"
    with kvikpy.CuFile(p, "w") as f, torch.cuda.stream(s):
        torch.cuda._sleep(200_000_000)
        t.fill_(0x33)  # produced on the stream before the write
        fut = f.raw_write_async(t, s)
        t.fill_(0x44)  # later work may reuse the buffer: must not reach the file
        assert fut.check_bytes_done() == n
    assert p.read_bytes() == b"\x33" * n


def test_closing_the_file_or_dropping_the_tensor_mid_read_is_safe(tmp_path: Path) -> None:
    """A running read keeps its tensor alive and its file open, and lets both go after."""
    import gc
    import weakref

    p, data = random_file(tmp_path, 64 << 20)
    with kvikpy.defaults.set({"num_threads": 1, "task_size": 1 << 20}):
        f = kvikpy.CuFile(p)
        t = torch.empty(len(data), dtype=torch.uint8, device="cuda")
        alive = weakref.ref(t)
        fut = f.pread(t)
        f.close()
        del t
        gc.collect()
        if not fut.done():
            assert alive() is not None, "the tensor was freed under a running read"
        assert fut.get() == len(data)
        del fut
        # The I/O thread may drop its share last; pyo3 then defers the decref to the
        # next call into the extension.
        assert kvikpy._lib.wait_for_io(10.0)
        kvikpy._lib.thread_pool_size()
        gc.collect()
        assert alive() is None, "the finished read still holds the tensor"


def test_bounce_pool_is_bounded_and_freeable(tmp_path: Path) -> None:
    p, data = random_file(tmp_path, 64 << 20)
    t = torch.empty(len(data), dtype=torch.uint8, device="cuda")
    threads = 4
    bounce = 1 << 20
    with kvikpy.defaults.set({"num_threads": threads, "bounce_buffer_size": bounce}):
        kvikpy.bounce_buffer_free()
        for _ in range(5):
            with kvikpy.CuFile(p) as f:
                f.read(t)
        freed = kvikpy.bounce_buffer_free()
    # Each pool thread (and the caller) holds at most two pinned buffers.
    assert 0 < freed <= 2 * (threads + 1) * (bounce + 8192)
    assert kvikpy.bounce_buffer_free() == 0


def test_profile_counts_the_phases_of_device_reads(tmp_path: Path) -> None:
    """The engine's per-phase timing sees a device read's bytes and each of its phases
    while on, and nothing while off."""
    p, data = random_file(tmp_path, 32 << 20)
    t = torch.empty(len(data), dtype=torch.uint8, device="cuda")
    lib = kvikpy._lib
    lib.profile_phases(reset=True)
    with kvikpy.CuFile(p, "r") as f:
        f.read(t)
    phases, moved = lib.profile_phases(reset=True)
    assert moved == 0 and all(c == 0 for _, _, c in phases), "off unless switched on"
    lib.profile_enable(True)
    try:
        with kvikpy.defaults.set({"num_threads": 4}), kvikpy.CuFile(p, "r") as f:
            f.read(t)
    finally:
        lib.profile_enable(False)
    phases, moved = lib.profile_phases(reset=True)
    assert moved == len(data)
    counts = {name: c for name, _, c in phases}
    assert set(counts) == {"bind", "buffers", "host_io", "enqueue", "wait"}
    assert counts["host_io"] > 0 and counts["enqueue"] == counts["host_io"]
    assert counts["wait"] > 0 and counts["bind"] > 0
    assert t.cpu().numpy().tobytes() == data
