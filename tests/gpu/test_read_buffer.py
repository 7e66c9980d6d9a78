"""kvikpy.read / kvikpy.write and kvikpy.Buffer on the GPU: DLPack, CAI, streams, memory."""

from __future__ import annotations

import os

# JAX would otherwise take 75% of GPU memory at its first use, starving later tests.
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
import functools
import gc
import resource
from pathlib import Path

import numpy as np
import pytest
from conftest import caller_context_kept, crossings, random_file

import kvikpy

torch = pytest.importorskip("torch")
cupy = pytest.importorskip("cupy")


def test_read_to_torch_cupy_and_jax(tmp_path: Path) -> None:
    p, data = random_file(tmp_path, (5 << 20) + 3)
    buf = kvikpy.read(p)
    assert buf.device == f"cuda:{torch.cuda.current_device()}"
    assert buf.__dlpack_device__() == (2, torch.cuda.current_device())
    t = torch.from_dlpack(buf)
    assert t.is_cuda and t.dtype == torch.uint8 and t.shape == (len(data),)
    assert t.cpu().numpy().tobytes() == data
    c = cupy.from_dlpack(kvikpy.read(p))
    assert cupy.asnumpy(c).tobytes() == data
    c2 = cupy.asarray(kvikpy.read(p))  # through __cuda_array_interface__
    assert cupy.asnumpy(c2).tobytes() == data
    jax = pytest.importorskip("jax")
    buf = kvikpy.read(p)
    with caller_context_kept():
        if any(d.platform == "gpu" for d in jax.devices()):
            j = jax.dlpack.from_dlpack(buf)
            assert np.asarray(j).tobytes() == data


def test_typed_ranges_and_errors(tmp_path: Path) -> None:
    a = np.random.default_rng(1).standard_normal((64, 33)).astype(np.float32)
    p = tmp_path / "a.bin"
    a.tofile(p)
    t = torch.from_dlpack(kvikpy.read(p, dtype="float32", shape=(64, 33)))
    assert t.dtype == torch.float32 and tuple(t.shape) == (64, 33)
    assert np.array_equal(t.cpu().numpy(), a)
    row = torch.from_dlpack(kvikpy.read(p, offset=33 * 4 * 5, size=33 * 4, dtype="float32"))
    assert np.array_equal(row.cpu().numpy(), a[5])
    with pytest.raises(ValueError, match=str(a.nbytes)):
        kvikpy.read(p, offset=a.nbytes - 4, size=8)
    with pytest.raises(ValueError, match="shape"):
        kvikpy.read(p, dtype="float32", shape=(10, 10))
    with pytest.raises(ValueError, match=r"does not exist: .*; use device='cuda:0'.*device='cpu'"):
        kvikpy.read(p, device=f"cuda:{kvikpy.device_count()}")


@pytest.mark.parametrize("n", [0, 1, 4097])
def test_tiny_and_empty_files(tmp_path: Path, n: int) -> None:
    p, data = random_file(tmp_path, n, seed=n)
    t = torch.from_dlpack(kvikpy.read(p))
    assert t.is_cuda and t.numel() == n
    assert t.cpu().numpy().tobytes() == data
    assert kvikpy.read(p).to_numpy().tobytes() == data


def test_host_copies_and_array_interfaces(tmp_path: Path) -> None:
    a = np.random.default_rng(2).standard_normal(1000).astype(np.float32)
    p = tmp_path / "a.bin"
    a.tofile(p)
    buf = kvikpy.read(p, dtype="float32")
    assert buf.dtype == np.float32
    assert np.array_equal(buf.to_numpy(), a)
    assert np.array_equal(np.from_dlpack(buf, device="cpu", copy=True), a)
    with pytest.raises(BufferError):
        buf.__dlpack__(dl_device=(1, 0), copy=False)
    cai = buf.__cuda_array_interface__
    assert cai["version"] == 3 and cai["typestr"] == "<f4" and cai["stream"] is None
    s = torch.cuda.Stream()
    ordered = kvikpy.read(p, dtype="float32", stream=s)
    assert ordered.__cuda_array_interface__["stream"] == s.cuda_stream
    s.synchronize()
    assert np.array_equal(cupy.asnumpy(cupy.asarray(ordered)), a)


def test_threads_reading_into_one_buffer(tmp_path: Path) -> None:
    import threading

    n = 48 << 20
    p, data = random_file(tmp_path, n, seed=11)
    t = torch.zeros(n, dtype=torch.uint8, device="cuda")
    parts = 12
    step = n // parts
    errors: list[BaseException] = []

    def work(i: int) -> None:
        try:
            with kvikpy.CuFile(p) as f:
                view = t[i * step : (i + 1) * step]
                assert f.pread(view, file_offset=i * step, task_size=1 << 20).get() == step
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=work, args=(i,)) for i in range(parts)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors
    assert t.cpu().numpy().tobytes() == data


def test_file_larger_than_the_bounce_pool(tmp_path: Path) -> None:
    n = (96 << 20) + 4099
    p, data = random_file(tmp_path, n, seed=12)
    settings = {"num_threads": 2, "bounce_buffer_size": 1 << 20, "task_size": 8 << 20}
    with kvikpy.defaults.set(settings):
        t = torch.from_dlpack(kvikpy.read(p, offset=3, size=n - 3))
        assert t.cpu().numpy().tobytes() == data[3:]
        out = tmp_path / "o.bin"
        assert kvikpy.write(out, t) == n - 3
    assert out.read_bytes() == data[3:]


@pytest.mark.slow
def test_file_over_4_gib(tmp_path: Path) -> None:
    """A 4 GiB + 3 MiB file of random bytes (written in 64 MiB random blocks)."""
    n = (4 << 30) + (3 << 20)
    p = tmp_path / "big.bin"
    rng = np.random.default_rng(4)
    block = 64 << 20
    with open(p, "wb") as fh:
        left = n
        while left:
            chunk = rng.integers(0, 256, min(block, left), dtype=np.uint8)
            fh.write(chunk.tobytes())
            left -= len(chunk)
    t = torch.from_dlpack(kvikpy.read(p))
    assert t.numel() == n
    host = np.fromfile(p, dtype=np.uint8)
    for start in (0, (2 << 30) - 7, (4 << 30) - 5, n - (1 << 20)):
        want = host[start : start + (1 << 20)]
        assert np.array_equal(t[start : start + (1 << 20)].cpu().numpy(), want)
    # Whole-buffer check on the GPU: sums of the bytes, 256 MiB at a time.
    step = 256 << 20
    gpu_sum = sum(int(t[i : i + step].sum(dtype=torch.int64)) for i in range(0, n, step))
    assert gpu_sum == int(host.sum(dtype=np.int64))


def test_cpu_reads_are_unpinned_and_zero_copy(tmp_path: Path) -> None:
    p, data = random_file(tmp_path, 1 << 20)
    buf = kvikpy.read(p, device="cpu")
    # Not pinned: a per-call cuMemHostAlloc would cost more than the read itself.
    assert not buf.is_pinned and buf.device == "cpu"
    arr = np.from_dlpack(buf)
    assert arr.tobytes() == data
    arr2 = np.asarray(memoryview(buf))
    assert arr2.ctypes.data == buf.ptr
    t = torch.from_dlpack(buf)
    assert t.device.type == "cpu" and t.numpy().tobytes() == data


def test_stream_ordered_read_is_visible_to_later_work(tmp_path: Path) -> None:
    n = 32 << 20
    p, data = random_file(tmp_path, n, seed=3)
    expected = int(np.frombuffer(data, dtype=np.uint8).astype(np.int64).sum())
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        torch.cuda._sleep(100_000_000)
        buf = kvikpy.read(p, stream=s)
        t = torch.from_dlpack(buf)
        total = t.to(torch.int64).sum()  # allocates on the stream: must not deadlock
    s.synchronize()
    assert int(total) == expected


def test_write_whole_buffers(tmp_path: Path) -> None:
    p, data = random_file(tmp_path, 3 << 20)
    buf = kvikpy.read(p)
    out = tmp_path / "o.bin"
    assert kvikpy.write(out, buf) == len(data)
    assert out.read_bytes() == data
    t = torch.arange(1000, dtype=torch.int32, device="cuda")
    assert kvikpy.write(out, t, offset=8) == 4000
    got = out.read_bytes()
    assert got[:8] == data[:8] and np.frombuffer(got[8:4008], np.int32).tolist() == list(
        range(1000)
    )
    with kvikpy.CuFile(out, "r") as f:  # a Buffer is also a destination
        dest = kvikpy.read(p)
        assert f.read(dest) == len(data)


def _gpu_free() -> int:
    free, _ = cupy.cuda.runtime.memGetInfo()
    return int(free)


def test_ten_thousand_reads_do_not_leak(tmp_path: Path) -> None:
    p, data = random_file(tmp_path, 4096 + 17, seed=9)
    for _ in range(100):
        kvikpy.read(p)
    gc.collect()
    torch.cuda.synchronize()
    free_before = _gpu_free()
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for i in range(10_000):
        buf = kvikpy.read(p)
        if i % 1000 == 0:
            assert torch.from_dlpack(buf).cpu().numpy().tobytes() == data
        del buf
    gc.collect()
    torch.cuda.synchronize()
    assert _gpu_free() >= free_before - (8 << 20)
    rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert rss_after - rss_before < 32 * 1024  # KiB


def test_no_device_or_host_memory_leak(tmp_path: Path) -> None:
    p, _ = random_file(tmp_path, 64 << 20)
    for _ in range(3):  # warm up pools, contexts and streams
        torch.from_dlpack(kvikpy.read(p)).sum()
    torch.cuda.synchronize()
    gc.collect()
    free_before = _gpu_free()
    rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for _ in range(40):
        buf = kvikpy.read(p)
        capsule_holder = torch.from_dlpack(buf)
        del buf, capsule_holder
        unused = kvikpy.read(p).__dlpack__()  # an unconsumed capsule frees on its own
        del unused
    gc.collect()
    torch.cuda.synchronize()
    assert _gpu_free() >= free_before - (16 << 20)
    rss_after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert rss_after - rss_before < 256 * 1024  # KiB: no whole-file host copies piling up


def test_torch_cpu_tensors_work_through_dlpack(tmp_path: Path) -> None:
    p, data = random_file(tmp_path, 65536)
    t = torch.empty(65536, dtype=torch.uint8)
    with kvikpy.CuFile(p) as f:
        assert f.read(t) == 65536
    assert t.numpy().tobytes() == data


@pytest.mark.skipif("kvikpy.device_count() < 2")
def test_multi_gpu(tmp_path: Path) -> None:
    p, data = random_file(tmp_path, (8 << 20) + 5)
    for ordinal in range(kvikpy.device_count()):
        t = torch.empty(len(data), dtype=torch.uint8, device=f"cuda:{ordinal}")
        with kvikpy.CuFile(p) as f:
            assert f.read(t) == len(data)
        assert t.cpu().numpy().tobytes() == data
        buf = kvikpy.read(p, device=f"cuda:{ordinal}")
        assert buf.device == f"cuda:{ordinal}"
        t2 = torch.from_dlpack(buf)
        assert t2.device.index == ordinal and t2.cpu().numpy().tobytes() == data
        out = tmp_path / f"o{ordinal}.bin"
        kvikpy.write(out, t2)
        assert out.read_bytes() == data


def test_out_of_gpu_memory_is_a_memory_error(tmp_path: Path) -> None:
    """A device allocation the GPU cannot satisfy is MemoryError, as on the host."""
    free, _ = torch.cuda.mem_get_info()
    p = tmp_path / "huge.bin"
    with open(p, "wb") as f:
        f.truncate(free * 4)  # sparse: a size, no data written
    with pytest.raises(MemoryError, match="out of GPU memory"):
        kvikpy.read(p)


def test_a_gpu_read_crosses_into_the_engine_twice(tmp_path: Path) -> None:
    p, data = random_file(tmp_path, (1 << 20) + 6)
    kvikpy.read(p)  # warm: first calls import modules
    for device in ("cuda", 0, "cuda:0"):
        read = functools.partial(kvikpy.read, p, offset=6, device=device, dtype="float16")
        calls = crossings(read)
        assert calls == ["device_lookup", "read_file"], calls
        assert bytes(torch.from_dlpack(read()).cpu().view(torch.uint8).numpy()) == data[6:]
