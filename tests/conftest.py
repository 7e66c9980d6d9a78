"""Shared fixtures and helpers of kvikpy's test suite.

* Settings are process-global: ``_restore_settings`` (autouse) snapshots every setting
  before each test and restores it afterwards, so no test leaks a change into another.
* ``random_bytes(n, seed)`` and ``file_with(data)`` build random test data and files;
  tests never use all-zero data, which would hide reads that did nothing.
* ``run_python(code, env=...)`` runs code in a fresh interpreter, for everything the
  engine reads only once per process (``KVIKIO_*`` variables) or that happens at exit.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import kvikpy
from kvikpy import _lib

PAGE = 4096


def random_bytes(n: int, seed: int = 0) -> bytes:
    """``n`` reproducible random bytes (never all zeros for n >= 16)."""
    return np.random.default_rng(seed).bytes(n)


def random_array(n: int, seed: int = 0) -> np.ndarray:
    """A writable uint8 array of ``n`` reproducible random bytes."""
    return np.frombuffer(bytearray(random_bytes(n, seed)), dtype=np.uint8)


def write_file(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def random_file(folder: Path, n: int, seed: int = 0, name: str | None = None) -> tuple[Path, bytes]:
    """A file of ``n`` reproducible random bytes in ``folder`` (``d{seed}.bin`` unless
    ``name`` is given), and those bytes."""
    data = random_bytes(n, seed)
    return write_file(folder / (name or f"d{seed}.bin"), data), data


def task_lengths(offset: int, size: int, task: int) -> list[int]:
    """The engine's split: boundaries on a grid anchored at the 4 KiB below ``offset``."""
    anchor = offset - offset % 4096
    cuts = [offset]
    edge = anchor + task
    while edge < offset + size:
        cuts.append(edge)
        edge += task
    cuts.append(offset + size)
    return [b - a for a, b in itertools.pairwise(cuts)]


def o_direct_supported(path: Path) -> bool:
    """Whether ``path`` (an existing file) can be opened with O_DIRECT, probed with os.open."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    except OSError:
        return False
    os.close(fd)
    return True


def aligned_array(n: int, offset: int = 0) -> np.ndarray:
    """A uint8 array of ``n`` bytes whose data starts ``offset`` bytes past a page boundary."""
    raw = np.empty(n + 2 * PAGE, dtype=np.uint8)
    start = (-raw.ctypes.data) % PAGE + offset
    out = raw[start : start + n]
    assert n == 0 or out.ctypes.data % PAGE == offset % PAGE
    return out


def wait_until(predicate: Callable[[], bool], timeout: float = 10.0) -> bool:
    """Poll ``predicate`` until it is true or ``timeout`` seconds pass; return its last value."""
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return predicate()
        time.sleep(0.005)
    return True


def clean_env(**overrides: str) -> dict[str, str]:
    """The current environment without any ``KVIKIO_*`` variable, plus ``overrides``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVIKIO_")}
    env.setdefault("OPENBLAS_NUM_THREADS", "1")  # numpy's BLAS threads: startup cost only
    env.update(overrides)
    return env


def benchmark_env(folder: Path, startup: str = "") -> dict[str, str]:
    """The environment of a benchmark's processes (``clean_env``): the kvikpy under test (an
    installed wheel, or this checkout's) through a link of its own in a new folder of
    ``folder``, then this checkout's ``benchmarks``; ``startup``, if given, runs first in
    every process (a ``sitecustomize``)."""
    site = Path(tempfile.mkdtemp(prefix="site-", dir=folder))
    (site / "kvikpy").symlink_to(Path(kvikpy.__file__).resolve().parent)
    if startup:
        (site / "sitecustomize.py").write_text(startup)
    env = clean_env()
    env.pop("PYTHONSAFEPATH", None)
    env["PYTHONPATH"] = os.pathsep.join([str(site), str(Path(__file__).resolve().parent.parent)])
    return env


def crossings(call: Callable[[], object]) -> list[str]:
    """The calls into the extension that ``call()`` makes, by name, in order: what kvikpy's
    modules take from ``kvikpy._lib`` and call (functions, classes made), and the methods
    of its objects (seen by a profiler)."""
    seen: list[str] = []

    class Counted:
        def __getattr__(self, name: str) -> Any:
            value = getattr(_lib, name)
            if not callable(value):
                return value

            def counted(*args: Any, **kwargs: Any) -> Any:
                seen.append(name)
                return value(*args, **kwargs)

            return counted

    patch = pytest.MonkeyPatch()

    def profile(frame: Any, event: str, arg: Any) -> None:
        owner = getattr(arg, "__self__", None)
        if event == "c_call" and type(owner).__module__ == "kvikpy._lib":
            seen.append(f"{type(owner).__name__}.{arg.__name__}")

    try:
        for name, module in list(sys.modules.items()):
            if name.startswith("kvikpy") and getattr(module, "_lib", None) is _lib:
                patch.setattr(module, "_lib", Counted())
        sys.setprofile(profile)
        call()
    finally:
        sys.setprofile(None)
        patch.undo()
    return seen


def run_python(
    code: str,
    *args: str,
    env: dict[str, str] | None = None,
    timeout: float = 120,
    **kwargs: object,
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` with ``args`` in a fresh interpreter with ``clean_env(**env)``."""
    return subprocess.run(
        [sys.executable, "-c", code, *args],
        check=False,
        env=clean_env(**(env or {})),
        capture_output=True,
        text=True,
        timeout=timeout,
        **kwargs,  # type: ignore[arg-type]
    )


def run_cli(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """``python -m kvikpy ARGS`` in a fresh interpreter with ``clean_env(**env)``."""
    return subprocess.run(
        [sys.executable, "-m", "kvikpy", *args],
        check=False,
        env=clean_env(**env),
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture(autouse=True)
def _restore_settings() -> Iterator[None]:
    """Snapshot every setting before the test and restore all of them afterwards."""
    names = _lib.setting_names()
    before = {name: kvikpy.defaults.get(name) for name in names}
    yield
    kvikpy.defaults.set(before)
    after = {name: kvikpy.defaults.get(name) for name in names}
    assert after == before


@pytest.fixture(name="random_bytes")
def _random_bytes_fixture() -> Callable[..., bytes]:
    return random_bytes


@pytest.fixture
def file_with(tmp_path: Path) -> Callable[..., Path]:
    """``file_with(data, name="data.bin")``: a file in ``tmp_path`` holding ``data``."""

    def make(data: bytes, name: str = "data.bin") -> Path:
        return write_file(tmp_path / name, data)

    return make


@pytest.fixture
def tmpfs_dir(tmp_path: Path) -> Iterator[Path]:
    """A fresh directory on tmpfs (/dev/shm); skips where there is none."""
    shm = Path("/dev/shm")
    if not shm.is_dir() or not _is_tmpfs(shm):
        pytest.skip("/dev/shm is not a tmpfs here")
    d = shm / f"kvikpy-test-{os.getpid()}-{tmp_path.name}"
    d.mkdir()
    try:
        yield d
    finally:
        for p in d.iterdir():
            p.unlink()
        d.rmdir()


def _is_tmpfs(path: Path) -> bool:
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return False
    return any(line.split()[1:3] == [str(path), "tmpfs"] for line in mounts)


SLOW_READ_MIB = 32


@pytest.fixture
def slow_read(tmp_path: Path) -> tuple[Path, bytes]:
    """A file, and settings under which reading it whole takes a while (~0.1 s or more).

    One I/O thread, O_DIRECT reads staged through 4 KiB bounce buffers (when the
    filesystem supports O_DIRECT; otherwise 4 KiB tasks). Read it into an unaligned
    buffer (``aligned_array(n, 1)``) so every chunk goes through the bounce buffer.
    The autouse fixture restores the settings afterwards.
    """
    data = random_bytes(SLOW_READ_MIB << 20, seed=99)
    path = write_file(tmp_path / "slow.bin", data)
    kvikpy.defaults.set(
        {
            "num_threads": 1,
            "auto_direct_io_read": True,
            "bounce_buffer_size": PAGE,
            "task_size": (1 << 20) if o_direct_supported(path) else PAGE,
        }
    )
    return path, data


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Everything under tests/gpu/ is a ``gpu`` test."""
    for item in items:
        if "gpu" in Path(str(item.path)).parent.parts[-1:]:
            item.add_marker(pytest.mark.gpu)


@pytest.fixture(autouse=True)
def _skip_without_hardware(request: pytest.FixtureRequest) -> None:
    """``gpu`` tests need a CUDA GPU, ``multi_gpu`` tests two; ``cufile`` tests need
    libcufile to load (real GDS is not required: they check the fallback, or run through
    the stand-in)."""
    if request.node.get_closest_marker("gpu") and not kvikpy.cuda_available():
        pytest.skip(f"needs a CUDA GPU: {_lib.cuda_unavailable_reason()}")
    if request.node.get_closest_marker("multi_gpu") and kvikpy.device_count() < 2:
        pytest.skip(f"needs two GPUs; this machine has {kvikpy.device_count()}")
    if request.node.get_closest_marker("cufile"):
        status = _lib.cufile_status()
        if status["library"] is None:
            pytest.skip(f"needs libcufile: {status['load_error']}")


@contextlib.contextmanager
def caller_context_kept() -> Iterator[None]:
    """Make the thread's current CUDA context current again after the block. JAX's first
    look at the GPUs (``jax.devices()``) leaves the last GPU's context current on the
    calling thread: without this, every later ``device="cuda"`` read of the test process
    would go to that GPU, and :func:`_keeps_the_current_context` fails the test."""
    import ctypes

    cuda = ctypes.CDLL("libcuda.so.1")
    ctx = ctypes.c_void_p()
    assert cuda.cuCtxGetCurrent(ctypes.byref(ctx)) == 0
    try:
        yield
    finally:
        assert cuda.cuCtxSetCurrent(ctx) == 0


def _driver_context() -> tuple[int, int | None]:
    """The main thread's current CUDA context as the driver reports it, and its device
    ordinal: ``(0, None)`` where none is current."""
    import ctypes

    cuda = ctypes.CDLL("libcuda.so.1")
    ctx = ctypes.c_void_p()
    if cuda.cuCtxGetCurrent(ctypes.byref(ctx)) != 0 or not ctx.value:
        return 0, None
    ordinal = ctypes.c_int(-1)
    rc = cuda.cuCtxGetDevice(ctypes.byref(ordinal))
    return ctx.value, ordinal.value if rc == 0 else None


@pytest.fixture(autouse=True)
def _keeps_the_current_context(
    request: pytest.FixtureRequest, _skip_without_hardware: None
) -> Iterator[None]:
    """Every GPU test leaves the thread's current CUDA context as it found it (where one
    was current): kvikpy must never change which GPU its caller uses, and a test that
    switches devices itself restores the caller's, so the next test starts where the
    user would. Checked with the driver, which torch and CuPy both follow."""
    if not request.node.get_closest_marker("gpu"):
        yield
        return
    before = _driver_context()
    yield
    after = _driver_context()
    if before[0] and after != before:
        pytest.fail(
            f"the thread's current CUDA context was device {before[1]}'s before the test "
            f"and is device {after[1]}'s after it: something changed the caller's device"
        )


class PwriteRecorder:
    """``CuFile.pwrite`` wrapped (for the save tests): every start and every wait recorded
    in order as ``(kind, fileno, size, file_offset)``, and the ``task_size`` each start
    named; the ``fail_at``-th start (from 0) raises ``raise_`` instead."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, fail_at: int = -1, raise_: Any = None):
        from kvikpy.cufile import CuFile

        self.events: list[tuple[str, int, int, int]] = []
        self.task_sizes: list[int | None] = []
        real = CuFile.pwrite
        recorder = self

        class Future:
            def __init__(self, inner: Any, key: tuple[int, int, int]) -> None:
                self.inner, self.key = inner, key

            def get(self) -> int:
                recorder.events.append(("wait", *self.key))
                return int(self.inner.get())

        def pwrite(
            f: CuFile,
            buf: Any,
            size: int | None = None,
            file_offset: int = 0,
            task_size: int | None = None,
        ) -> Any:
            assert size is not None
            if len([e for e in self.events if e[0] == "start"]) == fail_at:
                raise raise_
            key = (f.fileno(), size, file_offset)
            self.events.append(("start", *key))
            self.task_sizes.append(task_size)
            return Future(real(f, buf, size, file_offset, task_size), key)

        monkeypatch.setattr(CuFile, "pwrite", pwrite)
