"""Where bytes go: the ``device=`` values of the Python API and the CLI's ``--device``.

One job: parse ``"cuda"``, ``"cuda:N"``, ``N`` and ``"cpu"``, resolve ``"cuda"`` to the
caller's current device, check that a GPU asked for exists, and word the errors the way
the caller spells the argument (``device='cpu'`` in Python, ``--device cpu`` on the
command line). Every module that takes a device goes through :func:`resolve`.
"""

from __future__ import annotations

from typing import Literal

import kvikpy._lib as _lib
from kvikpy.errors import CudaUnavailableError

__all__ = ["check_option", "label", "parse", "resolve", "resolve_option"]

_SPELLINGS = "'cuda', 'cuda:N', an int or 'cpu'"


def parse(device: object) -> Literal["cpu", "cuda"] | int:
    """The syntax of a ``device`` value alone, without asking CUDA anything.

    Returns
    -------
    str or int
        ``"cpu"``, ``"cuda"`` (the current device, found by :func:`resolve`), or ``N``
        for ``"cuda:N"`` and the int ``N`` (any int: :func:`resolve` checks the range).

    Raises
    ------
    TypeError
        For a bool.
    ValueError
        For anything else that is not one of the spellings.
    """
    if isinstance(device, bool):
        raise TypeError(f"device must be {_SPELLINGS}, not a bool")
    if isinstance(device, int):
        return device
    if device == "cpu":
        return "cpu"
    if device == "cuda":
        return "cuda"
    if isinstance(device, str) and device.startswith("cuda:") and device[5:].isdigit():
        return int(device[5:])
    raise ValueError(f"device must be {_SPELLINGS}, got {device!r}")


def resolve(device: str | int, option: str = "device") -> int | None:
    """The CUDA ordinal for ``device``, or ``None`` for host memory.

    Parameters
    ----------
    device
        ``"cuda"`` (the calling thread's current device), ``"cuda:N"``, ``N`` or ``"cpu"``.
    option
        How the caller spells the argument in its errors: ``"device"`` for the Python API
        (``device='cpu'``), ``"--device"`` for the command line (``--device cpu``).

    Raises
    ------
    kvikpy.CudaUnavailableError
        For a GPU on a machine without CUDA.
    ValueError
        For a malformed value or a GPU that does not exist.
    TypeError
        For a bool.
    """

    def spelled(value: object) -> str:
        return f"{option} {value}" if option.startswith("-") else f"{option}={value!r}"

    ordinal = parse(device)
    if ordinal == "cpu":
        return None
    # One call into the engine: the device count, the current device for "cuda", and
    # why CUDA is unavailable, if it is.
    count, current, reason = _lib.device_lookup(ordinal == "cuda")
    if reason is not None:
        raise CudaUnavailableError(
            f"{spelled(device)} needs a GPU, but CUDA is not available ({reason}); "
            f"use {spelled('cpu')} to read into host memory"
        )
    if current is not None:
        return current
    assert isinstance(ordinal, int)
    if not 0 <= ordinal < count:
        valid = spelled("cuda:0") + ("" if count == 1 else f" to {spelled(label(count - 1))},")
        raise ValueError(
            f"CUDA device {ordinal} does not exist: this machine has {count} GPU(s); "
            f"use {valid} or {spelled('cpu')}"
        )
    return ordinal


def label(ordinal: int | None) -> str:
    """``"cpu"`` for ``None`` (host memory), else ``"cuda:N"``."""
    return "cpu" if ordinal is None else f"cuda:{ordinal}"


def check_option(text: str) -> str:
    """Check the syntax of a ``--device`` value: ``auto``, ``cpu``, ``cuda`` or ``cuda:N``
    (argparse ``type=``; no int, as a command line has only strings).

    Raises
    ------
    ValueError
        For anything else (argparse reports it as a usage error).
    """
    if text != "auto":
        try:
            parse(text)
        except ValueError:
            raise ValueError(f"expected auto, cpu, cuda or cuda:N, got {text!r}") from None
    return text


def resolve_option(choice: str) -> tuple[str, int | None]:
    """Turn a ``--device`` value into a label and a CUDA ordinal (``None`` for host).

    Parameters
    ----------
    choice
        ``auto`` (a GPU if CUDA is available, else ``cpu``), ``cpu``, ``cuda`` or
        ``cuda:N``.

    Returns
    -------
    tuple[str, int | None]
        ``("cpu", None)`` or ``("cuda:N", N)``.

    Raises
    ------
    kvikpy.CudaUnavailableError
        If a GPU is asked for and CUDA is unavailable.
    ValueError
        If the device does not exist.
    """
    if choice == "auto":
        choice = "cuda" if _lib.cuda_available() else "cpu"
    ordinal = resolve(choice, option="--device")
    return label(ordinal), ordinal
