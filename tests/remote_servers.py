"""Real HTTP servers on loopback for the remote-file tests: a file server with range
support (kvikpy's own handler) or without, and servers that fail on purpose (answer 503
a few times, drop the connection mid-body, send a short body, answer too slowly, answer
404 or 403). Each runs in a thread of the test process, on an ephemeral port, started
and stopped by :func:`serve`."""

from __future__ import annotations

import functools
import os
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from kvikpy._http_server import (
    QuietRequestHandler,
    QuietServer,
    RangeRequestHandler,
    copy_range,
    parse_range,
)


@contextmanager
def serve(handler: type[BaseHTTPRequestHandler], **options: Any) -> Iterator[str]:
    """Serve with ``handler`` (given ``options`` as keyword arguments) on 127.0.0.1 in a
    thread; yields the base URL, ``http://127.0.0.1:<port>``."""
    server = QuietServer(("127.0.0.1", 0), functools.partial(handler, **options))
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        host, port = server.server_address[:2]
        yield f"http://{host}:{port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def refused_url() -> str:
    """A URL where nothing listens: a port just bound and released."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/a.bin"


class Counter:
    """Requests seen, shared by the handler instances of one server (one per request):
    their count and ``Range`` headers."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.count = 0
        self.ranges: list[str | None] = []
        self.if_matches: list[str | None] = []

    def next(self, range_header: str | None = None, if_match: str | None = None) -> int:
        with self.lock:
            self.count += 1
            self.ranges.append(range_header)
            self.if_matches.append(if_match)
            return self.count


class CountingRangeHandler(RangeRequestHandler):
    """The range-support file server, counting requests."""

    def __init__(self, *args: Any, counter: Counter, **kwargs: Any) -> None:
        self.counter = counter
        super().__init__(*args, **kwargs)

    def do_GET(self) -> None:
        self.counter.next(self.headers.get("Range"), self.headers.get("If-Match"))
        super().do_GET()


class NoEtagHandler(CountingRangeHandler):
    """The counting range server, sending no ``ETag`` (as some servers do not)."""

    def end_headers(self) -> None:
        self._etag = None
        super().end_headers()


def replace_file(path: Path, data: bytes) -> None:
    """Replace the file at ``path`` with one holding ``data``, as a deployment does (a new
    file renamed over the old one), with a modification time of its own."""
    new = path.with_name(path.name + ".new")
    new.write_bytes(data)
    old_ns = path.stat().st_mtime_ns
    os.utime(new, ns=(old_ns + 1_000_000_007, old_ns + 1_000_000_007))
    os.replace(new, path)


class ReplacingHandler(CountingRangeHandler):
    """The counting range server, which replaces the file it is first asked the size of
    (``HEAD``) with ``replacement`` (see :func:`replace_file`) once it has sized it and
    before its answer leaves: a file that changes on the server between a reader's open
    and its read. Later size requests see the new file, unchanged."""

    def __init__(self, *args: Any, replacement: list[bytes], **kwargs: Any) -> None:
        self.replacement = replacement
        super().__init__(*args, **kwargs)

    def end_headers(self) -> None:
        if self.command == "HEAD":
            with self.counter.lock:
                data = self.replacement.pop() if self.replacement else None
            if data is not None:
                replace_file(Path(self.translate_path(self.path)), data)
        super().end_headers()


class FlakyHandler(RangeRequestHandler):
    """Answers 503 to the first ``failures`` requests (HEAD and GET), then serves files."""

    def __init__(self, *args: Any, counter: Counter, failures: int, **kwargs: Any) -> None:
        self.counter = counter
        self.failures = failures
        super().__init__(*args, **kwargs)

    def _flaky(self, serve: Any) -> None:
        if self.counter.next(self.headers.get("Range")) <= self.failures:
            self.send_error(HTTPStatus.SERVICE_UNAVAILABLE)
            return
        serve()

    def do_GET(self) -> None:
        self._flaky(super().do_GET)

    def do_HEAD(self) -> None:
        self._flaky(super().do_HEAD)


class _RangeFault(QuietRequestHandler):
    """Base of the faulty servers: HEAD tells the true size; GET of a range is handed to
    :meth:`fault` with the file's bytes and the range asked for."""

    def do_GET(self) -> None:
        path = Path(self.translate_path(self.path))
        data = path.read_bytes()
        wanted = parse_range(self.headers.get("Range", ""), len(data))
        first, last = wanted if isinstance(wanted, tuple) else (0, len(data) - 1)
        self.fault(data, first, last)

    def fault(self, data: bytes, first: int, last: int) -> None:
        raise NotImplementedError


class DropMidBodyHandler(_RangeFault):
    """Promises the whole range, sends half of it, then closes the connection."""

    def fault(self, data: bytes, first: int, last: int) -> None:
        count = last - first + 1
        self.send_response(HTTPStatus.PARTIAL_CONTENT)
        self.send_header("Content-Range", f"bytes {first}-{last}/{len(data)}")
        self.send_header("Content-Length", str(count))
        self.end_headers()
        self.wfile.write(data[first : first + count // 2])
        self.wfile.flush()
        self.close_connection = True
        self.connection.shutdown(socket.SHUT_RDWR)


class ShortBodyHandler(_RangeFault):
    """Answers a range with fewer bytes than asked, announced honestly."""

    def fault(self, data: bytes, first: int, last: int) -> None:
        last = first + (last - first) // 2
        self.send_response(HTTPStatus.PARTIAL_CONTENT)
        self.send_header("Content-Range", f"bytes {first}-{last}/{len(data)}")
        self.send_header("Content-Length", str(last - first + 1))
        self.end_headers()
        self.wfile.write(data[first : last + 1])


class SlowHandler(RangeRequestHandler):
    """Waits ``delay`` seconds before answering each GET of the first ``slow`` ones."""

    def __init__(
        self, *args: Any, counter: Counter, delay: float, slow: int, **kwargs: Any
    ) -> None:
        self.counter = counter
        self.delay = delay
        self.slow = slow
        super().__init__(*args, **kwargs)

    def do_GET(self) -> None:
        if self.counter.next(self.headers.get("Range")) <= self.slow:
            time.sleep(self.delay)
        super().do_GET()


class StatusHandler(QuietRequestHandler):
    """Answers every request with ``status`` (an error document as body)."""

    def __init__(self, *args: Any, status: int, **kwargs: Any) -> None:
        self.status = status
        super().__init__(*args, **kwargs)

    def do_GET(self) -> None:
        self.send_error(self.status)

    def do_HEAD(self) -> None:
        self.send_error(self.status)


def copy_to(handler: BaseHTTPRequestHandler, path: Path, offset: int, count: int) -> None:
    """Write ``count`` bytes of ``path`` from ``offset`` to the handler's client."""
    with path.open("rb") as f:
        copy_range(f, handler.wfile, offset, count)
