"""Remote files against servers that fail on purpose (real servers on loopback): the
retry rule of kvikio (the http_status_codes answers and timeouts, up to
http_max_attempts attempts), timeouts, and the exception of every failure: 404, 403,
connection refused, a connection dropped mid-body, a body shorter than asked."""

from __future__ import annotations

import errno
from pathlib import Path

import pytest
from conftest import random_bytes
from remote_servers import (
    Counter,
    DropMidBodyHandler,
    FlakyHandler,
    ShortBodyHandler,
    SlowHandler,
    StatusHandler,
    refused_url,
    serve,
)

from kvikpy import RemoteFile, defaults
from kvikpy.errors import (
    RemoteConnectionError,
    RemoteError,
    RemoteNotFoundError,
    RemotePermissionError,
    RemoteTimeoutError,
)

DATA = random_bytes(100_000, seed=7)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    (tmp_path / "a.bin").write_bytes(DATA)
    return tmp_path


@pytest.mark.timeout(60)
def test_503_twice_then_200_is_retried(root):
    counter = Counter()
    with (
        serve(FlakyHandler, directory=str(root), counter=counter, failures=2) as url,
        RemoteFile.open_http(f"{url}/a.bin") as f,  # HEAD: 503, 503, then 200
    ):
        buf = bytearray(f.nbytes())
        assert f.read(buf) == len(DATA)
    assert bytes(buf) == DATA
    assert counter.count == 4  # three HEADs and one GET
    # The waits between attempts (kvikio's backoff) are the engine's backoff(), checked
    # as a schedule by its unit test, not timed here.


def test_503_with_one_attempt_fails(root):
    counter = Counter()
    with (
        serve(FlakyHandler, directory=str(root), counter=counter, failures=2) as url,
        defaults.set("http_max_attempts", 1),
        pytest.raises(RemoteError, match="maximum number of attempts") as info,
    ):
        RemoteFile.open_http(f"{url}/a.bin")
    assert isinstance(info.value, RuntimeError) and isinstance(info.value, OSError)
    assert "Got HTTP code 503" in str(info.value)
    assert info.value.errno == errno.EIO
    assert counter.count == 1


def test_status_outside_the_retry_list_fails_at_once(root):
    counter = Counter()
    with (
        serve(FlakyHandler, directory=str(root), counter=counter, failures=1) as url,
        defaults.set("http_status_codes", [429]),
        pytest.raises(RuntimeError, match="503"),
    ):
        RemoteFile.open_http(f"{url}/a.bin")
    assert counter.count == 1


def test_exhausted_retries_on_reads(root):
    counter = Counter()
    with serve(FlakyHandler, directory=str(root), counter=counter, failures=2) as url:
        f = RemoteFile.open_http(f"{url}/a.bin", nbytes=len(DATA))
        with (
            defaults.set("http_max_attempts", 2),
            pytest.raises(RemoteError, match=r"maximum number of attempts \(2"),
        ):
            f.read(bytearray(100))
        buf = bytearray(100)
        assert f.read(buf) == 100  # the server recovered
    assert bytes(buf) == DATA[:100]


def test_timeout_is_retried(root):
    counter = Counter()
    with (
        serve(SlowHandler, directory=str(root), counter=counter, delay=2.5, slow=1) as url,
        defaults.set("http_timeout", 1),
    ):
        f = RemoteFile.open_http(f"{url}/a.bin")
        buf = bytearray(1000)
        assert f.read(buf) == 1000
    assert bytes(buf) == DATA[:1000]
    assert counter.count == 2


@pytest.mark.timeout(60)
def test_timeout_every_attempt_raises_timeout_error(root):
    counter = Counter()
    with (
        serve(SlowHandler, directory=str(root), counter=counter, delay=2.5, slow=10) as url,
        defaults.set({"http_timeout": 1, "http_max_attempts": 2}),
    ):
        f = RemoteFile.open_http(f"{url}/a.bin")
        with pytest.raises(TimeoutError, match="Operation timed out") as info:
            f.read(bytearray(1000))
    assert isinstance(info.value, RemoteTimeoutError) and isinstance(info.value, RuntimeError)
    assert info.value.errno == errno.ETIMEDOUT
    assert counter.count == 2  # both attempts made, no third; pytest-timeout bounds a hang


@pytest.mark.parametrize(
    ("status", "exception", "code"),
    [
        (404, RemoteNotFoundError, errno.ENOENT),
        (410, FileNotFoundError, errno.ENOENT),
        (403, RemotePermissionError, errno.EACCES),
        (401, PermissionError, errno.EACCES),
        (400, RemoteError, errno.EIO),
    ],
)
def test_error_statuses(root, status, exception, code):
    with serve(StatusHandler, directory=str(root), status=status) as url:
        with pytest.raises(exception, match=f"URL returned error: {status}") as info:
            RemoteFile.open_http(f"{url}/a.bin")
        assert info.value.errno == code
        assert info.value.filename == f"{url}/a.bin"
        # The same for a read, with the size given (no HEAD).
        f = RemoteFile.open_http(f"{url}/a.bin", nbytes=10)
        with pytest.raises(exception):
            f.read(bytearray(10))


def test_connection_refused():
    url = refused_url()
    with pytest.raises(ConnectionError, match="connection refused") as info:
        RemoteFile.open_http(url)
    assert isinstance(info.value, RemoteConnectionError)
    assert info.value.errno == errno.ECONNREFUSED
    f = RemoteFile.open_http(url, nbytes=100)
    with pytest.raises(ConnectionError):
        f.read(bytearray(100))


def test_connection_dropped_mid_body(root):
    with serve(DropMidBodyHandler, directory=str(root)) as url:
        f = RemoteFile.open_http(f"{url}/a.bin", nbytes=len(DATA))
        with pytest.raises(OSError, match="after 500 of the 1000 bytes") as info:
            f.read(bytearray(1000), file_offset=10)
    assert isinstance(info.value, RemoteError)


def test_body_shorter_than_asked(root):
    with serve(ShortBodyHandler, directory=str(root)) as url:
        f = RemoteFile.open_http(f"{url}/a.bin", nbytes=len(DATA))
        with pytest.raises(RemoteError, match="announced 500 bytes for a request of 1000") as info:
            f.read(bytearray(1000), file_offset=10)
    assert info.value.errno == errno.EIO


def test_failed_pread_raises_from_the_future(root):
    with serve(StatusHandler, directory=str(root), status=404) as url:
        f = RemoteFile.open_http(f"{url}/a.bin", nbytes=8 << 20)
        fut = f.pread(bytearray(8 << 20), task_size=1 << 20)
        with pytest.raises(FileNotFoundError):
            fut.get()
