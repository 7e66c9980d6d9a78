"""kvikpy waits for the work torch has queued on a tensor before it reads or writes it:
torch's ``__cuda_array_interface__`` names no stream, so kvikpy asks torch which stream
is current on the tensor's device (plain tensors and parameters) or takes the tensor
through DLPack (subclasses), and waits for that stream's work. Each case queues a long
spin kernel and then the kernel that makes the tensor's bytes, and calls kvikpy at once:
without the wait, kvikpy would see (or be overwritten by) the bytes from before."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import kvikpy

torch = pytest.importorskip("torch")

N = 16 << 20
# About 0.1 s of spinning on an H100 (torch.cuda._sleep counts GPU clock cycles): far
# longer than kvikpy's call takes to start its copy.
SPIN = 200_000_000


@pytest.fixture(params=["default stream", "side stream"])
def on_stream(request):
    if request.param == "default stream":
        yield
        return
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        yield


def test_a_write_waits_for_the_kernel_that_computed_the_tensor(tmp_path: Path, on_stream):
    t = torch.zeros(N, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    torch.cuda._sleep(SPIN)
    t.fill_(7)  # queued behind the spin: not done when the write starts
    with kvikpy.CuFile(tmp_path / "out.bin", "w") as f:
        assert f.write(t) == N
    assert (tmp_path / "out.bin").read_bytes() == b"\x07" * N


def test_a_read_lands_after_the_kernels_already_queued_on_the_tensor(tmp_path: Path, on_stream):
    data = os.urandom(N)
    (tmp_path / "in.bin").write_bytes(data)
    t = torch.empty(N, dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    torch.cuda._sleep(SPIN)
    t.fill_(0)  # queued behind the spin: it must not overwrite what the read brings
    with kvikpy.CuFile(tmp_path / "in.bin") as f:
        assert f.read(t) == N
    torch.cuda.synchronize()
    assert t.cpu().numpy().tobytes() == data


class InterfaceNamingStream:
    """A CUDA array interface (version 3) over a torch tensor that names ``stream``."""

    def __init__(self, t, stream) -> None:
        self.__cuda_array_interface__ = {
            "data": (t.data_ptr(), False),
            "shape": (t.numel(),),
            "typestr": "|u1",
            "strides": None,
            "version": 3,
            "stream": stream.cuda_stream,
        }


@pytest.mark.parametrize("handed", ["torch tensor", "interface naming its stream"])
def test_raw_read_async_orders_the_producers_stream_before_its_own_without_blocking(
    tmp_path: Path, handed: str
):
    # The tensor's last writer is queued on one stream, the read is ordered on another:
    # the read's stream waits for the writer on the GPU, and the call returns at once,
    # while the writer still runs.
    data = os.urandom(N)
    (tmp_path / "in.bin").write_bytes(data)
    expected = sum(data)
    t = torch.empty(N, dtype=torch.uint8, device="cuda")
    t.fill_(1)  # the fill kernel loaded before the spin (loading it would wait for the GPU)
    with kvikpy.CuFile(tmp_path / "in.bin") as f:
        # A small read first leaves only small pinned buffers idle: the stream-ordered
        # call needs larger ones, and must not free these (that waits for the GPU).
        assert f.read(t, 1 << 20) == 1 << 20
    producer, consumer = torch.cuda.Stream(), torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(producer):
        torch.cuda._sleep(SPIN)
        t.fill_(0)
        buf = t if handed == "torch tensor" else InterfaceNamingStream(t, producer)
        with kvikpy.CuFile(tmp_path / "in.bin") as f:
            future = f.raw_read_async(buf, consumer.cuda_stream)
            writer_running = not producer.query()
            with torch.cuda.stream(consumer):
                total = t.to(torch.int64).sum()  # later work on the read's stream
            assert future.check_bytes_done() == N
    consumer.synchronize()
    assert int(total) == expected
    assert writer_running, "raw_read_async returned only after the writer's work had run"


class TensorSubclass(torch.Tensor):
    """A subclass: kvikpy takes it through DLPack, not the plain-tensor path."""


@pytest.mark.parametrize("kind", ["4 KiB into a tensor", "parameter", "subclass"])
def test_small_reads_wait_too_whatever_the_tensor_type(tmp_path: Path, on_stream, kind: str):
    data = os.urandom(4096)
    (tmp_path / "in.bin").write_bytes(data)
    t = torch.empty(4096, dtype=torch.uint8, device="cuda")
    if kind == "parameter":
        t = torch.nn.Parameter(t, requires_grad=False)
    elif kind == "subclass":
        t = t.as_subclass(TensorSubclass)
    torch.cuda.synchronize()
    torch.cuda._sleep(SPIN)
    t.fill_(0)
    with kvikpy.CuFile(tmp_path / "in.bin") as f:
        assert f.read(t) == 4096
    torch.cuda.synchronize()
    assert t.detach().cpu().numpy().tobytes() == data


def test_tensors_the_fast_path_leaves_alone_keep_their_errors(tmp_path: Path):
    (tmp_path / "in.bin").write_bytes(os.urandom(8192))
    strided = torch.zeros(8192, dtype=torch.uint8, device="cuda")[::2]
    grad = torch.zeros(1024, dtype=torch.float32, device="cuda", requires_grad=True)
    with kvikpy.CuFile(tmp_path / "in.bin") as f:
        with pytest.raises((ValueError, RuntimeError, TypeError, BufferError)):
            f.read(strided)
        with pytest.raises((ValueError, RuntimeError, TypeError, BufferError)):
            f.read(grad)
    assert not strided.any() and not grad.detach().any()
