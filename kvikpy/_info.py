"""What ``kvikpy.info()`` and ``python -m kvikpy info`` report: versions, platform, CUDA
devices, the GPU I/O path, settings and the library's location, as a dict."""

from __future__ import annotations

import os
import platform
import sys
from typing import Any

import kvikpy._lib as _lib
from kvikpy import _devices, _display, _gds, defaults
from kvikpy._api import cuda_available, device_count

__all__ = ["collect_info", "staging_info"]


def _setting_value(name: str) -> Any:
    """A setting as JSON can hold it (``compat_mode`` by its name)."""
    value = defaults.get(name)
    return value.name if isinstance(value, defaults.CompatMode) else value


def staging_info() -> dict[str, Any]:
    """The staging budget of a checkpoint load at the current settings, and the staging
    memory kvikpy holds now.

    Returns
    -------
    dict
        ``checkpoint_staging`` (the setting, in bytes); ``gpu_load``: for a load into GPU
        memory, ``bounce`` (the most pinned bytes its reads hold at once) and
        ``windows`` (the GPU memory left for its two staging windows per device);
        ``host_load``: ``bounce`` for a load into host memory (the host buffers of its
        O_DIRECT reads); ``uncapped``: what those reads would hold at once without the
        budget, ``pinned`` (per GPU) and ``host``; ``memory``: the bounce buffers held
        now, ``host`` and ``pinned`` per device ordinal, each with ``held``
        (allocated, idle or in use), ``in_use`` (held by transfers) and their peaks.
    """
    gpu_bounce, windows = _lib.staging_split(True, False)
    host_bounce, _ = _lib.staging_split(False, True)
    pinned, host = _lib.staging_demand()
    return {
        "checkpoint_staging": _setting_value("checkpoint_staging"),
        "gpu_load": {"bounce": gpu_bounce, "windows": windows},
        "host_load": {"bounce": host_bounce},
        "uncapped": {"pinned": pinned, "host": host},
        "memory": _lib.staging_memory(),
    }


def shared_pieces(device_count: int) -> list[tuple[int, int, int]]:
    """How local reads move while 2 to ``device_count`` GPUs of this process read at once:
    ``(GPUs, piece bytes, pinned buffers per read)`` for each count where the engine cuts
    them into shared pieces (none on one GPU, or where no copy turns are taken)."""
    out = []
    for gpus in range(2, device_count + 1):
        cut = _lib.shared_read_pieces(gpus)
        if cut is not None:
            out.append((gpus, *cut))
    return out


def collect_info() -> dict[str, Any]:
    """Versions, platform, CUDA devices, settings and library location, as a dict.

    Returns
    -------
    dict
        ``kvikpy``, ``python``, ``python_implementation``, ``executable``, ``platform``,
        ``cuda_available``, ``cuda_unavailable_reason``, ``device_count``, ``devices``
        (``"cuda:N"`` labels: the engine does not report device names), ``compat_mode``
        (whether I/O resolves to POSIX rather than cuFile), ``gpu_io`` (which path GPU
        reads take), ``io_threads`` (the I/O thread pools: one for host transfers and one
        per GPU, sized by ``num_threads`` and ``gpu_threads``), ``cufile`` (one line:
        whether cuFile is usable, why not, and what ``compat_mode`` then does), ``gds``
        (see :func:`kvikpy._gds.gds_status`: usable, the first reason it is not, the
        libcufile loaded, stand-in or not, its version, nvidia-fs, the driver
        properties), ``staging`` (see :func:`staging_info`), ``settings`` and
        ``library`` (the path of the loaded extension module).
    """
    available = cuda_available()
    gds = _gds.gds_status()
    mode = str(_setting_value("compat_mode"))
    count = device_count() if available else 0
    per_gpu, budget = _lib.gpu_pool_threads()
    return {
        "kvikpy": _lib.__version__,
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "executable": sys.executable,
        "platform": platform.platform(),
        "cuda_available": available,
        "cuda_unavailable_reason": None if available else _lib.cuda_unavailable_reason(),
        "device_count": count,
        "devices": [_devices.label(i) for i in range(count)],
        "compat_mode_preferred": defaults.is_compat_mode_preferred(),
        "gpu_io": _display.gpu_io(gds, mode, available),
        "io_threads": _display.io_threads(
            int(defaults.get("num_threads")), per_gpu, count, budget, shared_pieces(count)
        ),
        "cufile": _display.cufile_note(gds, mode),
        "gds": gds,
        "staging": staging_info(),
        "settings": {name: _setting_value(name) for name in _lib.setting_names()},
        "library": os.path.abspath(str(_lib.__file__)),
    }
