"""A small WebHDFS server for the tests: Hadoop's REST protocol for reading
(``GET /webhdfs/v1/<path>?op=GETFILESTATUS`` and ``?op=OPEN&offset=&length=``) over a
local directory, with the name node's redirect of ``OPEN`` to a "data node" (the same
server, under ``/datanode``) as real clusters answer, and Hadoop's JSON errors.

Each request's ``user.name`` is recorded, so tests can check the user sent."""

from __future__ import annotations

import json
import threading
import urllib.parse
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from remote_servers import copy_to


class Requests:
    """What the server was asked, shared by the handler instances."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.log: list[tuple[str, dict[str, list[str]]]] = []

    def add(self, path: str, query: dict[str, list[str]]) -> None:
        with self.lock:
            self.log.append((path, query))


class WebHdfsHandler(BaseHTTPRequestHandler):
    """Serves ``root`` as an HDFS namespace: ``/webhdfs/v1/<path>`` is ``root/<path>``."""

    PREFIX = "/webhdfs/v1"

    def __init__(self, *args: Any, root: Path, requests: Requests, **kwargs: Any) -> None:
        self.root = root
        self.requests = requests
        super().__init__(*args, **kwargs)

    def log_message(self, format: str, *args: Any) -> None:
        """Log nothing."""

    def _json(self, status: int, body: dict[str, Any]) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _not_found(self, path: str) -> None:
        self._json(
            HTTPStatus.NOT_FOUND,
            {
                "RemoteException": {
                    "exception": "FileNotFoundException",
                    "javaClassName": "java.io.FileNotFoundException",
                    "message": f"File does not exist: {path}",
                }
            },
        )

    def do_GET(self) -> None:
        url = urllib.parse.urlparse(self.path)
        query = urllib.parse.parse_qs(url.query)
        self.requests.add(url.path, query)
        datanode = url.path.startswith("/datanode")
        prefix = "/datanode" + self.PREFIX if datanode else self.PREFIX
        if not url.path.startswith(prefix + "/"):
            self._json(HTTPStatus.BAD_REQUEST, {"RemoteException": {"message": "bad path"}})
            return
        hdfs_path = urllib.parse.unquote(url.path[len(prefix) :])
        local = self.root / hdfs_path.lstrip("/")
        if not local.is_file():
            self._not_found(hdfs_path)
            return
        op = query.get("op", [""])[0].upper()
        size = local.stat().st_size
        if op == "GETFILESTATUS":
            self._json(
                HTTPStatus.OK,
                {"FileStatus": {"length": size, "type": "FILE", "pathSuffix": ""}},
            )
        elif op == "OPEN" and not datanode:
            # The name node sends the client to a data node.
            self.send_response(HTTPStatus.TEMPORARY_REDIRECT)
            self.send_header("Location", f"/datanode{url.path}?{url.query}")
            self.send_header("Content-Length", "0")
            self.end_headers()
        elif op == "OPEN":
            offset = int(query.get("offset", ["0"])[0])
            length = int(query.get("length", [str(size)])[0])
            count = max(0, min(length, size - offset))
            self.send_response(HTTPStatus.OK)
            self.send_header("Content-Type", "application/octet-stream")
            self.send_header("Content-Length", str(count))
            self.end_headers()
            copy_to(self, local, offset, count)
        else:
            self._json(
                HTTPStatus.BAD_REQUEST,
                {"RemoteException": {"message": f"Invalid value for webhdfs parameter op: {op}"}},
            )
