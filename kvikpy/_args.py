"""Integer arguments (offsets, sizes, counts, chunk sizes): the one check every pure-Python
API runs on them, with Python's own rule and the extension's words.

Whatever ``operator.index`` takes is an integer (``int``, numpy integers, objects with
``__index__``) except ``bool``; anything else (floats, strings, ``None``, bools) is a
``TypeError``. A negative value where none is allowed is a ``ValueError``, one above
``2**63 - 1`` (the largest file offset) an ``OverflowError``. The extension's entry points
(``CuFile.read`` and the rest) apply the same rule in their own argument conversion
(``intake::Int``), so both routes answer alike
(``tests/test_read_api.py`` checks it).
"""

from __future__ import annotations

import operator

#: The largest file offset or size: ``off_t`` is a signed 64-bit integer.
MAX_OFFSET = (1 << 63) - 1


def integer(name: str, value: object) -> int:
    """``value`` as an ``int``; ``TypeError`` naming ``name`` for anything that is none."""
    if type(value) is int:  # the common case, once per range of a many-range batch
        return value
    if isinstance(value, bool) or type(value).__name__ == "bool_":  # numpy's bool too
        raise TypeError(f"{name} must be an integer, got the bool {value!r}; pass an int")
    try:
        return operator.index(value)  # type: ignore[arg-type]
    except TypeError:
        raise TypeError(
            f"{name} must be an integer, got {type(value).__name__} {value!r}"
        ) from None


def _within(name: str, n: int, minimum: int, what: str, maximum: int) -> int:
    """``n`` if it lies in ``[minimum, maximum]``: ``ValueError`` below (it must be
    ``what``), ``OverflowError`` above."""
    if n < minimum:
        raise ValueError(f"{name} must be {what}, got {n}")
    if n > maximum:
        raise OverflowError(f"{name} {n} is out of range: at most {maximum} is allowed")
    return n


def non_negative(name: str, value: object, *, maximum: int = MAX_OFFSET) -> int:
    """``value`` as an ``int`` from 0 to ``maximum``: ``TypeError`` for a non-integer,
    ``ValueError`` for a negative one, ``OverflowError`` for one above ``maximum``."""
    return _within(name, integer(name, value), 0, "non-negative", maximum)


def positive(name: str, value: object, *, maximum: int = MAX_OFFSET) -> int:
    """``value`` as an ``int`` from 1 to ``maximum`` (see :func:`non_negative`)."""
    return _within(name, integer(name, value), 1, "positive", maximum)


def end(name: str, offset: int, size: int) -> int:
    """``offset + size``, the end of a byte range, or ``OverflowError`` where it passes
    the largest file offset (``name`` says what the range is)."""
    stop = offset + size
    if stop > MAX_OFFSET:
        raise OverflowError(
            f"{name} [{offset}, {stop}) ends past the largest file offset ({MAX_OFFSET}); "
            "pass a smaller offset or size"
        )
    return stop
