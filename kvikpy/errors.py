"""kvikpy's own exceptions.

Operating-system failures are raised as Python's own ``OSError`` subclasses
(``FileNotFoundError``, ``PermissionError``, ...) and bad arguments as ``ValueError`` or
``TypeError``; the classes here cover what is specific to kvikpy. Every one derives from
:class:`KvikpyError`, and also from the builtin class a caller would naturally catch.

Where kvikio raises ``RuntimeError`` (a file that does not open, a failed read or write, a
read through a file opened ``"w"``), kvikpy raises the Python type *and* a
``RuntimeError``: the classes below derive from both, so ``except FileNotFoundError:`` and
kvikio's ``except RuntimeError:`` catch the same exception, with ``errno`` and
``filename`` set as Python sets them. kvikpy picks the class by errno as ``OSError``
itself does (``ENOENT`` is :class:`FileNotFoundRuntimeError`, a ``FileNotFoundError``).
"""

from __future__ import annotations

import io

__all__ = [
    "BlockingIORuntimeError",
    "BrokenPipeRuntimeError",
    "ChildProcessRuntimeError",
    "ConfigError",
    "ConnectionAbortedRuntimeError",
    "ConnectionRefusedRuntimeError",
    "ConnectionResetRuntimeError",
    "CuFileError",
    "CudaError",
    "CudaUnavailableError",
    "FileExistsRuntimeError",
    "FileNotFoundRuntimeError",
    "FileTypeError",
    "InternalError",
    "InterruptedRuntimeError",
    "IsADirectoryRuntimeError",
    "KvikpyError",
    "MmapClosedError",
    "NegativeValueError",
    "NotADirectoryRuntimeError",
    "OSRuntimeError",
    "PermissionRuntimeError",
    "ProcessLookupRuntimeError",
    "RemoteConnectionError",
    "RemoteError",
    "RemoteNotFoundError",
    "RemotePermissionError",
    "RemoteRangeError",
    "RemoteTimeoutError",
    "RemoteUrlError",
    "TimeoutRuntimeError",
    "UnsupportedOperationError",
]


class KvikpyError(Exception):
    """Base class of every exception kvikpy defines."""


class ConfigError(KvikpyError, ValueError):
    """A ``KVIKIO_*`` environment variable holds a value kvikpy cannot parse.

    The message names the variable, the value found and the accepted forms. Fix or unset
    the variable (``os.environ`` changes are seen on the next call).
    """


class InternalError(KvikpyError, RuntimeError):
    """A bug inside kvikpy's engine (a Rust panic), caught before it could crash Python.

    Please report it with the message; the operation that raised it did not complete.
    """


class CudaUnavailableError(KvikpyError, RuntimeError):
    """GPU memory was asked for, but no usable CUDA driver or GPU was found.

    The message says what is missing. Pass ``device="cpu"`` to read into host memory
    instead; host-memory I/O needs no GPU.
    """


class CudaError(KvikpyError, RuntimeError):
    """A CUDA driver call failed; the message names the call and the ``CUresult``."""


class CuFileError(KvikpyError, RuntimeError):
    """cuFile (GPUDirect Storage) could not be used, or one of its calls failed.

    Raised where cuFile was required (``compat_mode`` OFF, :mod:`kvikpy.cufile_driver`)
    and on failed cuFile transfers; the message carries cuFile's own error
    (``HANDLE_NOT_REGISTERED (5027) ...``). A ``RuntimeError``, as kvikio raises.
    """


class MmapClosedError(KvikpyError, ValueError, RuntimeError):
    """A read from a :class:`kvikpy.Mmap` that was closed.

    A ``ValueError``, as reading a closed Python file raises, and a ``RuntimeError``, as
    kvikio raises; its message starts with kvikio's ("Cannot read from a closed
    MmapHandle"). Create a new :class:`kvikpy.Mmap` to read the file again.
    """


class NegativeValueError(KvikpyError, ValueError, OverflowError):
    """A negative number where kvikio takes a size, a count or an offset (a setting such as
    ``task_size``, a page-cache range).

    A ``ValueError`` (kvikpy's rule for bad arguments) and an ``OverflowError`` (what
    kvikio raises, converting the number to C's ``size_t``); the message says
    ``negative value``, as kvikio's does.
    """


class FileTypeError(KvikpyError, TypeError, ValueError):
    """The ``file`` argument is none of a path, a file descriptor or an open file object.

    A ``TypeError``, and a ``ValueError`` as kvikio raises for it.
    """


class UnsupportedOperationError(KvikpyError, io.UnsupportedOperation, RuntimeError):
    """Reading a file opened without read access (``"w"``), or writing one opened ``"r"``.

    An ``io.UnsupportedOperation`` (as Python's own files raise), and the ``RuntimeError``
    kvikio raises; the message starts with kvikio's ``Operation not permitted``.
    """


class OSRuntimeError(KvikpyError, OSError, RuntimeError):
    """An operating-system call failed: an ``OSError`` with ``errno``, ``strerror`` and
    ``filename``, and the ``RuntimeError`` kvikio raises for it.

    Raised as such for errnos Python has no subclass for; the classes below cover the
    others, each also the builtin ``OSError`` subclass of its errno. Opening errors
    start with kvikio's ``Unable to open file``.
    """


class FileNotFoundRuntimeError(OSRuntimeError, FileNotFoundError):
    """``ENOENT``: a ``FileNotFoundError`` and a ``RuntimeError``."""


class PermissionRuntimeError(OSRuntimeError, PermissionError):
    """``EACCES``, ``EPERM``: a ``PermissionError`` and a ``RuntimeError``."""


class IsADirectoryRuntimeError(OSRuntimeError, IsADirectoryError):
    """``EISDIR``: an ``IsADirectoryError`` and a ``RuntimeError``."""


class NotADirectoryRuntimeError(OSRuntimeError, NotADirectoryError):
    """``ENOTDIR``: a ``NotADirectoryError`` and a ``RuntimeError``."""


class FileExistsRuntimeError(OSRuntimeError, FileExistsError):
    """``EEXIST``: a ``FileExistsError`` and a ``RuntimeError``."""


class InterruptedRuntimeError(OSRuntimeError, InterruptedError):
    """``EINTR``: an ``InterruptedError`` and a ``RuntimeError``."""


class BlockingIORuntimeError(OSRuntimeError, BlockingIOError):
    """``EAGAIN``, ``EALREADY``, ``EINPROGRESS``: a ``BlockingIOError`` and a ``RuntimeError``."""


class TimeoutRuntimeError(OSRuntimeError, TimeoutError):
    """``ETIMEDOUT``: a ``TimeoutError`` and a ``RuntimeError``."""


class BrokenPipeRuntimeError(OSRuntimeError, BrokenPipeError):
    """``EPIPE``, ``ESHUTDOWN``: a ``BrokenPipeError`` and a ``RuntimeError``."""


class ConnectionAbortedRuntimeError(OSRuntimeError, ConnectionAbortedError):
    """``ECONNABORTED``: a ``ConnectionAbortedError`` and a ``RuntimeError``."""


class ConnectionRefusedRuntimeError(OSRuntimeError, ConnectionRefusedError):
    """``ECONNREFUSED``: a ``ConnectionRefusedError`` and a ``RuntimeError``."""


class ConnectionResetRuntimeError(OSRuntimeError, ConnectionResetError):
    """``ECONNRESET``: a ``ConnectionResetError`` and a ``RuntimeError``."""


class ChildProcessRuntimeError(OSRuntimeError, ChildProcessError):
    """``ECHILD``: a ``ChildProcessError`` and a ``RuntimeError``."""


class ProcessLookupRuntimeError(OSRuntimeError, ProcessLookupError):
    """``ESRCH``: a ``ProcessLookupError`` and a ``RuntimeError``."""


# Remote files (kvikpy.RemoteFile, kvikpy.read of a URL). Each class is also the builtin
# exception a caller would catch for it (FileNotFoundError for a 404...) and, like every
# failure kvikio reports from libcurl, a RuntimeError.


class RemoteError(KvikpyError, OSError, RuntimeError):
    """A remote file (HTTP(S), S3, WebHDFS) could not be opened or read.

    An ``OSError`` (``errno`` ``EIO``, ``filename`` the URL) whose message names the
    request, what the server answered and what to do: an error status after the retries
    of ``http_max_attempts``, or a body shorter or longer than the range asked for; with
    ``errno`` ``ESTALE``, a file that changed on the server since it was opened (its
    ``ETag`` differs: open it again to read its new version). The subclasses below cover
    the failures that have a builtin type of their own.
    """


class RemoteNotFoundError(RemoteError, FileNotFoundError):
    """The server has no such file (HTTP 404 or 410)."""


class RemotePermissionError(RemoteError, PermissionError):
    """The server refused access (HTTP 401 or 403): credentials missing, wrong or not
    allowed to read the object, or a presigned URL expired."""


class RemoteConnectionError(RemoteError, ConnectionError):
    """No connection to the server: refused (``errno`` ``ECONNREFUSED``: nothing listens
    there), the host unknown, TLS failed, or the connection broke during the answer."""


class RemoteTimeoutError(RemoteError, TimeoutError):
    """Every attempt took longer than the ``http_timeout`` setting (seconds)."""


class RemoteRangeError(RemoteError, OverflowError):
    """The server ignored a range request and sent the whole file: it does not support
    HTTP ranges, which reading part of a file (or in parallel) needs. An
    ``OverflowError`` too, as kvikio raises."""


class RemoteUrlError(KvikpyError, ValueError, RuntimeError):
    """A remote file's URL, endpoint type or credentials cannot make a request: no
    scheme, a form no allowed endpoint type has, a type outside ``allow_list``, missing
    AWS keys or region."""
