"""Remote files over HTTP: kvikpy.RemoteFile against real servers on loopback (kvikpy's
range-support file server, Python's plain one without range support), kvikpy.read,
read_many and read_ranges of URLs, endpoint-type rules, kvikpy.utils.LocalHttpServer,
and the http_* settings."""

from __future__ import annotations

import multiprocessing
import pickle
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import random_bytes
from remote_servers import Counter, CountingRangeHandler, serve

import kvikpy
from kvikpy import RemoteEndpointType, RemoteFile, defaults
from kvikpy._http_server import (
    QuietRequestHandler,
    RangeRequestHandler,
    _first_address,
    parse_range,
)
from kvikpy.errors import NegativeValueError, RemoteRangeError, RemoteUrlError
from kvikpy.utils import LocalHttpServer

MiB = 1 << 20


@pytest.fixture
def files(tmp_path: Path) -> dict[str, bytes]:
    """Files of random bytes in ``tmp_path``, by name."""
    contents = {
        "small.bin": random_bytes(1000, seed=1),
        "large.bin": random_bytes(9 * MiB + 12345, seed=2),
        "empty.bin": b"",
        "dir/a b+c.bin": random_bytes(4097, seed=3),
    }
    for name, data in contents.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(data)
    return contents


@pytest.fixture
def server(tmp_path: Path, files: dict[str, bytes]):
    with serve(RangeRequestHandler, directory=str(tmp_path)) as url:
        yield url


def test_open_http_size_str_and_type(server, files):
    with RemoteFile.open_http(f"{server}/small.bin") as f:
        assert f.nbytes() == len(files["small.bin"])
        assert f"{server}/small.bin" in str(f)
        assert str(f).startswith("<RemoteFile ")
        assert f.remote_endpoint_type() is RemoteEndpointType.HTTP
        assert not f.closed
    assert f.closed
    f.close()  # idempotent


@pytest.mark.parametrize("threads", [1, 3])
@pytest.mark.parametrize(
    ("name", "task_size"), [("small.bin", 99), ("small.bin", 999), ("large.bin", 4 * MiB)]
)
def test_read_whole_file_host(server, files, threads, name, task_size):
    data = files[name]
    with (
        defaults.set({"num_threads": threads, "task_size": task_size}),
        RemoteFile.open_http(f"{server}/{name}") as f,
    ):
        buf = np.zeros(f.nbytes(), dtype=np.uint8)
        assert f.read(buf) == len(data)
    assert buf.tobytes() == data


@pytest.mark.parametrize(
    ("offset", "size"), [(0, 1), (1, 4096), (4095, 2), (12345, 5 * MiB), (9 * MiB, 12345)]
)
def test_pread_ranges(server, files, offset, size):
    data = files["large.bin"]
    with RemoteFile.open_http(f"{server}/large.bin") as f:
        buf = bytearray(size + 7)
        fut = f.pread(buf, size, offset, task_size=MiB)
        assert isinstance(fut, kvikpy.IOFuture)
        assert fut.get() == size
    assert bytes(buf[:size]) == data[offset : offset + size]
    assert bytes(buf[size:]) == bytes(7)


def test_reads_split_into_parallel_range_requests(tmp_path, files):
    counter = Counter()
    with (
        serve(CountingRangeHandler, directory=str(tmp_path), counter=counter) as url,
        defaults.set({"num_threads": 4, "task_size": MiB}),
    ):
        f = RemoteFile.open_http(f"{url}/large.bin")
        buf = bytearray(f.nbytes())
        assert f.read(buf, task_size=MiB) == len(buf)
    assert bytes(buf) == files["large.bin"]
    ranges = sorted(counter.ranges, key=lambda r: int(r.split("=")[1].split("-")[0]))
    assert len(ranges) == 10  # 9 MiB + 12345 bytes in 1 MiB requests
    assert ranges[0] == f"bytes=0-{MiB - 1}"
    assert ranges[-1] == f"bytes={9 * MiB}-{len(buf) - 1}"


def test_read_past_the_end_is_a_value_error(server, files):
    with RemoteFile.open_http(f"{server}/small.bin") as f:
        with pytest.raises(ValueError, match=r"cannot read 0\+2000 bytes into a 1000 bytes file"):
            f.read(bytearray(2000))
        with pytest.raises(ValueError, match=r"cannot read 999\+5 bytes into a 1000 bytes file"):
            f.read(bytearray(100), size=5, file_offset=999)
        assert f.read(bytearray(10), size=0, file_offset=1000) == 0


def test_negative_size_or_offset_is_kvikpys_negative_value_error(server, files):
    with RemoteFile.open_http(f"{server}/small.bin") as f:
        for size, offset in ((-1, 0), (1, -1)):
            with pytest.raises(NegativeValueError, match="negative value") as info:
                f.read(bytearray(10), size, offset)
            # Both what kvikpy raises for bad arguments and what kvikio raises.
            assert isinstance(info.value, ValueError)
            assert isinstance(info.value, OverflowError)


def test_nbytes_given_skips_the_size_request(tmp_path, files):
    counter = Counter()
    with (
        serve(CountingRangeHandler, directory=str(tmp_path), counter=counter) as url,
        RemoteFile.open_http(f"{url}/small.bin", nbytes=10) as f,
    ):
        assert f.nbytes() == 10
        buf = bytearray(10)
        f.read(buf)
    assert bytes(buf) == files["small.bin"][:10]
    assert counter.count == 1  # the GET only: no HEAD was sent (HEAD is not counted) ...
    assert counter.ranges == ["bytes=0-9"]


def test_special_characters_in_paths(server, files):
    with RemoteFile.open_http(f"{server}/dir/a b+c.bin") as f:
        buf = bytearray(f.nbytes())
        f.read(buf)
    assert bytes(buf) == files["dir/a b+c.bin"]


def test_server_without_range_support(tmp_path, files):
    with (
        serve(QuietRequestHandler, directory=str(tmp_path)) as url,
        RemoteFile.open_http(f"{url}/small.bin") as f,
    ):
        assert f.nbytes() == 1000
        for offset in (0, 10):
            with pytest.raises(OverflowError, match="maybe the server doesn't support file ranges"):
                f.read(bytearray(10), size=10, file_offset=offset)
        with pytest.raises(RemoteRangeError) as info:
            f.read(bytearray(10))
        assert isinstance(info.value, OSError) and info.value.filename == f"{url}/small.bin"
        # A read of the whole file, in one request, is what the server's answer is.
        whole = bytearray(1000)
        assert f.read(whole) == 1000
    assert bytes(whole) == files["small.bin"]


def test_kvikpy_read_of_a_url(server, files):
    data = files["large.bin"]
    buf = kvikpy.read(f"{server}/large.bin", device="cpu")
    assert np.from_dlpack(buf).tobytes() == data
    part = kvikpy.read(f"{server}/large.bin", offset=123, size=4567, device="cpu", dtype="uint8")
    assert np.from_dlpack(part).tobytes() == data[123 : 123 + 4567]
    empty = kvikpy.read(f"{server}/empty.bin", device="cpu")
    assert np.from_dlpack(empty).size == 0
    with pytest.raises(ValueError, match="past the end"):
        kvikpy.read(f"{server}/small.bin", offset=10, size=1000, device="cpu")
    with pytest.raises(FileNotFoundError):
        kvikpy.read(f"{server}/missing.bin", device="cpu")


def test_read_many_and_read_ranges_of_urls(server, files, tmp_path):
    local = tmp_path / "small.bin"
    urls = [f"{server}/large.bin", str(local), f"{server}/small.bin"]
    batch = kvikpy.read_many(urls, device="cpu")
    got = np.from_dlpack(batch.buffer).tobytes()
    assert got == files["large.bin"] + files["small.bin"] + files["small.bin"]
    data = files["large.bin"]
    ranges = [(0, 10), (MiB - 3, 2 * MiB), (9 * MiB, 100)]
    batch = kvikpy.read_ranges(f"{server}/large.bin", ranges, device="cpu")
    expected = b"".join(data[o : o + n] for o, n in ranges)
    assert np.from_dlpack(batch.buffer).tobytes() == expected
    with pytest.raises(FileNotFoundError):
        kvikpy.read_many([f"{server}/missing.bin"], device="cpu")


def test_urls_are_read_only(server):
    with pytest.raises(Exception, match="reads only"):
        kvikpy.CuFile(f"{server}/small.bin", "r+")


def test_cufile_of_a_url_reads_it(server, files):
    with kvikpy.CuFile(f"{server}/small.bin") as f:
        assert f.path == f"{server}/small.bin"
        assert pickle.loads(pickle.dumps(f)).path == f.path
        assert f.nbytes() == 1000
        assert f.backend[0] == "remote"
        buf = bytearray(1000)
        assert f.read(buf) == 1000
    assert bytes(buf) == files["small.bin"]


def test_open_infers_and_checks_the_endpoint_type(server):
    url = f"{server}/small.bin"
    with RemoteFile.open(url) as f:
        assert f.remote_endpoint_type() is RemoteEndpointType.HTTP
    with RemoteFile.open(url, RemoteEndpointType.HTTP, nbytes=3) as f:
        assert f.nbytes() == 3
    with pytest.raises(RuntimeError, match="not in the allowlist"):
        RemoteFile.open(url, RemoteEndpointType.HTTP, [RemoteEndpointType.WEBHDFS])
    with pytest.raises(RemoteUrlError, match="Invalid URL for WebHDFS"):
        RemoteFile.open(url, RemoteEndpointType.WEBHDFS)
    with pytest.raises(RuntimeError, match="Unsupported endpoint URL"):
        RemoteFile.open(url, allow_list=[RemoteEndpointType.S3])
    with pytest.raises(ValueError, match="Bad scheme"):
        RemoteFile.open("://bucket/object")
    with pytest.raises(RuntimeError, match="Unsupported endpoint URL"):
        RemoteFile.open("unsupported://bucket/object")


def test_infer_remote_endpoint_type():
    infer = kvikpy.infer_remote_endpoint_type
    assert infer("http://example.com/a.bin") is RemoteEndpointType.HTTP
    assert infer("http://nn:9870/webhdfs/v1/a.bin") is RemoteEndpointType.WEBHDFS
    presigned = (
        "https://b.s3.us-east-1.amazonaws.com/k?X-Amz-Algorithm=AWS4-HMAC-SHA256"
        "&X-Amz-Credential=c&X-Amz-Signature=s"
    )
    assert infer(presigned) is RemoteEndpointType.S3_PRESIGNED_URL
    assert infer("s3://bucket/key") in (RemoteEndpointType.S3, RemoteEndpointType.S3_PUBLIC)
    with pytest.raises(RemoteUrlError, match="Unsupported endpoint URL"):
        infer("s3://bucket")
    assert kvikpy.is_remote_file_available() is True
    assert kvikpy.remote_file.RemoteFile is RemoteFile


def test_local_http_server_matches_kvikio(tmp_path, files):
    with LocalHttpServer(tmp_path, max_lifetime=60) as server:
        assert server.url == f"http://{server.ip}:{server.port}"
        with RemoteFile.open_http(f"{server.url}/large.bin") as f:
            buf = bytearray(f.nbytes())
            f.read(buf)
    assert bytes(buf) == files["large.bin"]
    with (
        LocalHttpServer(tmp_path, range_support=False, max_lifetime=60) as server,
        RemoteFile.open_http(f"{server.url}/small.bin") as f,
        pytest.raises(OverflowError),
    ):
        f.read(bytearray(10))


@pytest.mark.parametrize(
    ("header", "size", "expected"),
    [
        ("bytes=0-9", 100, (0, 9)),
        ("bytes=90-200", 100, (90, 99)),
        ("bytes=-10", 100, (90, 99)),
        ("bytes=95-", 100, (95, 99)),
        ("bytes=100-", 100, False),
        ("bytes=5-2", 100, False),
        ("bytes=0-1,5-6", 100, None),
        ("items=0-1", 100, None),
    ],
)
def test_range_header_parsing(header, size, expected):
    assert parse_range(header, size) == expected


def test_http_settings_follow_kvikio():
    assert defaults.get("http_max_attempts") == 3
    assert defaults.get("http_status_codes") == [429, 500, 502, 503, 504]
    assert defaults.get("http_timeout") == 60
    with defaults.set({"http_max_attempts": 5, "http_status_codes": [500], "http_timeout": 2}):
        assert defaults.get("http_max_attempts") == 5
        assert defaults.get("http_status_codes") == [500]
        assert defaults.get("http_timeout") == 2
        defaults.set("http_status_codes", (503, 429))
        assert defaults.get("http_status_codes") == [503, 429]
    assert defaults.get("http_status_codes") == [429, 500, 502, 503, 504]
    for name in ("http_max_attempts", "http_timeout"):
        with pytest.raises(ValueError, match="positive integer"):
            defaults.set(name, 0)
    for bad in (0, ["a"], "503", [True]):
        with pytest.raises(TypeError):
            defaults.set("http_status_codes", bad)
    with pytest.raises(ValueError, match="at most 32"):
        defaults.set("http_status_codes", list(range(400, 440)))


@pytest.mark.timeout(120)
def test_local_http_server_reports_a_server_process_that_dies_before_serving():
    # A real spawned process that exits at once with status 3, never reporting an
    # address: the wait ends as soon as it is gone, naming its exit code, instead of a
    # bare queue.Empty after the whole timeout. The timeout given (an hour) is far past
    # the test's own: a wait that did not notice the exit would fail through
    # pytest-timeout, not pass late.
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=sys.exit, args=(3,), daemon=True)
    process.start()
    with pytest.raises(RuntimeError, match="exited with code 3 before it served"):
        _first_address(queue, process, timeout=3600)


def test_local_http_server_wait_is_bounded_for_a_process_that_never_serves():
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    process = context.Process(target=time.sleep, args=(60,), daemon=True)
    process.start()
    with pytest.raises(TimeoutError, match=r"did not start serving within 0\.5 s"):
        _first_address(queue, process, timeout=0.5)
    process.join(timeout=10)
    assert not process.is_alive(), "the stuck server process is killed"
