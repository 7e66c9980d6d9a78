"""Real HTTP servers on loopback for the remote-file tests: a file server with range
support (kvikpy's own handler) or without, and servers that fail on purpose (answer 503
a few times, drop the connection mid-body, send a short body, answer too slowly, answer
404 or 403). Each runs in a thread of the test process, on an ephemeral port, started
and stopped by :func:`serve`."""

from __future__ import annotations

import functools
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

    def next(self, range_header: str | None = None) -> int:
        with self.lock:
            self.count += 1
            self.ranges.append(range_header)
            return self.count


class CountingRangeHandler(RangeRequestHandler):
    """The range-support file server, counting requests."""

    def __init__(self, *args: Any, counter: Counter, **kwargs: Any) -> None:
        self.counter = counter
        super().__init__(*args, **kwargs)

    def do_GET(self) -> None:
        self.counter.next(self.headers.get("Range"))
        super().do_GET()


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
