"""Remote files on WebHDFS, against a small WebHDFS server on loopback
(tests/webhdfs_server.py: GETFILESTATUS, OPEN with offset and length, the name node's
redirect to a data node, Hadoop's JSON errors)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import random_bytes
from remote_servers import serve
from webhdfs_server import Requests, WebHdfsHandler

import kvikpy
from kvikpy import RemoteEndpointType, RemoteFile

MiB = 1 << 20
DATA = random_bytes(3 * MiB + 17, seed=21)


@pytest.fixture
def webhdfs(tmp_path: Path):
    (tmp_path / "home" / "user").mkdir(parents=True)
    (tmp_path / "home" / "user" / "data.bin").write_bytes(DATA)
    requests = Requests()
    with serve(WebHdfsHandler, root=tmp_path, requests=requests) as url:
        yield url, requests


def test_size_and_type(webhdfs):
    url, requests = webhdfs
    for query in ("", "?op=OPEN"):
        with RemoteFile.open_webhdfs(f"{url}/webhdfs/v1/home/user/data.bin{query}") as f:
            assert f.nbytes() == len(DATA)
            assert f.remote_endpoint_type() is RemoteEndpointType.WEBHDFS
            assert f.url == f"{url}/webhdfs/v1/home/user/data.bin"
    assert requests.log[0][1]["op"] == ["GETFILESTATUS"]


@pytest.mark.parametrize("threads", [1, 4])
@pytest.mark.parametrize(("offset", "size"), [(0, len(DATA)), (800, 80), (MiB - 1, 2 * MiB)])
def test_parallel_reads(webhdfs, threads, offset, size):
    url, requests = webhdfs
    with kvikpy.defaults.set({"num_threads": threads, "task_size": 1 << 19}):
        f = RemoteFile.open_webhdfs(f"{url}/webhdfs/v1/home/user/data.bin")
        buf = np.zeros(size, dtype=np.uint8)
        assert f.pread(buf, file_offset=offset).get() == size
    assert buf.tobytes() == DATA[offset : offset + size]
    opens = [q for path, q in requests.log if q.get("op") == ["OPEN"]]
    # Every OPEN reached the data node after the name node's redirect.
    assert len([p for p, q in requests.log if p.startswith("/datanode")]) == len(opens) // 2
    assert sum(int(q["length"][0]) for p, q in requests.log if p.startswith("/datanode")) == size


def test_user_name_from_the_url_or_the_environment(webhdfs, monkeypatch):
    url, requests = webhdfs
    RemoteFile.open_webhdfs(f"{url}/webhdfs/v1/home/user/data.bin?user.name=ann").read(
        bytearray(10)
    )
    assert all(q.get("user.name") == ["ann"] for _, q in requests.log)
    requests.log.clear()
    monkeypatch.setenv("KVIKIO_WEBHDFS_USERNAME", "bob")
    RemoteFile.open_webhdfs(f"{url}/webhdfs/v1/home/user/data.bin").read(bytearray(10))
    assert requests.log and all(q.get("user.name") == ["bob"] for _, q in requests.log)


def test_open_infers_webhdfs_and_kvikpy_read_takes_its_urls(webhdfs):
    url, _ = webhdfs
    full = f"{url}/webhdfs/v1/home/user/data.bin"
    with RemoteFile.open(full) as f:
        assert f.remote_endpoint_type() is RemoteEndpointType.WEBHDFS
    assert np.from_dlpack(kvikpy.read(full, device="cpu")).tobytes() == DATA
    short = url.replace("http://", "webhdfs://") + "/home/user/data.bin"
    part = kvikpy.read(short, offset=5, size=100, device="cpu")
    assert np.from_dlpack(part).tobytes() == DATA[5:105]


def test_missing_file(webhdfs):
    url, _ = webhdfs
    with pytest.raises(FileNotFoundError, match="FileNotFoundException"):
        RemoteFile.open_webhdfs(f"{url}/webhdfs/v1/home/user/missing.bin")
