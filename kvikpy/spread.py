"""One batch spread over several devices: ``read_many`` and ``read_ranges`` with
``device=["cuda:0", "cuda:1"]`` (or an explicit element-to-device map).

One job: plan how a batch's elements split into one part per device (which elements
each device gets, balanced by size). :mod:`kvikpy.batch` reads the parts at the same
time (each part one ordinary batch read on its device) and presents them as one
:class:`kvikpy.SpreadBatch`, element ``i`` on the device it was given to.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from kvikpy import _devices

__all__ = [
    "assign",
    "balance",
    "element_index",
    "file_sizes",
    "is_spread",
]


def element_index(i: int, n: int) -> int:
    """Index ``i`` (negative counts from the end) of a batch of ``n`` elements, checked."""
    if not -n <= i < n:
        raise IndexError(f"index {i} is out of range for a batch of {n} elements")
    return i % n


#: ``device=`` values that spread a batch: a list of devices, or a map from element index
#: to device.
Spread = list[str | int] | tuple[str | int, ...] | Mapping[int, str | int]


def is_spread(device: object) -> bool:
    """Whether a ``device=`` value names several devices (a list, tuple or mapping)."""
    return isinstance(device, (list, tuple, Mapping))


def _label(device: str | int) -> str:
    ordinal = _devices.resolve(device)
    return "cpu" if ordinal is None else f"cuda:{ordinal}"


def assign(sizes: Sequence[int], device: Spread) -> dict[str, list[int]]:
    """Which elements each device gets: for a list of devices, runs of consecutive
    elements with about the same number of bytes per device (so each part is one large
    sequential pass); for a mapping, exactly what it says (every element must be
    mapped)."""
    n = len(sizes)
    if isinstance(device, Mapping):
        missing = [i for i in range(n) if i not in device]
        extra = [i for i in device if not (isinstance(i, int) and 0 <= i < n)]
        if missing or extra:
            raise ValueError(
                f"a device map must give every element 0..{n - 1} one device; "
                + (f"elements {missing[:5]} have none" if missing else "")
                + ("; " if missing and extra else "")
                + (f"keys {extra[:5]} are not element indices" if extra else "")
            )
        out: dict[str, list[int]] = {}
        for i in range(n):
            out.setdefault(_label(device[i]), []).append(i)
        return out
    labels = [_label(d) for d in device]
    if not labels:
        raise ValueError("device= lists no devices; give at least one")
    if len(set(labels)) != len(labels):
        raise ValueError(f"device= names a device twice: {list(device)!r}")
    parts: dict[str, list[int]] = {label: [] for label in labels}
    for i, k in enumerate(balance(sizes, len(labels))):
        parts[labels[k]].append(i)
    return {d: v for d, v in parts.items() if v}


def balance(sizes: Sequence[int], devices: int) -> list[int]:
    """For each element, the index of its device: consecutive runs, about the same bytes
    each (an element goes where the middle of its bytes falls); by count when no size is
    known."""
    total, n = sum(sizes), len(sizes)
    out, done = [], 0
    for i, size in enumerate(sizes):
        k = int((done + size / 2) * devices / total) if total else i * devices // n
        out.append(min(k, devices - 1))
        done += size
    return out


def file_sizes(names: Sequence[str]) -> list[int]:
    """Sizes for balancing: a local file's size, 0 for one that cannot be sized here (a
    URL, a missing file: its own read reports it)."""
    out = []
    for name in names:
        try:
            out.append(os.stat(name).st_size if "://" not in name else 0)
        except OSError:
            out.append(0)
    return out
