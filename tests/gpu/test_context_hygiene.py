"""kvikpy never changes which GPU the calling thread uses: after every public call, on
every path (blocking, futures, stream-ordered, batches, chunks, DLPack/Arrow export,
destructors), the thread's current CUDA context is exactly the one it had before, as the
driver, torch and CuPy see it. ``device="cuda"`` follows the caller's current device."""

from __future__ import annotations

import ctypes
import gc
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import random_file

import kvikpy
import kvikpy.safetensors

torch = pytest.importorskip("torch")

_cuda = ctypes.CDLL("libcuda.so.1")


def current_context() -> int:
    """The calling thread's current CUDA context as the driver reports it (0: none)."""
    ctx = ctypes.c_void_p()
    assert _cuda.cuCtxGetCurrent(ctypes.byref(ctx)) == 0
    return ctx.value or 0


SIZE = (6 << 20) + 123  # several tasks, a partial last one


@pytest.fixture
def data(tmp_path: Path) -> tuple[Path, bytes]:
    return random_file(tmp_path, SIZE, seed=77)


def _safetensors_file(folder: Path) -> Path:
    from test_safetensors import sample, write_safetensors

    path = folder / "m.safetensors"
    write_safetensors(path, sample())
    return path


# Every public call that touches a device, as (name, call(target ordinal, file, folder)).
# Each returns what it made, so the test can also drop it (destructors) while checking.
# Buffers are kvikpy's own and streams the legacy default stream (0), so only kvikpy acts
# on the thread; TORCH_OPS hand memory or streams to torch, which binds contexts itself.
def _device_buffer(target: int, p: Path) -> Any:
    return kvikpy.read(p, device=target)


def _raw_async(method: str) -> Callable[[int, Path, Path], Any]:
    def call(t: int, p: Path, d: Path) -> Any:
        buf = _device_buffer(t, p)
        target, mode = (d / "w.bin", "w") if method == "raw_write_async" else (p, "r")
        with kvikpy.CuFile(target, mode) as f:
            assert getattr(f, method)(buf, 0).check_bytes_done() == SIZE
        return buf

    return call


def _cufile(method: str) -> Callable[[int, Path, Path], Any]:
    def call(t: int, p: Path, d: Path) -> Any:
        buf = _device_buffer(t, p)
        if method in ("write", "pwrite", "raw_write"):
            target, mode = d / "w.bin", "w"
        else:
            target, mode = p, "r"
        with kvikpy.CuFile(target, mode) as f:
            out = getattr(f, method)(buf)
            assert (out.get() if method.startswith("p") else out) == SIZE
        return buf

    return call


def _dlpack_and_drop(t: int, p: Path, _: Path) -> Any:
    tensor = torch.from_dlpack(kvikpy.read(p, device=t))
    del tensor  # the capsule's deleter frees kvikpy's memory here, in this thread
    gc.collect()
    return None


def _arrow_export(t: int, p: Path, _: Path) -> Any:
    buf = kvikpy.read(p, device=t)
    schema, array = buf.__arrow_c_device_array__()
    del schema, array  # release callbacks run here
    gc.collect()
    return buf


def _batch(t: int, p: Path, _: Path) -> Any:
    batch = kvikpy.read_many([p, p], device=t)
    assert batch[1].nbytes == SIZE
    schema, array = batch.__arrow_c_device_array__()
    del schema, array
    return batch


def _chunks(t: int, p: Path, _: Path) -> Any:
    total = sum(c.nbytes for c in kvikpy.iter_chunks(p, 1 << 20, device=t))
    assert total == SIZE
    return None


def _host_copy(t: int, p: Path, _: Path) -> Any:
    host = kvikpy.read(p, device=t).to_numpy()  # a copy through pinned host memory
    assert host.tobytes() == p.read_bytes()
    return host


OPS: dict[str, Callable[[int, Path, Path], Any]] = {
    "read": lambda t, p, d: kvikpy.read(p, device=t),
    "read(stream=torch)": lambda t, p, d: kvikpy.read(
        p, device=t, stream=torch.cuda.Stream(device=f"cuda:{t}")
    ),
    "write": lambda t, p, d: kvikpy.write(d / "w.bin", kvikpy.read(p, device=t)),
    "CuFile.read": _cufile("read"),
    "CuFile.pread": _cufile("pread"),
    "CuFile.write": _cufile("write"),
    "CuFile.pwrite": _cufile("pwrite"),
    "CuFile.raw_read": _cufile("raw_read"),
    "CuFile.raw_write": _cufile("raw_write"),
    "CuFile.raw_read_async": _raw_async("raw_read_async"),
    "CuFile.raw_write_async": _raw_async("raw_write_async"),
    "read_many + Arrow": _batch,
    "read_ranges": lambda t, p, d: kvikpy.read_ranges(p, [(0, 4096), (1 << 20, 5 << 20)], device=t),
    "iter_chunks": _chunks,
    "DLPack export, deleter": _dlpack_and_drop,
    "Arrow device export, release": _arrow_export,
    "to host": _host_copy,
    "safetensors.load_file": lambda t, p, d: kvikpy.safetensors.load_file(
        _safetensors_file(d), device=f"cuda:{t}"
    ),
}


TORCH_OPS = {"read(stream=torch)", "DLPack export, deleter", "safetensors.load_file"}


@pytest.fixture
def restore_torch_device():
    before = torch.cuda.current_device()
    yield
    torch.cuda.set_device(before)


def check_unchanged(caller: int, context: int) -> None:
    assert current_context() == context, "kvikpy changed the thread's current CUDA context"
    assert torch.cuda.current_device() == caller
    assert torch.zeros(1, device="cuda").device.index == caller


def run_and_check(op: str, caller: int, target: int, data, tmp_path) -> None:
    torch.cuda.set_device(caller)
    torch.cuda.synchronize()
    context = current_context()
    assert context != 0
    made = OPS[op](target, data[0], tmp_path)
    check_unchanged(caller, context)
    del made  # destructors (device memory, events, pinned memory) run in this thread
    gc.collect()
    check_unchanged(caller, context)
    assert kvikpy.read(data[0], size=4096).device == f"cuda:{caller}"
    check_unchanged(caller, context)


@pytest.mark.parametrize("op", sorted(set(OPS) - TORCH_OPS))
def test_a_thread_without_a_context_keeps_none(op, data, tmp_path):
    """On any number of GPUs: a thread with no current context has none afterwards."""
    outcome: list[BaseException | tuple[int, int, int]] = []

    def worker() -> None:
        try:
            before = current_context()
            made = OPS[op](0, data[0], tmp_path)
            after_call = current_context()
            del made
            gc.collect()
            outcome.append((before, after_call, current_context()))
        except BaseException as e:
            outcome.append(e)

    thread = threading.Thread(target=worker)
    thread.start()
    thread.join()
    result = outcome[0]
    if isinstance(result, BaseException):
        raise result
    assert result == (0, 0, 0), "kvikpy left a CUDA context current on a thread that had none"


@pytest.mark.parametrize("op", sorted(OPS))
def test_the_current_device_is_kept_on_one_gpu(op, data, tmp_path, restore_torch_device):
    run_and_check(op, 0, 0, data, tmp_path)


@pytest.mark.multi_gpu
@pytest.mark.parametrize(("caller", "target"), [(0, 1), (1, 0)])
@pytest.mark.parametrize("op", sorted(OPS))
def test_the_current_device_is_kept_across_gpus(
    op, caller, target, data, tmp_path, restore_torch_device
):
    run_and_check(op, caller, target, data, tmp_path)


@pytest.mark.multi_gpu
def test_device_cuda_means_the_callers_current_device(data, restore_torch_device):
    for ordinal in (1, 0, 1):
        torch.cuda.set_device(ordinal)
        buf = kvikpy.read(data[0])
        assert buf.device == f"cuda:{ordinal}"
        t = torch.from_dlpack(buf)
        assert t.device.index == ordinal
        assert t.cpu().numpy().tobytes() == data[1]


@pytest.mark.multi_gpu
def test_pinned_host_memory_belongs_to_the_device_it_serves(data, restore_torch_device):
    """A GPU buffer's host copy is pinned under its own device's context, not GPU 0's."""
    attribute_context = 1  # CU_POINTER_ATTRIBUTE_CONTEXT
    torch.cuda.set_device(0)
    for ordinal in (1, 0):
        buf = kvikpy.read(data[0], device=ordinal)
        host = buf.to_numpy()  # copied through pinned host memory kvikpy allocates
        ctx = ctypes.c_void_p()
        rc = _cuda.cuPointerGetAttribute(
            ctypes.byref(ctx), attribute_context, ctypes.c_uint64(host.ctypes.data)
        )
        assert rc == 0
        torch.cuda.set_device(ordinal)
        assert ctx.value == current_context()
        torch.cuda.set_device(0)
        assert host.tobytes() == data[1]
