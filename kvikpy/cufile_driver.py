"""The cuFile (GPUDirect Storage) driver, with kvikio's ``kvikio.cufile_driver`` API.

kvikpy opens the driver itself on first use and closes it at interpreter exit, so these
functions are rarely needed. Without libcufile, :func:`libcufile_version` is ``(0, 0)``,
``get("is_gds_available")`` is ``False``, and everything else raises
:class:`kvikpy.CuFileError` (a ``RuntimeError``) saying why cuFile is unavailable.

Properties (sizes in KiB, as cuFile counts them):

==========================  =========  ==========================================
property                    settable   meaning
==========================  =========  ==========================================
``is_gds_available``        no         nvidia-fs reports a version
``major_version``           no         nvidia-fs major version (0 without it)
``minor_version``           no         nvidia-fs minor version
``allow_compat_mode``       no         cuFile may fall back to its own POSIX path
``per_buffer_cache_size``   no         per-buffer GPU bounce cache
``poll_mode``               yes        poll for completion of small transfers
``poll_thresh_size``        yes        largest transfer polled for
``max_device_cache_size``   yes        GPU bounce buffer cache
``max_pinned_memory_size``  yes        largest pinned GPU memory
==========================  =========  ==========================================
"""

from __future__ import annotations

import atexit
from collections.abc import Mapping
from typing import Any, overload

import kvikpy._lib as _lib

__all__ = [
    "ConfigContextManager",
    "driver_close",
    "driver_open",
    "get",
    "initialize",
    "libcufile_version",
    "set",
]

_READ_ONLY = (
    "is_gds_available",
    "major_version",
    "minor_version",
    "allow_compat_mode",
    "per_buffer_cache_size",
)
_SETTABLE = ("poll_mode", "poll_thresh_size", "max_device_cache_size", "max_pinned_memory_size")


def libcufile_version() -> tuple[int, int]:
    """libcufile's version as ``(major, minor)``; ``(0, 0)`` without libcufile or before
    libcufile 1.8.

    Returns
    -------
    tuple[int, int]
        For example ``(1, 15)``. This is cuFile's own version, not the CUDA toolkit's.
    """
    major, rest = divmod(int(_lib.cufile_version()), 1000)
    return (major, rest // 10)


def driver_open() -> None:
    """Open the cuFile driver once more (``cuFileDriverOpen``).

    Every call needs a matching :func:`driver_close`. kvikpy opens the driver itself on
    first use, so this is rarely needed.

    Raises
    ------
    kvikpy.CuFileError
        If libcufile is missing or the driver refuses to open (cuFile's message).
    """
    _lib.cufile_driver_open()


def driver_close() -> None:
    """Close the cuFile driver once (``cuFileDriverClose``), matching a :func:`driver_open`.

    Raises
    ------
    kvikpy.CuFileError
        If libcufile is missing or the driver refuses to close.
    """
    _lib.cufile_driver_close()


def initialize() -> None:
    """Open the cuFile driver now and close it at interpreter exit.

    Raises
    ------
    kvikpy.CuFileError
        If libcufile is missing or the driver refuses to open.
    """
    driver_open()
    atexit.register(driver_close)


def get(config_name: str) -> Any:
    """The value of one driver property.

    Parameters
    ----------
    config_name
        One of the properties in the module's table.

    Returns
    -------
    bool or int
        The property's value.

    Raises
    ------
    KeyError
        For an unknown name.
    kvikpy.CuFileError
        Without libcufile (except ``is_gds_available``, then ``False``).
    """
    if config_name not in _READ_ONLY and config_name not in _SETTABLE:
        raise KeyError(
            f"unknown cuFile driver property {config_name!r}; known: "
            f"{', '.join(_READ_ONLY + _SETTABLE)}"
        )
    if config_name == "is_gds_available":
        try:
            return bool(_lib.cufile_properties()["is_gds_available"])
        except RuntimeError:
            return False
    return _lib.cufile_properties()[config_name]


def _set_one(name: str, value: Any) -> None:
    if name in _READ_ONLY:
        raise KeyError(f"the cuFile driver property {name!r} is read-only")
    if name not in _SETTABLE:
        raise KeyError(f"unknown cuFile driver property {name!r}; settable: {', '.join(_SETTABLE)}")
    _lib.cufile_set_property(name, value)


class ConfigContextManager:
    """What :func:`set` returns: the properties are already set; used in a ``with``
    block, they get their previous values back on exit."""

    def __init__(self, config: Mapping[str, Any]) -> None:
        """Set every property of ``config``, remembering the previous values.

        Parameters
        ----------
        config
            Property names and their new values.
        """
        self._old: dict[str, Any] = {}
        for name, value in config.items():
            if name in _READ_ONLY:
                raise KeyError(f"the cuFile driver property {name!r} is read-only")
            self._old[name] = get(name)
            _set_one(name, value)

    def __enter__(self) -> None:
        return None

    def __repr__(self) -> str:
        names = ", ".join(sorted(self._old))
        return f"<kvikpy.cufile_driver.ConfigContextManager restoring {names or 'nothing'} on exit>"

    def __exit__(self, *exc: object) -> None:
        for name, value in self._old.items():
            _set_one(name, value)


@overload
def set(config: Mapping[str, Any], /) -> ConfigContextManager: ...
@overload
def set(key: str, value: Any, /) -> ConfigContextManager: ...
def set(*config: Any) -> ConfigContextManager:
    """Set driver properties: ``set("poll_mode", True)`` or ``set({...})``.

    Parameters
    ----------
    *config
        One mapping of property names to values, or one name and its value.

    Returns
    -------
    ConfigContextManager
        Used in a ``with`` block, it restores the previous values on exit.

    Raises
    ------
    KeyError
        For an unknown or read-only property.
    ValueError
        For any other form of arguments.
    kvikpy.CuFileError
        Without libcufile, or when cuFile refuses the value.
    """
    usage = (
        "use kvikpy.cufile_driver.set(config: dict) or kvikpy.cufile_driver.set(key: str, value)"
    )
    if len(config) == 1 and isinstance(config[0], Mapping):
        return ConfigContextManager(config[0])
    if len(config) == 2 and isinstance(config[0], str):
        return ConfigContextManager({config[0]: config[1]})
    raise ValueError(usage)
