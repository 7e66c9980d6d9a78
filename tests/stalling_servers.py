"""A real HTTP server on loopback that stalls: it answers ``HEAD`` in full (the file's
size), and a ``GET`` with its status and headers, then sends only the first
``body_bytes`` bytes of the body and holds the connection open without sending more,
until the client goes away or the server stops. For the tests of interrupting remote
reads and of their time bounds (tests/test_interrupts.py).

Each connection is served in its own thread, requests after requests (a client reuses
the connection of its ``HEAD``); :attr:`StallingServer.stalled` counts requests stalled
so far and :attr:`StallingServer.abandoned` those whose client closed the connection
while it stalled.
"""

from __future__ import annotations

import re
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

_RANGE = re.compile(rb"^range:\s*bytes=(\d+)-(\d+)\s*$", re.IGNORECASE | re.MULTILINE)


class StallingServer:
    """Serve ``size`` bytes of zeros (see the module's docstring) on 127.0.0.1."""

    def __init__(self, size: int, body_bytes: int = 0) -> None:
        self.size = size
        self.body_bytes = body_bytes
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.05)
        self.url = f"http://127.0.0.1:{self.listener.getsockname()[1]}/stalled.bin"
        self.stop = threading.Event()
        self.lock = threading.Lock()
        self.stalled = 0
        self.abandoned = 0
        self.threads: list[threading.Thread] = []
        self.acceptor = threading.Thread(target=self._accept, daemon=True)
        self.acceptor.start()

    def _accept(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            t = threading.Thread(target=self._serve, args=(conn,), daemon=True)
            with self.lock:
                self.threads.append(t)
            t.start()

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(0.05)
        with conn:
            pending = b""
            while not self.stop.is_set():
                head, pending = self._request(conn, pending)
                if head is None:
                    return
                if head.startswith(b"HEAD"):
                    conn.sendall(
                        b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n"
                        b"Accept-Ranges: bytes\r\n\r\n" % self.size
                    )
                    continue
                match = _RANGE.search(head)
                first, last = (int(match[1]), int(match[2])) if match else (0, self.size - 1)
                length = last - first + 1
                conn.sendall(
                    b"HTTP/1.1 206 Partial Content\r\nContent-Length: %d\r\n"
                    b"Content-Range: bytes %d-%d/%d\r\n\r\n"
                    % (length, first, last, self.size)
                    + bytes(min(self.body_bytes, length))
                )
                with self.lock:
                    self.stalled += 1
                self._hold(conn)
                return

    def _request(self, conn: socket.socket, pending: bytes) -> tuple[bytes | None, bytes]:
        """The next request's head (None once the client or the server is gone)."""
        while b"\r\n\r\n" not in pending:
            if self.stop.is_set():
                return None, b""
            try:
                chunk = conn.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                return None, b""
            if not chunk:
                return None, b""
            pending += chunk
        head, _, rest = pending.partition(b"\r\n\r\n")
        return head, rest

    def _hold(self, conn: socket.socket) -> None:
        """Send nothing more until the client closes the connection or the server stops."""
        while not self.stop.is_set():
            try:
                if not conn.recv(65536):
                    break
            except TimeoutError:
                continue
            except OSError:
                break
        else:
            return
        with self.lock:
            self.abandoned += 1

    def wait_abandoned(self, count: int, timeout: float) -> bool:
        """Wait until ``count`` stalled requests have been given up by the client."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with self.lock:
                if self.abandoned >= count:
                    return True
            time.sleep(0.01)
        return False

    def close(self) -> None:
        self.stop.set()
        self.listener.close()
        self.acceptor.join(timeout=5)
        with self.lock:
            threads = list(self.threads)
        for t in threads:
            t.join(timeout=5)


@contextmanager
def stalling_server(size: int, body_bytes: int = 0) -> Iterator[StallingServer]:
    """A :class:`StallingServer` for the ``with`` block."""
    server = StallingServer(size, body_bytes)
    try:
        yield server
    finally:
        server.close()
