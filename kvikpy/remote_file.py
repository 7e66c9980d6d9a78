"""Remote files over HTTP(S), S3 and WebHDFS, with kvikio's ``kvikio.RemoteFile`` API.

A :class:`RemoteFile` reads byte ranges of a file on a server into host or GPU memory,
with HTTP range requests run in parallel on kvikpy's thread pool (GPU reads through the
pinned bounce buffers, a range per chunk, never a whole-file copy in host memory)::

    import kvikpy

    with kvikpy.RemoteFile.open_http("https://example.com/data.bin") as f:
        buf = bytearray(f.nbytes())
        f.read(buf)

    with kvikpy.RemoteFile.open("s3://my-bucket/data.bin") as f:  # AWS_* variables
        fut = f.pread(torch.empty(f.nbytes(), dtype=torch.uint8, device="cuda"))
        fut.get()

:func:`kvikpy.read`, :func:`kvikpy.read_many` and :func:`kvikpy.read_ranges` take URLs
(``http://``, ``https://``, ``s3://``, ``webhdfs://``) as well as paths. Requests are
retried and timed out as the ``http_max_attempts``, ``http_status_codes`` and
``http_timeout`` settings say (:mod:`kvikpy.defaults`); a read whose request fails for
good stops its other requests, and Ctrl-C interrupts every wait for a remote file at once
(its requests stop within tens of milliseconds). Failures raise
:class:`kvikpy.errors.RemoteError` or one of its subclasses, which are also Python's own
types (``FileNotFoundError`` for a 404, ``PermissionError`` for a 403,
``ConnectionError``, ``TimeoutError``) and, as in kvikio, ``RuntimeError``.

Credentials stay with the host they were made for. User info in an HTTP(S) URL
(``https://user:password@host/path``, percent-encoded) is sent as HTTP basic
authentication, as curl does; it is taken out of the URL, so that no ``repr``, message,
exception (nor its ``filename``) or log shows the password (user info is redacted as
``user:***@`` wherever a URL given is quoted). Redirects are followed (at most 10), but a
request that carries a credential (basic authentication, an S3 signature or session
token) follows a redirect only within its origin (scheme, host and port), signed again
for the new URL; a redirect to another host is an error naming both hosts, never sent.
For S3 it means the bucket lives in another region or endpoint: set
``AWS_DEFAULT_REGION`` or ``AWS_ENDPOINT_URL``, as the AWS SDKs require. Requests that
carry no credential follow redirects anywhere (as kvikio's libcurl does).

HTTPS certificates are always verified, against Mozilla's public roots unless a CA
bundle is configured; the first of these names it: the ``http_ca_bundle`` setting
(``KVIKPY_HTTP_CA_BUNDLE``), ``AWS_CA_BUNDLE`` (S3 endpoints only, as the AWS SDKs),
``CURL_CA_BUNDLE`` (as kvikio), ``REQUESTS_CA_BUNDLE``, then ``SSL_CERT_FILE`` and
``SSL_CERT_DIR`` (OpenSSL's; both where both are set). A bundle is a PEM file, or a
directory of PEM files, of CA certificates; it *replaces* the public roots (as for curl,
OpenSSL and the AWS SDKs), so to trust both, name a file holding your CA and the
system's bundle (``/etc/ssl/certs/ca-certificates.crt``). The configuration is taken
when a file is opened. A bundle that cannot be read or holds no certificate raises
:class:`kvikpy.ConfigError` naming it and the setting or variable that named it.
"""

from __future__ import annotations

import enum
import urllib.parse

import kvikpy._lib as _lib
from kvikpy import _paths
from kvikpy._open_file import OpenFile
from kvikpy.cufile import BufferLike, IOFuture
from kvikpy.errors import NegativeValueError

__all__ = [
    "RemoteEndpointType",
    "RemoteFile",
    "infer_remote_endpoint_type",
    "is_remote_file_available",
]


class RemoteEndpointType(enum.Enum):
    """The kinds of remote endpoint kvikpy reads, with kvikio's names and values.

    Attributes
    ----------
    AUTO
        Infer the type from the URL (see :func:`infer_remote_endpoint_type`).
    S3
        AWS S3 with credentials: requests signed (SigV4) with ``AWS_ACCESS_KEY_ID``,
        ``AWS_SECRET_ACCESS_KEY`` (and ``AWS_SESSION_TOKEN`` for temporary keys) in
        ``AWS_DEFAULT_REGION``; ``AWS_ENDPOINT_URL`` for S3-compatible servers.
    S3_PUBLIC
        An S3 object anyone may read: unsigned requests.
    S3_PRESIGNED_URL
        An S3 presigned URL: the signature is in the URL's query.
    WEBHDFS
        Apache Hadoop's WebHDFS (``http://<host>:<port>/webhdfs/v1/<path>``).
    HTTP
        Any HTTP(S) server that supports range requests.
    """

    AUTO = 0
    S3 = 1
    S3_PUBLIC = 2
    S3_PRESIGNED_URL = 3
    WEBHDFS = 4
    HTTP = 5


def is_remote_file_available() -> bool:
    """Whether :class:`RemoteFile` can be used: always True in kvikpy, whose engine has
    its own HTTP client (kvikio needs a build with libcurl)."""
    return True


def infer_remote_endpoint_type(url: str) -> RemoteEndpointType:
    """The endpoint type :meth:`RemoteFile.open` picks for ``url`` (no request is sent).

    Parameters
    ----------
    url
        The remote file's URL.

    Returns
    -------
    RemoteEndpointType
        S3 for ``s3://`` URLs and AWS S3 HTTP URLs (S3_PUBLIC where no credentials are
        set), S3_PRESIGNED_URL for those carrying ``X-Amz-Algorithm`` and
        ``X-Amz-Signature``, WEBHDFS for ``http://<host>:<port>/webhdfs/v1/...``, HTTP for
        any other HTTP(S) URL with a path.

    Raises
    ------
    kvikpy.errors.RemoteUrlError
        For a URL without a scheme or of no supported form (a ``ValueError`` and a
        ``RuntimeError``).
    """
    return RemoteEndpointType(_lib.infer_remote_endpoint_type(url))


class RemoteFile(OpenFile):
    """A file on a remote server, read in parallel with HTTP range requests.

    Open one with a class method (:meth:`open`, :meth:`open_http`, :meth:`open_s3`,
    :meth:`open_s3_url`, :meth:`open_s3_public`, :meth:`open_s3_presigned_url`,
    :meth:`open_webhdfs`), not with the constructor. The size is asked of the server once,
    when the file is opened (pass ``nbytes`` to skip that request). A remote file is
    read-only; it is a context manager, and :meth:`close` is idempotent.
    """

    def __init__(self, handle: _lib.RemoteHandle) -> None:
        """Wrap a remote file the engine opened (use the class methods instead).

        Parameters
        ----------
        handle
            The engine's handle of the open remote file.
        """
        self._remote = handle
        self._handle = handle.file

    @classmethod
    def open_http(cls, url: str, nbytes: int | None = None) -> RemoteFile:
        """Open a file on an HTTP(S) server that supports range requests.

        Parameters
        ----------
        url
            The file's URL; user info (``https://user:password@host/path``,
            percent-encoded) is sent as HTTP basic authentication to that host only, and
            never shown.
        nbytes
            The file's size; ``None`` (the default) asks the server (a ``HEAD`` request).
        """
        return cls(_lib.RemoteHandle.open_http(url, nbytes))

    @classmethod
    def open_s3(
        cls,
        bucket_name: str,
        object_name: str,
        nbytes: int | None = None,
        aws_region_name: str | None = None,
        aws_access_key_id: str | None = None,
        aws_secret_access_key: str | None = None,
        aws_endpoint_url: str | None = None,
        aws_session_token: str | None = None,
    ) -> RemoteFile:
        """Open an S3 object by bucket and object name, with signed requests.

        Each ``aws_*`` argument left ``None`` is read from its environment variable:
        ``AWS_DEFAULT_REGION``, ``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``,
        ``AWS_ENDPOINT_URL``, ``AWS_SESSION_TOKEN`` (needed with temporary keys, those
        starting with ``ASIA``).

        Parameters
        ----------
        bucket_name
            The bucket.
        object_name
            The object's key.
        nbytes
            The object's size; ``None`` asks the server.
        aws_region_name
            The region, such as ``"us-east-1"``.
        aws_access_key_id
            The access key id.
        aws_secret_access_key
            The secret access key (it signs requests; it is never sent).
        aws_endpoint_url
            An S3-compatible server to use instead of AWS (``"http://127.0.0.1:9000"``):
            the object is then ``<aws_endpoint_url>/<bucket_name>/<object_name>``;
            otherwise ``https://<bucket_name>.s3.<region>.amazonaws.com/<object_name>``.
        aws_session_token
            The session token of temporary credentials.
        """
        return cls(
            _lib.RemoteHandle.open_s3(
                bucket_name,
                object_name,
                nbytes,
                _lib.S3Credentials(
                    aws_region_name,
                    aws_access_key_id,
                    aws_secret_access_key,
                    aws_endpoint_url,
                    aws_session_token,
                ),
            )
        )

    @classmethod
    def open_s3_url(
        cls,
        url: str,
        nbytes: int | None = None,
        aws_region_name: str | None = None,
        aws_access_key_id: str | None = None,
        aws_secret_access_key: str | None = None,
        aws_endpoint_url: str | None = None,
        aws_session_token: str | None = None,
    ) -> RemoteFile:
        """Open an S3 object by URL, with signed requests.

        Parameters
        ----------
        url
            ``s3://<bucket>/<object>``, or the object's HTTP(S) URL
            (``http://127.0.0.1:9000/<bucket>/<object>``).
        nbytes
            The object's size; ``None`` asks the server.
        aws_region_name
            The region (``AWS_DEFAULT_REGION`` if None), as for :meth:`open_s3`.
        aws_access_key_id
            The access key id (``AWS_ACCESS_KEY_ID`` if None).
        aws_secret_access_key
            The secret access key (``AWS_SECRET_ACCESS_KEY`` if None).
        aws_endpoint_url
            As for :meth:`open_s3`; used with ``s3://`` URLs only.
        aws_session_token
            The session token of temporary credentials (``AWS_SESSION_TOKEN`` if None).

        Raises
        ------
        ValueError
            For a URL that is neither ``s3://`` nor HTTP(S) ("Unsupported protocol").
        """
        scheme = urllib.parse.urlparse(url.lower()).scheme
        credentials = _lib.S3Credentials(
            aws_region_name,
            aws_access_key_id,
            aws_secret_access_key,
            aws_endpoint_url,
            aws_session_token,
        )
        if scheme in ("http", "https", "s3"):
            return cls(_lib.RemoteHandle.open_s3_url(url, nbytes, credentials, scheme != "s3"))
        raise ValueError(
            f"Unsupported protocol: {_paths.redact_url(url)!r}; open_s3_url takes "
            "s3://<bucket>/<object> or an http(s):// URL of the object"
        )

    @classmethod
    def open_s3_public(cls, url: str, nbytes: int | None = None) -> RemoteFile:
        """Open an S3 object anyone may read, with unsigned requests.

        Parameters
        ----------
        url
            The object's HTTP(S) URL, or ``s3://<bucket>/<object>`` (at the URL that
            ``AWS_ENDPOINT_URL`` or ``AWS_DEFAULT_REGION`` gives).
        nbytes
            The object's size; ``None`` asks the server.
        """
        return cls(_lib.RemoteHandle.open_s3_public(url, nbytes))

    @classmethod
    def open_s3_presigned_url(cls, presigned_url: str, nbytes: int | None = None) -> RemoteFile:
        """Open an S3 object by a presigned URL (its signature in the query).

        Parameters
        ----------
        presigned_url
            The presigned URL, sent as given.
        nbytes
            The object's size; ``None`` asks the server (a 1-byte ranged ``GET``: S3
            refuses ``HEAD`` on a URL presigned for ``GET``).
        """
        return cls(_lib.RemoteHandle.open_s3_presigned_url(presigned_url, nbytes))

    @classmethod
    def open_webhdfs(cls, url: str, nbytes: int | None = None) -> RemoteFile:
        """Open a file on Apache Hadoop's HDFS through WebHDFS.

        Parameters
        ----------
        url
            ``http://<host>:<port>/webhdfs/v1/<path>`` (a ``user.name=`` in its query is
            kept; otherwise ``KVIKIO_WEBHDFS_USERNAME`` names the user, if set), or
            ``webhdfs://<host>:<port>/<path>``.
        nbytes
            The file's size; ``None`` asks the server (``op=GETFILESTATUS``).
        """
        return cls(_lib.RemoteHandle.open_webhdfs(url, nbytes))

    @classmethod
    def open(
        cls,
        url: str,
        remote_endpoint_type: RemoteEndpointType = RemoteEndpointType.AUTO,
        allow_list: list[RemoteEndpointType] | None = None,
        nbytes: int | None = None,
    ) -> RemoteFile:
        """Open a remote file by URL, of the endpoint type given or inferred.

        Parameters
        ----------
        url
            The file's URL (see :func:`infer_remote_endpoint_type` for the forms).
        remote_endpoint_type
            ``AUTO`` (the default) infers the type from the URL, trying the types of
            ``allow_list`` in order; an S3 URL is tried with credentials (asking the
            object's size), then, if that fails and ``S3_PUBLIC`` is allowed, without.
            Another type is used as given.
        allow_list
            The types allowed; ``None`` allows S3, S3_PUBLIC, S3_PRESIGNED_URL, WEBHDFS
            and HTTP, in that order.
        nbytes
            The file's size; ``None`` asks the server.

        Raises
        ------
        kvikpy.errors.RemoteUrlError
            For a URL without a scheme or of no allowed form, a type not in
            ``allow_list``, or a URL that does not have the given type's form (a
            ``ValueError`` and a ``RuntimeError``).
        kvikpy.errors.RemoteError
            If the server cannot be reached or refuses the size request.
        """
        allowed = None if allow_list is None else [t.value for t in allow_list]
        return cls(
            _lib.RemoteHandle.open(
                url, RemoteEndpointType(remote_endpoint_type).value, allowed, nbytes
            )
        )

    def __str__(self) -> str:
        return f'<{type(self).__name__} "{_paths.redact_url(self._remote.url)}">'

    def __repr__(self) -> str:
        return (
            f"<kvikpy.RemoteFile {_paths.redact_url(self._remote.url)!r} "
            f"{self.remote_endpoint_type().name} "
            f"{self.nbytes()} bytes{' closed' if self.closed else ''}>"
        )

    @property
    def url(self) -> str:
        """The file's URL, as requests use it: without user info (whose credentials
        travel in a header, never shown)."""
        return self._remote.url

    def remote_endpoint_type(self) -> RemoteEndpointType:
        """The file's endpoint type."""
        return RemoteEndpointType(self._remote.remote_endpoint_type())

    def nbytes(self) -> int:
        """The file's size in bytes (known since it was opened; no request)."""
        return self._remote.nbytes()

    def _checked_size(self, buf: BufferLike, size: int | None, file_offset: int) -> int:
        if size is None:
            size = _lib.buffer_nbytes(buf)
        if size < 0 or file_offset < 0:
            raise NegativeValueError(
                f"negative value: size and file_offset must be non-negative, got {size} "
                f"and {file_offset}"
            )
        nbytes = self.nbytes()
        if file_offset + size > nbytes:
            raise ValueError(
                f"cannot read {file_offset}+{size} bytes into a {nbytes} bytes file "
                f"({_paths.redact_url(self.url)}); read at most "
                f"{max(nbytes - file_offset, 0)} bytes at that offset"
            )
        return size

    def pread(
        self,
        buf: BufferLike,
        size: int | None = None,
        file_offset: int = 0,
        task_size: int | None = None,
    ) -> IOFuture:
        """Start reading ``size`` bytes at ``file_offset`` into ``buf``; return a future.

        The read is cut into ranges of ``task_size`` bytes requested in parallel on the
        thread pool (GPU memory: through pinned bounce buffers).

        Parameters
        ----------
        buf
            Writable, contiguous host or GPU memory (as for :meth:`kvikpy.CuFile.pread`).
        size
            Bytes to read; default the buffer's size.
        file_offset
            Where in the file to start.
        task_size
            The bytes of one range request; default ``defaults.get("task_size")``.

        Returns
        -------
        IOFuture
            Resolves to the bytes read (``size``).

        Raises
        ------
        ValueError
            If ``[file_offset, file_offset + size)`` reaches past the end of the file.
        """
        size = self._checked_size(buf, size, file_offset)
        return IOFuture(self._handle.pread_exact(buf, size, file_offset, task_size))

    def read(
        self,
        buf: BufferLike,
        size: int | None = None,
        file_offset: int = 0,
        task_size: int | None = None,
    ) -> int:
        """Read ``size`` bytes at ``file_offset`` into ``buf`` (a blocking :meth:`pread`).

        Parameters
        ----------
        buf
            Writable, contiguous host or GPU memory.
        size
            Bytes to read; default the buffer's size.
        file_offset
            Where in the file to start.
        task_size
            The bytes of one range request; default ``defaults.get("task_size")``.

        Returns
        -------
        int
            The bytes read (``size``).
        """
        size = self._checked_size(buf, size, file_offset)
        return self._handle.read_exact(buf, size, file_offset, task_size)
