"""One batch spread over several devices: ``read_many`` and ``read_ranges`` with
``device=["cuda:0", "cuda:1"]`` (or an explicit element-to-device map).

One job: split a batch's elements into one part per device, read the parts at the same
time (each part is one ordinary batch read: one allocation on its device, one parallel
pass, the engine's pinned pools and streams of that device), and present the parts as
one sequence, element ``i`` on the device it was given to.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, overload

from kvikpy import _devices, _lib

if TYPE_CHECKING:
    from kvikpy.batch import Batch

__all__ = [
    "SpreadBatch",
    "assign",
    "balance",
    "element_index",
    "file_sizes",
    "is_spread",
    "read_spread",
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


class SpreadBatch(Sequence[_lib.Buffer]):
    """A batch whose elements lie on several devices: one :class:`kvikpy.Batch` per device.

    ``batch[i]`` is element ``i`` (a :class:`kvikpy.Buffer` on its device, as in
    :class:`kvikpy.Batch`), ``batch.device_of(i)`` says where it is, ``batch.parts`` maps
    each device to its own ``Batch`` and ``batch.indices[device]`` lists which elements
    that part holds, in order. Made by :func:`kvikpy.read_many` and
    :func:`kvikpy.read_ranges` with several devices, not directly.

    Parameters
    ----------
    parts
        Each device's batch, by device label (``"cpu"``, ``"cuda:N"``).
    indices
        Each device's elements, by their index in the whole batch, in the order of that
        device's batch.
    n
        The number of elements in the whole batch.
    """

    def __init__(self, parts: dict[str, Batch], indices: dict[str, list[int]], n: int):
        self._parts = parts
        self._indices = indices
        self._where: list[tuple[str, int]] = [("", 0)] * n
        for device, members in indices.items():
            for k, i in enumerate(members):
                self._where[i] = (device, k)

    @property
    def parts(self) -> dict[str, Batch]:
        """Each device's own batch (``"cpu"`` or ``"cuda:N"`` to :class:`kvikpy.Batch`)."""
        return dict(self._parts)

    @property
    def indices(self) -> dict[str, list[int]]:
        """Each device's elements, by their index in this batch, in order."""
        return {d: list(v) for d, v in self._indices.items()}

    @property
    def failures(self) -> dict[int, BaseException]:
        """Elements that could not be read (``errors="skip"``), by index in this batch."""
        out: dict[int, BaseException] = {}
        for device, part in self._parts.items():
            for k, e in part.failures.items():
                out[self._indices[device][k]] = e
        return dict(sorted(out.items()))

    @property
    def sizes(self) -> list[int]:
        """Each element's size in bytes, in order."""
        return [int(self._parts[d].sizes[k]) for d, k in self._where]

    def device_of(self, i: int) -> str:
        """The device of element ``i``: ``"cpu"`` or ``"cuda:N"``.

        Parameters
        ----------
        i
            The element's index (negative counts from the end).
        """
        return self._where[element_index(i, len(self))][0]

    def __len__(self) -> int:
        return len(self._where)

    @overload
    def __getitem__(self, i: int) -> _lib.Buffer: ...
    @overload
    def __getitem__(self, i: slice) -> list[_lib.Buffer]: ...
    def __getitem__(self, i: int | slice) -> _lib.Buffer | list[_lib.Buffer]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        device, k = self._where[element_index(i, len(self))]
        return self._parts[device][k]

    def __iter__(self) -> Iterator[_lib.Buffer]:
        for i in range(len(self)):
            yield self[i]

    def __repr__(self) -> str:
        shares = ", ".join(f"{d}: {len(v):,}" for d, v in self._indices.items())
        return (
            f"<kvikpy.SpreadBatch {len(self):,} elements on {len(self._parts)} devices ({shares})>"
        )


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


def read_spread(
    sizes: Sequence[int],
    device: Spread,
    read_part: Callable[[list[int], str], Batch],
) -> SpreadBatch:
    """Read each device's elements with ``read_part(indices, device)``, all parts at once
    (the engine releases the GIL, so the parts overlap); the first error is raised after
    every part has finished, and nothing stays allocated."""
    plan = assign(sizes, device)
    if len(plan) == 1:
        ((label, members),) = plan.items()
        return SpreadBatch({label: read_part(members, label)}, plan, len(sizes))
    # Imported here: concurrent.futures (and the logging it pulls in) is a fifth of
    # `import kvikpy`, and only reads spread over several GPUs need it.
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max_workers=len(plan), thread_name_prefix="kvikpy-spread") as pool:
        futures = {label: pool.submit(read_part, members, label) for label, members in plan.items()}
        parts: dict[str, Batch] = {}
        errors: list[BaseException] = []
        for label, future in futures.items():
            try:
                parts[label] = future.result()
            except BaseException as e:  # every part finishes before anything is raised
                errors.append(e)
    if errors:
        parts.clear()
        raise errors[0]
    return SpreadBatch(parts, plan, len(sizes))


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
