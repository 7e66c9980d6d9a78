"""Real servers on loopback for the remote-file security tests: a file server that
records every request's headers and redirects a path prefix (to another server, or to
another path of its own), a check of AWS SigV4 signatures as S3 computes them, an HTTPS
file server, and a private certificate authority with a server certificate made in the
test (``cryptography``). Each server runs in a thread of the test process, on an
ephemeral port."""

from __future__ import annotations

import datetime
import functools
import hashlib
import hmac
import ssl
import threading
import urllib.parse
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http import HTTPStatus
from pathlib import Path
from typing import Any

from kvikpy._http_server import QuietServer, RangeRequestHandler


@dataclass
class Seen:
    """One request a server received: method, path (with query) and headers (names
    lower-cased)."""

    method: str
    path: str
    headers: dict[str, str]


@dataclass
class Log:
    """The requests a server received, shared by its handler instances."""

    requests: list[Seen] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, seen: Seen) -> None:
        with self.lock:
            self.requests.append(seen)

    def all(self) -> list[Seen]:
        with self.lock:
            return list(self.requests)


class RecordingHandler(RangeRequestHandler):
    """Serves files with range support, recording each request in ``log``; a request
    whose path starts with ``prefix`` is answered ``status`` (a redirect) to ``to`` (a
    base URL, or ``""`` for this server) followed by the rest of the path, after
    ``replace`` is applied to it (``(old, new)``); with ``to=None``, without a
    ``Location`` (as S3 answers a request to the wrong region). Redirects name the
    bucket's region in ``x-amz-bucket-region``, as S3's do."""

    def __init__(
        self,
        *args: Any,
        log: Log,
        prefix: str | None = None,
        to: str | None = "",
        status: int = HTTPStatus.TEMPORARY_REDIRECT,
        replace: tuple[str, str] = ("", ""),
        **kwargs: Any,
    ) -> None:
        self.log = log
        self.prefix = prefix
        self.to = to
        self.status = status
        self.replace = replace
        super().__init__(*args, **kwargs)

    def _record(self) -> bool:
        """Record the request; answer it with the redirect where it is one."""
        headers = {k.lower(): v for k, v in self.headers.items()}
        self.log.add(Seen(self.command, self.path, headers))
        if self.prefix is None or not self.path.startswith(self.prefix):
            return False
        rest = self.path[len(self.prefix) :]
        old, new = self.replace
        if old:
            rest = rest.replace(old, new, 1)
        self.send_response(self.status)
        if self.to is not None:
            self.send_header("Location", f"{self.to}{rest}")
        self.send_header("x-amz-bucket-region", "eu-west-3")
        self.send_header("Content-Length", "0")
        self.end_headers()
        return True

    def do_GET(self) -> None:
        if not self._record():
            super().do_GET()

    def do_HEAD(self) -> None:
        if not self._record():
            super().do_HEAD()


@contextmanager
def serve(
    handler: type[RecordingHandler] = RecordingHandler,
    *,
    host: str = "127.0.0.1",
    tls: ssl.SSLContext | None = None,
    **options: Any,
) -> Iterator[str]:
    """Serve with ``handler`` (given ``options``) on ``host`` in a thread, over TLS where
    ``tls`` is given; yields the base URL (``http://127.0.0.1:<port>``)."""
    server = QuietServer((host, 0), functools.partial(handler, **options))
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    try:
        port = server.server_address[1]
        scheme = "https" if tls is not None else "http"
        yield f"{scheme}://{host}:{port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)


def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode(), hashlib.sha256).digest()


def sigv4_valid(seen: Seen, secret: str) -> bool:
    """Whether ``seen`` carries a valid AWS SigV4 signature made with ``secret``, as S3
    checks it: the canonical request rebuilt from what the server received (method,
    path, query, the signed headers), the key derived from the secret and the scope."""
    auth = seen.headers.get("authorization", "")
    if not auth.startswith("AWS4-HMAC-SHA256 "):
        return False
    parts = dict(p.strip().split("=", 1) for p in auth[len("AWS4-HMAC-SHA256 ") :].split(","))
    scope = parts["Credential"].split("/", 1)[1]
    day, region, service, _ = scope.split("/")
    names = parts["SignedHeaders"].split(";")
    path, _, query = seen.path.partition("?")
    pairs = sorted(
        (urllib.parse.quote(k, safe="-_.~"), urllib.parse.quote(v, safe="-_.~"))
        for k, v in urllib.parse.parse_qsl(query, keep_blank_values=True)
    )
    canonical = "\n".join(
        [
            seen.method,
            path,
            "&".join(f"{k}={v}" for k, v in pairs),
            "".join(f"{n}:{seen.headers.get(n, '').strip()}\n" for n in names),
            ";".join(names),
            seen.headers.get("x-amz-content-sha256", ""),
        ]
    )
    date = seen.headers.get("x-amz-date", "")
    to_sign = "\n".join(
        ["AWS4-HMAC-SHA256", date, scope, hashlib.sha256(canonical.encode()).hexdigest()]
    )
    key = _hmac(f"AWS4{secret}".encode(), day)
    for part in (region, service, "aws4_request"):
        key = _hmac(key, part)
    expected = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    return hmac.compare_digest(expected, parts["Signature"])


@dataclass
class Pki:
    """A private certificate authority and a server certificate it issued, as PEM files:
    ``ca`` (the CA's certificate), ``cert`` and ``key`` (the server's, valid for
    127.0.0.1 and localhost)."""

    ca: Path
    cert: Path
    key: Path

    def server_context(self) -> ssl.SSLContext:
        """A TLS context serving the server certificate."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(self.cert, self.key)
        return context


def make_pki(directory: Path) -> Pki:
    """Create a CA and a server certificate for 127.0.0.1 and localhost in
    ``directory``."""
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)
    valid = (now - datetime.timedelta(days=1), now + datetime.timedelta(days=1))

    def name(common: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common)])

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = (
        x509.CertificateBuilder()
        .subject_name(name("kvikpy test CA"))
        .issuer_name(name("kvikpy test CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(valid[0])
        .not_valid_after(valid[1])
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(name("localhost"))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(valid[0])
        .not_valid_after(valid[1])
        .add_extension(
            x509.SubjectAlternativeName(
                [
                    x509.DNSName("localhost"),
                    x509.IPAddress(ipaddress.IPv4Address("127.0.0.1")),
                ]
            ),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    pki = Pki(directory / "ca.pem", directory / "server.pem", directory / "server.key")
    pki.ca.write_bytes(ca_cert.public_bytes(serialization.Encoding.PEM))
    pki.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pki.key.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return pki
