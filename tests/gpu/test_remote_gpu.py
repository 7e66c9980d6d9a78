"""Remote files into GPU memory: RemoteFile reads and preads into torch and CuPy device
arrays, kvikpy.read / read_many / read_ranges of URLs on the GPU (stream-ordered too),
through the pinned bounce buffers (a range request per task), against real servers on
loopback; every byte checked, the data random (never zeros)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import random_bytes
from remote_servers import Counter, CountingRangeHandler, StatusHandler, serve
from webhdfs_server import Requests, WebHdfsHandler

import kvikpy
from kvikpy import RemoteFile
from kvikpy._http_server import QuietRequestHandler

torch = pytest.importorskip("torch")
cupy = pytest.importorskip("cupy")

MiB = 1 << 20
DATA = random_bytes(21 * MiB + 4321, seed=31)
SMALL = random_bytes(3000, seed=32)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "data.bin").write_bytes(DATA)
    (tmp_path / "small.bin").write_bytes(SMALL)
    return tmp_path


@pytest.fixture
def server(root: Path):
    counter = Counter()
    with serve(CountingRangeHandler, directory=str(root), counter=counter) as url:
        yield url, counter


def on_host(t) -> bytes:
    if isinstance(t, torch.Tensor):
        return t.cpu().numpy().tobytes()
    return cupy.asnumpy(t).tobytes()


@pytest.mark.parametrize("threads", [1, 16])
def test_device_reads_ask_for_whole_tasks_like_host_reads(server, threads):
    # Each piece of a device pipeline is an HTTP request: cutting 4 MiB tasks into 1 MiB
    # pieces (the rule for files on one thread) made one thread 0.59x kvikio on the H100.
    url, counter = server
    with (
        kvikpy.defaults.set({"num_threads": threads, "task_size": 4 * MiB}),
        RemoteFile.open_http(f"{url}/data.bin") as f,
    ):
        before = counter.count
        host = bytearray(f.nbytes())
        assert f.read(host) == len(DATA)
        host_requests = counter.count - before
        t = torch.empty(f.nbytes(), dtype=torch.uint8, device="cuda")
        assert f.read(t) == len(DATA)
        device_requests = counter.count - before - host_requests
    assert bytes(host) == DATA and on_host(t) == DATA
    assert host_requests >= len(DATA) // (4 * MiB)
    assert device_requests == host_requests, counter.ranges[before:]


@pytest.mark.parametrize("threads", [1, 4, 16])
@pytest.mark.parametrize("task_size", [MiB, 4 * MiB])
def test_read_into_torch(server, threads, task_size):
    url, _ = server
    with (
        kvikpy.defaults.set({"num_threads": threads, "task_size": task_size}),
        RemoteFile.open_http(f"{url}/data.bin") as f,
    ):
        t = torch.empty(f.nbytes(), dtype=torch.uint8, device="cuda")
        assert f.read(t) == len(DATA)
    assert on_host(t) == DATA


@pytest.mark.parametrize(("offset", "size"), [(0, 1), (7, 4096), (MiB - 3, 9 * MiB + 5)])
def test_pread_into_cupy_at_offsets(server, offset, size):
    url, _ = server
    f = RemoteFile.open_http(f"{url}/data.bin")
    a = cupy.zeros(size + 16, dtype=cupy.uint8)
    assert f.pread(a, size, offset).get() == size
    got = cupy.asnumpy(a)
    assert got[:size].tobytes() == DATA[offset : offset + size]
    assert not got[size:].any()


def test_small_bounce_buffers_cut_device_reads_into_chunk_ranges(server):
    url, counter = server
    with kvikpy.defaults.set({"bounce_buffer_size": 256 << 10, "task_size": 4 * MiB}):
        f = RemoteFile.open_http(f"{url}/data.bin")
        t = torch.empty(4 * MiB, dtype=torch.uint8, device="cuda")
        assert f.read(t, file_offset=MiB) == 4 * MiB
    assert on_host(t) == DATA[MiB : 5 * MiB]
    # Each range fits a bounce buffer: the file is never staged whole in host memory.
    sizes = [int(r.split("-")[1]) - int(r.split("=")[1].split("-")[0]) + 1 for r in counter.ranges]
    assert max(sizes) <= 256 << 10 and sum(sizes) == 4 * MiB


def test_kvikpy_read_of_urls_on_the_gpu(server):
    url, _ = server
    t = torch.from_dlpack(kvikpy.read(f"{url}/data.bin"))
    assert t.is_cuda and on_host(t) == DATA
    part = torch.from_dlpack(kvikpy.read(f"{url}/data.bin", offset=12345, size=3 * MiB))
    assert on_host(part) == DATA[12345 : 12345 + 3 * MiB]
    stream = torch.cuda.Stream()
    ordered = kvikpy.read(f"{url}/data.bin", offset=5, size=2 * MiB, stream=stream)
    stream.synchronize()
    assert on_host(torch.from_dlpack(ordered)) == DATA[5 : 5 + 2 * MiB]


def test_batches_of_urls_on_the_gpu(server, root):
    url, _ = server
    batch = kvikpy.read_many([f"{url}/small.bin", str(root / "data.bin"), f"{url}/data.bin"])
    got = cupy.asnumpy(cupy.from_dlpack(batch.buffer)).tobytes()
    assert got == SMALL + DATA + DATA
    ranges = [(0, 100), (5 * MiB + 1, 2 * MiB), (21 * MiB, 4321)]
    batch = kvikpy.read_ranges(f"{url}/data.bin", ranges)
    got = cupy.asnumpy(cupy.from_dlpack(batch.buffer)).tobytes()
    assert got == b"".join(DATA[o : o + n] for o, n in ranges)


def test_server_without_ranges_on_the_gpu(root):
    with serve(QuietRequestHandler, directory=str(root)) as url:
        f = RemoteFile.open_http(f"{url}/small.bin")
        t = torch.empty(len(SMALL), dtype=torch.uint8, device="cuda")
        assert f.read(t) == len(SMALL)  # the whole file in one request
        assert on_host(t) == SMALL
        with pytest.raises(OverflowError, match="doesn't support file ranges"):
            f.read(t, size=10, file_offset=10)


def test_errors_during_device_reads(root):
    with serve(StatusHandler, directory=str(root), status=404) as url:
        f = RemoteFile.open_http(f"{url}/data.bin", nbytes=len(DATA))
        t = torch.empty(len(DATA), dtype=torch.uint8, device="cuda")
        with pytest.raises(FileNotFoundError):
            f.pread(t).get()
    # The device and kvikpy still work afterwards.
    with serve(CountingRangeHandler, directory=str(root), counter=Counter()) as url:
        assert on_host(torch.from_dlpack(kvikpy.read(f"{url}/small.bin"))) == SMALL


def test_webhdfs_into_device_memory(root):
    (root / "hdfs").mkdir()
    (root / "hdfs" / "data.bin").write_bytes(DATA)
    with serve(WebHdfsHandler, root=root, requests=Requests()) as url:
        f = RemoteFile.open_webhdfs(f"{url}/webhdfs/v1/hdfs/data.bin")
        a = cupy.empty(f.nbytes(), dtype=cupy.uint8)
        assert f.read(a) == len(DATA)
    assert cupy.asnumpy(a).tobytes() == DATA
    assert np.frombuffer(DATA[:16], dtype=np.uint8).any()
