"""kvikpy's own exceptions.

Operating-system failures are raised as Python's own ``OSError`` subclasses
(``FileNotFoundError``, ``PermissionError``, ...) and bad arguments as ``ValueError`` or
``TypeError``; the classes here cover what is specific to kvikpy. Every one derives from
:class:`KvikpyError`, and also from the builtin class a caller would naturally catch.
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "CuFileError",
    "CudaError",
    "CudaUnavailableError",
    "InternalError",
    "KvikpyError",
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
