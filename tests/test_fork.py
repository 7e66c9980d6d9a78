"""Fork while I/O runs: a child forked while kvikpy's pool is busy (``os.fork()``,
multiprocessing's "fork" start method) gets a working library, and the parent's reads
finish as if nothing happened.

Every scenario runs in a fresh interpreter bounded by a timeout, so a child that
deadlocks fails the test instead of hanging the suite. Inside, a thread keeps the pool
busy with many small-task reads of a 64 MiB file and a read is pending when the process
forks; the child then does one kind of I/O, checks every byte, and exits normally (its
atexit hooks included), reporting on stdout.
"""

from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest
from conftest import random_file, run_python

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="fork() is POSIX-only")

SIZE = 64 << 20

# The parent: a busy pool (a thread re-reading the file with 16 KiB tasks), a pending
# read, then fork. `CHILD` is the child's body; it sees `path`, `expected`, `pending`
# (the parent's future) and `work` (a scratch folder), and must print "CHILD OK".
HARNESS = textwrap.dedent(
    """
    import os, sys, threading, time, warnings
    # Python 3.12+ warns that forking a multi-threaded process may deadlock: that is
    # exactly what is tested here.
    warnings.simplefilter("ignore", DeprecationWarning)
    import numpy as np
    import kvikpy

    path, work = sys.argv[1], sys.argv[2]
    expected = np.fromfile(path, dtype=np.uint8)
    kvikpy.defaults.set({"task_size": 16 << 10, "num_threads": 3})

    stop = threading.Event()
    busy_errors = []

    def keep_busy():
        buf = np.empty_like(expected)
        with kvikpy.CuFile(path, "r") as f:
            while not stop.is_set():
                try:
                    assert f.pread(buf).get() == buf.nbytes
                    assert np.array_equal(buf, expected)
                except BaseException as e:  # reported by the parent
                    busy_errors.append(e)
                    return

    busy = threading.Thread(target=keep_busy, daemon=True)
    busy.start()
    pending_buf = np.empty_like(expected)
    pending_file = kvikpy.CuFile(path, "r")
    # 16,384 tasks of 4 KiB on three threads beside the busy reader: running for tens of
    # milliseconds, so a short pause lets its threads start and still forks mid-read.
    pending = pending_file.pread(pending_buf, task_size=4096)
    time.sleep(0.003)
    assert not pending.done(), "the read finished before the fork: nothing was tested"

    def child():
    CHILD_BODY

    started = time.monotonic()
    pid = os.fork()
    if pid == 0:
        try:
            child()
            print("CHILD OK", flush=True)
        except BaseException:
            import traceback
            traceback.print_exc()
            sys.stdout.flush()
            os._exit(1)
        sys.exit(0)  # a normal exit: kvikpy's atexit hooks run in the child too
    deadline = time.monotonic() + 45
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            print("CHILD HUNG", flush=True)
            sys.exit(3)
        time.sleep(0.01)
    print(f"child took {time.monotonic() - started:.2f} s, status {status}", flush=True)
    # The parent's own operations are unaffected.
    assert pending.get() == expected.nbytes
    assert np.array_equal(pending_buf, expected)
    stop.set()
    busy.join(30)
    assert not busy.is_alive() and not busy_errors, busy_errors
    pending_file.close()
    assert os.waitstatus_to_exitcode(status) == 0, status
    print("PARENT OK", flush=True)
    """
)


def run_scenario(tmp_path: Path, child: str) -> str:
    path, _ = random_file(tmp_path, SIZE, seed=7)
    work = tmp_path / "work"
    work.mkdir()
    body = textwrap.indent(textwrap.dedent(child).strip(), "    ")
    code = HARNESS.replace("CHILD_BODY", body)
    result = run_python(code, str(path), str(work), timeout=90)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert "CHILD OK" in result.stdout and "PARENT OK" in result.stdout, out
    return out


def test_whole_file_read_in_a_child_forked_during_reads(tmp_path: Path) -> None:
    run_scenario(
        tmp_path,
        """
        out = kvikpy.read(path, device="cpu")
        assert np.array_equal(np.from_dlpack(out), expected)
        """,
    )


def test_pread_with_many_tasks_in_a_child_forked_during_reads(tmp_path: Path) -> None:
    run_scenario(
        tmp_path,
        """
        buf = np.empty_like(expected)
        with kvikpy.CuFile(path, "r") as f:
            assert f.pread(buf, task_size=64 << 10).get() == buf.nbytes
            assert np.array_equal(buf, expected)
            # The inherited host bounce pool is not reused: O_DIRECT staging works too.
            part = np.empty(3 << 20, dtype=np.uint8)
            assert f.pread(part, file_offset=4097, task_size=1 << 20).get() == part.nbytes
            assert np.array_equal(part, expected[4097 : 4097 + part.nbytes])
        """,
    )


def test_read_many_and_read_ranges_in_a_child_forked_during_reads(tmp_path: Path) -> None:
    run_scenario(
        tmp_path,
        """
        batch = kvikpy.read_many([path, path], device="cpu")
        flat = np.from_dlpack(batch.buffer)
        assert np.array_equal(flat, np.concatenate([expected, expected]))
        ranges = [(0, 4096), (1 << 20, 65536), (len(expected) - 100, 100), (5, 7)]
        batch = kvikpy.read_ranges(path, ranges, device="cpu")
        flat = np.from_dlpack(batch.buffer)
        assert np.array_equal(flat, np.concatenate([expected[o : o + n] for o, n in ranges]))
        """,
    )


def test_iter_chunks_in_a_child_forked_during_reads(tmp_path: Path) -> None:
    run_scenario(
        tmp_path,
        """
        got = [np.from_dlpack(c).copy() for c in kvikpy.iter_chunks(path, 5 << 20, device="cpu")]
        assert np.array_equal(np.concatenate(got), expected)
        """,
    )


def test_writes_in_a_child_forked_during_reads(tmp_path: Path) -> None:
    run_scenario(
        tmp_path,
        """
        target = os.path.join(work, "copy.bin")
        assert kvikpy.write(target, expected) == expected.nbytes
        assert np.array_equal(np.fromfile(target, dtype=np.uint8), expected)
        with kvikpy.CuFile(target, "r+") as f:
            part = expected[: 8 << 20][::-1].copy()
            assert f.pwrite(part, file_offset=4096, task_size=256 << 10).get() == part.nbytes
        back = np.fromfile(target, dtype=np.uint8)
        assert np.array_equal(back[4096 : 4096 + part.nbytes], part)
        """,
    )


def test_settings_and_a_fresh_pool_carry_over_to_the_child(tmp_path: Path) -> None:
    run_scenario(
        tmp_path,
        """
        assert kvikpy.defaults.get("task_size") == 16 << 10
        assert kvikpy.defaults.get("num_threads") == 3
        kvikpy.defaults.set("num_threads", 2)
        assert kvikpy.read(path, device="cpu").nbytes == len(expected)
        assert kvikpy._lib.thread_pool_size() == 2
        """,
    )


@pytest.mark.timeout(180)
def test_waiting_on_a_read_started_before_fork_fails_in_the_child(tmp_path: Path) -> None:
    out = run_scenario(
        tmp_path,
        """
        assert pending.done(), "it can never finish here, so it reports done"
        try:  # a get() that waited for the parent's tasks would hang: CHILD HUNG
            pending.get()
        except RuntimeError as e:
            message = str(e)
        else:
            raise AssertionError("get() of a read started before fork returned")
        assert "before os.fork()" in message and "start new reads" in message, message
        calls = []
        pending.add_done_callback(calls.append)
        assert calls == [pending], "a callback on it runs at once"
        # A read that had finished before the fork still gives its result.
        done_before = kvikpy.CuFile(path, "r").pread(np.empty(10, np.uint8))
        assert done_before.get() == 10
        print("MESSAGE:", message)
        """,
    )
    assert "MESSAGE: this read or write was started before os.fork()" in out


@pytest.mark.timeout(180)
def test_a_child_forked_during_reads_has_no_io_to_wait_for_at_exit(tmp_path: Path) -> None:
    # At exit, kvikpy waits up to 30 s for reads in flight (atexit: _lib.wait_for_io(30)).
    # The parent's reads in flight at the fork never finish in the child, so the child
    # must not count them: the same wait with no time at all finds nothing in flight.
    run_scenario(
        tmp_path,
        """
        assert kvikpy._lib.wait_for_io(0.0), "the parent's reads are in flight in the child"
        """,
    )


def test_multiprocessing_fork_pool_reads_while_the_parent_reads(tmp_path: Path) -> None:
    path, _ = random_file(tmp_path, SIZE, seed=3)
    code = textwrap.dedent(
        """
        import multiprocessing, sys, threading, warnings
        warnings.simplefilter("ignore", DeprecationWarning)
        import numpy as np
        import kvikpy

        path = sys.argv[1]
        kvikpy.defaults.set({"task_size": 16 << 10})
        expected = np.fromfile(path, dtype=np.uint8)

        def checksum(offset):
            buf = np.empty(8 << 20, dtype=np.uint8)
            with kvikpy.CuFile(path, "r") as f:
                assert f.pread(buf, file_offset=offset).get() == buf.nbytes
            a = kvikpy.read(path, device="cpu", offset=offset, size=buf.nbytes)
            assert np.array_equal(np.from_dlpack(a), buf)
            return int(buf.sum(dtype=np.int64))

        stop = threading.Event()
        def keep_busy():
            buf = np.empty_like(expected)
            with kvikpy.CuFile(path, "r") as f:
                while not stop.is_set():
                    f.pread(buf).get()

        busy = threading.Thread(target=keep_busy, daemon=True)
        busy.start()
        offsets = [i << 20 for i in range(0, 48, 6)]
        with multiprocessing.get_context("fork").Pool(2) as pool:
            got = pool.map_async(checksum, offsets).get(timeout=45)
        stop.set()
        busy.join(30)
        want = [int(expected[o : o + (8 << 20)].sum(dtype=np.int64)) for o in offsets]
        assert got == want, (got, want)
        print("POOL OK")
        """
    )
    result = run_python(code, str(path), timeout=90)
    assert result.returncode == 0 and "POOL OK" in result.stdout, result.stdout + result.stderr


def test_remote_reads_in_a_child_forked_during_remote_reads(tmp_path: Path) -> None:
    # The child reads another file than the parent over HTTP while the parent's reads go
    # on: it gets a fresh pool and agent (the parent's pooled connections are sockets the
    # parent goes on using, and the agent's lock may be held by a parent thread).
    from remote_servers import serve

    from kvikpy._http_server import RangeRequestHandler

    parent_path, _ = random_file(tmp_path, 1 << 20, seed=5)
    child_path, _ = random_file(tmp_path, 1 << 20, seed=6)
    code = textwrap.dedent(
        """
        import os, sys, threading, time, warnings
        warnings.simplefilter("ignore", DeprecationWarning)
        import numpy as np
        import kvikpy

        base, parent_name, child_name, folder = sys.argv[1:5]
        mine = np.fromfile(os.path.join(folder, parent_name), dtype=np.uint8)
        theirs = np.fromfile(os.path.join(folder, child_name), dtype=np.uint8)
        kvikpy.defaults.set({"task_size": 64 << 10, "num_threads": 8})
        stop = threading.Event()
        errors = []

        def keep_busy():
            try:
                while not stop.is_set():
                    got = kvikpy.read(f"{base}/{parent_name}", device="cpu")
                    assert np.array_equal(np.from_dlpack(got), mine)
            except BaseException as e:
                errors.append(e)

        # Idle connections in the agent's pool, then the parent reads on while forking.
        kvikpy.read(f"{base}/{parent_name}", device="cpu")
        busy = [threading.Thread(target=keep_busy, daemon=True) for _ in range(2)]
        for t in busy:
            t.start()
        time.sleep(0.2)
        pid = os.fork()
        if pid == 0:
            try:
                for _ in range(5):
                    got = kvikpy.read(f"{base}/{child_name}", device="cpu")
                    assert np.array_equal(np.from_dlpack(got), theirs)
                print("CHILD OK", flush=True)
            except BaseException:
                import traceback
                traceback.print_exc()
                sys.stdout.flush()
                os._exit(1)
            sys.exit(0)
        deadline = time.monotonic() + 45
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, 9)
                print("CHILD HUNG", flush=True)
                sys.exit(3)
            time.sleep(0.01)
        time.sleep(0.3)  # the parent's reads go on after the child is gone
        stop.set()
        for t in busy:
            t.join(30)
        assert not any(t.is_alive() for t in busy) and not errors, errors
        assert os.waitstatus_to_exitcode(status) == 0, status
        print("PARENT OK", flush=True)
        """
    )
    with serve(RangeRequestHandler, directory=str(tmp_path)) as base:
        args = (base, parent_path.name, child_path.name, str(tmp_path))
        result = run_python(code, *args, timeout=90)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert "CHILD OK" in result.stdout and "PARENT OK" in result.stdout, out
