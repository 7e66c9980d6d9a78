"""kvikpy's text progress bar: one line on stderr, redrawn in place, with a percentage,
the bytes done and in all (KiB, MiB, GiB), elapsed and remaining time and the average
rate in decimal units (MB/s, GB/s), as kvikpy's benchmarks and command line give rates.

It is kvikpy's own rather than tqdm's because a bar must be cheap to show the first time:
importing tqdm costs 15-30 ms (it imports logging, inspect and its command line), more
than the read it would follow. It imports nothing but the standard library and kvikpy's
own display and closing helpers."""

from __future__ import annotations

import sys
import threading
import time
from typing import TextIO

from kvikpy._closing import ClosedOnExit
from kvikpy._display import human_bytes

_WIDTH = 24  # characters of the bar itself
_BLOCKS = " ▏▎▍▌▋▊▉█"
_MIN_REDRAW = 0.1  # seconds between redraws; the last state is always drawn on close


def _size(n: float) -> str:
    return human_bytes(n, digits=2)


def _rate(bytes_per_second: float) -> str:
    """A rate in decimal units (GB/s = 10^9 bytes/s), as kvikpy's benchmarks and CLI say."""
    for unit, scale in (("GB/s", 1e9), ("MB/s", 1e6), ("kB/s", 1e3)):
        if bytes_per_second >= scale:
            return f"{bytes_per_second / scale:.2f} {unit}"
    return f"{bytes_per_second:.0f} B/s"


def _clock(seconds: float) -> str:
    seconds = int(seconds)
    minutes, seconds = divmod(seconds, 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{seconds:02d}" if hours else f"{minutes:02d}:{seconds:02d}"


class TextBar(ClosedOnExit):
    """A byte-counting bar with tqdm's small interface: ``update(n)``, ``close()``, use as
    a context manager, and the attributes ``n``, ``total``, ``desc`` and ``start_t``
    (the clock's start, which a caller may set back to when its operation began)."""

    def __init__(self, total: int | None, desc: str, file: TextIO | None = None) -> None:
        self.total = total
        self.desc = desc
        self.n = 0
        self.start_t = time.time()
        self.closed = False
        self._file = file
        self._drawn = 0.0
        self._lock = threading.Lock()
        self._draw(final=False)

    def format(self, now: float | None = None) -> str:
        """The bar's line as it stands."""
        elapsed = max((time.time() if now is None else now) - self.start_t, 0.0)
        rate = self.n / elapsed if elapsed > 0 else 0.0
        speed = _rate(rate) if rate else "?/s"
        if not self.total:
            return f"{self.desc}: {_size(self.n)} [{_clock(elapsed)}, {speed}]"
        fraction = min(self.n / self.total, 1.0)
        eighths = int(fraction * _WIDTH * 8)
        full, part = divmod(eighths, 8)
        bar = "█" * full + (_BLOCKS[part] if full < _WIDTH else "")
        left = (self.total - self.n) / rate if rate else None
        remaining = _clock(left) if left is not None else "?"
        return (
            f"{self.desc}: {fraction * 100:3.0f}%|{bar:<{_WIDTH}}| {_size(self.n)}/"
            f"{_size(self.total)} [{_clock(elapsed)}<{remaining}, {speed}]"
        )

    def _draw(self, final: bool) -> None:
        now = time.time()
        if not final and now - self._drawn < _MIN_REDRAW and self._drawn:
            return
        self._drawn = now
        out = self._file or sys.stderr
        try:
            out.write("\r" + self.format(now) + ("\n" if final else ""))
            out.flush()
        except (OSError, ValueError):  # a closed or broken stream: the read goes on
            pass

    def update(self, n: int) -> None:
        """Count ``n`` more bytes done."""
        with self._lock:
            if self.closed or not n:
                return
            self.n += n
            self._draw(final=False)

    def close(self) -> None:
        """Draw the final state and end the line. Idempotent."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            self._draw(final=True)
