"""Fork while device I/O runs: a CUDA context cannot cross fork(), so in a child forked
after the parent initialised CUDA every device operation fails with
``CudaUnavailableError`` saying why (never a hang or a crash), host reads work, and the
parent's device reads finish with the right bytes. A child whose parent never touched
CUDA can use the GPU.

Each scenario runs in a fresh interpreter with a timeout (a child that hangs is killed
and fails the test; no time is asserted); device bytes are checked by writing the device
buffer back to a file with kvikpy (no CuPy or torch needed).
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from conftest import random_file, run_python

SIZE = 64 << 20

PARENT_BUSY = {
    "pread": """
        dev = kvikpy.read(path, device="cuda:0")
        with kvikpy.CuFile(path, "r") as f:
            while not stop.is_set():
                assert f.pread(dev, task_size=256 << 10).get() == dev.nbytes
    """,
    "read_many": """
        while not stop.is_set():
            batch = kvikpy.read_many([path, path], device="cuda:0")
            assert batch.buffer.nbytes == 2 * len(expected)
    """,
    "iter_chunks": """
        while not stop.is_set():
            for chunk in kvikpy.iter_chunks(path, 8 << 20, device="cuda:0"):
                pass
    """,
}

HARNESS = textwrap.dedent(
    """
    import os, sys, threading, time, warnings
    warnings.simplefilter("ignore", DeprecationWarning)  # 3.12+: fork of a threaded process
    import numpy as np
    import kvikpy
    from kvikpy import _lib

    path, work = sys.argv[1], sys.argv[2]
    expected = np.fromfile(path, dtype=np.uint8)
    kvikpy.defaults.set({"task_size": 256 << 10, "num_threads": 4})

    def device_bytes(buf, name):
        target = os.path.join(work, name)
        kvikpy.write(target, buf)
        return np.fromfile(target, dtype=np.uint8)

    stop = threading.Event()
    busy_errors = []

    def keep_busy():
        try:
    BUSY_BODY
        except BaseException as e:
            busy_errors.append(e)

    busy = threading.Thread(target=keep_busy, daemon=True)
    busy.start()
    dev = kvikpy.read(path, device="cuda:0")  # CUDA is initialised in the parent
    pending_file = kvikpy.CuFile(path, "r")
    pending = pending_file.pread(dev, task_size=64 << 10)
    time.sleep(0.01)

    started = time.monotonic()
    pid = os.fork()
    if pid == 0:
        try:
            # Each refusal is checked for its type and message; one that hung instead
            # fails the test through the deadline below (CHILD HUNG).
            for attempt in (
                lambda: kvikpy.read(path),
                lambda: kvikpy.read(path, device="cuda:0"),
                lambda: kvikpy.CuFile(path, "r").pread(dev).get(),
                lambda: _lib.Buffer.allocate(4096, 0, False),
                lambda: kvikpy.read_many([path], device="cuda:0"),
            ):
                try:
                    attempt()
                except kvikpy.CudaUnavailableError as e:
                    assert "before os.fork()" in str(e), e
                    assert '"spawn"' in str(e), e
                else:
                    raise AssertionError("a device operation worked in the forked child")
            assert not kvikpy.cuda_available()
            assert "before os.fork()" in _lib.cuda_unavailable_reason()
            if not pending.done():
                raise AssertionError("a read started before fork must report done here")
            try:
                pending.get()
            except RuntimeError as e:
                assert "before os.fork()" in str(e)
            # Host memory works in the child.
            host = kvikpy.read(path, device="cpu")
            assert np.array_equal(np.from_dlpack(host), expected)
            buf = np.empty_like(expected)
            with kvikpy.CuFile(path, "r") as f:
                assert f.pread(buf).get() == buf.nbytes
            assert np.array_equal(buf, expected)
            print("CHILD OK", flush=True)
        except BaseException:
            import traceback
            traceback.print_exc()
            sys.stdout.flush()
            os._exit(1)
        sys.exit(0)  # a normal exit: atexit hooks and thread-local destructors run
    deadline = time.monotonic() + 60
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
    print(f"child took {time.monotonic() - started:.2f} s", flush=True)
    assert pending.get() == expected.nbytes
    stop.set()
    busy.join(60)
    assert not busy.is_alive() and not busy_errors, busy_errors
    assert np.array_equal(device_bytes(dev, "dev.bin"), expected)
    assert os.waitstatus_to_exitcode(status) == 0, status
    print("PARENT OK", flush=True)
    """
)


@pytest.mark.gpu
@pytest.mark.timeout(300)
@pytest.mark.parametrize("busy", sorted(PARENT_BUSY))
def test_device_io_in_a_child_forked_during_device_reads_fails_clearly(
    tmp_path: Path, busy: str
) -> None:
    path, _ = random_file(tmp_path, SIZE, seed=11)
    work = tmp_path / "work"
    work.mkdir()
    body = textwrap.indent(textwrap.dedent(PARENT_BUSY[busy]).strip(), " " * 8)
    code = HARNESS.replace("BUSY_BODY", body)
    result = run_python(code, str(path), str(work), timeout=180)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert "CHILD OK" in result.stdout and "PARENT OK" in result.stdout, out


@pytest.mark.gpu
def test_a_child_of_a_parent_that_never_used_cuda_can_use_the_gpu(tmp_path: Path) -> None:
    path, _ = random_file(tmp_path, 16 << 20, seed=12)
    code = textwrap.dedent(
        """
        import os, sys, threading, warnings
        warnings.simplefilter("ignore", DeprecationWarning)
        import numpy as np
        import kvikpy

        path, work = sys.argv[1], sys.argv[2]
        expected = np.fromfile(path, dtype=np.uint8)
        # POSIX only: opening cuFile's driver would initialise CUDA in the parent.
        kvikpy.defaults.set({"task_size": 64 << 10, "compat_mode": "on"})
        buf = np.empty_like(expected)
        f = kvikpy.CuFile(path, "r")
        pending = f.pread(buf)  # host only: the parent never initialises CUDA
        pid = os.fork()
        if pid == 0:
            try:
                kvikpy.defaults.set("compat_mode", "auto")
                dev = kvikpy.read(path, device="cuda:0")
                target = os.path.join(work, "child.bin")
                kvikpy.write(target, dev)
                assert np.array_equal(np.fromfile(target, dtype=np.uint8), expected)
                print("CHILD OK", flush=True)
            except BaseException:
                import traceback
                traceback.print_exc()
                sys.stdout.flush()
                os._exit(1)
            sys.exit(0)
        _, status = os.waitpid(pid, 0)
        assert pending.get() == expected.nbytes and np.array_equal(buf, expected)
        assert os.waitstatus_to_exitcode(status) == 0, status
        print("PARENT OK", flush=True)
        """
    )
    work = tmp_path / "work"
    work.mkdir()
    result = run_python(code, str(path), str(work), timeout=120)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    assert "CHILD OK" in result.stdout and "PARENT OK" in result.stdout, out
