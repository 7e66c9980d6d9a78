"""A remote file's reads are pinned to the version the server gave when it was opened
(its ``ETag``, sent back as ``If-Match`` on every ranged GET): a file replaced on the
server between open and read is one clear error, never a mix of two versions. Against
real loopback servers: kvikpy's range server (which sends ``ETag`` and honours
``If-Match``), one that replaces the file right after sizing it, one without ``ETag``."""

from __future__ import annotations

import errno
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from conftest import random_bytes
from remote_servers import (
    Counter,
    CountingRangeHandler,
    NoEtagHandler,
    ReplacingHandler,
    replace_file,
    serve,
)

import kvikpy
from kvikpy import RemoteFile, defaults
from kvikpy._http_server import entity_tag
from kvikpy.errors import RemoteError

pytestmark = pytest.mark.timeout(60)

MiB = 1 << 20
OLD = random_bytes(3 * MiB + 17, seed=31)
NEW = random_bytes(len(OLD), seed=32)  # the same size: only the version tells them apart


@pytest.fixture
def path(tmp_path: Path) -> Path:
    (tmp_path / "f.bin").write_bytes(OLD)
    return tmp_path / "f.bin"


def check_changed(info: pytest.ExceptionInfo[RemoteError], url: str, old: str) -> None:
    """The error of a read of a file that changed since it was opened."""
    e = info.value
    assert isinstance(e, OSError) and e.errno == errno.ESTALE
    assert e.filename == url
    text = str(e)
    assert f"GET {url} (bytes=" in text
    assert "changed on the server since it was opened" in text
    assert old in text
    assert "Open the file again and read it again" in text


@contextmanager
def opened(handler: type[CountingRangeHandler], path: Path, counter: Counter) -> Iterator[Any]:
    """A server of ``path``'s directory with ``handler``, and ``path`` opened on it:
    yields ``(server URL, RemoteFile)``."""
    with (
        serve(handler, directory=str(path.parent), counter=counter) as server,
        RemoteFile.open_http(f"{server}/f.bin") as f,
    ):
        yield server, f


def test_a_file_replaced_after_open_is_an_error_not_mixed_bytes(path):
    with opened(CountingRangeHandler, path, Counter()) as (server, f):
        old = entity_tag(path.stat())
        replace_file(path, NEW)
        new = entity_tag(path.stat())
        assert new != old
        buf = bytearray(len(OLD))
        with pytest.raises(RemoteError) as info:
            f.read(buf, task_size=MiB)
        check_changed(info, f"{server}/f.bin", old)
        # kvikpy's server answers 412 with the file's ETag now: both are named.
        assert new in str(info.value)
        assert buf != NEW
        # Opened again, the file reads whole, at its new version.
        with RemoteFile.open_http(f"{server}/f.bin") as again:
            buf = bytearray(again.nbytes())
            assert again.read(buf, task_size=MiB) == len(NEW)
        assert bytes(buf) == NEW


def test_cufile_of_a_url_replaced_after_open(path):
    with serve(CountingRangeHandler, directory=str(path.parent), counter=Counter()) as server:
        url = f"{server}/f.bin"
        with kvikpy.CuFile(url) as f:
            old = entity_tag(path.stat())
            replace_file(path, NEW)
            with pytest.raises(RemoteError) as info:
                f.read(bytearray(len(OLD)))
        check_changed(info, url, old)


def test_kvikpy_read_of_a_file_replaced_between_size_and_data(path):
    counter = Counter()
    replacement = [NEW]
    url_of = "{}/f.bin".format
    old = entity_tag(path.stat())
    with (
        defaults.set("task_size", MiB),
        serve(
            ReplacingHandler,
            directory=str(path.parent),
            counter=counter,
            replacement=replacement,
        ) as server,
    ):
        with pytest.raises(RemoteError) as info:
            kvikpy.read(url_of(server), device="cpu")
        check_changed(info, url_of(server), old)
        assert not replacement  # the server did replace it after sizing it
        # Each ranged GET of that read asked for the version sized: the server refused
        # them (412). Read again, the file is its new version, whole.
        assert counter.if_matches and set(counter.if_matches) == {old}
        assert bytes(kvikpy.read(url_of(server), device="cpu")) == NEW


def test_read_many_of_a_file_replaced_between_size_and_data(path):
    counter = Counter()
    old = entity_tag(path.stat())
    with (
        defaults.set("task_size", MiB),
        serve(
            ReplacingHandler, directory=str(path.parent), counter=counter, replacement=[NEW]
        ) as server,
    ):
        url = f"{server}/f.bin"
        # Sized when the batch is planned, then opened again by each task to read: each
        # opening is pinned to the version sized.
        with pytest.raises(RemoteError) as info:
            kvikpy.read_many([url], device="cpu")
        check_changed(info, url, old)
        assert counter.if_matches and set(counter.if_matches) == {old}
        assert bytes(kvikpy.read_many([url], device="cpu").buffer) == NEW


def test_unchanged_files_read_as_before_each_get_pinned(path):
    counter = Counter()
    with (
        serve(CountingRangeHandler, directory=str(path.parent), counter=counter) as server,
        defaults.set({"num_threads": 3, "task_size": MiB}),
    ):
        etag = entity_tag(path.stat())
        with RemoteFile.open_http(f"{server}/f.bin") as f:
            buf = bytearray(f.nbytes())
            assert f.read(buf) == len(OLD)
            assert bytes(buf) == OLD
        assert bytes(kvikpy.read(f"{server}/f.bin", device="cpu")) == OLD
        ranges = kvikpy.read_ranges(f"{server}/f.bin", [(5, 10), (2 * MiB, 100)], device="cpu")
        assert bytes(ranges.buffer) == OLD[5:15] + OLD[2 * MiB : 2 * MiB + 100]
        assert counter.count == 2 * 4 + 2  # 3 MiB + 17 bytes in 1 MiB tasks, twice; 2 ranges
        batch = kvikpy.read_many([f"{server}/f.bin"], device="cpu")
        assert bytes(batch.buffer) == OLD
    gets = counter.count
    assert gets > 2 * 4 + 2
    assert counter.if_matches == [etag] * gets
    assert all(r is not None and r.startswith("bytes=") for r in counter.ranges)


def test_a_server_without_etag_reads_as_before(path):
    counter = Counter()
    with opened(NoEtagHandler, path, counter) as (_, f):
        buf = bytearray(f.nbytes())
        assert f.read(buf, task_size=MiB) == len(OLD)
        assert bytes(buf) == OLD
        # Nothing to pin to: a replaced file is read as the server serves it now.
        replace_file(path, NEW)
        assert f.read(buf, task_size=MiB) == len(NEW)
        assert bytes(buf) == NEW
    assert counter.count == 8
    assert counter.if_matches == [None] * 8


def test_local_http_server_sends_etag_and_honours_if_match(path):
    """kvikpy.utils.LocalHttpServer's handler, as a client other than kvikpy sees it."""
    import http.client

    etag = entity_tag(path.stat())
    with serve(CountingRangeHandler, directory=str(path.parent), counter=Counter()) as server:
        host, port = server.removeprefix("http://").split(":")

        def answer(method: str, headers: dict[str, str]) -> tuple[int, str | None, bytes]:
            conn = http.client.HTTPConnection(host, int(port), timeout=30)
            try:
                conn.request(method, "/f.bin", headers=headers)
                response = conn.getresponse()
                return response.status, response.getheader("ETag"), response.read()
            finally:
                conn.close()

        assert answer("HEAD", {})[:2] == (200, etag)
        assert answer("GET", {"Range": "bytes=0-9", "If-Match": etag}) == (206, etag, OLD[:10])
        assert answer("GET", {"Range": "bytes=0-9", "If-Match": f"W/{etag}"})[0] == 412
        assert answer("GET", {"If-Match": '"other", *'})[0] == 200
        assert answer("GET", {"Range": "bytes=0-9", "If-Match": '"other"'}) == (412, etag, b"")
        os.utime(path, ns=(1, 1))
        assert answer("GET", {"Range": "bytes=0-9", "If-Match": etag})[0] == 412
