"""A local HTTP server for tests and examples of remote files: :class:`LocalHttpServer`
(kvikio's ``kvikio.utils.LocalHttpServer``) and a request handler with range support,
both on Python's :mod:`http.server`."""

from __future__ import annotations

import functools
import multiprocessing
import os
import pathlib
import re
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, SimpleHTTPRequestHandler, ThreadingHTTPServer
from queue import Empty
from typing import Any, BinaryIO

__all__ = ["LocalHttpServer", "QuietRequestHandler", "QuietServer", "RangeRequestHandler"]

_RANGE = re.compile(r"^\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*$")
_COPY_CHUNK = 1 << 20


def parse_range(header: str, size: int) -> tuple[int, int] | bool | None:
    """The inclusive byte range ``(first, last)`` a single-range ``Range`` header asks of
    a file of ``size`` bytes; None for a header this handler does not serve as a range
    (malformed, or several ranges: the whole file is sent), False for a range that lies
    outside the file (416)."""
    match = _RANGE.match(header)
    if match is None:
        return None
    first, last = match.groups()
    if not first and not last:
        return None
    if not first:  # the last `last` bytes
        count = int(last)
        if count == 0:
            return False
        return max(size - count, 0), size - 1
    start = int(first)
    end = size - 1 if not last else min(int(last), size - 1)
    if start >= size or (last and int(last) < start):
        return False
    return start, end


class QuietRequestHandler(SimpleHTTPRequestHandler):
    """Python's file server, without a log line per request."""

    def log_message(self, format: str, *args: Any) -> None:
        """Log nothing (the default writes every request to stderr)."""


def entity_tag(stat: os.stat_result) -> str:
    """The strong ``ETag`` of a file of this ``stat``: its size and modification time in
    nanoseconds, in hexadecimal (as nginx and Apache make theirs), so that a file
    rewritten or replaced gets another."""
    return f'"{stat.st_size:x}-{stat.st_mtime_ns:x}"'


def matches(if_match: str, etag: str) -> bool:
    """Whether an ``If-Match`` header's value admits a file whose ``ETag`` is ``etag``:
    ``*``, or a list holding it (strong comparison: a weak tag never matches)."""
    tags = [tag.strip() for tag in if_match.split(",")]
    return "*" in tags or etag in tags


class RangeRequestHandler(QuietRequestHandler):
    """Python's file server, answering a single-range ``Range`` request with 206 and the
    range (and 416 for a range outside the file), as remote file reads need. Each file's
    answers carry its ``ETag`` (see :func:`entity_tag`), and a request whose ``If-Match``
    names another version is answered ``412 Precondition Failed``, as real servers do."""

    _range: tuple[int, int] | None = None
    _etag: str | None = None

    def end_headers(self) -> None:
        """The headers, with the file's ``ETag`` where the answer is about a file."""
        if self._etag is not None:
            self.send_header("ETag", self._etag)
        super().end_headers()

    def send_head(self) -> Any:
        """Headers of a ranged answer where the request has a range, else the parent's;
        412 where ``If-Match`` names another version of the file."""
        self._range = None
        self._etag = None
        header = self.headers.get("Range")
        path = self.translate_path(self.path)
        if os.path.isdir(path):
            return super().send_head()
        try:
            f = open(path, "rb")  # noqa: SIM115 - returned open, closed by the caller
        except OSError:
            if header is None:
                return super().send_head()
            self.send_error(HTTPStatus.NOT_FOUND, "File not found")
            return None
        stat = os.fstat(f.fileno())
        self._etag = entity_tag(stat)
        if_match = self.headers.get("If-Match")
        if if_match is not None and not matches(if_match, self._etag):
            f.close()
            self.send_response(HTTPStatus.PRECONDITION_FAILED)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        if header is None:
            f.close()
            return super().send_head()
        size = stat.st_size
        wanted = parse_range(header, size)
        if wanted is None:
            f.close()
            return super().send_head()
        if wanted is False:
            f.close()
            self.send_response(HTTPStatus.REQUESTED_RANGE_NOT_SATISFIABLE)
            self.send_header("Content-Range", f"bytes */{size}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return None
        assert isinstance(wanted, tuple)
        first, last = wanted
        self.send_response(HTTPStatus.PARTIAL_CONTENT)
        self.send_header("Content-Type", self.guess_type(path))
        self.send_header("Accept-Ranges", "bytes")
        self.send_header("Content-Range", f"bytes {first}-{last}/{size}")
        self.send_header("Content-Length", str(last - first + 1))
        self.end_headers()
        self._range = (first, last)
        return f

    def copyfile(self, source: Any, outputfile: Any) -> None:
        """Copy the range asked for, or the whole file."""
        if self._range is None:
            super().copyfile(source, outputfile)
            return
        first, last = self._range
        try:
            # Zero-copy from the file to the socket where the platform can.
            self.connection.sendfile(source, first, last - first + 1)
        except (AttributeError, OSError, ValueError):
            copy_range(source, outputfile, first, last - first + 1)


def copy_range(source: BinaryIO, out: Any, offset: int, count: int) -> None:
    """Copy ``count`` bytes of ``source`` from ``offset`` to ``out``, a chunk at a time."""
    source.seek(offset)
    while count > 0:
        chunk = source.read(min(count, _COPY_CHUNK))
        if not chunk:
            break
        out.write(chunk)
        count -= len(chunk)


class QuietServer(ThreadingHTTPServer):
    """A threading server that does not print a traceback for a client that hung up
    (a reader that stopped early, such as one refusing an answer without a range)."""

    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        """Ignore connections the client closed; report anything else as usual."""
        import sys

        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)


def _serve(
    queue: Any,
    handler: type[BaseHTTPRequestHandler],
    handler_options: dict[str, Any],
    max_lifetime: float,
) -> None:
    """The server process: serve on an ephemeral loopback port, report the address, and
    stop after ``max_lifetime`` seconds at the latest."""
    httpd = QuietServer(("127.0.0.1", 0), functools.partial(handler, **handler_options))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    queue.put(httpd.server_address[:2])
    time.sleep(max_lifetime)
    print(f"ThreadingHTTPServer shutting down because of timeout ({max_lifetime}sec)")


#: How long a server process may take to start serving (a fresh interpreter that imports
#: kvikpy: seconds when idle, far more on a machine busy with other test processes).
_START_TIMEOUT_S = 120.0


def _first_address(queue: Any, process: Any, timeout: float) -> tuple[str, int]:
    """The address the server process reports, or an error as soon as that process dies
    (an exception in it goes to stderr) or ``timeout`` seconds pass, rather than a bare
    ``queue.Empty`` after the whole wait."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            ip, port = queue.get(timeout=0.2)
            return str(ip), int(port)
        except Empty:
            pass
        if not process.is_alive():
            raise RuntimeError(
                f"LocalHttpServer: the server process exited with code {process.exitcode} "
                f"before it served (its error, if any, is on standard error above)"
            )
        if time.monotonic() > deadline:
            process.kill()
            raise TimeoutError(
                f"LocalHttpServer: the server process did not start serving within "
                f"{timeout:g} s; the machine may be overloaded"
            )


class LocalHttpServer:
    """A local HTTP server in its own process, serving a directory on 127.0.0.1 (kvikio's
    ``kvikio.utils.LocalHttpServer``; slow, but enough for tests and examples).

    Parameters
    ----------
    root_path
        The directory to serve.
    range_support
        Answer ``Range`` requests with the range (what :class:`kvikpy.RemoteFile` needs);
        False serves whole files only. kvikpy's own handler, with no dependency
        (kvikio's needs the ``rangehttpserver`` package).
    max_lifetime
        The most seconds the server lives (it is stopped on leaving the ``with`` block).
    handler
        A request handler class to use instead (given ``directory=root_path`` and
        ``handler_options`` as keyword arguments).
    handler_options
        Keyword arguments for the handler.

    Examples
    --------
    >>> with LocalHttpServer(root_path="/my/server/") as server:  # doctest: +SKIP
    ...     with kvikpy.RemoteFile.open_http(f"{server.url}/myfile") as f:
    ...         f.read(buf)
    """

    def __init__(
        self,
        root_path: str | pathlib.Path,
        range_support: bool = True,
        max_lifetime: int = 120,
        handler: type[BaseHTTPRequestHandler] | None = None,
        handler_options: dict[str, Any] | None = None,
    ) -> None:
        self.root_path = root_path
        self.range_support = range_support
        self.max_lifetime = max_lifetime
        self.handler = handler
        self.handler_options = handler_options or {}

    def __enter__(self) -> LocalHttpServer:
        # A fresh interpreter rather than a fork: forking a process whose I/O threads
        # already run (kvikpy's pool) can deadlock, and Python 3.12 warns about it.
        context = multiprocessing.get_context("spawn")
        queue = context.Queue()
        handler: type[BaseHTTPRequestHandler]
        if self.handler is not None:
            handler = self.handler
        elif self.range_support:
            handler = RangeRequestHandler
        else:
            handler = QuietRequestHandler
        options = {**self.handler_options, "directory": str(self.root_path)}
        self.process = context.Process(
            target=_serve, args=(queue, handler, options, self.max_lifetime), daemon=True
        )
        self.process.start()
        ip, port = _first_address(queue, self.process, _START_TIMEOUT_S)
        self.ip: str = ip
        self.port: int = port
        self.url = f"http://{ip}:{port}"
        return self

    def __exit__(self, *exc: object) -> None:
        self.process.kill()
        self.process.join(timeout=10)
