"""IOFuture: get/done, wait_all, done-callbacks, asyncio, and the lifetime of buffers and
files behind running operations."""

from __future__ import annotations

import asyncio
import gc
import signal
import sys
import threading
import weakref

import numpy as np
import pytest
from conftest import aligned_array, random_bytes, run_python, wait_until

import kvikpy
from kvikpy import _lib

MiB = 1 << 20
DATA = random_bytes(3 * MiB + 11, seed=41)

# pwrite at an offset no file can reach: every task fails inside the pool (EINVAL/EFBIG).
UNREACHABLE_OFFSET = 2**63 - 4096


def pending_read(slow_read):
    """Start the slow read of the ``slow_read`` fixture; return (file, future, buffer)."""
    path, data = slow_read
    f = kvikpy.CuFile(path)
    buf = aligned_array(len(data), 1)
    fut = f.pread(buf)
    return f, fut, buf


def test_get_returns_the_count_and_again_on_a_second_call(file_with):
    path = file_with(DATA)
    buf = bytearray(len(DATA))
    with kvikpy.CuFile(path) as f:
        fut = f.pread(buf, task_size=MiB)
        assert isinstance(fut, kvikpy.IOFuture)
        assert fut.get() == len(DATA)
        assert fut.done() is True
        assert fut.get() == len(DATA)
    assert bytes(buf) == DATA


def test_done_becomes_true(slow_read):
    f, fut, buf = pending_read(slow_read)
    with f:
        assert fut.done() is False
        assert "pending" in repr(fut)
        assert wait_until(fut.done)
        assert fut.done() is True
        assert "done" in repr(fut)
        assert fut.get() == len(slow_read[1])
    assert buf.tobytes() == slow_read[1]


def test_small_pread_is_done_at_once(file_with):
    """Requests of at most gds_threshold bytes run in the calling thread."""
    path = file_with(DATA)
    kvikpy.defaults.set("gds_threshold", 4096)
    buf = bytearray(4096)
    with kvikpy.CuFile(path) as f:
        fut = f.pread(buf, file_offset=5)
        assert fut.done()
        assert fut.get() == 4096
    assert bytes(buf) == DATA[5:4101]


def test_a_failing_future_raises_on_every_get(file_with):
    path = file_with(DATA)
    with kvikpy.CuFile(path, "r+") as f:
        fut = f.pwrite(random_bytes(MiB, seed=42), file_offset=UNREACHABLE_OFFSET, task_size=4096)
        with pytest.raises(OSError) as first:
            fut.get()
        assert first.value.filename == str(path)
        assert fut.done()
        with pytest.raises(OSError) as second:
            fut.get()
        assert second.value.errno == first.value.errno
    assert path.read_bytes() == DATA


def test_wait_all_returns_counts_in_order(file_with):
    path = file_with(DATA)
    bufs = [bytearray(n) for n in (10, MiB, 2 * MiB, 12345)]
    with kvikpy.CuFile(path) as f:
        futs = [f.pread(b, file_offset=i * 7, task_size=65536) for i, b in enumerate(bufs)]
        assert kvikpy.wait_all(futs) == [10, MiB, 2 * MiB, 12345]
        assert kvikpy.wait_all(iter(futs)) == [10, MiB, 2 * MiB, 12345]
        assert kvikpy.wait_all([]) == []
    for i, b in enumerate(bufs):
        assert bytes(b) == DATA[i * 7 : i * 7 + len(b)]


def test_wait_all_waits_for_all_then_raises_the_first_error(file_with, slow_read):
    path1 = file_with(DATA, "one.bin")
    path2 = file_with(DATA, "two.bin")
    slow_file, fut_slow, buf = pending_read(slow_read)
    with kvikpy.CuFile(path1, "r+") as f1, kvikpy.CuFile(path2, "r+") as f2, slow_file:
        good = f1.pread(bytearray(1000))
        bad1 = f1.pwrite(random_bytes(MiB, seed=43), file_offset=UNREACHABLE_OFFSET)
        bad2 = f2.pwrite(b"x" * 100, file_offset=UNREACHABLE_OFFSET)
        assert not fut_slow.done()
        with pytest.raises(OSError) as info:
            kvikpy.wait_all([good, bad1, fut_slow, bad2])
        assert info.value.filename == str(path1), "the first failure in order is raised"
        # Every future was waited for, the slow one after the failure included.
        assert fut_slow.done()
        assert bad1.done() and bad2.done()
        assert fut_slow.get() == len(slow_read[1])
    assert buf.tobytes() == slow_read[1]
    assert path1.read_bytes() == DATA
    assert path2.read_bytes() == DATA


def test_get_is_interruptible_by_signals(slow_read):
    """A signal handler's exception (like Ctrl-C's KeyboardInterrupt) interrupts get(); the
    operation keeps running and a later get() returns its count."""

    class Interrupted(Exception):
        pass

    def handler(signum, frame):
        raise Interrupted

    previous = signal.signal(signal.SIGUSR1, handler)
    try:
        f, fut, buf = pending_read(slow_read)
        with f:
            timer = threading.Timer(
                0.02, signal.pthread_kill, (threading.main_thread().ident, signal.SIGUSR1)
            )
            timer.start()
            with pytest.raises(Interrupted):
                fut.get()
            timer.join()
            assert fut.get() == len(slow_read[1])
        assert buf.tobytes() == slow_read[1]
    finally:
        signal.signal(signal.SIGUSR1, previous)


# ---------------------------------------------------------------------------------------
# Done-callbacks


def test_callback_registered_before_completion_runs_once(slow_read):
    f, fut, buf = pending_read(slow_read)
    calls = []
    called = threading.Event()

    def cb(x):
        calls.append((x, x.done(), threading.current_thread() is threading.main_thread()))
        called.set()

    with f:
        assert not fut.done(), "the read should still be running"
        fut.add_done_callback(cb)
        assert fut.get() == len(slow_read[1])
        assert called.wait(10)
    assert wait_until(lambda: len(calls) >= 1)
    gc.collect()
    assert len(calls) == 1
    (arg, was_done, in_main), *_ = calls
    assert arg is fut
    assert was_done is True
    assert in_main is False, "a pending future's callback runs in the I/O thread"
    assert buf.tobytes() == slow_read[1]


def test_callback_registered_after_completion_runs_at_once(file_with):
    path = file_with(DATA)
    with kvikpy.CuFile(path) as f:
        fut = f.pread(bytearray(MiB), task_size=4096)
        fut.get()
        calls = []
        fut.add_done_callback(calls.append)
        assert calls == [fut]
        fut.add_done_callback(calls.append)
        assert calls == [fut, fut]


def test_several_callbacks_each_run_once(slow_read):
    f, fut, _ = pending_read(slow_read)
    calls = []
    lock = threading.Lock()

    def make(i):
        def cb(x):
            with lock:
                calls.append(i)

        return cb

    with f:
        for i in range(5):
            fut.add_done_callback(make(i))
        fut.get()
        assert wait_until(lambda: len(calls) == 5)
    assert sorted(calls) == list(range(5))


def test_callback_exception_goes_to_unraisablehook_when_pending(slow_read, monkeypatch):
    seen = []
    got = threading.Event()

    def hook(unraisable):
        seen.append((unraisable.exc_type, str(unraisable.exc_value)))
        got.set()

    monkeypatch.setattr(sys, "unraisablehook", hook)

    def bad(_):
        raise ZeroDivisionError("callback failed on purpose")

    after = []
    f, fut, _ = pending_read(slow_read)
    with f:
        assert not fut.done()
        fut.add_done_callback(bad)
        fut.add_done_callback(after.append)
        assert fut.get() == len(slow_read[1])
        assert got.wait(10), "the exception never reached sys.unraisablehook"
    assert seen == [(ZeroDivisionError, "callback failed on purpose")]
    assert wait_until(lambda: after == [fut]), "a failing callback must not stop the others"


def test_callback_exception_goes_to_unraisablehook_when_done(file_with, monkeypatch):
    seen = []
    monkeypatch.setattr(sys, "unraisablehook", lambda u: seen.append(u.exc_type))
    path = file_with(DATA)
    with kvikpy.CuFile(path) as f:
        fut = f.pread(bytearray(100))
        fut.get()

        def bad(_):
            raise KeyError("oops")

        fut.add_done_callback(bad)  # must not raise here
    assert seen == [KeyError]


# ---------------------------------------------------------------------------------------
# asyncio


def test_await_a_done_future(file_with):
    path = file_with(DATA)
    buf = bytearray(1000)

    async def main():
        with kvikpy.CuFile(path) as f:
            fut = f.pread(buf, file_offset=3)
            fut.get()
            assert fut.done()
            return await fut

    assert asyncio.run(main()) == 1000
    assert bytes(buf) == DATA[3:1003]


def test_await_a_pending_future(slow_read):
    path, data = slow_read

    async def main():
        buf = aligned_array(len(data), 1)
        with kvikpy.CuFile(path) as f:
            fut = f.pread(buf)
            assert not fut.done()
            ticks = 0

            async def ticker():
                nonlocal ticks
                while True:
                    ticks += 1
                    await asyncio.sleep(0.001)

            t = asyncio.ensure_future(ticker())
            n = await fut
            t.cancel()
            return n, buf, ticks

    n, buf, ticks = asyncio.run(main())
    assert n == len(data)
    assert buf.tobytes() == data
    assert ticks > 1, "awaiting must not block the event loop"


def test_gather_several_pending_futures(slow_read):
    path, data = slow_read
    parts = 4
    step = len(data) // parts

    async def main():
        out = aligned_array(len(data), 1)
        with kvikpy.CuFile(path) as f:
            futs = [
                f.pread(out[i * step : (i + 1) * step], file_offset=i * step) for i in range(parts)
            ]
            assert not all(x.done() for x in futs)
            counts = await asyncio.gather(*futs)
        return counts, out

    counts, out = asyncio.run(main())
    assert counts == [step] * parts
    assert out.tobytes() == data


def test_await_a_failing_future_raises(file_with):
    path = file_with(DATA)

    async def main():
        with kvikpy.CuFile(path, "r+") as f:
            fut = f.pwrite(random_bytes(MiB, seed=44), file_offset=UNREACHABLE_OFFSET)
            return await fut

    with pytest.raises(OSError):
        asyncio.run(main())
    assert path.read_bytes() == DATA


# ---------------------------------------------------------------------------------------
# Lifetimes


def test_future_keeps_the_buffer_alive(slow_read):
    path, data = slow_read
    f = kvikpy.CuFile(path)
    buf = aligned_array(len(data), 1)
    base = buf.base
    ref = weakref.ref(base)
    fut = f.pread(buf)
    assert not fut.done()
    del buf, base
    gc.collect()
    assert ref() is not None, "the buffer was freed while the read was running"
    assert fut.get() == len(data)
    f.close()
    # The memory is released once the future is gone (no leak).
    del fut
    gc.collect()
    assert wait_until(lambda: ref() is None), "the buffer is never released"


def test_bytearray_cannot_be_resized_while_read_runs(slow_read):
    path, data = slow_read
    ba = bytearray(len(data) + 1)
    with kvikpy.CuFile(path) as f:
        fut = f.pread(memoryview(ba)[1:])
        assert not fut.done()
        with pytest.raises(BufferError):
            ba.extend(b"more")
        assert fut.get() == len(data)
    assert bytes(ba[1:]) == data


def test_dropping_an_unwaited_future_does_not_crash(slow_read):
    path, data = slow_read
    f = kvikpy.CuFile(path)
    buf = aligned_array(len(data), 1)
    ref = weakref.ref(buf.base)
    keep = [buf.base]  # our own reference, to see when kvikpy lets go of the memory
    fut = f.pread(buf)
    assert not fut.done()
    del fut, buf
    gc.collect()
    f.close()
    del f
    gc.collect()
    # The read runs on; once it is over, nothing but `keep` holds the memory.
    assert wait_until(lambda: sys.getrefcount(keep[0]) == 2, timeout=30)
    keep.clear()
    gc.collect()
    assert ref() is None


def test_closing_the_file_while_a_read_runs_lets_it_finish(slow_read):
    path, data = slow_read
    f = kvikpy.CuFile(path)
    buf = aligned_array(len(data), 1)
    fut = f.pread(buf)
    f.close()
    assert f.closed
    assert not fut.done()
    assert fut.get() == len(data)
    assert buf.tobytes() == data
    with pytest.raises(ValueError, match="closed file"):
        f.read(bytearray(1))


def test_closing_the_file_while_a_write_runs_lets_it_finish(tmp_path):
    kvikpy.defaults.set({"num_threads": 1, "gds_threshold": 0})
    path = tmp_path / "f.bin"
    with kvikpy.CuFile(path, "w") as f:
        fut = f.pwrite(DATA, task_size=4096)
    assert fut.get() == len(DATA)
    assert path.read_bytes() == DATA


EXIT_WITH_PENDING_FUTURE = """
import gc, os, sys
import numpy as np
import kvikpy
path, n = sys.argv[1], int(sys.argv[2])
kvikpy.defaults.set({"num_threads": 1, "auto_direct_io_read": True, "bounce_buffer_size": 4096})
f = kvikpy.CuFile(path)
buf = np.empty(n + 1, np.uint8)[1:]
fut = f.pread(buf, task_size=1 << 20)
fut.add_done_callback(lambda _: None)
assert not fut.done()
del fut, buf
f.close()
gc.collect()
print("exiting", flush=True)
"""


def test_interpreter_exit_with_an_unwaited_future_is_clean(slow_read):
    path, data = slow_read
    for _ in range(3):
        r = run_python(EXIT_WITH_PENDING_FUTURE, str(path), str(len(data)))
        assert r.returncode == 0, r.stderr
        assert r.stdout == "exiting\n"
        assert "panic" not in r.stderr.lower(), r.stderr


EXIT_WHILE_CALLBACK_RUNS = """
import sys, time
import numpy as np
import kvikpy
path, n = sys.argv[1], int(sys.argv[2])
kvikpy.defaults.set("num_threads", 1)
f = kvikpy.CuFile(path)
buf = np.empty(n, np.uint8)
fut = f.pread(buf, task_size=1 << 20)

def slow_callback(_):
    for _ in range(2000):
        time.sleep(0.0001)

fut.add_done_callback(slow_callback)
print(fut.get(), flush=True)
"""


def test_interpreter_exit_while_a_done_callback_runs_does_not_abort(slow_read):
    """The I/O thread running a callback when Python exits must not take the process down."""
    path, data = slow_read
    for _ in range(3):
        r = run_python(EXIT_WHILE_CALLBACK_RUNS, str(path), str(len(data)))
        assert r.returncode == 0, f"exit status {r.returncode}; stderr: {r.stderr[-2000:]}"
        assert r.stdout == f"{len(data)}\n"


EXIT_AFTER_ASYNCIO = """
import asyncio, sys
import numpy as np
import kvikpy
path, n = sys.argv[1], int(sys.argv[2])
kvikpy.defaults.set("num_threads", 1)
f = kvikpy.CuFile(path)
buf = np.empty(n, np.uint8)
step = n // 8

async def main():
    futs = [f.pread(buf[i * step:(i + 1) * step], file_offset=i * step, task_size=1 << 16)
            for i in range(8)]
    return await asyncio.gather(*futs)

print(sum(asyncio.run(main())), flush=True)
"""


def test_interpreter_exit_right_after_asyncio_gather_does_not_abort(slow_read):
    """An asyncio program awaiting kvikpy futures exits cleanly, every time."""
    path, data = slow_read
    failures = []
    runs = 8
    for _ in range(runs):
        r = run_python(EXIT_AFTER_ASYNCIO, str(path), str(len(data)))
        if r.returncode != 0:
            failures.append((r.returncode, r.stderr[-500:]))
        else:
            assert r.stdout == f"{len(data) // 8 * 8}\n"
    assert not failures, f"{len(failures)} of {runs} runs failed: {failures[:2]}"


def test_futures_from_many_threads(file_with):
    """Python threads starting and waiting on reads concurrently all get their data."""
    path = file_with(DATA)
    kvikpy.defaults.set("num_threads", 3)
    errors = []
    results = {}

    def worker(i):
        try:
            buf = np.empty(MiB, dtype=np.uint8)
            with kvikpy.CuFile(path) as f:
                for j in range(5):
                    off = (i * 5 + j) * 4099
                    assert f.pread(buf, file_offset=off, task_size=65536).get() == MiB
                    assert buf.tobytes() == DATA[off : off + MiB]
            results[i] = True
        except Exception as e:
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not errors
    assert len(results) == 6


def test_a_running_read_holds_its_buffer_and_releases_it_after(slow_read):
    """The buffer lives while the read runs (even with every user reference gone) and is
    released once the read is done, so futures neither crash nor leak arrays."""

    class Tracked(np.ndarray):
        pass

    path, data = slow_read
    f = kvikpy.CuFile(path)
    buf = aligned_array(len(data), 1).view(Tracked)
    alive = weakref.ref(buf)
    fut = f.pread(buf)
    f.close()
    del buf
    gc.collect()
    assert not fut.done(), "the slow read finished before the check: nothing was tested"
    assert alive() is not None, "the buffer was released under a running read"
    assert fut.get() == len(data)
    del fut
    assert kvikpy._lib.wait_for_io(10.0)
    kvikpy._lib.thread_pool_size()  # runs pyo3's deferred decrefs
    gc.collect()
    assert alive() is None, "the finished read still holds the buffer"


@pytest.mark.parametrize("timeout", [float("inf"), float("nan"), 1e300, -5.0])
def test_engine_waits_take_any_float_timeout(file_with, timeout):
    # Duration::from_secs_f64 panics on infinity, NaN and huge values: no such panic may
    # reach Python from a wait.
    path = file_with(DATA)
    buf = bytearray(100)
    with kvikpy.CuFile(path) as f:
        fut = f.pread(buf)
        fut.get()
        assert fut._handle.wait(timeout) is True
    assert _lib.wait_for_io(timeout) is True
