"""Process-wide settings, with kvikio's names, environment variables and semantics.

Read a setting with :func:`get` and change one or several with :func:`set`, which applies
at once and, used as a context manager, restores the previous values on exit::

    kvikpy.defaults.set("num_threads", 8)            # from now on
    with kvikpy.defaults.set({"task_size": 16 << 20, "auto_direct_io_read": True}):
        f.read(buf)                                  # only inside the block

=======================  ================================  ===========================
setting                  environment variable              default
=======================  ================================  ===========================
``compat_mode``          ``KVIKIO_COMPAT_MODE``            ``CompatMode.AUTO``
``num_threads``          ``KVIKIO_NTHREADS``               CPUs available, at most 16
``gpu_threads``          ``KVIKPY_GPU_THREADS``            0 (kvikpy chooses)
``task_size``            ``KVIKIO_TASK_SIZE``              4 MiB
``gds_threshold``        ``KVIKIO_GDS_THRESHOLD``          16 KiB
``bounce_buffer_size``   ``KVIKIO_BOUNCE_BUFFER_SIZE``     16 MiB
``auto_direct_io_read``  ``KVIKIO_AUTO_DIRECT_IO_READ``    ``"auto"``
``auto_direct_io_write`` ``KVIKIO_AUTO_DIRECT_IO_WRITE``   ``True``
``page_cache_dma``       ``KVIKPY_PAGE_CACHE_DMA``         ``True``
``write_sync``           ``KVIKPY_WRITE_SYNC``             ``False``
``http_max_attempts``    ``KVIKIO_HTTP_MAX_ATTEMPTS``      3
``http_status_codes``    ``KVIKIO_HTTP_STATUS_CODES``      ``[429, 500, 502, 503, 504]``
``http_timeout``         ``KVIKIO_HTTP_TIMEOUT``           60 (seconds)
``http_ca_bundle``       ``KVIKPY_HTTP_CA_BUNDLE``         ``None``
``checkpoint_staging``   ``KVIKPY_CHECKPOINT_STAGING``     512 MiB
=======================  ================================  ===========================

The ``http_*`` settings govern remote files (:class:`kvikpy.RemoteFile`, URLs given to
:func:`kvikpy.read`): each HTTP request is tried up to ``http_max_attempts`` times when
the server answers one of ``http_status_codes`` or the attempt takes longer than
``http_timeout`` seconds, waiting 0.5 s, 1 s, 2 s then 4 s between attempts.
``http_timeout`` bounds each attempt of one request, as kvikio's (libcurl's
``CURLOPT_TIMEOUT``) does. A read made of many requests fails as soon as one of them has
failed for good, the others stopping at once, so a server that stalls costs a read about
one request's attempts and waits (``http_max_attempts`` x ``http_timeout`` plus the
waits between attempts), whatever its size or number of tasks. Ctrl-C interrupts any
wait for a remote file at once.
``KVIKIO_HTTP_STATUS_CODES`` is a comma-separated list of 3-digit codes (``429,503``);
``defaults.set("http_status_codes", [429, 503])`` takes a list. Either way each code is
an HTTP status code, from 100 to 599.

``http_ca_bundle`` is kvikpy's own: the path of a PEM file (or a directory of PEM files)
of the certificate authorities HTTPS servers are verified against, instead of Mozilla's
public roots (a private CA, such as an internal MinIO's). ``None`` (the default) leaves
the choice to the conventional variables, in this order: ``AWS_CA_BUNDLE`` (S3 endpoints
only), ``CURL_CA_BUNDLE``, ``REQUESTS_CA_BUNDLE``, then ``SSL_CERT_FILE`` and
``SSL_CERT_DIR``. A configured bundle replaces the public roots, as for curl and OpenSSL:
to trust both, name a file that holds your CA and the system's bundle. Setting a path
that does not exist raises ``ValueError``; the bundle is read when a remote file is
opened, and one without a certificate raises :class:`kvikpy.ConfigError`.

Environment variables are read on first use. Sizes are plain integers of bytes
(``4194304``, not ``4MiB``); booleans accept ``true/false``, ``on/off``, ``yes/no`` and
``1/0``; ``KVIKIO_COMPAT_MODE`` accepts ``ON``, ``OFF``, ``AUTO`` and the boolean
spellings. A malformed variable raises :class:`kvikpy.ConfigError` naming it.

Unlike kvikio, whose default is a single thread, kvikpy uses as many threads as the
process may run on (CPU affinity and cgroup limits respected), capped at 16: enough to
reach the page-cache and PCIe ceilings on a 16-core machine without oversubscribing a
2-core one.

``gpu_threads`` is kvikpy's own. Host transfers run on one pool of ``num_threads``
threads; transfers to and from a GPU run on that GPU's own pool, so that one process
reading onto several GPUs at once scales as separate processes do (one pool shared by
every GPU held one process near 45 GB/s on 4 H100s, however many GPUs it read onto).
``gpu_threads`` sets the threads of each GPU's pool; 0, the default, gives each GPU's
pool ``num_threads`` threads and lets at most ``max(16, CPUs)`` of the process's GPU
threads move bytes between files and pinned memory at once, a budget shared equally
among the GPUs in use at the moment; the processes of one job on the host
(``LOCAL_WORLD_SIZE``, as torchrun sets it) divide ``max(16, CPUs / 2)`` among them (at
least 4 each). Every byte of a GPU read is copied from the page cache into a pinned
buffer and read out of it by the DMA, which is fastest while the buffers in use fit in
the CPU's cache: so while two or more GPUs of a process read at once, local reads move
in 1 MiB pieces over two pinned buffers (unless ``KVIKPY_READ_CHUNK_SIZE`` sets a piece
size). On a 64-core host one process reads onto each GPU with 16 threads (one process
onto four H100s: 81.4 GB/s against 64.2 with 8 threads per GPU in 4 MiB pieces, in one
run), and four torchrun ranks get 8 threads each.
``kvikpy.info()`` prints the numbers in use.

``auto_direct_io_read`` takes ``True``, ``False`` or ``"auto"`` (the default, and what
an unset ``KVIKIO_AUTO_DIRECT_IO_READ`` means; the variable also accepts ``auto``).
``True`` and ``False`` keep kvikio's meaning: the aligned middle of each task by
O_DIRECT, or everything through the page cache. ``"auto"`` reads by residency: each task
of at least 1 MiB of whole 4 KiB blocks asks the kernel (``cachestat``, or ``mincore``
on kernels before 6.5) which of its MiBs are cached, reads those through the page cache
and the others with O_DIRECT; smaller tasks read through the page cache with no extra
system call. The probes cost about 1-2 us per MiB read. Data read with O_DIRECT is not
left in the page cache, so a cold file read twice comes from the disk twice: set
``False`` for files read again soon.

``page_cache_dma`` is kvikpy's own: when a GPU's pool has one thread, device reads of at
least 1 MiB whose pages are all in the page cache are DMAed straight from the cached
pages (pinned in place for the copy) instead of being copied through pinned bounce
buffers first. (The driver pins pages one registration at a time, so with more threads
the bounce buffers are faster.) Set it to ``False`` to always use the bounce buffers.

``write_sync`` is kvikpy's own. The writers that produce a whole file
(:func:`kvikpy.write`, :func:`kvikpy.numpy.tofile` with a path,
:func:`kvikpy.arrow.write_ipc`) write it under a temporary name beside the target and
rename it into place once complete, so a failed write leaves the target as it was. With
``write_sync`` on, the new file's bytes and the rename reach the disk (``fsync`` of the
file, then of its directory) before the call returns.

``checkpoint_staging`` is kvikpy's own: the staging memory, in bytes, a checkpoint load
of :mod:`kvikpy.safetensors` may hold beyond the tensors it fills, at least 2 MiB. Every
load (:func:`~kvikpy.safetensors.load_file`, :func:`~kvikpy.safetensors.load_files`,
:func:`~kvikpy.safetensors.load_into`, :func:`~kvikpy.safetensors.load_pretrained`, with or
without a process group, local files and URLs alike, and the reads of
:class:`kvikpy.dcp.FileSystemReader`) splits it in two. Its reads' bounce
buffers (pinned host memory for GPU targets, the host buffers of O_DIRECT reads for host
targets) get half of it, or less when the reads would never hold that much at the other
settings (``num_threads``, ``task_size``, ``bounce_buffer_size``): about 64 MiB of pinned
memory with 16 threads and the defaults; a read waits while the load's others hold that
part, and one read always goes, however small the setting. The rest is GPU memory per
device: ``load_into`` and ``load_pretrained`` read into GPU tensors through two staging
windows of half of it each (a tensor larger than a window is read straight into its
target), convert dtypes through at most 64 MiB of it, and a load for a process group
exchanges at most half of it at once. ``load_file`` reads straight into the tensors it
returns and stages nothing on the GPU. :func:`kvikpy.info` shows the split at the current
settings. Reads that are not a checkpoint load's (:meth:`kvikpy.CuFile.read`,
:func:`kvikpy.read` ...) take their bounce buffers from the I/O pool unbounded by it.
"""

from __future__ import annotations

import enum
import html
from collections.abc import Mapping
from typing import Any

import kvikpy._lib as _lib
from kvikpy._display import human_bytes

__all__ = [
    "CompatMode",
    "bounce_buffer_size",
    "bounce_buffer_size_reset",
    "compat_mode",
    "compat_mode_reset",
    "gds_threshold",
    "gds_threshold_reset",
    "get",
    "get_num_threads",
    "is_compat_mode_preferred",
    "num_threads_reset",
    "reset_num_threads",
    "set",
    "task_size",
    "task_size_reset",
]


class CompatMode(enum.IntEnum):
    """kvikio's choice between cuFile (GPUDirect Storage) and POSIX I/O.

    In kvikio, ``OFF`` forces cuFile, ``ON`` forces POSIX with bounce buffers and ``AUTO``
    uses cuFile where the system supports it and the file registers. kvikpy applies it
    per file when the file is opened (``CuFile.backend`` says which source a file got and
    why; ``python -m kvikpy info`` whether cuFile is usable here).
    """

    OFF = 0
    ON = 1
    AUTO = 2


def _to_engine(name: str, value: Any) -> Any:
    if name == "compat_mode" and isinstance(value, CompatMode):
        return value.name
    return value


def get(name: str) -> Any:
    """Return the current value of the setting ``name``.

    Parameters
    ----------
    name
        A setting's name (see the table above), e.g. ``"num_threads"``.

    Returns
    -------
    Any
        The value: an int, a bool, a :class:`CompatMode` for ``compat_mode``, a list
        of ints for ``http_status_codes``, a str or ``None`` for ``http_ca_bundle``,
        ``True``, ``False`` or ``"auto"`` for ``auto_direct_io_read``.

    Raises
    ------
    KeyError
        If ``name`` is not a setting.
    kvikpy.ConfigError
        If a ``KVIKIO_*`` environment variable is malformed.
    """
    value = _lib.get_setting(name)
    if name == "compat_mode":
        return CompatMode[str(value)]
    return value


class _Applied:
    """The settings changed by one :func:`set` call; restores them when used with ``with``."""

    def __init__(self, previous: dict[str, Any]) -> None:
        self._previous = previous

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        _lib.set_settings([(k, _to_engine(k, v)) for k, v in self._previous.items()])


def set(*config: Any, **kwargs: Any) -> _Applied:
    """Change settings now; as a context manager, restore them on exit.

    Call as ``set(name, value)``, ``set({name: value, ...})`` or ``set(name=value, ...)``.
    All values are validated before any is applied, so a bad one changes nothing.

    Parameters
    ----------
    *config
        Either a setting's name and its value (two arguments), or one mapping of names to
        values; nothing when only keywords are given.
    **kwargs
        Settings as keywords, ``num_threads=8``; applied after ``config``.

    Returns
    -------
    object
        A context manager that restores the previous values of the changed settings on
        exit; ignoring it keeps the change.

    Raises
    ------
    KeyError
        For an unknown setting name.
    TypeError
        For a value of the wrong kind: an integer setting takes what ``operator.index``
        takes (ints, numpy integers), not floats, strings, bools or ``None``;
        ``http_status_codes`` takes a list of such integers.
    ValueError
        For a value the setting cannot take (zero threads, a negative size, a status
        code outside 100 to 599, anything but ``True``, ``False`` or ``"auto"`` for
        ``auto_direct_io_read``...).

    Examples
    --------
    >>> import kvikpy
    >>> with kvikpy.defaults.set("task_size", 1 << 20):
    ...     kvikpy.defaults.get("task_size")
    1048576
    """
    if len(config) == 2 and isinstance(config[0], str):
        pairs = {config[0]: config[1]}
    elif len(config) == 1 and isinstance(config[0], Mapping):
        pairs = dict(config[0])
    elif not config:
        pairs = {}
    else:
        raise TypeError(
            "defaults.set takes (name, value), a mapping of names to values, or keyword "
            f"arguments; got {len(config)} positional argument(s)"
        )
    pairs.update(kwargs)
    previous = {name: get(name) for name in pairs}
    _lib.set_settings([(k, _to_engine(k, v)) for k, v in pairs.items()])
    return _Applied(previous)


# Environment variables of the settings: the engine's one table of both.
_SETTING_VARIABLES = dict(_lib.setting_variables())


def _settings_table() -> str:
    """Every setting with its current value and environment variable, as a table of
    three columns (``kvikpy.defaults`` in a notebook)."""
    head = "".join(
        f"<th style='text-align:left;padding-right:1em'>{h}</th>"
        for h in ("setting", "value", "environment variable")
    )
    body = ""
    for name in _lib.setting_names():
        value = get(name)
        if isinstance(value, CompatMode):
            shown = f"CompatMode.{value.name}"
        elif name.endswith(("_size", "_threshold")):
            shown = f"{value:,} ({human_bytes(value)})"
        elif name == "auto_direct_io_read" and value == "auto":
            shown = "auto (by residency)"
        else:
            shown = str(value)
        cells = (name, shown, _SETTING_VARIABLES.get(name, ""))
        body += (
            "<tr>"
            + "".join(
                f"<td style='text-align:left;padding-right:1em'>{html.escape(c)}</td>"
                for c in cells
            )
            + "</tr>"
        )
    caption = "<caption style='text-align:left'><b>kvikpy.defaults</b></caption>"
    return f"<table>{caption}<tr>{head}</tr>{body}</table>"


def _repr_html_() -> str:
    """The settings as a table (what a notebook shows for ``kvikpy.defaults``): each
    setting's current value and its environment variable."""
    return _settings_table()


def is_compat_mode_preferred(mode: CompatMode | None = None) -> bool:
    """Whether ``mode`` (default: the current setting) resolves to POSIX I/O here.

    Parameters
    ----------
    mode
        The mode to resolve; ``None`` (the default) resolves the current ``compat_mode``.

    Notes
    -----
    ``ON`` does, ``OFF`` does not, and ``AUTO`` does unless cuFile is usable: libcufile
    loads, ``/run/udev`` is readable and the system is not WSL.
    """
    mode = get("compat_mode") if mode is None else CompatMode(mode)
    return bool(_lib.is_compat_mode_preferred(mode.name))


# kvikio's older per-setting functions, still called by many notebooks.


def compat_mode() -> bool:
    """Whether kvikpy runs in compatibility (POSIX) mode; see :func:`is_compat_mode_preferred`."""
    return is_compat_mode_preferred()


def compat_mode_reset(enable: bool | CompatMode) -> None:
    """Set ``compat_mode``.

    Parameters
    ----------
    enable
        ``True`` means ``CompatMode.ON``, ``False`` ``CompatMode.OFF``; a ``CompatMode``
        is kept as given.
    """
    set("compat_mode", enable)


def get_num_threads() -> int:
    """The number of I/O threads (``num_threads``)."""
    return int(get("num_threads"))


def reset_num_threads(nthreads: int) -> None:
    """Set the number of I/O threads; operations already queued finish on the old pool.

    Parameters
    ----------
    nthreads
        The new number of threads, at least 1.
    """
    set("num_threads", nthreads)


num_threads_reset = reset_num_threads


def task_size() -> int:
    """The default maximum size in bytes of one parallel task (``task_size``)."""
    return int(get("task_size"))


def task_size_reset(nbytes: int) -> None:
    """Set ``task_size``.

    Parameters
    ----------
    nbytes
        The maximum size in bytes of one parallel task, at least 1.
    """
    set("task_size", nbytes)


def gds_threshold() -> int:
    """Requests of at most this many bytes run in the calling thread (``gds_threshold``)."""
    return int(get("gds_threshold"))


def gds_threshold_reset(nbytes: int) -> None:
    """Set ``gds_threshold``.

    Parameters
    ----------
    nbytes
        Requests of at most this many bytes run in the calling thread.
    """
    set("gds_threshold", nbytes)


def bounce_buffer_size() -> int:
    """The size in bytes of each bounce buffer (``bounce_buffer_size``)."""
    return int(get("bounce_buffer_size"))


def bounce_buffer_size_reset(nbytes: int) -> None:
    """Set ``bounce_buffer_size``.

    Parameters
    ----------
    nbytes
        The size in bytes of each bounce buffer, at least 1.
    """
    set("bounce_buffer_size", nbytes)
