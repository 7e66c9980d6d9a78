"""kvikio's cuFile registration API and what kvikpy knows about GPUDirect Storage here."""

from __future__ import annotations

from typing import Any

import kvikpy._lib as _lib
from kvikpy._cuda_streams import stream_handle

__all__ = [
    "gds_status",
    "memory_deregister",
    "memory_register",
    "stream_deregister",
    "stream_register",
]


def memory_register(buf: Any, flags: int = 0) -> None:
    """Register ``buf``'s memory with cuFile (``cuFileBufRegister``), as kvikio does.

    Parameters
    ----------
    buf
        GPU memory (CuPy, torch, anything with ``__cuda_array_interface__`` or DLPack).
    flags
        cuFile's registration flags (0 by default).

    Notes
    -----
    A no-op where compat mode is preferred (``kvikpy.defaults.is_compat_mode_preferred()``),
    which includes every machine without a usable cuFile; memory already registered is
    not an error. Registration only speeds cuFile up: reads work without it.
    """
    _lib.memory_register(buf, flags)


def memory_deregister(buf: Any) -> None:
    """Undo :func:`memory_register` (``cuFileBufDeregister``); a no-op where compat mode
    is preferred.

    Parameters
    ----------
    buf
        The memory given to :func:`memory_register`.
    """
    _lib.memory_deregister(buf)


def stream_register(stream: Any, flags: int) -> None:
    """Register a CUDA stream with cuFile (``cuFileStreamRegister``), as kvikio does.

    Parameters
    ----------
    stream
        The stream: a raw ``CUstream`` int or a framework's stream object.
    flags
        cuFile's stream flags (which parameters are valid at submission and are aligned).

    Notes
    -----
    A no-op where compat mode is preferred. :meth:`kvikpy.CuFile.raw_read_async` registers
    the streams it is given itself, so this is rarely needed.
    """
    _lib.stream_register(stream_handle(stream), flags)


def stream_deregister(stream: Any) -> None:
    """Undo :func:`stream_register`; a no-op where compat mode is preferred.

    Parameters
    ----------
    stream
        The stream given to :func:`stream_register`.
    """
    _lib.stream_deregister(stream_handle(stream))


def gds_status() -> dict[str, Any]:
    """Whether GPUDirect Storage through cuFile is usable here, and if not, the first reason.

    Returns
    -------
    dict
        ``usable`` (bool: libcufile loads, nvidia-fs is loaded, ``/run/udev`` is readable,
        not WSL, and the driver opens; a file's registration can still be refused, which
        ``CuFile.backend`` reports per file), ``reason`` (None or the first reason found),
        ``library`` (the libcufile file loaded, or None), ``standin`` (the description of
        kvikpy's test stand-in when ``KVIKPY_CUFILE_LIBRARY`` loaded it, else None),
        ``libcufile_version`` (``"1.15"``, or None), ``nvidia_fs`` (bool) and
        ``properties`` (the driver properties, or None where the driver cannot open).
    """
    status = _lib.cufile_status()
    reason: str | None = status["load_error"]
    version = int(_lib.cufile_version())
    properties: dict[str, Any] | None = None
    if status["library"] is not None:
        try:
            properties = dict(_lib.cufile_properties())
        except RuntimeError as exc:
            reason = reason or f"the cuFile driver does not open: {exc}"
    if reason is None and not status["nvidia_fs"] and status["standin"] is None:
        reason = (
            "the nvidia-fs kernel module is not loaded (/proc/driver/nvidia-fs is absent), "
            "so cuFile cannot move data directly between storage and GPU memory"
        )
    reason = reason or status["system_refusal"]
    return {
        "usable": reason is None,
        "reason": reason,
        "library": status["library"],
        "standin": status["standin"],
        "libcufile_version": f"{version // 1000}.{version % 1000 // 10}" if version else None,
        "nvidia_fs": bool(status["nvidia_fs"]),
        "properties": properties,
    }
