"""Blocking calls release the GIL: other Python threads keep running during them.

A background thread stamps the time in a tight loop. The main thread notes the time just
before and just after one long blocking call. With the GIL held for the whole call, the
background thread could run only before the call starts and after it ends (at most a
switch interval, 5 ms, on either side), so no stamp could fall in the middle half of a
call lasting 100 ms or more; with the GIL released it stamps throughout.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
from conftest import aligned_array, o_direct_supported, random_bytes

import kvikpy

MiB = 1 << 20
MIN_CALL_SECONDS = 0.1


class Stamper:
    def __init__(self) -> None:
        self.stamps: list[float] = []
        self.count = 0
        self._stop = False
        self._running = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        self._running.set()
        i = 0
        while not self._stop:
            i += 1
            self.count = i
            if i % 64 == 0:
                self.stamps.append(time.perf_counter())

    def __enter__(self) -> Stamper:
        self._thread.start()
        assert self._running.wait(10)
        # Make sure it is really looping before the measured call starts.
        start = self.count
        deadline = time.monotonic() + 10
        while self.count == start and time.monotonic() < deadline:
            time.sleep(0.001)
        assert self.count != start
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop = True
        self._thread.join(10)


def measure(call: Callable[[], object]) -> tuple[float, int, int, list[float]]:
    """Run ``call`` in the main thread while a Stamper runs; return timings and samples."""
    with Stamper() as s:
        c0 = s.count
        t0 = time.perf_counter()
        call()
        t1 = time.perf_counter()
        c1 = s.count
    quarter = (t1 - t0) / 4
    middle = [t for t in s.stamps if t0 + quarter < t < t1 - quarter]
    return t1 - t0, c0, c1, middle


CALLS = {
    # a read of one task, run in the calling thread
    "read-inline": lambda f, buf: f.read(buf, task_size=len(buf)),
    # a read split over the pool; the caller waits on the future
    "read-pooled": lambda f, buf: f.read(buf, task_size=MiB),
    # IOFuture.get() on a pread
    "pread-get": lambda f, buf: f.pread(buf, task_size=MiB).get(),
    # a write of one task (O_DIRECT through 4 KiB bounce buffers where supported)
    "write-inline": lambda f, buf: f.write(buf, task_size=len(buf)),
}


@pytest.mark.parametrize("name", list(CALLS))
def test_gil_is_released_during_blocking_calls(tmp_path, name):
    call = CALLS[name]
    path = tmp_path / "f.bin"
    size = 16 * MiB
    for _attempt in range(5):
        path.write_bytes(random_bytes(size, seed=51))
        slow = {
            "num_threads": 1,
            "bounce_buffer_size": 4096,
            "auto_direct_io_read": True,
            "auto_direct_io_write": True,
        }
        kvikpy.defaults.set(slow)
        if not o_direct_supported(path):
            kvikpy.defaults.set("task_size", 4096)
        buf = aligned_array(size, 1)
        with kvikpy.CuFile(path, "r+") as f:
            duration, c0, c1, middle = measure(lambda f=f, buf=buf: call(f, buf))
        if duration >= MIN_CALL_SECONDS:
            break
        size *= 2  # too fast to tell: try again with more data
    else:
        pytest.skip(f"could not make the call last {MIN_CALL_SECONDS} s (last: {duration:.3f} s)")
    assert c1 > c0, "the background thread never ran during the call"
    assert middle, (
        f"no Python bytecode ran in another thread during the middle of a {duration:.3f} s "
        f"call: the GIL was held"
    )


def test_stamper_detects_a_held_gil():
    """Control: a long C call that holds the GIL (builtin sum) shows no stamps in the middle."""
    n = 2_000_000
    for _attempt in range(6):
        duration, _, _, middle = measure(lambda n=n: sum(range(n)))
        if duration >= MIN_CALL_SECONDS:
            break
        n *= 2
    else:
        pytest.skip("sum() was too fast to show anything")
    assert not middle, "the method sees another thread run although the GIL was held"


@pytest.mark.parametrize("kind", ["read_many", "read_ranges"])
def test_gil_is_released_during_batch_reads(tmp_path, kind):
    kvikpy.defaults.set({"num_threads": 1, "auto_direct_io_read": True})
    path = tmp_path / "f.bin"
    path.write_bytes(random_bytes(16 * MiB, seed=52))
    # One small file many times over, for read_many: an open, a read and a close each.
    small = tmp_path / "small.bin"
    small.write_bytes(random_bytes(64 << 10, seed=53))
    count = 2000
    for _attempt in range(5):
        if kind == "read_many":
            duration, c0, c1, middle = measure(
                lambda n=count: kvikpy.read_many([small] * n, device="cpu")
            )
        else:
            ranges = [((i * 4096) % (16 * MiB - 4096), 4096) for i in range(count)][::-1]
            duration, c0, c1, middle = measure(
                lambda ranges=ranges: kvikpy.read_ranges(path, ranges, device="cpu")
            )
        if duration >= MIN_CALL_SECONDS:
            break
        count *= 4
    else:
        pytest.skip(f"could not make the call last {MIN_CALL_SECONDS} s (last: {duration:.3f} s)")
    assert c1 > c0, "the background thread never ran during the call"
    assert middle, f"no bytecode ran in another thread during a {duration:.3f} s batch read"
