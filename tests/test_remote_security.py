"""Security of remote files, against real servers on loopback: credentials (an S3
signature and session token, HTTP basic authentication from a URL's user info) never
reach a host other than the one they were made for, even when a server redirects there;
a redirect within the origin is followed (signed again); passwords in URLs never show in
a repr, a message or an exception's filename; and HTTPS servers with a certificate from
a private CA are read once that CA is configured (the ``http_ca_bundle`` setting or the
conventional variables), refused otherwise."""

from __future__ import annotations

import base64
import hashlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from conftest import random_bytes
from remote_security_servers import Log, make_pki, serve, sigv4_valid

import kvikpy
from kvikpy import RemoteFile, defaults
from kvikpy.errors import (
    ConfigError,
    RemoteConnectionError,
    RemoteError,
    RemoteNotFoundError,
    RemotePermissionError,
)

DATA = random_bytes(300_000, seed=31)
SECRET = "kvikpy-test-secret"
TOKEN = "kvikpy-session-TOKEN-value"
PASSWORD = "hunter2%40pw"  # percent-encoded in the URL: the password is hunter2@pw
SHOWN = "hunter2"  # what must never appear


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A directory served by the test servers: ``f.bin`` and ``bucket/key.bin``."""
    (tmp_path / "bucket").mkdir()
    (tmp_path / "f.bin").write_bytes(DATA)
    (tmp_path / "bucket" / "key.bin").write_bytes(DATA)
    return tmp_path


def read_all(f: RemoteFile) -> bytes:
    buf = bytearray(f.nbytes())
    assert f.read(buf, task_size=100_000) == len(buf)
    return bytes(buf)


def open_signed(endpoint: str, key: str, nbytes: int | None = None) -> RemoteFile:
    """``bucket/key`` at ``endpoint`` with temporary credentials (a session token)."""
    return RemoteFile.open_s3(
        "bucket",
        key,
        nbytes,
        aws_region_name="us-east-1",
        aws_access_key_id="ASIATESTKEY",
        aws_secret_access_key=SECRET,
        aws_endpoint_url=endpoint,
        aws_session_token=TOKEN,
    )


# --- 1. Credentials and redirects ------------------------------------------------------


@pytest.mark.parametrize("nbytes", [None, len(DATA)])
def test_signed_request_is_not_redirected_to_another_host(root, nbytes):
    """S3 answers 307 with another host: the token and signature must not go there."""
    other_log, log = Log(), Log()
    with (
        serve(log=other_log, directory=str(root)) as other,
        serve(log=log, directory=str(root), prefix="/bucket/", to=f"{other}/bucket/") as s3,
        pytest.raises(RemotePermissionError) as info,
    ):
        f = open_signed(s3, "key.bin", nbytes)
        read_all(f)
    assert other_log.all() == [], "a signed request reached the other host"
    message = str(info.value)
    assert s3 in message and other in message, message
    assert "AWS_DEFAULT_REGION" in message and "AWS_ENDPOINT_URL" in message
    assert TOKEN not in message and SECRET not in message
    tokens = {r.headers.get("x-amz-security-token") for r in log.all()}
    assert log.all() and tokens == {TOKEN}


def test_signed_request_follows_a_redirect_within_its_origin_signed_again(root):
    log = Log()
    with (
        serve(log=log, directory=str(root), prefix="/bucket/moved/", to="/bucket/") as s3,
        open_signed(s3, "moved/key.bin") as f,
    ):
        assert read_all(f) == DATA
    seen = log.all()
    followed = [r for r in seen if r.path == "/bucket/key.bin"]
    assert followed and len(followed) == len(seen) / 2, [r.path for r in seen]
    for r in seen:
        assert r.headers.get("x-amz-security-token") == TOKEN
        assert sigv4_valid(r, SECRET), (r.method, r.path)
    assert {r.headers.get("range") for r in followed if r.method == "GET"} != {None}


def test_wrong_region_answer_names_the_region(root):
    """S3's answer to a request in the wrong region: 301, no Location, the region."""
    kwargs = {"prefix": "/bucket/", "to": None, "status": 301}
    with (
        serve(log=Log(), directory=str(root), **kwargs) as s3,
        pytest.raises(RemoteError, match="AWS_DEFAULT_REGION=eu-west-3"),
    ):
        open_signed(s3, "key.bin")


def test_public_request_follows_a_redirect_to_another_host(root):
    """Without credentials, a redirect may lead anywhere (as kvikio's libcurl)."""
    other_log, log = Log(), Log()
    with (
        serve(log=other_log, directory=str(root)) as other,
        serve(log=log, directory=str(root), prefix="/moved/", to=f"{other}/") as first,
        RemoteFile.open_http(f"{first}/moved/f.bin") as f,
    ):
        assert read_all(f) == DATA
    assert other_log.all() and all("authorization" not in r.headers for r in other_log.all())


def test_redirect_loops_end_with_an_error(root):
    log = Log()
    with (
        serve(log=log, directory=str(root), prefix="/loop/", to="/loop/") as server,
        pytest.raises(RemoteError, match="more than 10 redirects"),
    ):
        RemoteFile.open_http(f"{server}/loop/f.bin")
    assert len(log.all()) == 11


# --- 2. Passwords in URLs --------------------------------------------------------------


def basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


def test_user_info_is_sent_as_basic_auth_and_never_shown(root):
    log = Log()
    with serve(log=log, directory=str(root)) as server:
        host = server.removeprefix("http://")
        with RemoteFile.open_http(f"http://ann:{PASSWORD}@{host}/f.bin") as f:
            assert read_all(f) == DATA
            for text in (repr(f), str(f), f.url):
                assert SHOWN not in text and "ann" not in text, text
            assert f.url == f"{server}/f.bin"
    assert {r.headers.get("authorization") for r in log.all()} == {basic("ann", "hunter2@pw")}


def shown(e: BaseException) -> str:
    """Everything an exception shows: its message, args, filename and repr."""
    return " ".join(
        [str(e), repr(e), repr(e.args), str(getattr(e, "filename", "")), repr(e.__cause__)]
    )


def test_passwords_stay_out_of_exceptions(root):
    with serve(log=Log(), directory=str(root)) as server:
        host = server.removeprefix("http://")
        cases = [
            (RemoteNotFoundError, lambda: RemoteFile.open_http(f"http://ann:{PASSWORD}@{host}/no")),
            (
                RemoteNotFoundError,
                lambda: kvikpy.read(f"http://ann:{PASSWORD}@{host}/no", device="cpu"),
            ),
            (ValueError, lambda: RemoteFile.open_http(f"http://ann:{PASSWORD}@{host}:99999/f")),
            (ValueError, lambda: RemoteFile.open(f"ftp://ann:{PASSWORD}@{host}/f.bin")),
            (ValueError, lambda: RemoteFile.open_s3_url(f"ftp://ann:{PASSWORD}@{host}/f")),
            (ValueError, lambda: RemoteFile.open_http(f"http://{PASSWORD}@")),
        ]
        for kind, call in cases:
            with pytest.raises(kind) as info:
                call()
            assert SHOWN not in shown(info.value), shown(info.value)
        with pytest.raises(OSError) as info:
            kvikpy.CuFile(f"http://ann:{PASSWORD}@{host}/f.bin", "w")
        assert SHOWN not in shown(info.value), shown(info.value)
    with pytest.raises(RemoteConnectionError) as info:
        RemoteFile.open_http(f"http://ann:{PASSWORD}@{host}/f.bin")  # the server is gone
    assert SHOWN not in shown(info.value), shown(info.value)
    assert f"ann:***@{host}" in str(info.value) or host in str(info.value)


def test_presigned_signature_and_token_stay_out_of_reprs_and_exceptions(root):
    query = (
        "X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Signature=sigSECRET&X-Amz-Security-Token=tokSECRET"
    )
    with serve(log=Log(), directory=str(root)) as server:
        with RemoteFile.open_s3_presigned_url(f"{server}/f.bin?{query}") as f:
            assert read_all(f) == DATA
            for text in (repr(f), str(f)):
                assert "SECRET" not in text and "X-Amz-Signature=***" in text, text
        with pytest.raises(RemoteNotFoundError) as info:
            RemoteFile.open_s3_presigned_url(f"{server}/missing.bin?{query}")
        assert "SECRET" not in shown(info.value), shown(info.value)


def test_basic_auth_is_not_redirected_to_another_host(root):
    other_log = Log()
    with (
        serve(log=other_log, directory=str(root)) as other,
        serve(log=Log(), directory=str(root), prefix="/moved/", to=f"{other}/") as first,
    ):
        host = first.removeprefix("http://")
        with pytest.raises(RemotePermissionError) as info:
            RemoteFile.open_http(f"http://ann:{PASSWORD}@{host}/moved/f.bin")
    assert other_log.all() == []
    message = str(info.value)
    assert first in message and other in message and SHOWN not in message


def test_basic_auth_follows_a_redirect_within_its_origin(root):
    log = Log()
    with serve(log=log, directory=str(root), prefix="/moved/", to="/") as server:
        host = server.removeprefix("http://")
        with RemoteFile.open_http(f"http://ann:{PASSWORD}@{host}/moved/f.bin") as f:
            assert read_all(f) == DATA
    assert {r.headers.get("authorization") for r in log.all()} == {basic("ann", "hunter2@pw")}
    assert any(r.path == "/f.bin" for r in log.all())


# --- 3. A private CA -------------------------------------------------------------------

CA_VARIABLES = (
    "KVIKPY_HTTP_CA_BUNDLE",
    "AWS_CA_BUNDLE",
    "CURL_CA_BUNDLE",
    "REQUESTS_CA_BUNDLE",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
)


@pytest.fixture
def https(root: Path, tmp_path_factory: pytest.TempPathFactory, monkeypatch) -> Iterator[tuple]:
    """An HTTPS file server whose certificate a private CA issued, no CA configured
    (variables removed, the setting None); yields ``(base URL, CA file)``."""
    pytest.importorskip("cryptography")
    for name in CA_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    pki = make_pki(tmp_path_factory.mktemp("pki"))
    with (
        defaults.set("http_ca_bundle", None),
        serve(log=Log(), directory=str(root), tls=pki.server_context()) as base,
    ):
        yield base, pki.ca


def test_private_ca_is_refused_without_configuration(https):
    base, _ = https
    with pytest.raises(RemoteConnectionError) as info:
        RemoteFile.open_http(f"{base}/f.bin")
    message = str(info.value)
    assert "certificate" in message.lower() and "http_ca_bundle" in message, message


def test_private_ca_trusted_by_the_setting(https):
    base, ca = https
    with defaults.set("http_ca_bundle", ca):
        assert defaults.get("http_ca_bundle") == str(ca)
        with RemoteFile.open_http(f"{base}/f.bin") as f:
            assert read_all(f) == DATA
        assert np.from_dlpack(kvikpy.read(f"{base}/f.bin", device="cpu")).tobytes() == DATA
    # Back to the public roots: refused again (the agent follows the setting).
    with pytest.raises(RemoteConnectionError):
        RemoteFile.open_http(f"{base}/f.bin")


@pytest.mark.parametrize(
    "variable", ["CURL_CA_BUNDLE", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE", "SSL_CERT_DIR"]
)
def test_private_ca_trusted_by_a_variable(https, monkeypatch, variable):
    base, ca = https
    monkeypatch.setenv(variable, str(ca.parent if variable == "SSL_CERT_DIR" else ca))
    with RemoteFile.open_http(f"{base}/f.bin") as f:
        assert read_all(f) == DATA


def test_aws_ca_bundle_is_for_s3_endpoints_only(https, monkeypatch):
    base, ca = https
    monkeypatch.setenv("AWS_CA_BUNDLE", str(ca))
    with RemoteFile.open_s3_public(f"{base}/bucket/key.bin") as f:
        assert read_all(f) == DATA
    with pytest.raises(RemoteConnectionError):
        RemoteFile.open_http(f"{base}/f.bin")


def test_the_setting_wins_over_variables(https, monkeypatch, tmp_path):
    base, ca = https
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate")
    monkeypatch.setenv("CURL_CA_BUNDLE", str(garbage))
    with defaults.set("http_ca_bundle", str(ca)), RemoteFile.open_http(f"{base}/f.bin") as f:
        assert read_all(f) == DATA


def test_unusable_bundles_name_the_file_and_the_variable(https, monkeypatch, tmp_path):
    base, _ = https
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate")
    for variable, path in [
        ("SSL_CERT_FILE", tmp_path / "missing.pem"),
        ("CURL_CA_BUNDLE", garbage),
    ]:
        with monkeypatch.context() as mp:
            mp.setenv(variable, str(path))
            with pytest.raises(ConfigError) as info:
                RemoteFile.open_http(f"{base}/f.bin")
            message = str(info.value)
            assert str(path) in message and variable in message, message
    with (
        defaults.set("http_ca_bundle", str(garbage)),
        pytest.raises(ConfigError, match="http_ca_bundle"),
    ):
        RemoteFile.open_http(f"{base}/f.bin")
    before = defaults.get("http_ca_bundle")
    with pytest.raises(ValueError, match=r"missing\.pem"):
        defaults.set("http_ca_bundle", tmp_path / "missing.pem")
    assert defaults.get("http_ca_bundle") == before
    with pytest.raises(TypeError):
        defaults.set("http_ca_bundle", 3)


def test_kvikpy_http_ca_bundle_variable(https):
    """The setting's variable, read when a fresh process starts."""
    base, ca = https
    env = {k: v for k, v in os.environ.items() if k not in CA_VARIABLES}
    code = (
        "import hashlib, kvikpy, numpy\n"
        "print(kvikpy.defaults.get('http_ca_bundle'))\n"
        f"buf = kvikpy.read('{base}/f.bin', device='cpu')\n"
        "data = numpy.from_dlpack(buf).tobytes()\n"
        "print(hashlib.sha256(data).hexdigest())\n"
    )
    run = subprocess.run(
        [sys.executable, "-c", code],
        env={**env, "KVIKPY_HTTP_CA_BUNDLE": str(ca)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == [str(ca), hashlib.sha256(DATA).hexdigest()]
